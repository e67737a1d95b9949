"""The .h5ad source's read speed next to h5py's, on a Tahoe-like file written by anndata.

    .venv/bin/python bench/h5ad_read.py [--work DIR] [--cells N] [--threads 1,2] [--block ROWS]

Writes (once, kept in --work) two h5ad files with anndata from the same CSR matrix: cells with
about 1,450 nonzeros of 62,710 genes, float32 counts, int32 indices, ~1 GB of data + indices at
the default 86,000 cells; one uncompressed (anndata's default), one with compression="gzip"
(h5py's default level 4 and chunking). Then, for each file: h5py reading every row block
(indptr, then data and indices of the block's element range) in one thread, and
build/bench_h5ad_read (the zbatch source, the same blocks) with each thread count. Each figure is
the best of three rounds, after a warm-up read (the files are then in the page cache: this
measures decoding, not the disk). MB/s counts data + uint32 indices + int64 pointers, the same
bytes for both.
"""
import argparse
import json
import subprocess
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
N_GENES, NNZ_PER_CELL = 62_710, 1_450


def tahoe_like(cells, seed=0):
    """CSR of `cells` rows, each NNZ_PER_CELL distinct sorted genes (gaps uniform in [1, 85],
    redrawn for rows that would run past the last gene), counts mostly 1-3 as float32."""
    import scipy.sparse as sp
    rng = np.random.default_rng(seed)
    indices = np.empty((cells, NNZ_PER_CELL), np.int32)
    todo = np.arange(cells)
    while len(todo):
        cs = np.cumsum(rng.integers(1, 86, (len(todo), NNZ_PER_CELL), dtype=np.int32), axis=1) - 1
        ok = cs[:, -1] < N_GENES
        indices[todo[ok]] = cs[ok]
        todo = todo[~ok]
    data = rng.geometric(0.6, cells * NNZ_PER_CELL).astype(np.float32)
    indptr = np.arange(cells + 1, dtype=np.int64) * NNZ_PER_CELL
    return sp.csr_matrix((data, indices.ravel(), indptr.astype(np.int32)),
                         shape=(cells, N_GENES))


def make_files(work, cells):
    import anndata as ad
    import pandas as pd
    paths = {"uncompressed": work / f"tahoe_{cells}.h5ad",
             "gzip": work / f"tahoe_{cells}_gzip.h5ad"}
    if all(p.exists() for p in paths.values()):
        return paths
    X = tahoe_like(cells)
    a = ad.AnnData(X=X, obs=pd.DataFrame(index=[f"c{i}" for i in range(cells)]),
                   var=pd.DataFrame(index=[f"g{i}" for i in range(N_GENES)]))
    for name, p in paths.items():
        t = time.time()
        a.write_h5ad(p, compression="gzip" if name == "gzip" else None)
        print(f"wrote {p} ({p.stat().st_size / 1e9:.2f} GB) in {time.time() - t:.0f} s")
    return paths


def h5py_read(path, block):
    import h5py
    best, nbytes = None, 0
    for _ in range(3):
        t = time.perf_counter()
        nbytes = 0
        with h5py.File(path, "r") as f:
            g = f["X"]
            n = g["indptr"].shape[0] - 1
            for a in range(0, n, block):
                b = min(a + block, n)
                ptr = g["indptr"][a:b + 1].astype(np.int64)
                data, indices = g["data"][ptr[0]:ptr[-1]], g["indices"][ptr[0]:ptr[-1]]
                nbytes += data.nbytes + indices.size * 4 + ptr.size * 8
        dt = time.perf_counter() - t
        best = dt if best is None else min(best, dt)
    return {"seconds": round(best, 4), "MB_per_s": round(nbytes / best / 1e6, 1)}


def zbatch_read(path, threads, block):
    out = subprocess.run([str(REPO / "build" / "bench_h5ad_read"), str(path), "--threads",
                          str(threads), "--block", str(block), "--rounds", "3"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/zbatch-h5ad-bench"))
    ap.add_argument("--cells", type=int, default=86_000)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--block", type=int, default=4096)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    paths = make_files(args.work, args.cells)
    print(f"{'file':14} {'reader':18} {'seconds':>8} {'MB/s':>8}")
    for name, p in paths.items():
        zbatch_read(p, 1, args.block)  # warm the page cache
        r = h5py_read(p, args.block)
        print(f"{name:14} {'h5py (1 thread)':18} {r['seconds']:8.2f} {r['MB_per_s']:8.0f}")
        for t in map(int, args.threads.split(",")):
            r = zbatch_read(p, t, args.block)
            print(f"{name:14} {f'zbatch {t} thread(s)':18} {r['seconds']:8.2f} "
                  f"{r['MB_per_s']:8.0f}")


if __name__ == "__main__":
    main()
