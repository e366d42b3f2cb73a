"""What serve and generate spend checking the embedded store when they open it (issue 19).

    python benchmarks/verify_on_open.py --model demo --data /tmp/verify-demo
    puffergpt make-model /tmp/gpt2-shapes --preset gpt2     # GPT-2 small's shapes, random weights
    python benchmarks/verify_on_open.py --model /tmp/gpt2-shapes --data /tmp/verify-gpt2

Loads the model if the data directory lacks it, then times: the full check (every document
read back in a child process, as on a first start or after any file changed), the stamp
check of an unchanged store (every file of the weights hashed in full, as at every start),
and the same after a start that opened and closed the collections (zvec rewrites update
times in its index files at every close, which the digest leaves out; on Qdrant Edge, in the
fallback mode, ~30 files are rewritten with the same bytes)."""

from __future__ import annotations

import argparse
import time

from puffergpt.model import checkpoints
from puffergpt.search import load, manifest, verify
from puffergpt.search.manifest import open_engine
from puffergpt.stores import open_store


def timed(f) -> tuple[float, object]:
    t = time.perf_counter()
    out = f()
    return time.perf_counter() - t, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--data", required=True)
    a = ap.parse_args()
    key = manifest.model_key(a.model)
    store = open_store("embedded", a.data)
    try:
        load.load(store, checkpoints.load(a.model), key)
        m = manifest.read_manifest(store, key, a.model)
        full, _ = timed(lambda: verify.check_on_open(store, key, a.model, m, force=True))
        stamped, same = timed(lambda: verify.unchanged_since_verified(store, key, m))
        open_engine(store, a.model).open().session.close()  # a start: the shards opened and closed
        store.release(list(m["namespaces"]))
        after, same2 = timed(lambda: verify.unchanged_since_verified(store, key, m))
        files = store.stamp(list(m["namespaces"]))
    finally:
        store.close()
    print(
        f"{a.model}: {m['documents']:,} documents, {len(files)} files "
        f"({sum(v[0] for v in files.values()) / 1e6:,.0f} MB): "
        f"full check {full:.1f} s; stamp check {stamped * 1e3:.0f} ms (unchanged: {same}), "
        f"after a start {after * 1e3:.0f} ms (unchanged: {same2})"
    )


if __name__ == "__main__":
    main()
