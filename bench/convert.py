"""h5ad files to a pre-shuffled collection: zbatch convert next to annbatch's add_adatas, on the
same inputs, in one run.

    .venv/bin/python bench/convert.py [--cells 200000] [--files 4] [--genes 62710]
                                      [--dataset-size 2097152] [--memory 1GiB] [--threads 2]
                                      [--codec blosc:lz4:3:shuffle] [--seed 1] [--rounds 1]
                                      [--tools annbatch,zbatch,scratch,buffered,limit]
                                      [--timeout 7200]
                                      [--work DIR] [--keep] [--results DIR]

Inputs (made here, in the work directory; reused when --work holds inputs of the same
parameters): --files .h5ad files of --cells cells in all, Tahoe-like — ``zbatch synth --kind
cells`` (about 1,460 nonzeros per cell of --genes genes, float32 integer counts, categorical obs
cell_line / drug / plate and an int32 n_genes), one store per file with its own seed, read with
anndata and written with anndata's ``write_h5ad`` (its default: uncompressed), obs names made
unique across files (``f<k>_cell_<i>``).

Runs, each in its own process, the inputs read once beforehand so both start from the page cache:

- annbatch: ``DatasetCollection(out).add_adatas(adata_paths=inputs, shuffle=True,
  dataset_size=D, rng=seed)`` in .venv-annbatch with zarrs' codec pipeline, as annbatch's
  documentation recommends (tests/python/annbatch_bridge.py); its own defaults otherwise
  (blosc lz4 clevel 3 shuffle, 64 cells per chunk, 1 GiB shards, 1,000-cell shuffle blocks);
- zbatch: ``build/zbatch convert INPUT... -o OUT --dataset-size D --memory M --threads T --seed S
  [--codec C]``, by default with annbatch's codec, so both write the same kind of bytes;
- scratch (only when asked for in --tools): the zbatch command with ZBATCH_CONVERT_SCRATCH=1,
  every cell through the scatter's scratch files instead of read straight from the inputs by
  the gather (docs/CONVERT.md, "The direct path"): the same output bytes;
- buffered (only when asked for): the zbatch command with ZBATCH_CONVERT_BUFFERED=1, the output
  written and read back through the page cache instead of with direct I/O (docs/CONVERT.md): the
  same output bytes;
- limit: ``build/zbatch convert --limit INPUT... -o OUT [the same flags]``, which prints one JSON
  line ``{"read_s", "compress_s", "cells", "input_bytes"}``: the time to read the inputs and to
  compress the output alone. limit = cells / (read_s + compress_s) cells/s.

Measured per run: wall time of the process, cells/s, input MB/s (10^6 bytes of .h5ad per
second), peak RSS — GNU time's maximum resident size of the command (the largest process of
its tree), and the sum over the whole tree sampled every 50 ms, total and anonymous (mapped file
pages are resident but reclaimable); the larger is "peak RSS" — and the bytes written. Every
output is checked: annbatch's DatasetCollection opens it and holds every input cell once (its
src_path counts match the inputs), and zbatch opens it with the same length.
With --rounds R the tools alternate order and each keeps its fastest round; every round is in
the record.

Ratios (targets): zbatch/annbatch cells/s (>= 10), annbatch/zbatch peak RSS (>= 4), zbatch/limit.
Output: a table and one JSON record in --results (default results/): parameters, every run,
ratios, versions of both environments and the machine.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / "build" / "zbatch"
for p in (ROOT, ROOT / "python", ROOT / "tests" / "python"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import annbatch_bridge as bridge  # noqa: E402  (tests/python: annbatch runs in .venv-annbatch)

TAHOE_DATASET = 2 ** 21   # cells per dataset in annbatch's Tahoe-100M collection (FORMATS §7.3)
ANNBATCH_CODEC = "blosc:lz4:3:shuffle"   # add_adatas' default zarr_compressor
TARGET_SPEED, TARGET_MEMORY = 10.0, 4.0
PAGE = os.sysconf("SC_PAGE_SIZE")


# ------------------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------------------
def make_inputs(work: Path, cells: int, files: int, genes: int, seed: int) -> dict:
    """The .h5ad inputs (see the module docstring); reused when work/inputs.json says they were
    made with the same parameters."""
    import warnings
    import anndata as ad
    params = {"cells": cells, "files": files, "genes": genes, "seed": seed}
    manifest = work / "inputs.json"
    if manifest.exists():
        m = json.loads(manifest.read_text())
        if m["params"] == params and all(Path(p).exists() for p in m["paths"]):
            return m
    sizes = [cells // files + (1 if k < cells % files else 0) for k in range(files)]
    paths, nnz, t = [], 0, time.perf_counter()
    for k, n in enumerate(sizes):
        store, h5 = work / f"synth_{k}.zarr", work / f"input_{k}.h5ad"
        shutil.rmtree(store, ignore_errors=True)
        _sh(CLI, "synth", "--kind", "cells", "--n", n, "-o", store, "--seed", seed * 1000 + k,
            "--genes", genes, "--threads", 2,
            "--data-dtype", "float32", "--index-dtype", "int32")  # the inputs measured so far
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            a = ad.read_zarr(store)
            a.obs_names = [f"f{k}_cell_{i}" for i in range(n)]
            a.write_h5ad(h5)
            nnz += int(a.X.nnz)
        del a
        shutil.rmtree(store)
        paths.append(str(h5))
    m = {"params": params, "paths": paths, "sizes": sizes,
         "bytes": [Path(p).stat().st_size for p in paths], "make_s": time.perf_counter() - t,
         "nnz": nnz}
    manifest.write_text(json.dumps(m, indent=1))
    return m


def warm(paths) -> None:
    """Reads the files once, so every run starts with them in the page cache."""
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass


def _sh(*args) -> str:
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr}")
    return r.stdout


def du(path: Path) -> int:
    p = Path(path)
    if not p.exists():
        return 0
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


# ------------------------------------------------------------------------------------------------
# One measured process
# ------------------------------------------------------------------------------------------------
def _tree(pid: int) -> list[int]:
    """pid and its descendants, from /proc/<pid>/task/<tid>/children."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def _rss(pid: int) -> tuple[int, int, int]:
    """(resident, anonymous resident, peak resident) bytes of one process; zeros once it is
    gone."""
    vals = {"VmRSS:": 0, "RssAnon:": 0, "VmHWM:": 0}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = line.split(None, 1)[0] if line.strip() else ""
                if key in vals:
                    vals[key] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return vals["VmRSS:"], vals["RssAnon:"], vals["VmHWM:"]


