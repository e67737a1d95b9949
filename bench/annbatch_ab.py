"""annbatch's Loader and zbatch's DataLoader on two or more stores of the same cells (e.g. the
same synth cells written with two codecs), alternating store and loader within each round, so a
shared machine's load weighs on every store alike (issue 19).

    PYTHONPATH=$PWD/python .venv/bin/python bench/annbatch_ab.py STORE STORE [...]
        [--setting 512,32 --setting 1024,16] [--seconds 6] [--rounds 3] [--batch-size 4096]

Each annbatch run is ``bench/annbatch_loader.py``'s ``annbatch_run`` (its Loader at
``(chunk_size, preload_nchunks)``, two zarrs threads, scipy CSR), each zbatch run its
``zbatch_csr`` in annbatch's dtypes (uint8 values as stored, int32 gene ids; scipy CSR built
for every batch). Rounds reverse the store and loader order every other time. Prints every run
and the medians, with zbatch over annbatch per store and setting.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.annbatch_loader import annbatch_dtypes, annbatch_run, zbatch_csr  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stores", nargs="+")
    ap.add_argument("--setting", action="append", default=None,
                    help="annbatch's chunk_size,preload_nchunks (repeatable; 512,32 and 1024,16)")
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=4096)
    args = ap.parse_args(argv)
    settings = [tuple(int(v) for v in s.split(",")) for s in (args.setting or ["512,32",
                                                                               "1024,16"])]
    B = args.batch_size
    got: dict = {}
    for rnd in range(args.rounds):
        stores = args.stores if rnd % 2 == 0 else args.stores[::-1]
        loaders = ("annbatch", "zbatch") if rnd % 2 == 0 else ("zbatch", "annbatch")
        for cs, pn in settings:
            for s in stores:
                for who in loaders:
                    if who == "annbatch":
                        r = annbatch_run(s, B, args.seconds, cs, pn)
                    else:
                        r = zbatch_csr(s, B, args.seconds, cs, pn, dtypes=annbatch_dtypes(s))
                    got.setdefault((cs, pn, s, who), []).append(r["samples_per_s"])
                    print(f"round {rnd + 1} ({cs}, {pn}) {who:8s} {s}: "
                          f"{r['samples_per_s']:,.0f} cells/s (load {os.getloadavg()[0]:.1f})",
                          flush=True)
    print("\nmedians")
    for cs, pn in settings:
        for s in args.stores:
            a = statistics.median(got[(cs, pn, s, "annbatch")])
            z = statistics.median(got[(cs, pn, s, "zbatch")])
            print(f"({cs}, {pn}) {s}: annbatch {a:,.0f}, zbatch {z:,.0f} cells/s ({z / a:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
