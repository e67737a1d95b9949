"""`make demo`: the main job on a generated dataset.

For now (the read engine milestone) it writes a small AnnData store with anndata itself (sparse
CSR counts, categorical obs columns), reads it back through zbatch, checks the values against
anndata, and prints `zbatch info` of it. Later milestones make this the loader benchmark.
"""
import os
import subprocess
import sys
import time

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp

import zbatch

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
out = os.path.join(root, "build", "demo", "cells.zarr")
n_obs, n_vars = 20_000, 2_000
rng = np.random.default_rng(0)

print(f"demo: synthesising {n_obs} cells x {n_vars} genes (anndata {ad.__version__}) ...",
      flush=True)
nnz_per_cell = rng.lognormal(mean=np.log(150), sigma=0.5, size=n_obs).astype(int).clip(1, n_vars)
indptr = np.concatenate([[0], np.cumsum(nnz_per_cell)]).astype(np.int64)
indices = np.concatenate([np.sort(rng.choice(n_vars, k, replace=False)) for k in nnz_per_cell])
data = rng.poisson(2.0, size=indptr[-1]).astype(np.float32) + 1
X = sp.csr_matrix((data, indices.astype(np.int32), indptr), shape=(n_obs, n_vars))
obs = pd.DataFrame(
    {
        "cell_line": pd.Categorical(rng.choice([f"CL{i}" for i in range(50)], n_obs)),
        "drug": pd.Categorical(rng.choice([f"drug{i}" for i in range(380)], n_obs)),
        "n_genes": nnz_per_cell.astype(np.int32),
    },
    index=[f"cell{i}" for i in range(n_obs)],
)
var = pd.DataFrame(index=[f"gene{i}" for i in range(n_vars)])
adata = ad.AnnData(X=X, obs=obs, var=var)
if os.path.exists(out):
    import shutil
    shutil.rmtree(out)
os.makedirs(os.path.dirname(out), exist_ok=True)
with ad.settings.override(zarr_write_format=3):
    adata.write_zarr(out)

print("demo: reading X and obs back through zbatch ...", flush=True)
t0 = time.perf_counter()
got_data = zbatch.read_array(out, "X/data")
got_indices = zbatch.read_array(out, "X/indices")
got_indptr = zbatch.read_array(out, "X/indptr")
codes = zbatch.read_array(out, "obs/cell_line/codes")
cats = zbatch.read_array(out, "obs/cell_line/categories")
dt = time.perf_counter() - t0
ok = (np.array_equal(got_data, X.data) and np.array_equal(got_indices, X.indices)
      and np.array_equal(got_indptr, X.indptr)
      and list(cats[codes]) == list(obs["cell_line"].astype(str)))
mb = (got_data.nbytes + got_indices.nbytes + got_indptr.nbytes) / 1e6
print(f"demo: read {mb:.1f} MB of X in {dt * 1e3:.1f} ms "
      f"({'equal to anndata' if ok else 'MISMATCH with anndata'})\n", flush=True)

cli = os.path.join(root, "build", "zbatch")
subprocess.run([cli, "info", out], check=True)
sys.exit(0 if ok else 1)
