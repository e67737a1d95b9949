"""zbatch.convert_ase and zbatch.neighbor_list against ASE, on bulk structures of ~64 atoms.

    PYTHONPATH=python .venv/bin/python bench/convert_ase.py [--n 10000] [--cutoff 5]
        [--format extxyz] [--num-threads 2] [--ase-sample 300] [--work DIR] [--keep]

Data (made here): --n periodic bulk structures of 64 atoms — fcc Cu (cubic cell x 2x2x4),
bcc Fe (x 4x4x2), diamond Si (x 2x2x1), primitive fcc Al (x 4x4x4, a triclinic cell) — each
strained by up to ±3 %, rattled by 0.05 Å, with energy, forces and stress on a
SinglePointCalculator, written by ASE to one file of --format.

Figures (one JSON line each), per wall-clock second and per CPU second of this process (the
two differ when other work shares the cores):
- read: ase.io.iread over the file alone, structures/s (the floor of any ASE-based converter);
- convert: zbatch.convert_ase(file, store, cutoff), structures/s, end to end (read, neighbour
  lists, store written and committed);
- neighbours: zbatch.neighbor_list and ase.neighborlist.neighbor_list("ijS") on the same
  in-memory structures (ASE on the first --ase-sample of them), structures/s and pairs/s, and
  a check that both give the same set of (i, j, S).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import ase.io  # noqa: E402
from ase.build import bulk  # noqa: E402
from ase.calculators.singlepoint import SinglePointCalculator  # noqa: E402
from ase.neighborlist import neighbor_list as ase_neighbor_list  # noqa: E402

import zbatch  # noqa: E402

RECIPES = [("Cu", {"cubic": True}, (2, 2, 4)), ("Fe", {"cubic": True}, (4, 4, 2)),
           ("Si", {"cubic": True}, (2, 2, 1)), ("Al", {}, (4, 4, 4))]


def structures(n, seed=0):
    rng = np.random.default_rng(seed)
    bases = [bulk(sym, **kw).repeat(rep) for sym, kw, rep in RECIPES]
    for k in range(n):
        a = bases[k % len(bases)].copy()
        a.arrays.pop("initial_magmoms", None)  # bulk("Fe") has them: every structure the same
        a.set_cell(a.cell.array @ (np.eye(3) + rng.uniform(-0.03, 0.03, (3, 3))),
                   scale_atoms=True)
        a.positions += rng.normal(scale=0.05, size=a.positions.shape)
        a.calc = SinglePointCalculator(a, energy=float(rng.normal()),
                                       forces=rng.normal(size=(len(a), 3)),
                                       stress=rng.normal(size=6) * 1e-3)
        yield a


def rate(n, seconds):
    return n / seconds if seconds > 0 else float("inf")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--cutoff", type=float, default=5.0)
    ap.add_argument("--format", default="extxyz", choices=["extxyz", "traj", "db"])
    ap.add_argument("--ase-sample", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--num-threads", type=int, default=2)
    ap.add_argument("--work", default=None)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="zbatch-convert-ase-")
    os.makedirs(work, exist_ok=True)
    src = os.path.join(work, f"bulk.{args.format}")
    store = os.path.join(work, "bulk.zarr")
    records = []

    def emit(**rec):
        records.append(rec)
        print(json.dumps(rec), flush=True)

    try:
        t = time.perf_counter()
        if not os.path.exists(src):
            ase.io.write(src, list(structures(args.n)), format=args.format)
        emit(step="write source", seconds=round(time.perf_counter() - t, 2), n=args.n,
             bytes=os.path.getsize(src))

        t, c = time.perf_counter(), time.process_time()
        mem = list(ase.io.iread(src))
        dt, dc = time.perf_counter() - t, time.process_time() - c
        emit(step="read", structures_per_s=round(rate(len(mem), dt), 1),
             structures_per_cpu_s=round(rate(len(mem), dc), 1), seconds=round(dt, 2))

        shutil.rmtree(store, ignore_errors=True)
        t, c = time.perf_counter(), time.process_time()
        n = zbatch.convert_ase(src, store, cutoff=args.cutoff, batch_size=args.batch_size,
                               num_threads=args.num_threads)
        dt, dc = time.perf_counter() - t, time.process_time() - c
        edges = int(zbatch.read_array(store, "meta/edges_ptr")[-1])
        emit(step="convert", num_threads=args.num_threads, structures_per_s=round(rate(n, dt), 1),
             structures_per_cpu_s=round(rate(n, dc), 1), seconds=round(dt, 2),
             edges=edges, store_bytes=sum(os.path.getsize(os.path.join(d, f))
                                          for d, _, fs in os.walk(store) for f in fs))

        t, c = time.perf_counter(), time.process_time()
        pairs = 0
        for a in mem:
            i, _, _ = zbatch.neighbor_list(a.positions, a.cell, a.pbc, args.cutoff)
            pairs += len(i)
        dt, dc = time.perf_counter() - t, time.process_time() - c
        emit(step="neighbours zbatch", structures_per_s=round(rate(len(mem), dt), 1),
             structures_per_cpu_s=round(rate(len(mem), dc), 1),
             pairs_per_s=round(rate(pairs, dt)), us_per_structure=round(dt / len(mem) * 1e6, 1),
             pairs_per_structure=round(pairs / len(mem), 1))

        sample = mem[:args.ase_sample]
        t, c = time.perf_counter(), time.process_time()
        ase_pairs = 0
        for a in sample:
            ase_pairs += len(ase_neighbor_list("ijS", a, args.cutoff)[0])
        dt_ase, dc_ase = time.perf_counter() - t, time.process_time() - c
        t, c = time.perf_counter(), time.process_time()
        for a in sample:
            zbatch.neighbor_list(a.positions, a.cell, a.pbc, args.cutoff)
        dt_zb, dc_zb = time.perf_counter() - t, time.process_time() - c
        same = all(
            set(zip(*[x.tolist() if x.ndim == 1 else list(map(tuple, x.tolist()))
                      for x in zbatch.neighbor_list(a.positions, a.cell, a.pbc, args.cutoff)]))
            == set(zip(*[x.tolist() if x.ndim == 1 else list(map(tuple, x.tolist()))
                         for x in ase_neighbor_list("ijS", a, args.cutoff)]))
            for a in sample[:50])
        emit(step="neighbours ase", n=len(sample),
             structures_per_s=round(rate(len(sample), dt_ase), 1),
             structures_per_cpu_s=round(rate(len(sample), dc_ase), 1),
             pairs_per_s=round(rate(ase_pairs, dt_ase)),
             us_per_structure=round(dt_ase / len(sample) * 1e6, 1),
             zbatch_same_structures_per_s=round(rate(len(sample), dt_zb), 1),
             speedup_wall=round(dt_ase / dt_zb, 1), speedup_cpu=round(dc_ase / dc_zb, 1),
             same_pairs_first_50=same)
    finally:
        if not args.keep and not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