GNU_TIME = Path("/usr/bin/time")


def run_measured(cmd: list, *, log: Path, env=None, cwd=None, timeout: float = 7200) -> dict:
    """Runs ``cmd`` in its own session; returns exit code, wall time, CPU times and the peak
    RSS. stdout and stderr go to ``log``.out / .err; a run past ``timeout`` is killed (its
    process group).

    Peak RSS: GNU time's %M where /usr/bin/time exists (exact: the command is forked from that
    small process, and it reports the command's own ru_maxrss), plus a 50 ms sampler of the
    whole process tree (the sum of VmRSS, and of RssAnon; and every process's VmHWM). Not
    wait4's ru_maxrss of a child forked from this process: Linux carries the parent's resident
    size into the child's ru_maxrss across fork + exec, so a small command would read as large
    as this Python process."""
    peak = {"total": 0, "anon": 0, "hwm": 0}
    done = threading.Event()
    timed = [str(GNU_TIME), "-f", "%M", "-o", f"{log}.time"] if GNU_TIME.exists() else []
    with open(f"{log}.out", "w") as out, open(f"{log}.err", "w") as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(timed + [str(c) for c in cmd], stdout=out, stderr=err, env=env,
                             cwd=cwd, start_new_session=True)

        def sample():
            while not done.wait(0.05):
                tot = anon = 0
                for q in _tree(p.pid)[1 if timed else 0:]:   # GNU time itself left out
                    a, b, h = _rss(q)
                    tot, anon = tot + a, anon + b
                    peak["hwm"] = max(peak["hwm"], h)
                peak["total"], peak["anon"] = max(peak["total"], tot), max(peak["anon"], anon)
                if time.perf_counter() - t0 > timeout:
                    os.killpg(p.pid, signal.SIGKILL)
                    return

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        done.set()
        th.join()
        p.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    maxrss = None
    if timed:
        try:  # the last line: GNU time prints "Command exited with non-zero status" before it
            maxrss = int(Path(f"{log}.time").read_text().split()[-1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
    return {"rc": p.returncode, "wall_s": wall, "user_s": ru.ru_utime, "sys_s": ru.ru_stime,
            "maxrss_bytes": maxrss, "rss_source": "GNU time %M" if maxrss else "sampled",
            "tree_rss_peak_bytes": peak["total"], "tree_rss_anon_peak_bytes": peak["anon"],
            "tree_hwm_peak_bytes": peak["hwm"],
            "peak_rss_bytes": max(maxrss or 0, peak["total"], peak["hwm"]),
            "timed_out": wall > timeout, "command": [str(c) for c in cmd]}


def tail(path: str, n: int = 3000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-n:]
    except OSError:
        return ""


# ------------------------------------------------------------------------------------------------
# The runs
# ------------------------------------------------------------------------------------------------
def zbatch_flags(args) -> list:
    flags = ["--dataset-size", args.dataset_size, "--memory", args.memory,
             "--threads", args.threads, "--seed", args.seed]
    return flags + (["--codec", args.codec] if args.codec != "default" else [])


def check_output(out: Path, inputs: dict) -> dict:
    """The collection holds every input cell once: annbatch's DatasetCollection opens it (its
    src_path counts per input match the inputs) and zbatch opens it with the same length."""
    res = {"ok": False}
    try:
        obs, keys, sizes = bridge.open_collection(out, columns=["src_path"])
        counts = obs["src_path"].value_counts()
        res.update(datasets=len(keys), dataset_sizes=sizes,
                   annbatch_cells=int(sum(sizes)),
                   src_path_counts_match=all(int(counts.get(p, 0)) == n for p, n in
                                             zip(inputs["paths"], inputs["sizes"])))
        import zbatch
        res["zbatch_cells"] = len(zbatch.open(str(out)))
        n = sum(inputs["sizes"])
        res["ok"] = (res["annbatch_cells"] == n and res["zbatch_cells"] == n
                     and res["src_path_counts_match"])
    except Exception as e:  # a collection one of the tools cannot open is a failed run
        res["error"] = f"{type(e).__name__}: {e}"[-2000:]
    return res


def run_annbatch(args, inputs: dict, work: Path, rnd: int) -> dict:
    out = work / f"annbatch-{rnd}.zarr"
    job = work / f"annbatch-job-{rnd}"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(job, ignore_errors=True)
    cmd = bridge.prepare("write", job, out=str(out), paths=inputs["paths"],
                         options={"dataset_size": args.dataset_size}, seed=args.seed)
    warm(inputs["paths"])
    m = run_measured(cmd, log=work / f"annbatch-{rnd}", env=bridge.worker_env(), cwd=job,
                     timeout=args.timeout)
    m["tool"] = "annbatch"
    if m["rc"] == 0:
        res, _ = bridge.collect(job)
        m["inner_s"] = res["seconds"]          # add_adatas alone (no interpreter start, imports)
        m["versions"] = res["versions"]
        m["output_bytes"] = du(out)
        m["check"] = check_output(out, inputs)
    else:
        m["error"] = tail(f"{work}/annbatch-{rnd}.err")
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    return m


def run_zbatch(args, inputs: dict, work: Path, rnd: int, limit: bool = False,
               scratch: bool = False, buffered: bool = False) -> dict:
    name = "limit" if limit else "scratch" if scratch else "buffered" if buffered else "zbatch"
    out = work / f"{name}-{rnd}.zarr"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [CLI, "convert", *(["--limit"] if limit else []), *inputs["paths"], "-o", out,
           *zbatch_flags(args)]
    warm(inputs["paths"])
    env = dict(os.environ)
    env.pop("ZBATCH_CONVERT_SCRATCH", None)
    if scratch:  # the same conversion through the scratch files (docs/CONVERT.md)
        env["ZBATCH_CONVERT_SCRATCH"] = "1"
    env.pop("ZBATCH_CONVERT_BUFFERED", None)
    if buffered:  # the output through the page cache (docs/CONVERT.md)
        env["ZBATCH_CONVERT_BUFFERED"] = "1"
    m = run_measured(cmd, log=work / f"{name}-{rnd}", timeout=args.timeout, env=env)
    m["tool"] = name
    if m["rc"] != 0:
        m["error"] = tail(f"{work}/{name}-{rnd}.err")
    elif limit:
        lines = [ln for ln in Path(f"{work}/{name}-{rnd}.out").read_text().splitlines()
                 if ln.strip().startswith("{")]
        try:
            m["limit"] = json.loads(lines[-1])
            lim = m["limit"]
            m["limit_cells_per_s"] = lim["cells"] / (lim["read_s"] + lim["compress_s"])
        except (IndexError, KeyError, ValueError, ZeroDivisionError) as e:
            m["error"] = f"no usable JSON line from --limit ({e!r}): {lines[-1:]}"
    else:
        m["output_bytes"] = du(out)
        m["check"] = check_output(out, inputs)
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    return m


def ok(m: dict | None) -> bool:
    return bool(m) and m["rc"] == 0 and "error" not in m and (
        m["tool"] == "limit" or m.get("check", {}).get("ok", False))


def best(runs: list, tool: str) -> dict | None:
    """The fastest good run of a tool (the limit: its highest cells/s), else its last run."""
    mine = [r for r in runs if r["tool"] == tool]
    good = [r for r in mine if ok(r)]
    if not good:
        return mine[-1] if mine else None
    if tool == "limit":
        return max(good, key=lambda r: r["limit_cells_per_s"])
    return min(good, key=lambda r: r["wall_s"])


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------
def figures(m: dict | None, cells: int, input_bytes: int) -> dict:
    if not ok(m):
        return {}
    if m["tool"] == "limit":
        return {"cells_per_s": m["limit_cells_per_s"],
                "input_mb_per_s": m["limit"]["input_bytes"] / 1e6
                / (m["limit"]["read_s"] + m["limit"]["compress_s"])}
    return {"cells_per_s": cells / m["wall_s"], "input_mb_per_s": input_bytes / 1e6 / m["wall_s"],
            "peak_rss_bytes": m["peak_rss_bytes"]}


def ratios(fig: dict) -> dict:
    a, z, lim = fig.get("annbatch", {}), fig.get("zbatch", {}), fig.get("limit", {})
    r = {}
    if a and z:
        r["zbatch_over_annbatch_speed"] = z["cells_per_s"] / a["cells_per_s"]
        r["annbatch_over_zbatch_peak_rss"] = a["peak_rss_bytes"] / z["peak_rss_bytes"]
        r["speed_target_met"] = r["zbatch_over_annbatch_speed"] >= TARGET_SPEED
        r["memory_target_met"] = r["annbatch_over_zbatch_peak_rss"] >= TARGET_MEMORY
    if z and lim:
        r["zbatch_over_limit"] = z["cells_per_s"] / lim["cells_per_s"]
    if z and fig.get("scratch"):
        r["zbatch_over_scratch_path"] = z["cells_per_s"] / fig["scratch"]["cells_per_s"]
    if z and fig.get("buffered"):
        r["zbatch_over_buffered_output"] = z["cells_per_s"] / fig["buffered"]["cells_per_s"]
    return r


def _gib(b) -> str:
    return f"{b / 2**30:.2f} GiB" if b else "-"


def table(bests: dict, fig: dict, rat: dict) -> str:
    rows = [f"{'tool':9} {'wall s':>9} {'cells/s':>10} {'input MB/s':>10} {'peak RSS':>10} "
            f"{'anon RSS':>10} {'written':>10}  note"]
    for tool in ("annbatch", "zbatch", "scratch", "buffered", "limit"):
        m = bests.get(tool)
        if m is None:
            continue
        f = fig.get(tool, {})
        if not f:
            why = (m.get("error") or json.dumps(m.get("check", {}))).strip()
            rows.append(f"{tool:9} {'failed':>9}  {why.splitlines()[-1][:110] if why else ''}")
            continue
        note, wall = "", m["wall_s"]
        rss = (_gib(m.get("peak_rss_bytes")), _gib(m.get("tree_rss_anon_peak_bytes")),
               _gib(m.get("output_bytes")))
        if tool == "annbatch":
            note = f"add_adatas alone {m['inner_s']:.1f} s"
        elif tool != "limit":
            note = f"CPU user {m['user_s']:.1f} s + sys {m['sys_s']:.1f} s"
        if tool == "limit":
            lim = m["limit"]
            note = f"read {lim['read_s']:.1f} s + compress {lim['compress_s']:.1f} s"
            wall, rss = lim["read_s"] + lim["compress_s"], ("-", "-", "-")
        rows.append(f"{tool:9} {wall:9.1f} {f['cells_per_s']:10,.0f} {f['input_mb_per_s']:10.1f} "
                    f"{rss[0]:>10} {rss[1]:>10} {rss[2]:>10}  {note}")
    rows.append("")
    met = {True: "met", False: "NOT met"}
    if "zbatch_over_annbatch_speed" in rat:
        rows.append(f"zbatch / annbatch cells/s   {rat['zbatch_over_annbatch_speed']:7.2f}   "
                    f"(target >= {TARGET_SPEED:g}: {met[rat['speed_target_met']]})")
        rows.append(f"annbatch / zbatch peak RSS  {rat['annbatch_over_zbatch_peak_rss']:7.2f}   "
                    f"(target >= {TARGET_MEMORY:g}: {met[rat['memory_target_met']]})")
    if "zbatch_over_limit" in rat:
        rows.append(f"zbatch / limit cells/s      {rat['zbatch_over_limit']:7.2f}")
    if "zbatch_over_scratch_path" in rat:
        rows.append(f"zbatch / its scratch path   {rat['zbatch_over_scratch_path']:7.2f}")
    if "zbatch_over_buffered_output" in rat:
        rows.append(f"zbatch / buffered output    {rat['zbatch_over_buffered_output']:7.2f}")
    return "\n".join(rows)


def machine_and_versions() -> tuple[dict, dict]:
    from bench.run import machine, versions
    return machine(), versions()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", type=int, default=200_000)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--genes", type=int, default=62_710)
    ap.add_argument("--dataset-size", type=int, default=TAHOE_DATASET,
                    help="cells per output dataset, for both tools (default 2^21, Tahoe's)")
    ap.add_argument("--memory", default="1GiB", help="zbatch convert --memory")
    ap.add_argument("--threads", type=int, default=2, help="zbatch convert --threads")
    ap.add_argument("--codec", default=ANNBATCH_CODEC,
                    help="zbatch convert --codec ('default': the flag left out)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--tools", default="annbatch,zbatch,limit")
    ap.add_argument("--timeout", type=float, default=7200, help="seconds per run")
    ap.add_argument("--work", default=None, help="work directory (kept; inputs reused)")
    ap.add_argument("--keep", action="store_true", help="keep the outputs")
    ap.add_argument("--results", default=str(ROOT / "results"))
    args = ap.parse_args(argv)
    tools = [t for t in args.tools.split(",") if t]
    known = {"annbatch", "zbatch", "scratch", "buffered", "limit"}
    if set(tools) - known:
        ap.error(f"--tools: unknown {sorted(set(tools) - known)}")
    if not CLI.exists():
        print(f"{CLI} missing: run `make` first", file=sys.stderr)
        return 2
    work = (Path(args.work).resolve() if args.work
            else Path(tempfile.mkdtemp(prefix="zbatch-convert-")))
    work.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    load_start = os.getloadavg()
    try:
        print(f"inputs: {args.cells} cells in {args.files} .h5ad files -> {work}",
              file=sys.stderr, flush=True)
        inputs = make_inputs(work, args.cells, args.files, args.genes, args.seed)
        input_bytes = sum(inputs["bytes"])
        runs = []
        for rnd in range(max(1, args.rounds)):
            order = [t for t in ("annbatch", "zbatch", "scratch", "buffered") if t in tools]
            order = order if rnd % 2 == 0 else order[::-1]
            for tool in order + (["limit"] if "limit" in tools else []):
                print(f"[round {rnd + 1}] {tool} ...", file=sys.stderr, flush=True)
                m = (run_annbatch(args, inputs, work, rnd) if tool == "annbatch" else
                     run_zbatch(args, inputs, work, rnd, limit=tool == "limit",
                                scratch=tool == "scratch", buffered=tool == "buffered"))
                m["round"] = rnd
                runs.append(m)
                print(f"[round {rnd + 1}] {tool}: exit {m['rc']}, {m['wall_s']:.1f} s, peak RSS "
                      f"{m['peak_rss_bytes'] / 2**30:.2f} GiB"
                      + (f" — {m['error'].strip().splitlines()[-1][:160]}" if m.get("error")
                         else ""), file=sys.stderr, flush=True)
        bests = {t: best(runs, t) for t in tools}
        fig = {t: figures(m, args.cells, input_bytes) for t, m in bests.items()}
        rat = ratios(fig)
        print()
        print(f"{args.cells:,} cells in {args.files} files ({input_bytes / 1e9:.2f} GB of .h5ad), "
              f"dataset size {args.dataset_size:,}, zbatch --memory {args.memory} --threads "
              f"{args.threads} --codec {args.codec}")
        print(table(bests, fig, rat))
        mach, vers = machine_and_versions()
        record = {
            "record": "bench/convert.py: zbatch convert next to annbatch add_adatas",
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": ["bench/convert.py", *(sys.argv[1:] if argv is None else argv)],
            "parameters": {k: getattr(args, k) for k in
                           ("cells", "files", "genes", "dataset_size", "memory", "threads",
                            "codec", "seed", "rounds", "tools")},
            "inputs": {k: inputs[k] for k in ("paths", "sizes", "bytes", "nnz", "make_s")},
            "runs": runs, "best": {t: (m or {}).get("round") for t, m in bests.items()},
            "figures": fig, "ratios": rat,
            "targets": {"zbatch_over_annbatch_speed": TARGET_SPEED,
                        "annbatch_over_zbatch_peak_rss": TARGET_MEMORY},
            "machine": dict(mach, loadavg_start=list(load_start),
                            loadavg_end=list(os.getloadavg())),
            "versions": {"zbatch_env": vers,
                         "annbatch_env": next((r["versions"] for r in runs
                                               if r["tool"] == "annbatch" and "versions" in r),
                                              None)},
            "total_s": time.perf_counter() - t_all,
        }
        res = Path(args.results)
        res.mkdir(parents=True, exist_ok=True)
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        path = res / f"convert-{stamp}.json"
        k = 1
        while path.exists():
            path = res / f"convert-{stamp}-{k}.json"
            k += 1
        path.write_text(json.dumps(record, indent=1, default=str))
        print(f"\nrecord: {path}")
        return 0 if all(ok(bests.get(t)) for t in tools) else 1
    finally:
        if not args.work and not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
