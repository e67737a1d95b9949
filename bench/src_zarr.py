"""Decoded MB/s reading every row of X of an anndata Zarr store: zbatch's conversion source
(bench_src_zarr, src/convert/src_zarr.c) next to zarr-python, in one run, 1 and 2 threads.

    .venv/bin/python bench/src_zarr.py STORE [--cells N] [--threads 1,2] [--block ROWS]
                                       [--rounds R] [--format v2|v3]

STORE is made with ``zbatch synth --kind cells --n N`` (Tahoe-like CSR; about 11.7 KB of
decoded data + indices per cell, so ~86,000 cells make ~1 GB) when it does not exist yet.

Both readers do the same work: rows in blocks of ROWS (default 1024), each block reading its
pointers and then only the element range of data and indices they name; ``--threads`` blocks at
a time (zbatch: threads sharing one source; zarr-python: a thread pool over blocks, with
zarr's own ``threading.max_workers`` set to the same count). One untimed pass warms the page
cache, then each keeps its best of R rounds (with that round's CPU seconds, all threads: on a
shared machine they show the cost when the wall clock is disturbed). "Decoded" counts data +
indices + indptr in their stored dtypes, the same figure for both.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import zarr

REPO = Path(__file__).resolve().parents[1]


def zarr_python_pass(g, block, threads):
    indptr_arr, data_arr, indices_arr = g["indptr"], g["data"], g["indices"]
    n = indptr_arr.shape[0] - 1

    def one(start):
        stop = min(start + block, n)
        ip = indptr_arr[start:stop + 1]
        d = data_arr[int(ip[0]):int(ip[-1])]
        i = indices_arr[int(ip[0]):int(ip[-1])]
        return len(d) + 0 * len(i)

    t0, c0 = time.perf_counter(), time.process_time()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        nnz = sum(pool.map(one, range(0, n, block)))
    return time.perf_counter() - t0, time.process_time() - c0, nnz


def zarr_python(store, threads, block, rounds):
    out = []
    for t in threads:
        with zarr.config.set({"threading.max_workers": t}):
            g = zarr.open_group(str(store), mode="r")["X"]
            decoded = sum(g[k].nbytes for k in ("data", "indices", "indptr"))
            zarr_python_pass(g, block, t)  # warm
            best, cpu, _ = min(zarr_python_pass(g, block, t) for _ in range(rounds))
        out.append({"reader": "zarr-python", "key": "X", "threads": t, "block_rows": block,
                    "decoded_mb": round(decoded / 1e6, 1), "seconds": round(best, 4),
                    "mb_per_s": round(decoded / 1e6 / best, 1), "cpu_seconds": round(cpu, 4)})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store")
    ap.add_argument("--cells", type=int, default=86000)
    ap.add_argument("--format", default="v3")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--block", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    store = Path(a.store)
    if not store.exists():
        subprocess.run([str(REPO / "build" / "zbatch"), "synth", "--kind", "cells", "--n",
                        str(a.cells), "-o", str(store), "--format", a.format, "--threads", "2"],
                       check=True)
    r = subprocess.run([str(REPO / "build" / "bench_src_zarr"), str(store), "--threads",
                        a.threads, "--block", str(a.block), "--rounds", str(a.rounds)],
                       capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    rows += zarr_python(store, [int(t) for t in a.threads.split(",")], a.block, a.rounds)
    root = zarr.open_group(str(store), mode="r")
    data = root["X/data"]
    print(f"store {store}: X {root['X'].attrs['shape']}, nnz {data.shape[0]:,}, "
          f"zarr v{root.metadata.zarr_format}, data chunks {data.chunks} shards {data.shards}")
    print(f"{'reader':<12} {'threads':>7} {'decoded MB':>11} {'seconds':>8} {'MB/s':>8} "
          f"{'CPU s':>8} {'MB/CPU-s':>9}")
    for x in rows:
        print(f"{x['reader']:<12} {x['threads']:>7} {x['decoded_mb']:>11} {x['seconds']:>8} "
              f"{x['mb_per_s']:>8} {x['cpu_seconds']:>8} "
              f"{round(x['decoded_mb'] / x['cpu_seconds'], 1):>9}")
    json.dump(rows, sys.stderr)
    sys.stderr.write("\n")


if __name__ == "__main__":
    main()
