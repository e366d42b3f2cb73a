"""Honest embeddings on the small model (issue 34 item 5), against numpy recomputations:

- the demo's ``token_counts.npz`` equals a fresh count of its training text, recounted here
  from the Debian files and Python's docs by a second implementation of the recipe the file
  states (split, shuffle, filter), with numpy's bincount;
- neighbours and analogy mark rows seen fewer than RARE_BELOW times, through the routes the
  page calls, and the CLI; a model without counts says they are unknown;
- the card's analogy score the page shows equals numpy's own search of the same list;
- the map's first-axis correlation with log(1 + count) equals numpy's within 1e-6.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import random
import re

import numpy as np
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from puffergpt.lens import views
from puffergpt.model import token_counts, tokenizer, untrained
from puffergpt.model.checkpoints import demo_dir
from puffergpt.search.manifest import open_engine
from puffergpt.server import create_app

V = tokenizer.VOCAB_SIZE
ROOT = os.path.join(os.path.dirname(__file__), "..")
SETUP = "the demo's training text is Debian's: `make system` installs wordnet-base, fortunes and fortunes-min"


@pytest.fixture(scope="module")
def counts() -> token_counts.TokenCounts:
    tc = token_counts.for_model("demo", V)
    assert tc is not None, f"{token_counts.FILE} ships beside the demo model"
    return tc


def wordnet_docs() -> list[str]:
    docs = []
    for pos, name in (("noun", "noun"), ("verb", "verb"), ("adj", "adjective"), ("adv", "adverb")):
        with open(f"/usr/share/wordnet/data.{pos}", encoding="utf-8") as f:
            for line in f:
                if line.startswith("  ") or "|" not in line:
                    continue
                head, gloss = line.split("|", 1)
                fields = head.split()
                words = [fields[4 + 2 * i].split("(")[0].replace("_", " ") for i in range(int(fields[3], 16))]
                docs.append(f"{', '.join(words)} ({name}): {gloss.strip()}")
    return docs


def fortune_docs() -> list[str]:
    docs = []
    for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
        name = os.path.basename(path)
        if "." in name or name in {"ascii-art", "translate-me", "ethnic", "men-women"} or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            docs += [d.strip("\n") for d in f.read().split("\n%\n") if d.strip()]
    return docs


def pydoc_docs() -> list[str]:
    import pydoc_data.topics as t

    return [t.topics[k] for k in sorted(t.topics)]


def test_the_counts_file_equals_a_fresh_count_of_the_training_text(counts):
    meta = counts.meta
    assert meta["version"] == token_counts.VERSION and meta["seed"] == 3 and "train split" in meta["data"]
    for path, digest in meta["inputs"].items():  # the very files the demo was trained on
        full = path if os.path.isabs(path) else os.path.join(ROOT, path)
        assert os.path.isfile(full), f"{full} is missing: {SETUP}"
        with open(full, "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == digest, f"{full} is not the file the demo was trained on"
    with open(os.path.join(ROOT, "tests", "data", "english.txt"), encoding="utf-8") as f:
        held = {line.strip() for line in f if len(line.strip()) > 20}
    enc = tokenizer.get_encoding()
    fresh = np.zeros(V, np.int64)
    for name, docs in (("wordnet", wordnet_docs()), ("fortunes", fortune_docs()), ("pydoc", pydoc_docs())):
        docs = [d for d in docs if not any(h in d for h in held)]
        random.Random(meta["seed"]).shuffle(docs)
        train = docs[: -max(1, int(len(docs) * 0.02))]
        assert not any("<|endoftext|>" in d for d in train)  # so the plain encoding is the script's
        ids = enc.encode_ordinary_batch(train, num_threads=2)
        n = np.bincount(np.concatenate([np.asarray(x, np.int64) for x in ids]), minlength=V)
        n[tokenizer.EOT] += len(train)  # each document ends with <|endoftext|>
        assert int(n.sum()) == meta["sources"][name]["tokens"], name
        fresh += n
    assert np.array_equal(fresh, counts.counts)
    print(f"\n{int(fresh.sum()):,} training tokens recounted, {int((fresh > 0).sum()):,} ids seen, "
          f"{int((fresh < token_counts.RARE_BELOW).sum() - (fresh == 0).sum()):,} of them fewer than "
          f"{token_counts.RARE_BELOW} times; file {os.path.getsize(demo_dir() / token_counts.FILE):,} bytes")
    # the rows the demo trained are exactly the tokens seen 20 times or more (the script's min_count)
    assert set(np.flatnonzero(fresh < 20)) == set(untrained.rows(_demo_wte()))


def _demo_wte() -> np.ndarray:
    from puffergpt.model import checkpoints

    return checkpoints.load("demo").params["wte.weight"]


@pytest.fixture(scope="module")
def client(loaded, demo):
    store, key = loaded(demo)
    with TestClient(create_app(open_engine(store, demo.name, key))) as c:
        yield c


def test_rare_rows_are_marked_in_neighbours_and_analogy(client, counts):
    r = client.post("/api/neighbours", json={"word": " mole", "k": 5}).json()
    assert r["counts_known"] and r["rare_below"] == token_counts.RARE_BELOW == 100
    assert r["rare_inputs"] == [" mole"] and "' mole' was seen 48 times in training" in r["rare_note"]
    assert "barely moved from where it started" in r["rare_note"]
    for x in r["results"]:
        assert x["count"] == counts.counts[x["token_id"]] and x["rare"] == (x["count"] < 100)
    assert r["rare_results"] == sum(x["rare"] for x in r["results"]) >= 1
    a = client.post("/api/analogy", json={"a": " man", "b": " king", "c": " woman", "k": 10}).json()
    marked = [x for x in a["results"] if x["rare"]]
    assert marked and all(x["count"] < 100 for x in marked) and f"{len(marked)} of the 10 answers" in a["rare_note"]
    assert not any(x["rare"] for x in a["results"] if x["count"] >= 100)


def test_the_cli_analogy_marks_rare_answers_of_a_model_with_counts_beside_it(tmp_path):
    """Any checkpoint directory with a token_counts.npz gets its answers marked (a made model here,
    its counts made up: id % 200, so about half of the rows are rare)."""
    from puffergpt.cli import main
    from puffergpt.model.checkpoints import make_model

    ckpt = make_model(tmp_path / "tiny", "tiny", seed=0)
    made = np.arange(V) % 200
    token_counts.write(ckpt / token_counts.FILE, made, {"data": "made up for a test"})
    out = CliRunner().invoke(main, ["analogy", " man", " king", " woman", "--model", str(ckpt), "-k", "8",
                                    "--data", str(tmp_path / "data"), "--json"])
    assert out.exit_code == 0, out.output
    got = json.loads(out.stdout)
    assert got["counts_known"] and got["rare_below"] == 100
    assert [(x["count"], x["rare"]) for x in got["results"]] == [
        (x["token_id"] % 200, x["token_id"] % 200 < 100) for x in got["results"]]
    assert got["rare_results"] == sum(x["token_id"] % 200 < 100 for x in got["results"]) > 0
    text = CliRunner().invoke(main, ["analogy", " man", " king", " woman", "--model", str(ckpt), "-k", "8",
                                     "--data", str(tmp_path / "data")])
    assert "(rare)" in text.stdout and "note: " in text.stdout and "barely moved" in text.stdout


def test_the_card_score_equals_numpys_search(client):
    r = client.post("/api/analogy/card").json()
    wte = _demo_wte().astype(np.float64)
    bad = np.zeros(V, bool)
    bad[untrained.rows(_demo_wte())] = True
    unit = wte / np.linalg.norm(wte, axis=1, keepdims=True)
    right, tried = 0, 0
    for a, b, c, want in views.CARD_ANALOGIES:
        ids = [tokenizer.encode(w) for w in (a, b, c, want)]
        if any(len(x) != 1 or bad[x[0]] for x in ids):
            continue
        ids = [x[0] for x in ids]
        q = wte[ids[1]] - wte[ids[0]] + wte[ids[2]]
        cos = unit @ (q / np.linalg.norm(q))  # (V,)
        cos[ids[:3]] = cos[bad] = -2
        tried += 1
        right += int(np.argmax(cos)) == ids[3]
    print(f"\nthe card's analogies: {r['right']} of {r['tried']} right ({r['listed']} listed); "
          f"numpy: {right} of {tried}")
    assert (r["right"], r["tried"], r["listed"]) == (right, tried, len(views.CARD_ANALOGIES))
    assert len(r["results"]) == tried and sum(x["ok"] for x in r["results"]) == right


def test_the_maps_first_axis_correlation_equals_numpys(client, counts):
    words = [" king", " queen", " man", " woman", " Paris", " France", " London", " England"]
    m = client.post("/api/map", json={"words": words}).json()
    x = np.array([p["x"] for p in m["points"]])
    f = np.log1p([counts.counts[tokenizer.encode(w)[0]] for w in words])
    r = np.corrcoef(x, f)[0, 1]  # Pearson's r, numpy's
    assert abs(m["axis_frequency"]["pearson"] - r) <= 1e-6 and m["axis_frequency"]["is_frequency"]
    assert [p["count"] for p in m["points"]] == [int(counts.counts[tokenizer.encode(w)[0]]) for w in words]
    assert re.search(rf"r = \+{r:.2f} over these 8 words", m["axis_note"])


def test_a_model_without_counts_says_unknown(loaded, tiny):
    store, key = loaded(tiny)
    with TestClient(create_app(open_engine(store, tiny.name, key))) as c:
        r = c.post("/api/neighbours", json={"word": " man", "k": 3}).json()
        m = c.post("/api/map", json={"words": [" man", " woman", " king"]}).json()
    assert r["counts_known"] is False and r["rare_inputs"] is None and r["rare_results"] is None
    assert all(x["count"] is None and x["rare"] is None for x in r["results"])
    assert r["rare_note"] == token_counts.UNKNOWN and "unknown" in r["rare_note"]
    assert m["axis_frequency"] is None and m["axis_note"] == token_counts.UNKNOWN


def test_a_counts_file_of_another_version_names_the_command(tmp_path):
    path = tmp_path / token_counts.FILE
    token_counts.write(path, np.arange(10), {"data": "x"})
    with np.load(path) as z:
        parts = dict(z)
    parts["meta"] = np.array(json.dumps({**json.loads(str(parts["meta"])), "version": 99}))
    np.savez_compressed(path, **parts)
    with pytest.raises(token_counts.CountsError, match=re.escape(token_counts.REWRITE)):
        token_counts.read(path, V)
    back = token_counts.read(token_counts.write(tmp_path / "ok.npz", np.arange(10), {"data": "x"}), V)
    assert back.counts[:10].tolist() == list(range(10)) and back.of(50000) == 0
