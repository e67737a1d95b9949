"""CPU cost of reading narrow stores written with different codecs (issue 19).

    PYTHONPATH=$PWD/python .venv/bin/python bench/narrow_codecs.py STORE [STORE ...]
        [--mode block|random] [--rounds 5] [--batch 4096]

For each store (the same cells written with another codec, e.g. ``zbatch synth --kind cells
--n 30000 --seed 1 --codec C``): ``zbatch.open(STORE, num_threads=1, x_dtype="stored",
index_dtype="int32").read_many`` over batches of shuffled 512-row blocks covering the store
(``block``) or of 12 batches of 1,024 random cells (``random``), timed in process CPU time
(``time.process_time``), so neighbours on a shared machine slow the wall clock but barely this
figure. Stores alternate, the order reversed every other round; prints cells per CPU-second
(medians and every round) and each store's X/data and X/indices codecs.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

import zbatch


def batches(n: int, mode: str, batch: int, rng: np.random.Generator) -> list:
    if mode == "block":
        starts = rng.permutation(np.arange(0, n, 512))
        ids = np.concatenate([np.arange(s, min(s + 512, n)) for s in starts])
        return [np.sort(ids[i:i + batch]) for i in range(0, n, batch)]
    return [np.sort(rng.choice(n, min(1024, n), replace=False)) for _ in range(12)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stores", nargs="+")
    ap.add_argument("--mode", choices=("block", "random"), default="block")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4096)
    args = ap.parse_args(argv)
    ds = {s: zbatch.open(s, num_threads=1, x_dtype="stored", index_dtype="int32")
          for s in args.stores}
    n = min(len(d) for d in ds.values())
    plan = batches(n, args.mode, args.batch, np.random.default_rng(0))
    got = {s: [] for s in args.stores}
    for r in range(args.rounds):
        for s in (args.stores if r % 2 == 0 else args.stores[::-1]):
            cells = 0
            t0 = time.process_time()
            for b in plan:
                ds[s].read_many(b)
                cells += len(b)
            got[s].append(cells / (time.process_time() - t0))
    for s in args.stores:
        codecs = {nd["path"]: nd["codecs"].split("[")[-1].rstrip("]")
                  for nd in zbatch.info(s)["nodes"] if nd["path"] in ("X/data", "X/indices")}
        print(f"{args.mode} {s}: {statistics.median(got[s]):,.0f} cells per CPU-second "
              f"(rounds {' '.join(f'{v:,.0f}' for v in got[s])}); X/data {codecs.get('X/data')}, "
              f"X/indices {codecs.get('X/indices')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
