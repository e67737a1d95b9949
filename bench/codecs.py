"""Codec defaults by measurement: size on disk and decode speed of each candidate codec on the
same synthetic Tahoe-like cells, measured side by side in one run.

    .venv/bin/python bench/codecs.py [--n 20000] [--threads 2]

For each codec it runs `zbatch synth --kind cells` with that codec, then the read_many
benchmark (sorted ids) which also reports the decode-only limit of the same chunks. Prints a
table: codec, bytes on disk, compression ratio, decode-only GB/s, read_many GB/s.
"""
import argparse
import json
import os
import shutil
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = os.path.join(ROOT, "build", "zbatch")
BENCH = os.path.join(ROOT, "build", "bench_read_many")
CODECS = ["none", "lz4", "blosc:lz4:5:shuffle", "blosc:lz4:3:shuffle", "blosc:zstd:3:shuffle",
          "zstd:1", "zstd:3", "gzip:1"]


def du(path):
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(d, f))
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--codecs", default=",".join(CODECS))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="zbatch-codecs-")
    rows = []
    try:
        for codec in args.codecs.split(","):
            out = os.path.join(tmp, codec.replace(":", "_") + ".zarr")
            subprocess.run([CLI, "synth", "--kind", "cells", "--n", str(args.n), "-o", out,
                            "--seed", "1", "--codec", codec, "--data-dtype", "float32",
                            "--index-dtype", "int32"],  # the store the codec table measured
                           check=True, capture_output=True)
            r = subprocess.run([BENCH, out, "--batch", "2048", "--batches", "6", "--threads",
                                str(args.threads), "--patterns", "sorted"], check=True,
                               capture_output=True, text=True)
            rec = json.loads(r.stdout.strip().splitlines()[-1])
            rows.append((codec, du(out), rec["decode_only_gb_s"], rec["decoded_gb_s"]))
            shutil.rmtree(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    raw = next((r[1] for r in rows if r[0] == "none"), None)
    print(f"{'codec':24} {'bytes':>12} {'ratio':>7} {'decode-only GB/s':>17} "
          f"{'read_many GB/s':>15}")
    for codec, size, dec, rm in rows:
        ratio = f"{raw / size:.2f}" if raw else "-"
        print(f"{codec:24} {size:12d} {ratio:>7} {dec:17.3f} {rm:15.3f}")


if __name__ == "__main__":
    main()
