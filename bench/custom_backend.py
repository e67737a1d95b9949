"""A custom read_many backend (HDF5 through h5py, one group per sample) behind zbatch's
DataLoader, against the same samples read natively from a zbatch atomic store: structures/s
through the size-aware sampler, in one run (docs/GUIDE.md, "Custom backends").

    PYTHONPATH=python .venv/bin/python bench/custom_backend.py [--n 20000] [--workers 4]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import h5py
import numpy as np

import zbatch


class H5Reader:
    def __init__(self, path):
        self.f = h5py.File(path, "r")
        self.keys = sorted(self.f)

    def __len__(self):
        return len(self.keys)

    def read_many(self, ids):
        return [{k: g[k][()] for k in g} for g in (self.f[self.keys[i]] for i in ids)]


def samples(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        a = int(rng.integers(8, 64))
        e = 6 * a
        yield {"positions": rng.normal(size=(a, 3)).astype(np.float32),
               "atomic_numbers": rng.integers(1, 90, a).astype(np.int64),
               "forces": rng.normal(size=(a, 3)).astype(np.float32),
               "energy": np.array([rng.normal()], dtype=np.float32),
               "cell": np.eye(3, dtype=np.float32), "pbc": np.array([True, True, True]),
               "neighbor_list": rng.integers(0, a, (e, 2)).astype(np.int64),
               "shifts": np.zeros((e, 3), dtype=np.float32)}


def rate(ds) -> float:
    loader = zbatch.DataLoader(ds, sampler="size_aware", max_atoms=4096, batch_size=4096,
                               prefetch_factor=16, seed=0)
    t, n = time.perf_counter(), 0
    for b in loader:
        n += len(b["index"])
    return n / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args()
    d = tempfile.mkdtemp()
    zpath, hpath = os.path.join(d, "s.zarr"), os.path.join(d, "s.h5")
    zbatch.AtomicWriter(zpath).write(samples(args.n))
    with h5py.File(hpath, "w") as f:
        for i, s in enumerate(samples(args.n)):
            g = f.create_group(f"s{i:07d}")
            for k, v in s.items():
                g[k] = v
    native = zbatch.open(zpath, num_threads=args.workers)
    h5 = zbatch.Dataset(H5Reader(hpath), num_workers=args.workers)

    def shift(sample: dict, metadata):
        sample["positions"] = sample["positions"] + 1.0
        return sample, metadata

    h5.segment_lengths("atoms")   # sizes counted once (a reader without get_metadata)
    shifted = zbatch.Dataset(native, transforms=[shift])
    for name, ds in (("native zarr", native), ("h5py backend", h5),
                     ("native + Python sample transform", shifted)):
        print(f"{name:34s} {rate(ds):10.0f} structures/s")


if __name__ == "__main__":
    main()
