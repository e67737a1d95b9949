"""scDataset 0.3 (block shuffling + batched fetching) over backed AnnData or a Zarr CSR matrix.

Configuration, as scDataset's documentation recommends:
- ``BlockShuffling(block_size=16)`` with ``fetch_factor=16`` and the torch DataLoader's
  ``prefetch_factor = fetch_factor + 1``: the "Working with AnnData" example of the scDataset
  docs (examples page) and ``scdataset.experimental.suggest_parameters``, whose notes say
  "block_size = fetch_factor is optimal (recommended)" (``block_size_balanced``) and
  "prefetch_factor should be fetch_factor + 1";
- ``DataLoader(dataset, batch_size=None, num_workers=2)``: scDataset yields whole batches and
  splits its fetches between the DataLoader's worker processes (2 = this machine's cores);
- the fetch callback of that example, ``adata[indices].X`` on ``anndata.read_h5ad(path,
  backed="r")``; batches are CSR (``scipy.sparse.csr_matrix``), or dense through a
  ``batch_transform`` (``.toarray()`` per batch; the docs' example densifies the whole fetch in
  the callback, 16x the memory for the same values, so the per-batch form is the kinder one).

Over Zarr (scDataset accepts any indexable collection): ``anndata.io.sparse_dataset`` of the
store's ``X`` group, read by zarr-python with the zarrs codec pipeline, opened lazily in each
worker process (a zarrs thread pool does not survive fork).
"""
from __future__ import annotations

import os
import warnings

import numpy as np

from . import csr_rows, measure, result

BLOCK_SIZE = 16
FETCH_FACTOR = 16


def _is_zarr(path: str) -> bool:
    return os.path.isdir(path)


class LazyZarrCSR:
    """``anndata.io.sparse_dataset(zarr_group["X"])`` opened on first use in each process, with
    the zarrs codec pipeline; ``len`` and ``shape`` come from the metadata alone."""

    def __init__(self, path: str, zarrs_threads: int = 1):
        import json
        self.path = path
        self.zarrs_threads = zarrs_threads
        with open(os.path.join(path, "X", "zarr.json")) as f:
            self.shape = tuple(json.load(f)["attributes"]["shape"])
        self._pid = None
        self._x = None

    def _open(self):
        if self._pid != os.getpid():
            import anndata as ad
            import zarr
            zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline",
                             "threading.max_workers": self.zarrs_threads})
            self._x = ad.io.sparse_dataset(zarr.open_group(self.path, mode="r")["X"])
            self._pid = os.getpid()
        return self._x

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, idx):
        return self._open()[idx]

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_x"], d["_pid"] = None, None
        return d


def _fetch_anndata(adata, indices):
    return adata[indices].X


def _to_dense(x):
    return x.toarray()


def collection(data: str, zarrs_threads: int = 1):
    if _is_zarr(data):
        return LazyZarrCSR(data, zarrs_threads), None
    import anndata as ad
    return ad.read_h5ad(data, backed="r"), _fetch_anndata


def run(data: str, batch_size: int, seconds: float, num_workers: int = 2, output: str = "csr",
        seed: int = 0, block_size: int = BLOCK_SIZE, fetch_factor: int = FETCH_FACTOR,
        **_ignored) -> dict:
    import torch
    from scdataset import BlockShuffling, scDataset
    coll, fetch = collection(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = scDataset(coll, BlockShuffling(block_size=block_size), batch_size=batch_size,
                       fetch_factor=fetch_factor, fetch_callback=fetch,
                       batch_transform=_to_dense if output == "dense" else None, seed=seed)
    prefetch = fetch_factor + 1

    def epoch(e):
        return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=num_workers,
                                           prefetch_factor=prefetch if num_workers else None)

    m = measure(epoch, seconds, csr_rows)
    src = "zarr+zarrs" if _is_zarr(data) else "backed h5ad"
    config = {"tool": "scDataset", "source": src, "store": data, "strategy": "BlockShuffling",
              "block_size": block_size, "fetch_factor": fetch_factor,
              "dataloader": {"batch_size": None, "num_workers": num_workers,
                             "prefetch_factor": prefetch},
              "fetch_callback": "adata[indices].X" if fetch else "sparse_dataset[indices]",
              "batch_transform": "toarray" if output == "dense" else None,
              "batch_size": batch_size, "seed": seed}
    return result("scDataset", f"block bs={block_size} ff={fetch_factor} {output} [{src}]", m,
                  config)


def read_ids(data: str, ids, output: str = "csr", **_ignored) -> dict:
    """One scDataset fetch of ``ids`` (``Streaming(indices=ids)``, which sorts them as scDataset
    always does before fetching), in-process."""
    from scdataset import Streaming, scDataset
    coll, fetch = collection(data)
    ids = np.asarray(ids, dtype=np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = scDataset(coll, Streaming(indices=ids), batch_size=len(ids), fetch_factor=1,
                       fetch_callback=fetch,
                       batch_transform=_to_dense if output == "dense" else None, seed=0)
        (x,) = list(ds)
    return {"ids": np.sort(ids), "X": x}
