"""annbatch's Loader beside zbatch on the same cells store (issue 19, item 4).

    .venv/bin/python bench/annbatch_loader.py [--cells 30000] [--batch-size 4096]
        [--seconds 6] [--rounds 3] [--sweep-seconds 4] [--store PATH] [--work DIR]
        [--results DIR]

One run of this script: a Tahoe-like store (``zbatch synth --kind cells --n N``, zbatch's
default codecs: blosc lz4, without byte shuffle for the uint8 counts and uint16 gene ids,
sharded, Zarr v3) unless ``--store`` names one; then

1. a sweep of annbatch's ``(chunk_size, preload_nchunks)`` (``--sweep-seconds`` each) that picks
   annbatch's best setting on this machine;
2. ``--rounds`` rounds (order reversed in even rounds) of: annbatch's Loader at its documented
   setting (32, 512), its defaults (512, 32), the annbatch paper's fixed 16,384-row preload at
   chunk_size 256 and 1024, and its best; each paired with zbatch's DataLoader reading the same
   store with the same sampling (``sampler="block"``, ``block_size = chunk_size``,
   ``blocks_per_window = preload_nchunks``, one window per preload) and the same output
   (``scipy.sparse.csr_matrix``, built for every batch) twice: zbatch's default dtypes (float32
   values, int32 gene ids, whatever the store holds) and annbatch's (the dtypes annbatch yields
   from this store: ``x_dtype="stored"``, ``index_dtype="int32"`` on the narrow store, uint8
   values and int32 ids as scipy's constructor leaves annbatch's uint16 ids); zbatch at
   annbatch's best setting also with dense torch output (``output="torch"``, the C ``densify``
   transform; annbatch's environment has no torch, so annbatch has no dense torch figure); and
   ``zbatch bench`` at that setting, with either dtypes, for zbatch's C loader and its
   decode-only limit (the same chunks decoded with the same codec and threads, nothing else).

Every loader gets two cores (zbatch ``num_threads=2``; annbatch: zarrs' ``threading.max_workers
= 2``, annbatch runs in one process). annbatch runs in .venv-annbatch (bench/peers/annbatch_peer.py),
its timing loop inside that interpreter. Before timing, annbatch's yielded rows for a fixed id
list are checked against zbatch's read of the same ids. Figures: medians over the rounds, every
round kept. One JSON record in ``--results``: ``annbatch-loader-<time>.json``.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / "build" / "zbatch"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.peers import annbatch_peer, measure, zbatch_peer  # noqa: E402
from bench.run import check_ids, machine, same_content, versions  # noqa: E402

PRELOAD_ROWS = 16384  # the annbatch paper's fixed preload (its docstring's 32 x 512 too)
NAMED = {
    "documented": (32, 512),        # Loader docstring example, batch_size=4096
    "defaults": (512, 32),          # Loader's own defaults
    "paper cs256": (256, PRELOAD_ROWS // 256),   # paper: fixed 16,384-row preload
    "paper cs1024": (1024, PRELOAD_ROWS // 1024),
}
SWEEP = [(16, 1024), (32, 512), (64, 256), (128, 128), (256, 64), (512, 32), (1024, 16),
         (2048, 8), (64, 128), (256, 32), (512, 16), (256, 128), (512, 64)]


def _valid(cs: int, pn: int, batch: int) -> bool:
    return cs * pn >= batch and (cs * pn) % batch == 0  # annbatch's own rule


def annbatch_run(store: str, batch: int, seconds: float, cs: int, pn: int) -> dict:
    r = annbatch_peer.run(store, batch, seconds, num_workers=2, chunk_size=cs,
                          preload_nchunks=pn)
    return {"samples_per_s": r["samples_per_s"], "startup_s": r["startup_s"],
            "batches": r["batches"], "seconds": r["seconds"], "batch_types": r["batch_types"],
            "versions": r["config"]["versions"]}


def zbatch_csr(store: str, batch: int, seconds: float, cs: int, pn: int,
               dtypes: tuple = (None, None)) -> dict:
    ff = cs * pn // batch  # batches per preload: one coalesced read per annbatch preload
    r = zbatch_peer.run(store, batch, seconds, num_workers=2, output="csr", sampler="block",
                        block_size=cs, fetch_factor=ff, prefetch_factor=ff, x_dtype=dtypes[0],
                        index_dtype=dtypes[1])
    return {"samples_per_s": r["samples_per_s"], "startup_s": r["startup_s"],
            "batches": r["batches"], "seconds": r["seconds"], "batch_types": r["batch_types"],
            "amplification": r["amplification"], "config": r["config"]}


def annbatch_dtypes(store: str) -> tuple:
    """zbatch.open's (x_dtype, index_dtype) for the batches annbatch yields from ``store``: its
    values as stored; its gene ids as scipy's csr_matrix constructor leaves them (int32 for
    stored ids of up to 32 bits, which is every store here)."""
    import zbatch
    ids = zbatch.open(store, index_dtype="stored").fields["X/indices"]["dtype"]
    return ("stored", "int32" if np.dtype(ids).itemsize <= 4 else "int64")


def zbatch_dense_torch(store: str, batch: int, seconds: float, cs: int, pn: int) -> dict:
    import torch
    import zbatch
    ff = cs * pn // batch
    ds = zbatch.open(store, num_threads=2)
    dl = zbatch.DataLoader(ds, batch_size=batch, sampler="block", block_size=cs,
                           blocks_per_window=pn, prefetch_factor=ff, output="torch",
                           transforms=["densify"])
    kinds = set()

    def count(b):
        x = b["X_dense"]
        if not kinds:
            kinds.add(f"{type(x).__module__}.{type(x).__name__} {x.dtype} {tuple(x.shape)}")
            assert isinstance(x, torch.Tensor) and x.layout == torch.strided
        return x.shape[0]

    def epoch(e):
        dl.set_epoch(e)
        return dl

    m = measure(epoch, seconds, count)
    dl.close()
    m["batch_types"] = sorted(kinds)
    return m


def zbatch_limit(store: str, batch: int, seconds: float, cs: int, pn: int, work: Path,
                 dtypes: tuple = (None, None)) -> dict:
    opt = [] if dtypes[0] is None else ["--x-dtype", dtypes[0], "--index-dtype", dtypes[1]]
    r = subprocess.run([str(CLI), "bench", store, "--sampler", "block", "--block-size", str(cs),
                        "--blocks-per-window", str(pn), "--batch", str(batch), "--prefetch",
                        str(cs * pn // batch), "--threads", "2", "--seconds", str(seconds),
                        "--results", str(work / "bench-records"), "--json", *opt],
                       capture_output=True, text=True, check=True)
    f = json.loads(r.stdout)["figures"]
    d = f.get("decode_only") or {}
    return {"samples_per_s": f["samples_per_s"], "decode_only_samples_per_s":
            d.get("samples_per_s"), "ratio_to_decode_only": d.get("ratio")}


def content_check(store: str, n: int, cs: int, pn: int, batch: int) -> dict:
    ids = check_ids(n)
    got = annbatch_peer.read_ids(store, ids, chunk_size=cs, preload_nchunks=pn,
                                 batch_size=batch)
    ref = zbatch_peer.read_ids(store, ids)
    ok, detail = same_content(got, ref)
    return {"ids": ids, "equal": ok, "fields": detail, "chunk_size": cs, "preload_nchunks": pn,
            "reference": "zbatch read_many of the same store"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", type=int, default=30000)
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--sweep-seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--store", default=None, help="an existing anndata Zarr v3 store")
    ap.add_argument("--wide", action="store_true",
                    help="synthesise float32 counts and int32 gene ids (synth's default is "
                         "the narrow uint8 / uint16 store)")
    ap.add_argument("--work", default=None)
    ap.add_argument("--results", default=str(ROOT / "results"))
    ap.add_argument("--no-dense", action="store_true", help="skip zbatch's dense torch runs")
    args = ap.parse_args(argv)
    if not annbatch_peer.available():
        print(f"annbatch's environment {annbatch_peer.bridge.VENV} is missing: run `make`",
              file=sys.stderr)
        return 2
    B = args.batch_size
    work = Path(args.work or tempfile.mkdtemp(prefix="zbatch-annbatch-"))
    work.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    load_start = os.getloadavg()
    store = args.store
    if store is None:
        store = str(work / ("cells-wide.zarr" if args.wide else "cells.zarr"))
        if not Path(store).exists():
            subprocess.run([str(CLI), "synth", "--kind", "cells", "--n", str(args.cells), "-o",
                            store, "--seed", "1", "--threads", "2"]
                           + (["--data-dtype", "float32", "--index-dtype", "int32"]
                              if args.wide else []), check=True, capture_output=True)
    import zbatch
    n = len(zbatch.open(store))
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731

    log(f"store {store}: {n} cells; content check ...")
    check = content_check(store, n, *NAMED["documented"], B)
    log(f"  annbatch rows == zbatch rows: {check['equal']}")

    log(f"sweep of annbatch's (chunk_size, preload_nchunks), {args.sweep_seconds:g} s each")
    sweep = []
    for cs, pn in SWEEP:
        if not _valid(cs, pn, B):
            continue
        r = annbatch_run(store, B, args.sweep_seconds, cs, pn)
        sweep.append({"chunk_size": cs, "preload_nchunks": pn, "preload_rows": cs * pn, **r})
        log(f"  annbatch cs={cs:5} pn={pn:5}: {r['samples_per_s']:10,.0f} cells/s")
    best = max(sweep, key=lambda r: r["samples_per_s"])
    settings = dict(NAMED)
    settings["best"] = (best["chunk_size"], best["preload_nchunks"])
    log(f"annbatch's best in the sweep: chunk_size={settings['best'][0]} "
        f"preload_nchunks={settings['best'][1]}")

    same = annbatch_dtypes(store)
    log(f"annbatch's dtypes as zbatch.open options: x_dtype={same[0]!r}, "
        f"index_dtype={same[1]!r}")
    runs = []
    for name, (cs, pn) in settings.items():
        runs.append((f"annbatch {name}", "annbatch", cs, pn))
        runs.append((f"zbatch csr @ {name}", "zbatch-csr", cs, pn))
        runs.append((f"zbatch csr, annbatch's dtypes @ {name}", "zbatch-csr-same", cs, pn))
    if not args.no_dense:
        runs.append(("zbatch dense torch @ best", "zbatch-dense", *settings["best"]))
    runs.append(("zbatch bench @ best (loader + decode-only limit)", "zbatch-bench",
                 *settings["best"]))
    runs.append(("zbatch bench, annbatch's dtypes @ best", "zbatch-bench-same",
                 *settings["best"]))
    fns = {"annbatch": annbatch_run, "zbatch-csr": zbatch_csr,
           "zbatch-csr-same": lambda *a: zbatch_csr(*a, dtypes=same),
           "zbatch-dense": zbatch_dense_torch}
    rounds: dict = {r[0]: [] for r in runs}
    for rnd in range(max(1, args.rounds)):
        order = runs if rnd % 2 == 0 else runs[::-1]
        log(f"round {rnd + 1} of {args.rounds}")
        for rid, kind, cs, pn in order:
            try:
                if kind == "zbatch-bench":
                    r = zbatch_limit(store, B, args.seconds, cs, pn, work)
                elif kind == "zbatch-bench-same":
                    r = zbatch_limit(store, B, args.seconds, cs, pn, work, dtypes=same)
                else:
                    r = fns[kind](store, B, args.seconds, cs, pn)
            except Exception as exc:  # recorded, never hidden
                r = {"samples_per_s": 0.0, "error": f"{type(exc).__name__}: {exc}"[:2000]}
            rounds[rid].append(r)
            log(f"  {rid:52} {r['samples_per_s']:10,.0f} cells/s"
                + (f"  decode-only {r['decode_only_samples_per_s']:,.0f}"
                   if r.get("decode_only_samples_per_s") else ""))

    def med(rid, key="samples_per_s"):
        v = [r.get(key) for r in rounds[rid] if r.get(key)]
        return statistics.median(v) if v else 0.0

    table = []
    for rid, kind, cs, pn in runs:
        row = {"run": rid, "kind": kind, "chunk_size": cs, "preload_nchunks": pn,
               "cells_per_s": med(rid), "rounds": [r.get("samples_per_s") for r in rounds[rid]]}
        if kind.startswith("zbatch-bench"):
            row["decode_only_cells_per_s"] = med(rid, "decode_only_samples_per_s")
            row["decode_only_rounds"] = [r.get("decode_only_samples_per_s")
                                         for r in rounds[rid]]
        table.append(row)
    by = {r["run"]: r for r in table}
    ann_best = by["annbatch best"]["cells_per_s"]
    summary = {"annbatch_best_setting": settings["best"], "annbatch_best_cells_per_s": ann_best}
    for name in settings:
        a = by[f"annbatch {name}"]["cells_per_s"]
        for rid in (f"zbatch csr @ {name}", f"zbatch csr, annbatch's dtypes @ {name}"):
            by[rid]["ratio_over_annbatch_same_setting"] = by[rid]["cells_per_s"] / a if a else None
    for r in table:
        if r["kind"] != "annbatch" and ann_best:
            r["ratio_over_annbatch_best"] = r["cells_per_s"] / ann_best
    summary["zbatch_csr_at_best_over_annbatch_best"] = by["zbatch csr @ best"].get(
        "ratio_over_annbatch_best")
    summary["annbatch_dtypes"] = list(same)
    summary["zbatch_csr_annbatch_dtypes_at_best_over_annbatch_best"] = by[
        "zbatch csr, annbatch's dtypes @ best"].get("ratio_over_annbatch_best")
    summary["decode_only_cells_per_s"] = by[
        "zbatch bench @ best (loader + decode-only limit)"]["decode_only_cells_per_s"]
    summary["target_5x_met"] = bool((summary["zbatch_csr_at_best_over_annbatch_best"] or 0) >= 5)
    summary["target_5x_met_annbatch_dtypes"] = bool(
        (summary["zbatch_csr_annbatch_dtypes_at_best_over_annbatch_best"] or 0) >= 5)

    print(f"\n{n} cells, batch {B}, two cores each; medians of {args.rounds} rounds "
          f"({args.seconds:g} s each)\n")
    print(f"{'run':52} {'cs':>5} {'pn':>5} {'cells/s':>10} {'/annbatch best':>15} "
          f"{'/annbatch same':>15}")
    for r in table:
        rb = r.get("ratio_over_annbatch_best")
        rs = r.get("ratio_over_annbatch_same_setting")
        print(f"{r['run']:52} {r['chunk_size']:5} {r['preload_nchunks']:5} "
              f"{r['cells_per_s']:10,.0f} {(f'{rb:.2f}x' if rb else '-'):>15} "
              f"{(f'{rs:.2f}x' if rs else '-'):>15}")
    print(f"\nzbatch decode-only limit at annbatch's best setting: "
          f"{summary['decode_only_cells_per_s']:,.0f} cells/s")
    print(f"target annbatch >= 5x (zbatch CSR over annbatch at its best): "
          f"{summary['zbatch_csr_at_best_over_annbatch_best']:.2f}x with zbatch's default "
          f"dtypes ({'met' if summary['target_5x_met'] else 'NOT met'}), "
          f"{summary['zbatch_csr_annbatch_dtypes_at_best_over_annbatch_best']:.2f}x with "
          f"annbatch's ({'met' if summary['target_5x_met_annbatch_dtypes'] else 'NOT met'})")
    print(f"content check (annbatch's yielded rows == zbatch's): "
          f"{'equal' if check['equal'] else 'DIFFERENT'}")

    record = {
        "record": "bench/annbatch_loader.py: annbatch's Loader beside zbatch (issue 19)",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": ["bench/annbatch_loader.py", *(argv if argv is not None else sys.argv[1:])],
        "parameters": {"cells": n, "batch_size": B, "seconds": args.seconds,
                       "sweep_seconds": args.sweep_seconds, "rounds": args.rounds,
                       "store": store, "threads": 2,
                       "stored_dtypes": {k: zbatch.open(store, x_dtype="stored",
                                                        index_dtype="stored").fields[k]["dtype"]
                                         for k in ("X/data", "X/indices")},
                       "stored_codecs": {n["path"]: n["codecs"]
                                         for n in zbatch.info(store)["nodes"]
                                         if n["path"] in ("X/data", "X/indices")}},
        "machine": dict(machine(), loadavg_start=list(load_start),
                        loadavg_end=list(os.getloadavg())),
        "versions": versions(),
        "annbatch_versions": (sweep[0].get("versions") if sweep else None),
        "content_check": check, "sweep": sweep, "settings": settings, "table": table,
        "rounds": rounds, "summary": summary, "total_s": time.perf_counter() - t_all,
    }
    res = Path(args.results)
    res.mkdir(parents=True, exist_ok=True)
    path = res / f"annbatch-loader-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(record, indent=1, default=str))
    print(f"record: {path}")
    return 0 if check["equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
