"""zbatch.anndata.Loader (annbatch's API) side by side with zbatch's own DataLoader on the same
store, in one run (docs/ANNDATA.md, "Porting from annbatch").

    PYTHONPATH=python .venv/bin/python bench/anndata_facade.py [--cells 200000] [--genes 2000]

Writes a sparse AnnData store (float32 counts, ~3% dense) unless --store is given, then reads
one epoch with each loader at the same chunk_size / preload_nchunks / batch_size (facade:
shuffle=True; DataLoader: sampler="block", block_size=chunk_size,
blocks_per_window=preload_nchunks), twice each alternating, and prints cells/s.
"""
from __future__ import annotations

import argparse
import os
import time
import warnings

import numpy as np


def make_store(path: str, n: int, g: int) -> None:
    import anndata as ad
    import pandas as pd
    import scipy.sparse as sp
    rng = np.random.default_rng(0)
    X = sp.random(n, g, density=0.03, format="csr", dtype=np.float32, random_state=rng)
    X.data[:] = rng.integers(1, 50, X.nnz)
    obs = pd.DataFrame({"cell_type": pd.Categorical(rng.choice(["T", "B", "NK", "mono"], n)),
                        "score": rng.standard_normal(n).astype(np.float32)},
                       index=[f"c{i}" for i in range(n)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ad.AnnData(X=X, obs=obs, var=pd.DataFrame(index=[f"g{j}" for j in range(g)])
                   ).write_zarr(path)


def run_facade(path, a):
    from zbatch.anndata import Loader
    loader = Loader(chunk_size=a.chunk_size, preload_nchunks=a.preload_nchunks,
                    batch_size=a.batch_size, shuffle=True, rng=np.random.default_rng(0))
    loader.add_adata(path, obs_keys=["cell_type"])
    t, n = time.perf_counter(), 0
    for b in loader:
        n += b["X"].shape[0]
        b["obs"]
    return n, time.perf_counter() - t


def run_dataloader(path, a):
    import zbatch
    ds = zbatch.open(path, num_threads=os.cpu_count())
    loader = zbatch.DataLoader(ds, batch_size=a.batch_size, sampler="block",
                               block_size=a.chunk_size, blocks_per_window=a.preload_nchunks,
                               prefetch_factor=a.chunk_size * a.preload_nchunks // a.batch_size,
                               output="scipy", seed=0)
    t, n = time.perf_counter(), 0
    for b in loader:
        n += b["X"].shape[0]
        b["obs/cell_type"]
    return n, time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--store", default="/tmp/zbatch_facade_bench.zarr")
    p.add_argument("--cells", type=int, default=200_000)
    p.add_argument("--genes", type=int, default=2000)
    p.add_argument("--chunk-size", type=int, default=64)
    p.add_argument("--preload-nchunks", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=256)
    a = p.parse_args()
    if not os.path.exists(a.store):
        make_store(a.store, a.cells, a.genes)
    print(f"store {a.store}; chunk_size={a.chunk_size} preload_nchunks={a.preload_nchunks} "
          f"batch_size={a.batch_size}; {os.cpu_count()} CPUs")
    for rep in range(2):
        for name, fn in (("zbatch.anndata.Loader", run_facade),
                         ("zbatch.DataLoader(block)", run_dataloader)):
            n, s = fn(a.store, a)
            print(f"  {name:26s} pass {rep}: {n} cells in {s:.2f} s = {n / s:,.0f} cells/s")


if __name__ == "__main__":
    main()
