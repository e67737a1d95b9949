"""anndata 0.12's ``AnnLoader`` (an ``AnnCollection`` over the AnnData) on backed h5ad,
shuffled.

Configuration, as anndata's tutorial "Interfacing pytorch models with anndata" does:
``AnnLoader(adata, batch_size=B, shuffle=True)`` with ``adata = anndata.read_h5ad(path,
backed="r")``. Output dense is AnnLoader's default converter (X to a dense torch tensor);
output CSR is ``use_default_converter=False`` (X stays a ``scipy.sparse.csr_matrix``).

Cores: one. AnnLoader reads each batch with one indexing call (its ``BatchIndexSampler``) only
without DataLoader workers; with ``num_workers > 0`` it falls back to PyTorch's per-sample
indexing and collation, so the tutorial's single-process form is the recommended one. anndata
marks AnnLoader deprecated since 0.12.17 in favour of annbatch (Python >= 3.12, not runnable
here).
"""
from __future__ import annotations

import warnings

import numpy as np

from . import measure, result


def _loader(data: str, batch_size: int, output: str, num_workers: int = 0):
    import anndata as ad
    from anndata.experimental import AnnLoader
    adata = ad.read_h5ad(data, backed="r")
    kw = {"num_workers": num_workers} if num_workers else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AnnLoader(adata, batch_size=batch_size, shuffle=True,
                         use_default_converter=output == "dense", **kw)


def run(data: str, batch_size: int, seconds: float, num_workers: int = 0, output: str = "csr",
        seed: int = 0, **_ignored) -> dict:
    import torch
    np.random.seed(seed)  # AnnLoader's BatchIndexSampler shuffles with np.random
    torch.manual_seed(seed)
    # num_workers is accepted for the common signature; AnnLoader runs single-process (above)
    dl = _loader(data, batch_size, output)

    def epoch(_e):
        return dl

    m = measure(epoch, seconds, lambda b: b.X.shape[0])
    config = {"tool": "anndata.experimental.AnnLoader", "source": "backed h5ad", "store": data,
              "shuffle": True, "use_default_converter": output == "dense",
              "num_workers": 0, "batch_size": batch_size, "seed": seed}
    return result("AnnLoader", f"shuffled {output} [backed h5ad]", m, config)


def read_ids(data: str, ids, output: str = "csr", **_ignored) -> dict:
    """AnnLoader's own read of one batch: its AnnCollection indexed by the id list."""
    dl = _loader(data, len(ids), output)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x = dl.dataset[np.asarray(ids, dtype=np.int64)].X
    if hasattr(x, "numpy"):
        x = x.numpy()
    return {"ids": np.asarray(ids, dtype=np.int64), "X": x}
