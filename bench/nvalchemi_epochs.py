"""Whole epochs of zbatch's nvalchemi pipeline on one store: structures/s per epoch.

The pipeline of ``bench/nvalchemi_pipeline.py`` (``SizeAwareSampler(ds, max_atoms=4096,
max_batch_size=64)``, ``DataLoader(prefetch_factor=16, output="nvalchemi")``), zbatch only,
timed per whole epoch; with ``--cache-gib`` one untimed epoch first fills the decoded-chunk
cache. For old/new comparisons run two builds alternately (``--python DIR`` picks the
package)::

    PYTHONPATH=python .venv/bin/python bench/nvalchemi_epochs.py \\
        /tmp/zbatch-nvpipeline/atoms-20000-0-nvalchemi.zarr --cache-gib 3 --epochs 2
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("store")
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs")
    ap.add_argument("--cache-gib", type=float, default=0.0,
                    help="decoded-chunk cache (GiB); a warm-up epoch fills it first")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefetch", type=int, default=16,
                    help="prefetch_factor (0: the loader's default)")
    ap.add_argument("--block-size", type=int, default=0,
                    help="chunk-aware size-aware packing in blocks of K structures")
    ap.add_argument("--window-size", type=int, default=8192)
    ap.add_argument("--python", default=None, help="import zbatch from this directory")
    args = ap.parse_args(argv)
    if args.python:
        sys.path.insert(0, args.python)
    warnings.simplefilter("ignore")
    import zbatch

    ds = zbatch.open(args.store, num_threads=args.threads,
                     cache_bytes=int(args.cache_gib * 2**30))
    sampler = zbatch.samplers.SizeAwareSampler(ds, max_atoms=4096, max_batch_size=64,
                                               block_size=args.block_size or None,
                                               window_size=args.window_size)
    loader = zbatch.DataLoader(ds, sampler=sampler, prefetch_factor=args.prefetch or None,
                               output="nvalchemi")

    def epoch(label: str) -> None:
        n, t = 0, time.perf_counter()
        for b in loader:
            n += b.num_graphs
        dt = time.perf_counter() - t
        print(f"{label}: {n} structures in {dt:.2f} s = {n / dt:,.0f} structures/s",
              flush=True)

    if args.cache_gib:
        epoch("warm-up epoch")
    for e in range(args.epochs):
        epoch(f"epoch {e + 1}")


if __name__ == "__main__":
    main()
