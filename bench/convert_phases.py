"""CPU seconds of each phase of `zbatch convert`, for builds compared side by side.

    .venv/bin/python bench/convert_phases.py --rounds 3 [--work /tmp/bc] \
        [--cli build/zbatch --cli /other/build/zbatch] [-- EXTRA CONVERT FLAGS]

Runs each CLI's conversion of the inputs bench/convert.py made (WORK/input_*.h5ad), alternating
between the CLIs round by round, with bench/convert.py's flags (--dataset-size 2^21 --memory
1GiB --threads 2 --codec blosc:lz4:3:shuffle). The process's user and system time are read from
/proc when each phase's progress line says it finished ("took"), so each phase gets the CPU
time spent since the previous one (plan included in prepare's). On a shared machine CPU seconds
move far less than wall times (docs/PERFORMANCE.md, "Conversion to a pre-shuffled collection").
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLAGS = ["--dataset-size", "2097152", "--memory", "1GiB", "--threads", "2",
         "--codec", "blosc:lz4:3:shuffle"]


def cpu_of(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def run(cli: str, inputs: list[str], out: Path, extra: list[str]) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    p = subprocess.Popen([cli, "convert", *inputs, "-o", str(out), *FLAGS, *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    phases, last, seen = {}, (0.0, 0.0), (0.0, 0.0)
    for line in p.stderr:
        try:
            seen = cpu_of(p.pid)
        except OSError:
            pass
        if "took" in line:
            name = line.split()[0]
            phases[name] = {"user": round(seen[0] - last[0], 2),
                            "sys": round(seen[1] - last[1], 2)}
            last = seen
    p.stdout.read()
    rc = p.wait()
    shutil.rmtree(out, ignore_errors=True)
    return {"rc": rc, "wall_s": round(time.perf_counter() - t0, 2), "phases": phases}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cli", action="append", help="a zbatch CLI (repeat to compare builds)")
    ap.add_argument("--work", default="/tmp/bc", help="bench/convert.py's work directory")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("extra", nargs="*", help="more `zbatch convert` flags (after --)")
    a = ap.parse_args()
    clis = a.cli or [str(ROOT / "build" / "zbatch")]
    inputs = sorted(str(p) for p in Path(a.work).glob("input_*.h5ad"))
    if not inputs:
        raise SystemExit(f"no {a.work}/input_*.h5ad: run bench/convert.py --work {a.work} first")
    for r in range(a.rounds):
        for cli in clis:
            res = run(cli, inputs, Path(a.work) / "phases.zarr", a.extra)
            load = os.getloadavg()[0]
            print(json.dumps({"round": r, "cli": cli, "load": round(load, 1), **res}), flush=True)


if __name__ == "__main__":
    main()
