"""zbatch next to the loaders users would otherwise pick, on the same data, in one session.

    .venv/bin/python bench/run.py [--cells N] [--atoms N] [--seconds S] [--quick]
                                  [--results DIR] [--batch-size B] [--atoms-batch-size B]
                                  [--threads 2[,1]] [--work DIR] [--keep]

Data (made here, in a work directory):
- cells: ``zbatch synth --kind cells`` (Tahoe-like CSR, zbatch's default codec), its
  uncompressed copy (``zbatch convert --codec none``) and an h5ad written by anndata from the
  same store (anndata's default: uncompressed);
- atoms: ``zbatch synth --kind atoms``, its uncompressed copy, an nvalchemi store written by
  nvalchemi's own ``AtomicDataZarrWriter`` from the same structures (read back through zbatch),
  and an LMDB of pickled samples (the fairchem style) from the same structures.

Loaders (bench/peers/): scDataset (backed h5ad and Zarr+zarrs), anndata's AnnLoader, zarr-python
with the zarrs pipeline (random rows, contiguous blocks), annbatch's Loader (run in
.venv-annbatch, Python 3.12, its timing loop in that interpreter; skipped with a note when that
environment is missing), nvalchemi's DataLoader, LMDB + torch DataLoader, and zbatch.DataLoader
on every store, each peer paired with the zbatch run that
reads the same bytes the same way (sampler family, output, codec). Same batch size and two
cores for every tool (``--threads``: DataLoader workers or threads, as each tool allows; the
peer modules say which). Each group of loaders runs in its own fresh Python process, one after
the other (process state such as thread pools, which do not survive fork, stays apart).

Every peer's content is checked against zbatch for a fixed id list (``read_ids`` of each peer
module vs ``zbatch.Dataset.read_many``); zbatch's own loader batches are checked against
anndata (cells) and zarr-python (atoms).

Output: a table (loader, setting, samples/s, zbatch/peer ratio) and one JSON record per run of
this script in ``--results`` (default ``results/``): parameters, every figure, the versions of
every installed package and the machine (CPU model, cores, memory).

annbatch (the scverse loader) needs Python >= 3.12: bench/peers/annbatch_peer.py runs its
``Loader`` in .venv-annbatch (tests/python/annbatch_bridge.py) over the default-codec cells
store, at its documented (chunk_size, preload_nchunks) = (32, 512), its defaults (512, 32) and,
unless --quick, the annbatch paper's fixed 16,384-row preload at chunk_size 256 and 1024; each
paired with zbatch's block sampler at the same (block_size, blocks_per_window), CSR out. The
target "annbatch >= 5x" sets zbatch at annbatch's best of these against it. bench/annbatch_loader.py
is the fuller measurement (batch 4096, a sweep, dense torch for zbatch, medians of rounds).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import importlib.metadata as _md
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / "build" / "zbatch"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ANNBATCH_NOTE = ("annbatch 0.3.1's Loader runs in .venv-annbatch (Python 3.12; its timing loop "
                 "in that interpreter, figures back as JSON) on the default-codec cells store "
                 "through Loader.add_adata (X backed, one store, no collection), CSR out "
                 "(annbatch's environment has no torch: no dense figure), zarrs' pipeline with "
                 "threading.max_workers = the cores given, one process.")
# annbatch's (chunk_size, preload_nchunks): its docstring's (32, 512), its defaults (512, 32),
# the annbatch paper's fixed 16,384-row preload at chunk_size 256 and 1024 (not in --quick)
ANNBATCH_MISSING = (".venv-annbatch missing (`make` makes it: scripts/install-annbatch-env.sh); "
                    "annbatch's Loader not run")
ANNBATCH_SETTINGS = [(32, 512), (512, 32), (256, 64), (1024, 16)]
ANNBATCH_QUICK = [(32, 512), (512, 32)]
CORES_NOTE = ("Two cores per tool: zbatch num_threads; scDataset, zarrs, LMDB: torch DataLoader "
              "num_workers (zarrs threading.max_workers=1 per worker); nvalchemi: Dataset "
              "num_workers (thread pool); AnnLoader: one process (its batched read needs "
              "num_workers=0); annbatch: one process, zarrs threading.max_workers=2.")
BLOCK_SIZE = 16     # scDataset's recommended block_size = fetch_factor = 16
FETCH_FACTOR = 16
# scDataset's settings swept for its best (block_size, fetch_factor), each next to zbatch with
# the same sampling (block size and window) on the same bytes; (16, 16) is the main run's
SCD_SWEEP = [(64, 16), (256, 16), (16, 64), (64, 64), (256, 64)]
DEFAULT_LABEL = "blosc lz4, default"  # the codec `zbatch synth` writes without --codec
NV_PREFETCH = 16    # nvalchemi's DataLoader recipe


# ------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------
def _sh(*args, **kw):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)
    if r.returncode:
        raise RuntimeError(f"{' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr}")
    return r.stdout


def du(path) -> int:
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def make_data(work: Path, cells: int, atoms: int, genes: int | None, seed: int = 1) -> dict:
    """The stores every loader reads (see the module docstring)."""
    import warnings
    d = {
        "cells_zarr": work / "cells.zarr", "cells_none": work / "cells-none.zarr",
        "cells_h5ad": work / "cells.h5ad", "atoms_zarr": work / "atoms.zarr",
        "atoms_none": work / "atoms-none.zarr", "atoms_nv": work / "atoms-nvalchemi.zarr",
        "atoms_lmdb": work / "atoms.lmdb",
    }
    timings = {}
    t = time.perf_counter()
    extra = ["--genes", str(genes)] if genes else []
    # the float32/int32 store the peer figures were measured on (synth's default is now the
    # narrow one, docs/PERFORMANCE.md "Narrow exact storage")
    _sh(CLI, "synth", "--kind", "cells", "--n", cells, "-o", d["cells_zarr"], "--seed", seed,
        "--threads", 2, "--data-dtype", "float32", "--index-dtype", "int32", *extra)
    _sh(CLI, "convert", d["cells_zarr"], d["cells_none"], "--codec", "none")
    timings["cells_synth_convert_s"] = time.perf_counter() - t
    t = time.perf_counter()
    import anndata as ad
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ad.read_zarr(d["cells_zarr"]).write_h5ad(d["cells_h5ad"])
    timings["h5ad_write_s"] = time.perf_counter() - t
    t = time.perf_counter()
    _sh(CLI, "synth", "--kind", "atoms", "--n", atoms, "-o", d["atoms_zarr"], "--seed", seed,
        "--threads", 2)
    _sh(CLI, "convert", d["atoms_zarr"], d["atoms_none"], "--codec", "none")
    timings["atoms_synth_convert_s"] = time.perf_counter() - t
    from bench.peers import lmdb_peer, nvalchemi_peer
    t = time.perf_counter()
    nvalchemi_peer.write_store(str(d["atoms_zarr"]), str(d["atoms_nv"]))
    timings["nvalchemi_write_s"] = time.perf_counter() - t
    t = time.perf_counter()
    lmdb_peer.write_lmdb(str(d["atoms_zarr"]), str(d["atoms_lmdb"]))
    timings["lmdb_write_s"] = time.perf_counter() - t
    out = {k: str(v) for k, v in d.items()}
    out["bytes"] = {k: du(v) for k, v in d.items()}
    out["timings"] = timings
    return out


def check_ids(n: int, k: int = 16) -> list[int]:
    """The fixed id list of the content checks: distinct, unsorted, both ends included."""
    rng = np.random.default_rng(20240611)
    ids = list(rng.choice(np.arange(1, n - 1), size=min(k, max(0, n - 2)), replace=False))
    return [int(x) for x in [n - 1] + ids + [0]]


# ------------------------------------------------------------------------------------------------
# Independent oracles for zbatch's own loader batches
# ------------------------------------------------------------------------------------------------
ATOM_KEYS = ("positions", "atomic_numbers", "forces", "energy", "neighbor_list", "shifts",
             "cell", "pbc")


def zarr_atoms(path: str, ids) -> dict:
    """The collated graph of ``ids`` read with zarr-python's own pipeline (no zbatch): per-atom
    and per-edge rows sliced with the store's pointer arrays (live samples via samples_mask),
    neighbour lists offset by the running atom count."""
    import zarr
    from bench.peers import concat_graphs
    g = zarr.open_group(path, mode="r")
    ap, ep = g["meta/atoms_ptr"][:], g["meta/edges_ptr"][:]
    live = np.flatnonzero(g["meta/samples_mask"][:]) if "samples_mask" in g["meta"] else \
        np.arange(len(ap) - 1)
    core = {k: g[f"core/{k}"] for k in ATOM_KEYS if k in g["core"]}
    samples = []
    for i in ids:
        p = int(live[int(i)])
        s = {}
        for k, arr in core.items():
            if k in ("positions", "atomic_numbers", "forces"):
                s[k] = arr[ap[p]:ap[p + 1]]
            elif k in ("neighbor_list", "shifts"):
                s[k] = arr[ep[p]:ep[p + 1]]
            else:
                s[k] = arr[p:p + 1]
        s["neighbor_list"] = s["neighbor_list"] - ap[p]  # stored batch-based per sample
        samples.append(s)
    return concat_graphs(samples)


def same_content(peer: dict, ref: dict) -> tuple[bool, dict]:
    """Compares every key both hold: CSR (shape, values, explicit nonzeros), dense arrays and
    graph fields (exact, reshaped to the reference's shape when the sizes agree)."""
    import scipy.sparse as sp
    detail = {}
    for k, r in ref.items():
        if k not in peer or peer[k] is None or k == "ids":
            continue
        p = peer[k]
        if sp.issparse(r) or sp.issparse(p):
            ok = (sp.issparse(p) and sp.issparse(r) and p.shape == r.shape
                  and (p != r).nnz == 0 and p.nnz == r.nnz)
        else:
            p = np.asarray(p.numpy() if hasattr(p, "numpy") else p)
            r = np.asarray(r)
            ok = p.size == r.size and np.array_equal(p.reshape(r.shape), r)
        detail[k] = bool(ok)
    return bool(detail) and all(detail.values()), detail


# ------------------------------------------------------------------------------------------------
# The plan: which loaders, on which store, paired with which zbatch run
# ------------------------------------------------------------------------------------------------
def plan(data: dict, args) -> list[dict]:
    """Groups of runs; every group runs in one fresh process, runs in order, then its content
    checks. Peers carry ``match``: the id of the zbatch run that reads the same bytes the same
    way."""
    B, BA = args.batch_size, args.atoms_batch_size
    quick = args.quick
    threads = args.threads
    annbatch_ok = annbatch_available()
    groups = {"cells-peers": [], "cells-zbatch": [], "atoms-peers": [], "atoms-zbatch": []}

    def add(group, rid, module, store, t, match=None, **kw):
        groups[group].append({"id": f"{rid}@t{t}", "module": module, "data": data[store],
                              "store": store, "threads": t,
                              "match": f"{match}@t{t}" if match else None,
                              "kwargs": dict(kw, num_workers=t)})

    for t in threads:
        full = (t == threads[0])  # the other thread counts run the main settings only
        # zbatch, cells
        zb = [("zb-c-def-block-csr", "cells_zarr", "block", "csr", DEFAULT_LABEL),
              ("zb-c-none-block-csr", "cells_none", "block", "csr", "none"),
              ("zb-c-def-random-csr", "cells_zarr", "random", "csr", DEFAULT_LABEL),
              ("zb-c-none-random-csr", "cells_none", "random", "csr", "none")]
        if full:
            zb += [("zb-c-def-block-dense", "cells_zarr", "block", "dense", DEFAULT_LABEL),
                   ("zb-c-none-block-dense", "cells_none", "block", "dense", "none"),
                   ("zb-c-none-random-dense", "cells_none", "random", "dense", "none")]
            if not quick:
                zb += [("zb-c-def-random-dense", "cells_zarr", "random", "dense",
                        DEFAULT_LABEL)]
        for rid, store, sampler, out, label in zb:
            add("cells-zbatch", rid, "zbatch_peer", store, t, sampler=sampler, output=out,
                label=label, batch_size=B, block_size=BLOCK_SIZE, fetch_factor=FETCH_FACTOR,
                prefetch_factor=FETCH_FACTOR)
        # annbatch's Loader at its settings, each beside zbatch's block sampler at the same
        # (block_size, blocks_per_window), one window per preload, CSR, same store
        if annbatch_ok:
            for cs, pn in (ANNBATCH_QUICK if quick or not full else ANNBATCH_SETTINGS):
                if cs * pn < B or (cs * pn) % B:
                    continue  # annbatch refuses a preload that batch_size does not divide
                tag = f"cs{cs}-pn{pn}"
                ff = cs * pn // B
                add("cells-zbatch", f"zb-c-def-block-csr-{tag}", "zbatch_peer", "cells_zarr", t,
                    sampler="block", output="csr", label=DEFAULT_LABEL, batch_size=B,
                    block_size=cs, fetch_factor=ff, prefetch_factor=ff)
                add("cells-peers", f"annbatch-csr-{tag}", "annbatch_peer", "cells_zarr", t,
                    f"zb-c-def-block-csr-{tag}", output="csr", batch_size=B, chunk_size=cs,
                    preload_nchunks=pn)
        # peers, cells (fork-using runs first; the in-process zarrs run last: see zarrs_peer)
        add("cells-peers", "scdataset-h5ad-csr", "scdataset_peer", "cells_h5ad", t,
            "zb-c-none-block-csr", output="csr", batch_size=B)
        add("cells-peers", "scdataset-zarr-csr", "scdataset_peer", "cells_zarr", t,
            "zb-c-def-block-csr", output="csr", batch_size=B)
        add("cells-peers", "zarrs-blocks-csr", "zarrs_peer", "cells_zarr", t,
            "zb-c-def-block-csr", pattern="blocks", block_size=BLOCK_SIZE, output="csr",
            batch_size=B)
        # the same reader over the uncompressed copy: zbatch on the same bytes
        add("cells-peers", "zarrs-blocks-csr-none", "zarrs_peer", "cells_none", t,
            "zb-c-none-block-csr", pattern="blocks", block_size=BLOCK_SIZE, output="csr",
            batch_size=B)
        add("cells-peers", "zarrs-random-csr", "zarrs_peer", "cells_zarr", t,
            "zb-c-def-random-csr", pattern="random", output="csr", batch_size=B)
        if full and not quick:
            for bs, ff in SCD_SWEEP:
                tag = f"bs{bs}-ff{ff}"
                for rid, store, label in ((f"zb-c-none-block-csr-{tag}", "cells_none", "none"),
                                          (f"zb-c-def-block-csr-{tag}", "cells_zarr",
                                           DEFAULT_LABEL)):
                    add("cells-zbatch", rid, "zbatch_peer", store, t, sampler="block",
                        output="csr", label=label, batch_size=B, block_size=bs,
                        fetch_factor=ff, prefetch_factor=ff)
                add("cells-peers", f"scdataset-h5ad-csr-{tag}", "scdataset_peer", "cells_h5ad",
                    t, f"zb-c-none-block-csr-{tag}", output="csr", batch_size=B, block_size=bs,
                    fetch_factor=ff)
        if full:
            add("cells-peers", "scdataset-h5ad-dense", "scdataset_peer", "cells_h5ad", t,
                "zb-c-none-block-dense", output="dense", batch_size=B)
            if not quick:
                add("cells-peers", "scdataset-zarr-dense", "scdataset_peer", "cells_zarr", t,
                    "zb-c-def-block-dense", output="dense", batch_size=B)
                add("cells-peers", "zarrs-blocks-dense", "zarrs_peer", "cells_zarr", t,
                    "zb-c-def-block-dense", pattern="blocks", block_size=BLOCK_SIZE,
                    output="dense", batch_size=B)
                add("cells-peers", "zarrs-random-dense", "zarrs_peer", "cells_zarr", t,
                    "zb-c-def-random-dense", pattern="random", output="dense", batch_size=B)
            add("cells-peers", "annloader-csr", "anndata_peer", "cells_h5ad", t,
                "zb-c-none-random-csr", output="csr", batch_size=B)
            add("cells-peers", "annloader-dense", "anndata_peer", "cells_h5ad", t,
                "zb-c-none-random-dense", output="dense", batch_size=B)
            if not quick:
                # the in-process zarrs variant (no DataLoader workers, zarrs' own threads);
                # after it no DataLoader may fork in this process
                e = {"pattern": "blocks", "block_size": BLOCK_SIZE, "output": "csr",
                     "batch_size": B, "zarrs_threads": t}
                groups["cells-peers"].append({
                    "id": f"zarrs-blocks-csr-inproc@t{t}", "module": "zarrs_peer",
                    "data": data["cells_zarr"], "store": "cells_zarr", "threads": t,
                    "match": f"zb-c-def-block-csr@t{t}", "kwargs": dict(e, num_workers=0)})
        # zbatch, atoms
        za = [("zb-a-def", "atoms_zarr", DEFAULT_LABEL, 0),
              ("zb-a-none", "atoms_none", "none", 0),
              ("zb-a-nv", "atoms_nv", "nvalchemi's store", 0)]
        if full and not quick:
            za.append(("zb-a-nv-cache", "atoms_nv", "nvalchemi's store, 512 MiB cache",
                       512 << 20))
        for rid, store, label, cache in za:
            add("atoms-zbatch", rid, "zbatch_peer", store, t, sampler="random", label=label,
                batch_size=BA, prefetch_factor=NV_PREFETCH, cache_bytes=cache)
        # peers, atoms
        add("atoms-peers", "lmdb", "lmdb_peer", "atoms_lmdb", t, "zb-a-none", batch_size=BA)
        add("atoms-peers", "nvalchemi", "nvalchemi_peer", "atoms_nv", t, "zb-a-nv",
            batch_size=BA, prefetch_factor=NV_PREFETCH)
    # the in-process zarrs runs must come after every forking run of their group
    groups["cells-peers"].sort(key=lambda r: r["kwargs"].get("num_workers", 1) == 0
                               and r["module"] == "zarrs_peer")
    return [{"group": g, "runs": runs} for g, runs in groups.items() if runs]


def annbatch_available() -> bool:
    """Whether annbatch's environment (.venv-annbatch) is there to run the annbatch peer."""
    from bench.peers import annbatch_peer
    return annbatch_peer.available()


def checks_for(group: str, data: dict, n_cells: int, n_atoms: int, batch: int) -> list[dict]:
    ci, ai = check_ids(n_cells), check_ids(n_atoms)
    if group == "cells-peers":
        extra = ([{"id": "annbatch", "module": "annbatch_peer", "data": data["cells_zarr"],
                   "ids": ci, "ref": data["cells_zarr"], "output": "csr"}]
                 if annbatch_available() else [])
        return extra + [
            {"id": "scdataset-h5ad", "module": "scdataset_peer", "data": data["cells_h5ad"],
             "ids": ci, "ref": data["cells_zarr"], "output": "csr"},
            {"id": "scdataset-h5ad-dense", "module": "scdataset_peer",
             "data": data["cells_h5ad"], "ids": ci, "ref": data["cells_zarr"],
             "output": "dense"},
            {"id": "scdataset-zarr", "module": "scdataset_peer", "data": data["cells_zarr"],
             "ids": ci, "ref": data["cells_zarr"], "output": "csr"},
            {"id": "annloader", "module": "anndata_peer", "data": data["cells_h5ad"],
             "ids": ci, "ref": data["cells_zarr"], "output": "csr"},
            {"id": "annloader-dense", "module": "anndata_peer", "data": data["cells_h5ad"],
             "ids": ci, "ref": data["cells_zarr"], "output": "dense"},
            {"id": "zarrs", "module": "zarrs_peer", "data": data["cells_zarr"], "ids": ci,
             "ref": data["cells_zarr"], "output": "csr"},
        ]
    if group == "atoms-peers":
        return [
            {"id": "lmdb", "module": "lmdb_peer", "data": data["atoms_lmdb"], "ids": ai,
             "ref": data["atoms_zarr"], "output": "graph"},
            {"id": "nvalchemi", "module": "nvalchemi_peer", "data": data["atoms_nv"],
             "ids": ai, "ref": data["atoms_zarr"], "output": "graph"},
        ]
    if group == "cells-zbatch":
        return [{"id": "zbatch-loader-cells", "kind": "zbatch-loader", "data": s,
                 "oracle": data["cells_h5ad"], "batch_size": batch, "output": o}
                for s in (data["cells_zarr"], data["cells_none"]) for o in ("csr", "dense")]
    if group == "atoms-zbatch":
        return [{"id": "zbatch-loader-atoms", "kind": "zbatch-loader", "data": s,
                 "oracle": s, "batch_size": batch, "output": "graph"}
                for s in (data["atoms_zarr"], data["atoms_none"], data["atoms_nv"])]
    return []


# ------------------------------------------------------------------------------------------------
# Worker: one group in this (fresh) process
# ------------------------------------------------------------------------------------------------
def _run_check(c: dict) -> dict:
    import importlib
    from bench.peers import zbatch_peer
    out = {"id": c["id"], "data": c["data"], "output": c["output"]}
    try:
        if c.get("kind") == "zbatch-loader":
            ds, dl, _cfg = zbatch_peer.loader(c["data"], c["batch_size"], 2, c["output"],
                                              seed=3, sampler="random")
            b = next(iter(dl))
            ids = np.asarray(b["index"], dtype=np.int64)
            if ds.layout == "atomic":
                got = {k: np.asarray(b[k]) for k in ATOM_KEYS + ("atoms_ptr", "edges_ptr",
                                                                  "batch_idx")}
                ref = zarr_atoms(c["oracle"], ids)
                out["reference"] = "zarr-python read of the same store"
            else:
                import anndata as ad
                a = ad.read_h5ad(c["oracle"], backed="r")
                order = np.argsort(ids, kind="stable")
                x = a.X[ids[order]][np.argsort(order)]  # h5py wants increasing ids
                key = "X_dense" if c["output"] == "dense" else "X"
                got = {"X": b[key]}
                ref = {"X": x.toarray() if c["output"] == "dense" else x}
                out["reference"] = "anndata backed h5ad X rows"
            dl.close()
            out["ids"] = ids.tolist()[:64]
        else:
            mod = importlib.import_module(f"bench.peers.{c['module']}")
            got = mod.read_ids(c["data"], c["ids"], output=c["output"])
            ids = np.asarray(got["ids"], dtype=np.int64)
            ref = zbatch_peer.read_ids(c["ref"], ids, output=c["output"])
            out["ids"] = ids.tolist()
            out["reference"] = f"zbatch read_many on {Path(c['ref']).name}"
        ok, detail = same_content(got, ref)
        out.update(equal=ok, fields=detail)
    except Exception as exc:  # a failed check is recorded, never hidden
        out.update(equal=False, error=f"{type(exc).__name__}: {exc}",
                   traceback=traceback.format_exc(limit=4))
    return out


def _sweep_amplification(data: dict, batch: int, quick: bool, seconds: float) -> list[dict]:
    """zbatch's read amplification against block size, for two read windows: one batch per
    coalesced read (``window="batch"``: what loaders that read batch by batch do) and
    ``fetch_factor`` batches (``window="16 batches"``: scDataset's fetch, zbatch's window);
    unless quick, also zbatch's throughput for each (2 s each, CSR)."""
    from bench.peers import zbatch_peer
    rows = []
    sizes = [1, 4, 16, 64, 256, 1024]
    for store in ("cells_zarr", "cells_none"):
        for window, ff in (("batch", 1), (f"{FETCH_FACTOR} batches", FETCH_FACTOR)):
            for bs in sizes + ["random"]:
                sampler = "random" if bs == "random" else "block"
                b = BLOCK_SIZE if bs == "random" else bs
                a = zbatch_peer.amplification(data[store], batch, sampler, b, ff, ff,
                                              windows=2)
                row = {"store": store, "window": window, "sampler": sampler,
                       "block_size": None if bs == "random" else bs,
                       "amplification": a["amplification"], "read_stats": a}
                if not quick:
                    r = zbatch_peer.run(data[store], batch, min(seconds, 2.0), sampler=sampler,
                                        block_size=b, fetch_factor=ff, prefetch_factor=ff,
                                        output="csr")
                    row["samples_per_s"] = r["samples_per_s"]
                rows.append(row)
    return rows


def worker(plan_path: str, out_path: str) -> None:
    import importlib
    import warnings
    warnings.simplefilter("ignore")
    job = json.loads(Path(plan_path).read_text())
    entries = []
    for r in job["runs"]:
        print(f"  {r['id']} ...", file=sys.stderr, flush=True)
        mod = importlib.import_module(f"bench.peers.{r['module']}")
        kw = dict(r["kwargs"])
        batch = kw.pop("batch_size")
        t = time.perf_counter()
        try:
            res = mod.run(r["data"], batch, job["seconds"], seed=job["seed"], **kw)
        except Exception as exc:
            res = {"loader": r["module"], "setting": r["id"], "samples_per_s": 0.0,
                   "error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc(limit=6)}
        res.update(id=r["id"], group=job["group"], store=r["store"], threads=r["threads"],
                   match=r["match"], wall_s=time.perf_counter() - t)
        entries.append(res)
        print(f"    {res.get('samples_per_s', 0):,.0f} samples/s", file=sys.stderr, flush=True)
    checks = [_run_check(c) for c in job["checks"]]
    sweep = None
    if job.get("sweep"):
        sweep = _sweep_amplification(job["data"], job["batch_size"], job["quick"],
                                     job["seconds"])
    Path(out_path).write_text(json.dumps({"entries": entries, "checks": checks,
                                          "sweep": sweep}, default=_json_default))


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    return repr(o)


# ------------------------------------------------------------------------------------------------
# Machine, versions, table, record
# ------------------------------------------------------------------------------------------------
def machine() -> dict:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {"cpu_model": cpu, "logical_cores": os.cpu_count(), "usable_cores": usable,
            "memory_bytes": mem, "memory_gib": round(mem / 2**30, 1) if mem else None,
            "kernel": platform.release(), "platform": platform.platform(),
            "python": sys.version.split()[0], "hostname": platform.node()}


def versions() -> dict:
    out = {}
    for dist in _md.distributions():
        name = dist.metadata["Name"]
        if name:
            out[name] = dist.version
    try:
        import zbatch
        out.setdefault("zbatch", getattr(zbatch, "__version__", "dev"))
    except Exception:
        pass
    try:
        out["zbatch-cli"] = _sh(CLI, "--help").splitlines()[0].strip()
    except Exception:
        pass
    return dict(sorted(out.items(), key=lambda kv: kv[0].lower()))


def ratios(entries: list[dict]) -> None:
    by_id = {e["id"]: e for e in entries}
    for e in entries:
        m = by_id.get(e.get("match") or "")
        if m and e.get("samples_per_s", 0) > 0 and m.get("samples_per_s", 0) > 0:
            e["ratio_zbatch_over_peer"] = m["samples_per_s"] / e["samples_per_s"]
            e["matched_setting"] = m.get("setting")
        else:
            e["ratio_zbatch_over_peer"] = None


def targets(entries: list[dict]) -> list[dict]:
    """Issue 6's ratio targets, each from the runs of this record: the peer's figure, the zbatch
    figure it is set against (same sampling, same output, same bytes or zbatch's default
    codec), the ratio and whether it meets the target. scDataset is taken at its best
    (block_size, fetch_factor) over the sweep; zbatch at that same setting."""
    by_id = {e["id"]: e for e in entries if e.get("samples_per_s", 0) > 0}
    t0 = min((e["threads"] for e in entries), default=2, key=lambda t: -t)
    out = []

    def add(name, goal, peer_id, zb_ids):
        p = by_id.get(f"{peer_id}@t{t0}")
        if not p:
            return
        for zid in zb_ids:
            z = by_id.get(f"{zid}@t{t0}")
            if not z:
                continue
            r = z["samples_per_s"] / p["samples_per_s"]
            out.append({"target": name, "goal": goal, "peer": p["id"],
                        "peer_setting": f"{p.get('setting')} <{p.get('store')}>", "peer_samples_per_s": p["samples_per_s"],
                        "zbatch": z["id"], "zbatch_setting": f"{z.get('setting')} <{z.get('store')}>",
                        "zbatch_samples_per_s": z["samples_per_s"], "ratio": r,
                        "met": r >= goal})

    scd = [e for e in entries if e["id"].startswith("scdataset-h5ad-csr")
           and e.get("threads") == t0 and e.get("samples_per_s", 0) > 0]
    if scd:
        best = max(scd, key=lambda e: e["samples_per_s"])
        tag = best["id"].split("@")[0][len("scdataset-h5ad-csr"):]
        add("scDataset at its best, CSR", 10, best["id"].split("@")[0],
            [f"zb-c-none-block-csr{tag}", f"zb-c-def-block-csr{tag}"])
    add("scDataset, dense", 10, "scdataset-h5ad-dense", ["zb-c-none-block-dense"])
    ab = [e for e in entries if e["id"].startswith("annbatch-csr-")
          and e.get("threads") == t0 and e.get("samples_per_s", 0) > 0]
    if ab:  # annbatch at its best setting of this run; zbatch with the same sampling
        best = max(ab, key=lambda e: e["samples_per_s"])
        tag = best["id"].split("@")[0][len("annbatch-csr-"):]
        add("annbatch at its best, CSR", 5, best["id"].split("@")[0],
            [f"zb-c-def-block-csr-{tag}"])
    add("AnnLoader (backed, shuffled), CSR", 20, "annloader-csr",
        ["zb-c-none-random-csr", "zb-c-def-random-csr"])
    add("AnnLoader (backed, shuffled), dense", 20, "annloader-dense",
        ["zb-c-none-random-dense", "zb-c-def-random-dense"])
    add("zarr-python + zarrs, contiguous blocks, CSR", 10, "zarrs-blocks-csr",
        ["zb-c-def-block-csr"])
    add("zarr-python + zarrs, contiguous blocks, CSR, uncompressed store", 10,
        "zarrs-blocks-csr-none", ["zb-c-none-block-csr"])
    add("zarr-python + zarrs, contiguous blocks, dense", 10, "zarrs-blocks-dense",
        ["zb-c-def-block-dense"])
    add("nvalchemi DataLoader", 20, "nvalchemi", ["zb-a-nv", "zb-a-def", "zb-a-none"])
    add("LMDB + torch DataLoader", 10, "lmdb", ["zb-a-none", "zb-a-def"])
    return out


def targets_table(rows: list[dict]) -> str:
    lines = ["targets (ratio = zbatch samples/s over the peer's, same run):"]
    for r in rows:
        lines.append(f"  {r['target']:46} {r['ratio']:6.1f}x  (goal {r['goal']}x: "
                     f"{'met' if r['met'] else 'NOT met'})  zbatch {r['zbatch_setting']} "
                     f"{r['zbatch_samples_per_s']:,.0f} vs {r['peer_setting']} "
                     f"{r['peer_samples_per_s']:,.0f}")
    return "\n".join(lines)


def table(entries: list[dict]) -> str:
    rows = [("loader", "setting", "threads", "samples/s", "zbatch/peer", "vs zbatch run")]
    order = sorted(entries, key=lambda e: (not e["group"].startswith("cells"),
                                           e.get("loader") != "zbatch"))
    for group in ("cells", "atoms"):
        for e in order:
            if not e["group"].startswith(group):
                continue
            r = e.get("ratio_zbatch_over_peer")
            sps = f"{e['samples_per_s']:,.0f}" if not e.get("error") else "FAILED"
            rows.append((e.get("loader", "?"), e.get("setting", e["id"]), str(e["threads"]),
                         sps, f"{r:.2f}x" if r else "-",
                         e.get("matched_setting", "") if r else ""))
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for k, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w[i]) if i in (0, 1, 5) else c.rjust(w[i])
                               for i, c in enumerate(r)).rstrip())
        if k == 0:
            lines.append("  ".join("-" * x for x in w))
    return "\n".join(lines)


