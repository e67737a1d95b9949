"""zbatch.convert_lmdb on a fairchem-style LMDB of PyG Data objects, next to reading the LMDB
alone and next to the user code it replaces (a loop unpickling each entry into a dict for
zbatch.AtomicWriter).

    PYTHONPATH=python .venv/bin/python bench/convert_lmdb.py [--n 5000] [--atoms 72]
        [--edges 2400] [--num-threads 2] [--work DIR] [--keep]

Data (made here): --n entries as OCP's AtomsToGraphs writes them (torch tensors in a PyG 2
``Data``: pos, float atomic_numbers, cell [1, 3, 3], natoms, edge_index [2, E], cell_offsets
[E, 3], distances, y, force, tags, fixed, sid), --atoms atoms and --edges edges each, about
the sizes of OC20 S2EF entries, with a ``length`` key.

Figures (one JSON line each), entries per wall-clock second and per CPU second:
- read: every value fetched and unpickled (the floor of any converter);
- convert: zbatch.convert_lmdb end to end (store written and committed);
- user_loop: the eight-line loop through AtomicWriter (the fields renamed by hand).
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import lmdb  # noqa: E402
import torch  # noqa: E402
from torch_geometric.data import Data  # noqa: E402

import zbatch  # noqa: E402


def make(path: str, n: int, atoms: int, edges: int) -> None:
    rng = np.random.default_rng(0)
    env = lmdb.open(path, subdir=False, map_size=1 << 36, lock=False)
    txn = env.begin(write=True)
    for k in range(n):
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
        d = Data(pos=t(rng.random((atoms, 3), dtype=np.float32) * 12),
                 atomic_numbers=t(rng.integers(1, 80, atoms).astype(np.float32)),
                 cell=t((np.eye(3, dtype=np.float32) * 12)[None]), natoms=atoms,
                 edge_index=t(rng.integers(0, atoms, (2, edges))),
                 cell_offsets=t(rng.integers(-1, 2, (edges, 3)).astype(np.float32)),
                 distances=t(rng.random(edges, dtype=np.float32) * 6), y=float(k),
                 force=t(rng.random((atoms, 3), dtype=np.float32)),
                 tags=t(rng.integers(0, 3, atoms)), fixed=t(np.zeros(atoms, np.float32)),
                 sid=k)
        txn.put(str(k).encode("ascii"), pickle.dumps(d, protocol=pickle.HIGHEST_PROTOCOL))
        if k % 1000 == 999:
            txn.commit()
            txn = env.begin(write=True)
    txn.put(b"length", pickle.dumps(n))
    txn.commit()
    env.close()


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def read_all(path: str, n: int) -> None:
    env = lmdb.open(path, subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        for k in range(n):
            pickle.loads(txn.get(str(k).encode("ascii")))
    env.close()


def user_loop(path: str, n: int, out: str) -> None:
    env = lmdb.open(path, subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        def samples():
            for k in range(n):
                d = pickle.loads(txn.get(str(k).encode("ascii")))
                yield {"positions": d.pos, "atomic_numbers": d.atomic_numbers.long(),
                       "cell": d.cell[0], "forces": d.force, "energy": np.float64(d.y),
                       "neighbor_list": d.edge_index.flip(0).T, "neighbor_list_shifts":
                       d.cell_offsets.long(), "shifts": d.cell_offsets @ d.cell[0],
                       "tags": d.tags, "fixed": d.fixed}
        zbatch.AtomicWriter(out, levels={"tags": "atom", "fixed": "atom"}).write(samples())
    env.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--atoms", type=int, default=72)
    ap.add_argument("--edges", type=int, default=2400)
    ap.add_argument("--num-threads", type=int, default=2)
    ap.add_argument("--work")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="zbatch-lmdb-")
    os.makedirs(work, exist_ok=True)
    src = os.path.join(work, "data.lmdb")
    try:
        if not os.path.exists(src):
            make(src, a.n, a.atoms, a.edges)
        size = os.path.getsize(src)
        for name, fn in (
                ("read", lambda: read_all(src, a.n)),
                ("convert", lambda: zbatch.convert_lmdb(src, os.path.join(work, "c.zarr"),
                                                        num_threads=a.num_threads)),
                ("user_loop", lambda: user_loop(src, a.n, os.path.join(work, "u.zarr")))):
            for p in ("c.zarr", "u.zarr"):
                shutil.rmtree(os.path.join(work, p), ignore_errors=True)
            wall, cpu = timed(fn)
            print(json.dumps({"figure": name, "entries": a.n, "atoms": a.atoms,
                              "edges": a.edges, "lmdb_mb": round(size / 2**20, 1),
                              "wall_s": round(wall, 2), "per_s": round(a.n / wall),
                              "per_cpu_s": round(a.n / cpu)}), flush=True)
    finally:
        if not a.keep and not a.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
