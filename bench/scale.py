"""Throughput per sample and peak RSS against dataset size (issue 6: flat within 10% from 10^5
to 10^7 samples; peak RSS independent of the size).

    .venv/bin/python bench/scale.py [--sizes 98304,999424,9994240] [--seconds 3] [--repeat 3]
                                    [--all] [--work DIR] [--keep] [--results DIR]

Small samples, so the 10^7 case fits this machine: a generic-layout store (FORMATS-zbatch.md
§1) of a per-sample float32 row of 16 values (Poisson counts, compressible like expression
data) and an int32 label, written by ``zbatch.write_array`` with 4096-row chunks in shards of
64 chunks, once with the library's default codec and once uncompressed. Every size is read by
``zbatch bench`` with the same sampler, batch (1024), window (4 batches) and threads (2), the
sizes one after the other, --repeat times in alternating order (the median run of each size is
kept, every run is in the record); the table gives samples/s, the ratio to the smallest size,
peak RSS (the largest of the runs), read amplification and the ratio to the decode-only limit.
Settings:

- ``block``: block shuffling with blocks of one chunk (4096 rows), one block per window (rows
  shuffled inside it) — each chunk decoded once per epoch, whatever the size;
- ``sequential``: in order;
- ``random`` over the uncompressed store: every sample from anywhere; the raw path reads only
  the rows drawn. (Random draws over a compressed store decode a whole chunk for a handful of
  rows; the fewer rows of a chunk a window draws, the more it decodes per sample, so its
  throughput falls with the size by construction — measured with ``--all`` and shown apart.)

The default sizes (about 10^5, 10^6 and 10^7) are multiples of 16384 rows, so every run reads
the same shape of windows (other sizes work as well: the block sampler puts its short block in
the epoch's last window, keeping the others aligned with the loader's).

One JSON record per run of this script under --results.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / "build" / "zbatch"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT / "python"))

ROW = 16
CHUNK = 4096
BATCH = 1024  # 4 batches per window: a 10^5 epoch is 24 windows, so the per-epoch refill of
              # the pipeline (the first window of an epoch is not read ahead) stays small
SHARD = 64 * CHUNK


def write_store(path: Path, n: int, codec: str | None, seed: int = 0) -> float:
    import zbatch
    t = time.perf_counter()
    rng = np.random.default_rng(seed)
    x = rng.poisson(2.0, size=(n, ROW)).astype(np.float32)
    label = (np.arange(n) % 50).astype(np.int32)
    path.mkdir(parents=True)
    zbatch.write_array(str(path), "x", x, chunks=CHUNK, shards=SHARD, codec=codec,
                       num_threads=2)
    zbatch.write_array(str(path), "label", label, chunks=CHUNK, shards=SHARD, codec=codec,
                       num_threads=2)
    del x
    (path / "zarr.json").write_text(json.dumps({
        "zarr_format": 3, "node_type": "group",
        "attributes": {"zbatch": {"num_samples": n, "fields": {
            "x": {"array": "x", "kind": "per_sample"},
            "label": {"array": "label", "kind": "per_sample"}}}}}))
    return time.perf_counter() - t


SETTINGS = [  # (name, store, sampler, extra bench arguments)
    ("block", "default", "block", ["--block-size", str(CHUNK), "--blocks-per-window", "1"]),
    ("sequential", "default", "sequential", []),
    ("random", "none", "random", []),
]
EXTRA = [("random-compressed", "default", "random", [])]


def bench(path: Path, sampler: str, extra: list, seconds: float, results: Path) -> dict:
    args = [str(CLI), "bench", str(path), "--sampler", sampler, "--batch", str(BATCH),
            "--prefetch", "4", "--threads", "2", "--seconds", str(seconds), "--obs-column",
            "none", "--json", "--results", str(results), *extra]
    r = subprocess.run(args, check=True, capture_output=True, text=True)
    return json.loads(r.stdout)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="98304,999424,9994240")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeat", type=int, default=3,
                    help="passes over the sizes per setting, alternating forward and backward; "
                         "each size's median is kept (one 4 s run per size moved block by "
                         "up to 18%% between sizes on this shared machine)")
    ap.add_argument("--all", action="store_true", help="also random draws over the compressed store")
    ap.add_argument("--work", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--results", default=str(ROOT / "results"))
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    settings = SETTINGS + (EXTRA if args.all else [])
    samplers = [s[0] for s in settings]
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="zbatch-scale-"))
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        stores = {}
        for n in sizes:
            for kind, codec in (("default", None), ("none", "none")):
                p = work / f"scale-{n}-{kind}.zarr"
                if not p.exists():
                    s = write_store(p, n, codec)
                    print(f"wrote {n:,} samples ({kind}) in {s:.1f} s -> {p}", file=sys.stderr,
                          flush=True)
                stores[(n, kind)] = p
        for sampler, kind, smp, extra in settings:
            runs = {n: [] for n in sizes}
            for k in range(max(1, args.repeat)):
                for n in (sizes if k % 2 == 0 else sizes[::-1]):
                    rec = bench(stores[(n, kind)], smp, extra, args.seconds,
                                results / "scale-runs")
                    runs[n].append(rec["figures"])
                    print(f"  {sampler:17} {n:>11,}  "
                          f"{rec['figures']['samples_per_s']:>12,.0f} samples/s",
                          file=sys.stderr, flush=True)
            for n in sizes:
                fs = sorted(runs[n], key=lambda f: f["samples_per_s"])
                f = fs[len(fs) // 2]  # the median run (the upper one of an even count)
                d = f.get("decode_only") or {}
                rows.append({"sampler": sampler, "store": kind, "samples": n,
                             "samples_per_s": f["samples_per_s"],
                             "samples_per_s_runs": [x["samples_per_s"] for x in runs[n]],
                             # the largest of the runs: RSS must not grow with the size
                             "peak_rss_bytes": max(x["peak_rss_bytes"] for x in runs[n]),
                             "peak_anon_rss_bytes": max((x.get("peak_anon_rss_bytes") or 0)
                                                        for x in runs[n]),
                             "amplification": f["amplification"],
                             "decode_only_ratio": d.get("ratio"),
                             "page_faults_per_batch": f["page_faults_per_batch"]})
        print(f"\n{'setting':17} {'samples':>11} {'samples/s':>12} {'vs smallest':>11} "
              f"{'RSS anon':>10} {'RSS all':>10} {'amplif.':>8} {'vs decode-only':>14}")
        for sampler in samplers:
            base = next(r for r in rows if r["sampler"] == sampler)
            for r in (r for r in rows if r["sampler"] == sampler):
                r["ratio_to_smallest"] = r["samples_per_s"] / base["samples_per_s"]
                r["rss_ratio_to_smallest"] = r["peak_rss_bytes"] / base["peak_rss_bytes"]
                dr = r["decode_only_ratio"]
                print(f"{sampler:17} {r['samples']:>11,} {r['samples_per_s']:>12,.0f} "
                      f"{r['ratio_to_smallest']:>11.2f} "
                      f"{(r['peak_anon_rss_bytes'] or 0) / 2**20:>8.1f}Mi "
                      f"{r['peak_rss_bytes'] / 2**20:>8.1f}Mi {r['amplification']:>8.2f} "
                      f"{dr if dr is None else round(dr, 2):>14}")
        flat = {s: max(abs(r["ratio_to_smallest"] - 1) for r in rows if r["sampler"] == s)
                for s in samplers}
        print("\nlargest deviation from the smallest size: "
              + ", ".join(f"{s} {100 * v:.1f}%" for s, v in flat.items())
              + " (target: within 10%)")
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = results / f"scale-{stamp}.json"
        out.write_text(json.dumps({
            "record": "bench/scale.py: throughput and peak RSS against dataset size",
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": ["bench/scale.py", *(argv if argv is not None else sys.argv[1:])],
            "parameters": {"sizes": sizes, "settings": [list(x[:3]) + [x[3]] for x in settings],
                           "seconds": args.seconds, "repeat": args.repeat, "row": ROW, "chunk_rows": CHUNK,
                           "shard_rows": SHARD, "batch": BATCH, "prefetch": 4, "threads": 2},
            "rows": rows, "max_deviation": flat}, indent=1))
        print(f"record: {out}")
        return 0
    finally:
        if not args.keep and not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