def best_rounds(entries: list) -> list:
    """One entry per run id: the round with the highest samples/s, with every round's figure
    in ``samples_per_s_rounds`` (a failed round counts as 0 and is kept only if all failed)."""
    by_id: dict = {}
    for e in entries:
        by_id.setdefault(e["id"], []).append(e)
    out = []
    for rounds in by_id.values():
        best = dict(max(rounds, key=lambda e: e.get("samples_per_s", 0.0)))
        best["samples_per_s_rounds"] = [e.get("samples_per_s", 0.0) for e in rounds]
        out.append(best)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", type=int, default=20000)
    ap.add_argument("--atoms", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=10.0, help="steady-state seconds per run")
    ap.add_argument("--quick", action="store_true",
                    help="tiny data, ~1 s per run, fewer settings (the test's mode)")
    ap.add_argument("--results", default=str(ROOT / "results"))
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--atoms-batch-size", type=int, default=32)
    ap.add_argument("--threads", default="2",
                    help="comma-separated core counts; the first gets every setting")
    ap.add_argument("--genes", type=int, default=None, help="columns of X (synth default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds over every run (reversed order in even rounds); each run "
                         "keeps its best round (neighbours on a shared machine only slow "
                         "things down), every round's figure is recorded")
    ap.add_argument("--work", default=None, help="work directory (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--worker", nargs=2, metavar=("PLAN", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return 0
    if args.quick:
        argv_given = set(a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:]))
        if "--cells" not in argv_given:
            args.cells = 1500
        if "--atoms" not in argv_given:
            args.atoms = 300
        if "--seconds" not in argv_given:
            args.seconds = 1.0
    args.threads = [int(x) for x in str(args.threads).split(",") if x]
    if not CLI.is_file():
        print(f"zbatch CLI missing at {CLI}: build it first", file=sys.stderr)
        return 2
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="zbatch-peers-"))
    work.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    load_start = os.getloadavg()
    try:
        print(f"data: {args.cells} cells, {args.atoms} structures -> {work}", file=sys.stderr)
        data = make_data(work, args.cells, args.atoms, args.genes)
        entries, checks, sweep = [], [], None
        groups = plan(data, args)
        rounds = [groups if r % 2 == 0 else groups[::-1] for r in range(max(1, args.repeat))]
        for rnd, g in ((r, g) for r, gs in enumerate(rounds) for g in gs):
            first = rnd == 0  # content checks and the sweep run once
            job = {"group": g["group"], "runs": g["runs"], "seconds": args.seconds,
                   "seed": args.seed, "quick": args.quick, "data": data,
                   "batch_size": args.batch_size,
                   "checks": checks_for(g["group"], data, args.cells, args.atoms,
                                        args.batch_size if g["group"].startswith("cells")
                                        else args.atoms_batch_size) if first else [],
                   "sweep": first and g["group"] == "cells-zbatch"}
            pj, oj = work / f"plan-{g['group']}.json", work / f"out-{g['group']}.json"
            pj.write_text(json.dumps(job, default=_json_default))
            print(f"[{g['group']}] {len(g['runs'])} runs"
                  + (f" (round {rnd + 1} of {len(rounds)})" if len(rounds) > 1 else ""),
                  file=sys.stderr, flush=True)
            budget = 120 + len(g["runs"]) * (args.seconds * 3 + 60)
            r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker",
                                str(pj), str(oj)], cwd=str(ROOT), timeout=budget)
            if r.returncode or not oj.is_file():
                entries += [{"id": x["id"], "group": g["group"], "loader": x["module"],
                             "setting": x["id"], "threads": x["threads"], "match": x["match"],
                             "samples_per_s": 0.0,
                             "error": f"worker exited with {r.returncode}"} for x in g["runs"]]
                continue
            out = json.loads(oj.read_text())
            entries += out["entries"]
            checks += out["checks"]
            sweep = out["sweep"] or sweep
        entries = best_rounds(entries)
        ratios(entries)
        print()
        print(table(entries))
        goals = targets(entries)
        print("\n" + targets_table(goals))
        bad = [c for c in checks if not c.get("equal")]
        print(f"\ncontent checks: {len(checks) - len(bad)}/{len(checks)} equal"
              + (": FAILED " + ", ".join(c["id"] for c in bad) if bad else ""))
        if sweep:
            print("\nzbatch read amplification (bytes decoded / delivered) by block size:")
            for row in sweep:
                extra = (f"  {row['samples_per_s']:,.0f} samples/s"
                         if "samples_per_s" in row else "")
                print(f"  {row['store']:10} {row['window']:10} {row['sampler']:6} "
                      f"{str(row['block_size'] or '-'):>5}  {row['amplification']:6.2f}{extra}")
        print("\n" + CORES_NOTE + "\n" + ANNBATCH_NOTE)
        if not annbatch_available():
            print(f"annbatch: SKIPPED ({ANNBATCH_MISSING})")
        record = {
            "record": "bench/run.py: zbatch next to peer loaders",
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": [sys.executable, *sys.argv] if argv is None else ["bench/run.py", *argv],
            "parameters": {"cells": args.cells, "atoms": args.atoms, "seconds": args.seconds,
                           "repeat": max(1, args.repeat),
                           "quick": args.quick, "batch_size": args.batch_size,
                           "atoms_batch_size": args.atoms_batch_size,
                           "threads": args.threads, "seed": args.seed, "genes": args.genes,
                           "block_size": BLOCK_SIZE, "fetch_factor": FETCH_FACTOR,
                           "nvalchemi_prefetch_factor": NV_PREFETCH},
            "machine": dict(machine(), loadavg_start=list(load_start),
                            loadavg_end=list(os.getloadavg())),
            "versions": versions(),
            "data": data,
            "entries": entries,
            "checks": checks,
            "amplification_sweep": sweep,
            "targets": goals,
            "notes": {"cores": CORES_NOTE, "annbatch": ANNBATCH_NOTE if annbatch_available()
                      else f"SKIPPED: {ANNBATCH_MISSING}",
                      "samples_per_s": "steady state: from the first batch on; startup_s apart"},
            "total_s": time.perf_counter() - t_all,
        }
        res = Path(args.results)
        res.mkdir(parents=True, exist_ok=True)
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        path = res / f"peers-{stamp}{'-quick' if args.quick else ''}.json"
        k = 1
        while path.exists():
            path = res / f"peers-{stamp}-{k}{'-quick' if args.quick else ''}.json"
            k += 1
        path.write_text(json.dumps(record, indent=1, default=_json_default))
        print(f"\nrecord: {path}")
        return 0 if not bad and all(e.get("samples_per_s", 0) > 0 for e in entries) else 1
    finally:
        if not args.keep and not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
