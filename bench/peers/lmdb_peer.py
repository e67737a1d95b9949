"""An LMDB of pickled samples with a torch DataLoader: the fairchem / OC20 style.

One key per sample (its index as ASCII), the value a pickled dict of numpy arrays (positions,
atomic_numbers, forces, energy, neighbor_list local to the sample, shifts, cell, pbc), plus a
``length`` key. The dataset opens the environment lazily in each process with fairchem's
``LmdbDataset`` options (``subdir=False, readonly=True, lock=False, readahead=False,
meminit=False, max_readers=1``); ``__getitem__`` unpickles one sample; a ``collate_fn``
concatenates samples the way nvalchemi's Batch and zbatch do (neighbour lists offset by the
running atom count) into torch tensors.

Cores: ``DataLoader(ds, batch_size=B, shuffle=True, num_workers=2, collate_fn=collate)``, 2
worker processes, PyTorch's default ``prefetch_factor`` (2).
"""
from __future__ import annotations

import os
import pickle

import numpy as np

from . import atoms_samples, concat_graphs, measure, result


def write_lmdb(src: str, dst: str, map_size: int = 64 << 30) -> int:
    """Writes the structures of the zbatch atomic store ``src`` into the LMDB file ``dst``
    (``map_size`` only reserves address space; the file grows with the data)."""
    import lmdb
    n = 0
    env = lmdb.open(dst, subdir=False, map_size=map_size, meminit=False)
    try:
        txn = env.begin(write=True)
        for s in atoms_samples(src):
            txn.put(f"{n}".encode("ascii"), pickle.dumps(s, protocol=pickle.HIGHEST_PROTOCOL))
            n += 1
            if n % 1000 == 0:
                txn.commit()
                txn = env.begin(write=True)
        txn.put(b"length", pickle.dumps(n, protocol=pickle.HIGHEST_PROTOCOL))
        txn.commit()
    finally:
        env.close()
    return n


class LmdbDataset:
    """Map-style dataset over the LMDB, opened per process (fairchem's options)."""

    def __init__(self, path: str):
        self.path = path
        env = self._env_open()
        with env.begin() as txn:
            self.n = pickle.loads(txn.get(b"length"))
        env.close()
        self._env, self._pid = None, None

    def _env_open(self):
        import lmdb
        return lmdb.open(self.path, subdir=False, readonly=True, lock=False, readahead=False,
                         meminit=False, max_readers=1)

    def __getstate__(self):
        return {"path": self.path, "n": self.n, "_env": None, "_pid": None}

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self._pid != os.getpid():
            self._env, self._pid = self._env_open(), os.getpid()
        with self._env.begin(write=False) as txn:
            return pickle.loads(txn.get(f"{int(i)}".encode("ascii")))


def collate(samples):
    import torch
    return {k: torch.from_numpy(v) for k, v in concat_graphs(samples).items()}


def run(data: str, batch_size: int, seconds: float, num_workers: int = 2, output: str = "graph",
        seed: int = 0, **_ignored) -> dict:
    import torch
    from torch.utils.data import DataLoader
    ds = LmdbDataset(data)
    gen = torch.Generator()
    gen.manual_seed(seed)

    def epoch(_e):
        return DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=num_workers,
                          collate_fn=collate, generator=gen)

    m = measure(epoch, seconds, lambda b: len(b["atoms_ptr"]) - 1)
    config = {"tool": "lmdb + torch DataLoader", "store": data,
              "layout": "one pickled dict per key",
              "lmdb_open": {"subdir": False, "readonly": True, "lock": False,
                            "readahead": False, "meminit": False, "max_readers": 1},
              "dataloader": {"batch_size": batch_size, "shuffle": True,
                             "num_workers": num_workers, "prefetch_factor": 2},
              "seed": seed}
    return result("LMDB", "shuffled atoms [pickled samples]", m, config)


def read_ids(data: str, ids, output: str = "graph", **_ignored) -> dict:
    """The samples ``ids`` through the dataset and its collate_fn, as numpy arrays."""
    ds = LmdbDataset(data)
    out = concat_graphs([ds[int(i)] for i in ids])
    out["ids"] = np.asarray(ids, dtype=np.int64)
    return out


def samples(data: str, ids) -> list[dict]:
    """The raw per-sample dicts stored under ``ids``."""
    ds = LmdbDataset(data)
    return [ds[int(i)] for i in ids]
