"""zarr-python 3.1 with the zarrs codec pipeline and a torch DataLoader, over the anndata Zarr
store (CSR ``X``).

Configuration: ``zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})`` as the
zarrs-python README (and annbatch's "Zarr Configuration" page) say for local stores;
``threading.max_workers`` sizes zarrs' Rust thread pool. The peer reads ``X/indptr`` once per
process, then row ranges of ``X/data`` and ``X/indices`` as slices (zarrs serves contiguous
slices natively; integer-array indexing falls back to zarr-python's own pipeline), all slices of
one batch gathered concurrently through zarr's async API.

Two access patterns, the DataLoader's items being whole batches (``batch_size=None``):
- ``pattern="random"``: ``BatchSampler(RandomSampler)`` ids, one slice per row;
- ``pattern="blocks"``: each batch is ``batch_size / block_size`` blocks of ``block_size``
  contiguous rows, block order a per-epoch permutation; one slice per block.

Cores: ``num_workers`` DataLoader worker processes (2), each with ``threading.max_workers =
zarrs_threads`` (1), or, with ``num_workers=0``, the main process with ``zarrs_threads`` threads.
The arrays are opened lazily in each process: a zarrs thread pool created before a fork leaves
the forked workers hanging.
"""
from __future__ import annotations

import asyncio
import os

import numpy as np

from . import csr_rows, measure, result


class ZarrsCSR:
    """The CSR arrays of an anndata Zarr store, opened per process with zarrs."""

    def __init__(self, path: str, zarrs_threads: int = 1):
        import json
        self.path = path
        self.zarrs_threads = zarrs_threads
        with open(os.path.join(path, "X", "zarr.json")) as f:
            self.shape = tuple(json.load(f)["attributes"]["shape"])
        self._pid = None

    def __getstate__(self):
        return {"path": self.path, "zarrs_threads": self.zarrs_threads, "shape": self.shape,
                "_pid": None}

    def __len__(self):
        return self.shape[0]

    def _open(self):
        if self._pid == os.getpid():
            return
        import zarr
        import zarr.api.asynchronous as za
        zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline",
                         "threading.max_workers": self.zarrs_threads})
        self._loop = asyncio.new_event_loop()

        async def open_all():
            g = await za.open_group(store=self.path, mode="r")
            x = await g.getitem("X")
            return (await x.getitem("data"), await x.getitem("indices"),
                    await x.getitem("indptr"))

        self._data, self._indices, indptr = self._loop.run_until_complete(open_all())
        self.indptr = np.asarray(self._loop.run_until_complete(indptr.getitem(slice(None))),
                                 dtype=np.int64)
        self._pid = os.getpid()

    def read_ranges(self, starts: np.ndarray, stops: np.ndarray):
        """CSR rows for the row ranges [starts[k], stops[k]), in that order."""
        self._open()
        ip = self.indptr
        lo, hi = ip[starts], ip[stops]

        async def gather():
            d = [self._data.getitem(slice(int(a), int(b))) for a, b in zip(lo, hi)]
            i = [self._indices.getitem(slice(int(a), int(b))) for a, b in zip(lo, hi)]
            return await asyncio.gather(asyncio.gather(*d), asyncio.gather(*i))

        dparts, iparts = self._loop.run_until_complete(gather())
        import scipy.sparse as sp
        lens = np.concatenate([np.diff(ip[a:b + 1]) for a, b in zip(starts, stops)])
        indptr = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(lens, out=indptr[1:])
        data = np.concatenate(dparts) if dparts else np.zeros(0, np.float32)
        indices = np.concatenate(iparts) if iparts else np.zeros(0, np.int32)
        return sp.csr_matrix((data, indices, indptr), shape=(len(lens), self.shape[1]))


class RandomRows:
    """Map-style dataset whose item is a batch: a list of row ids, one slice per row."""

    def __init__(self, csr: ZarrsCSR, dense: bool):
        self.csr, self.dense = csr, dense

    def __len__(self):
        return len(self.csr)

    def __getitem__(self, ids):
        ids = np.asarray(ids, dtype=np.int64)
        x = self.csr.read_ranges(ids, ids + 1)
        return x.toarray() if self.dense else x


class Blocks:
    """Map-style dataset whose item ``k`` is batch ``k`` of the epoch: ``blocks_per_batch``
    blocks of ``block_size`` contiguous rows, block order a permutation drawn per epoch."""

    def __init__(self, csr: ZarrsCSR, batch_size: int, block_size: int, seed: int, epoch: int,
                 dense: bool):
        self.csr, self.dense = csr, dense
        self.block_size = block_size
        self.per_batch = max(1, batch_size // block_size)
        nblocks = -(-len(csr) // block_size)
        self.order = np.random.default_rng([seed, epoch]).permutation(nblocks)

    def __len__(self):
        return -(-len(self.order) // self.per_batch)

    def __getitem__(self, k):
        blocks = self.order[k * self.per_batch:(k + 1) * self.per_batch]
        starts = blocks * self.block_size
        stops = np.minimum(starts + self.block_size, len(self.csr))
        x = self.csr.read_ranges(starts, stops)
        return x.toarray() if self.dense else x


def run(data: str, batch_size: int, seconds: float, num_workers: int = 2, output: str = "csr",
        seed: int = 0, pattern: str = "random", block_size: int = 16, zarrs_threads=None,
        **_ignored) -> dict:
    import torch
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler
    if zarrs_threads is None:
        zarrs_threads = 1 if num_workers else 2
    csr = ZarrsCSR(data, zarrs_threads)
    dense = output == "dense"
    gen = torch.Generator()
    gen.manual_seed(seed)

    def epoch(e):
        if pattern == "random":
            ds = RandomRows(csr, dense)
            sampler = BatchSampler(RandomSampler(range(len(csr)), generator=gen), batch_size,
                                   drop_last=False)
            return DataLoader(ds, batch_size=None, sampler=sampler, num_workers=num_workers)
        ds = Blocks(csr, batch_size, block_size, seed, e, dense)
        return DataLoader(ds, batch_size=None, shuffle=False, num_workers=num_workers)

    m = measure(epoch, seconds, csr_rows)
    config = {"tool": "zarr-python+zarrs", "store": data, "pattern": pattern,
              "codec_pipeline.path": "zarrs.ZarrsCodecPipeline",
              "threading.max_workers": zarrs_threads,
              "dataloader": {"batch_size": None, "num_workers": num_workers},
              "batch_size": batch_size, "seed": seed}
    setting = "random rows" if pattern == "random" else f"blocks bs={block_size}"
    if pattern != "random":
        config["block_size"] = block_size
    where = (f"{num_workers} workers" if num_workers
             else f"in-process, zarrs threads={zarrs_threads}")
    return result("zarrs", f"{setting} {output} [{where}]", m, config)


def read_ids(data: str, ids, output: str = "csr", **_ignored) -> dict:
    """The peer's row read (one slice per row, in the given order)."""
    x = RandomRows(ZarrsCSR(data, 2), output == "dense")[list(ids)]
    return {"ids": np.asarray(ids, dtype=np.int64), "X": x}
