"""One chunk-aware window of an nvalchemi-layout store read a few times on one thread: a fixed
workload for instruction counts of the reader's delivery (valgrind --tool=callgrind).

Eight random blocks of ``--block`` consecutive structures (78: one ``neighbor_list`` chunk of
nvalchemi's default layout), shuffled, read ``--reads`` times with ``read_many``; with
``--cache-gib`` the first read fills the decoded-chunk cache and the others are served from it::

    valgrind --tool=callgrind --callgrind-out-file=cg.out .venv/bin/python \\
        bench/nvalchemi_window.py /tmp/zbatch-nvpipeline/atoms-20000-0-nvalchemi.zarr \\
        --cache-gib 3 --reads 3 [--python OTHER_BUILD/python]
    callgrind_annotate cg.out | grep -E "zip|copy_box|shift_span"
"""
from __future__ import annotations

import argparse
import sys
import warnings


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("store")
    ap.add_argument("--cache-gib", type=float, default=0.0)
    ap.add_argument("--reads", type=int, default=3)
    ap.add_argument("--block", type=int, default=78, help="structures per block")
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--python", default=None, help="import zbatch from this directory")
    args = ap.parse_args(argv)
    if args.python:
        sys.path.insert(0, args.python)
    warnings.simplefilter("ignore")
    import numpy as np
    import zbatch

    ds = zbatch.open(args.store, num_threads=1, cache_bytes=int(args.cache_gib * 2**30))
    rng = np.random.default_rng(args.seed)
    blocks = rng.choice(len(ds) // args.block, args.blocks, replace=False)
    ids = np.concatenate([np.arange(b * args.block, (b + 1) * args.block) for b in blocks])
    rng.shuffle(ids)
    for _ in range(args.reads):
        stats = ds.read_many(ids.tolist()).stats
    print(f"{len(ids)} structures, last read: {stats}")


if __name__ == "__main__":
    main()
