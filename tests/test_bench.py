"""`puffergpt bench --quick` works and its JSON has every field (no timing is asserted)."""

import json

from click.testing import CliRunner

from puffergpt.cli import main


def test_bench_quick_json(tmp_path, tiny_dir):
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    r = CliRunner().invoke(
        main, ["bench", "--model", str(tiny_dir), "--quick", "--json", str(out), "--chart", str(png)]
    )
    assert r.exit_code == 0, r.output
    report = json.loads(out.read_text())
    assert {"model", "machine", "results"} <= set(report)
    engines = {x["engine"]: x for x in report["results"]}
    assert {"numpy", "transformers", "embedded"} <= set(engines)
    for x in report["results"]:
        assert {"engine", "decode_ms_per_token", "prefill_ms", "requests_per_token", "round_trips_per_token",
                "bytes_scanned_per_token", "peak_rss_mb"} <= set(x)
        assert {"median", "p90"} <= set(x["decode_ms_per_token"]) and x["decode_ms_per_token"]["median"] > 0
        assert set(x["prefill_ms"]) == {"16"}  # tiny's context of 128 leaves out the 128-token prompt
    e = engines["embedded"]
    assert e["requests_per_token"] == 2 + 6 * 2 and e["bytes_scanned_per_token"] > 0 and e["load_s"] > 0
    assert png.stat().st_size > 1000
    assert "embedded" in r.output and "numpy" in r.output


def test_bench_unknown_backend(tiny_dir):
    r = CliRunner().invoke(main, ["bench", "--model", str(tiny_dir), "--backends", "faiss"])
    assert r.exit_code != 0 and "unknown backend 'faiss'" in r.output
