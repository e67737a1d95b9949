"""The loader's window against the block sampler's (docs/SAMPLERS.md, "Match the loader's
window to the sampler's"): zbatch.DataLoader with the block sampler's defaults at a small batch,
once with the automatic window (prefetch_factor not given: enough batches to hold the
sampler's window) and once with 4 batches, alternating, two epochs per run.

    PYTHONPATH=python .venv/bin/python bench/loader_window.py STORE [--batch 256] [--rounds 3]
"""
from __future__ import annotations

import argparse
import time

import zbatch


def run(ds, batch: int, prefetch, seed: int) -> tuple[float, int, int]:
    dl = zbatch.DataLoader(ds, batch_size=batch, sampler="block", prefetch_factor=prefetch,
                           seed=seed)
    t, n, decoded = time.perf_counter(), 0, 0
    for epoch in range(2):
        dl.set_epoch(epoch)
        for b in dl:
            n += len(b["index"])
            decoded += b.stats["chunks_decoded"]
    dl.close()
    return n / (time.perf_counter() - t), decoded, dl.prefetch_factor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    ds = zbatch.open(args.store, num_threads=args.threads)
    rows = {None: [], 4: []}
    for r in range(args.rounds):
        for prefetch in (None, 4):
            rows[prefetch].append(run(ds, args.batch, prefetch, r))
    for prefetch, runs in rows.items():
        label = f"prefetch_factor={'auto' if prefetch is None else prefetch} ({runs[0][2]} batches)"
        print(f"{label:34} " + " · ".join(f"{c:,.0f}" for c, _, _ in runs)
              + f" cells/s; chunks decoded per run {runs[0][1]:,}")


if __name__ == "__main__":
    main()
