"""`make demo`: the main job on a generated dataset, in about a minute.

1. synthesises a Tahoe-like AnnData store (`zbatch synth --kind cells`, sharded like Tahoe-100M);
2. runs the zbatch loader over it with the block sampler and with random sampling
   (`zbatch bench`), next to the decode-only limit of the same chunks measured in the same run;
3. runs three peers briefly on the same cells (scDataset over backed h5ad, zarr-python with
   the zarrs codec pipeline and a torch DataLoader, and annbatch's Loader at its best setting
   found by bench/annbatch_loader.py, run in .venv-annbatch; skipped with a message when that
   environment is missing);
4. prints a short table: zbatch, the decode-only limit, the peers, the ratios.

    .venv/bin/python scripts/demo.py [--cells N] [--seconds S]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = os.path.join(ROOT, "build", "zbatch")
sys.path.insert(0, ROOT)


def progress(step, total, text):
    print(f"[{step}/{total}] {text}", flush=True)


def bench(store, sampler, seconds, results):
    r = subprocess.run([CLI, "bench", store, "--sampler", sampler, "--batch", "1024", "--prefetch",
                        "4", "--threads", "2", "--seconds", str(seconds), "--results", results,
                        "--json"], check=True, capture_output=True, text=True)
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", type=int, default=30000)
    ap.add_argument("--seconds", type=float, default=6)
    args = ap.parse_args()
    work = os.path.join(ROOT, "build", "demo")
    results = os.path.join(ROOT, "results")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    os.makedirs(results, exist_ok=True)
    store = os.path.join(work, "cells.zarr")
    steps = 5
    t0 = time.time()

    progress(1, steps, f"synthesising {args.cells} Tahoe-like cells (62,710 genes) ...")
    r = subprocess.run([CLI, "synth", "--kind", "cells", "--n", str(args.cells), "-o", store,
                        "--seed", "0", "--shard-nnz", str(1 << 23)], check=True,
                       capture_output=True, text=True)
    print("      " + r.stdout.strip().splitlines()[-1], flush=True)

    progress(2, steps, f"zbatch, block sampler, {args.seconds:g} s ...")
    block = bench(store, "block", args.seconds, results)
    progress(3, steps, f"zbatch, random sampling, {args.seconds:g} s ...")
    rand = bench(store, "random", args.seconds, results)

    rows = []
    for name, rec in (("zbatch block", block), ("zbatch random", rand)):
        f = rec["figures"]
        d = f.get("decode_only") or {}
        w = f.get("decode_write") or {}
        rows.append((name, f["samples_per_s"], f["amplification"], d.get("samples_per_s"),
                     d.get("ratio"), w.get("ratio")))

    progress(4, steps, "peers on the same cells (h5ad written by anndata; annbatch on the store) ...")
    peers = []
    try:
        import anndata as ad
        h5ad = os.path.join(work, "cells.h5ad")
        ad.read_zarr(store).write_h5ad(h5ad)
        from bench.peers import scdataset_peer, zarrs_peer
        for label, fn, data, kw in (
                ("scDataset (backed h5ad, block)", scdataset_peer.run, h5ad, {}),
                ("zarr-python + zarrs + torch (blocks)", zarrs_peer.run, store,
                 {"pattern": "blocks"})):
            try:
                res = fn(data, batch_size=1024, seconds=args.seconds, num_workers=2, **kw)
                peers.append((label, res["samples_per_s"]))
            except Exception as e:  # a peer that cannot run is reported, not fatal
                peers.append((label, f"skipped: {type(e).__name__}: {e}"[:80]))
    except Exception as e:
        peers.append(("peers", f"skipped: {type(e).__name__}: {e}"[:80]))
    from bench.peers import annbatch_peer
    cs, pn = annbatch_peer.BEST
    label = f"annbatch Loader (cs={cs}, pn={pn}, CSR)"
    if not annbatch_peer.available():
        peers.append((label, "skipped: .venv-annbatch missing (annbatch needs Python 3.12; "
                             "`make` makes it)"))
    else:
        try:
            res = annbatch_peer.run(store, batch_size=1024, seconds=args.seconds, num_workers=2,
                                    chunk_size=cs, preload_nchunks=pn)
            peers.append((label, res["samples_per_s"]))
        except Exception as e:  # a peer that cannot run is reported, not fatal
            peers.append((label, f"skipped: {type(e).__name__}: {e}"[:80]))

    progress(5, steps, f"done in {time.time() - t0:.0f} s\n")
    print(f"{'loader':40} {'samples/s':>12} {'amplif.':>8} {'decode-only':>12} {'ratio':>6}"
          f" {'ratio to decode + write':>24}")
    for name, sps, amp, lim, ratio, wratio in rows:
        print(f"{name:40} {sps:12,.0f} {amp:8.2f} {lim or 0:12,.0f} {ratio or 0:6.2f}"
              f" {wratio or 0:24.2f}")
    best = block["figures"]["samples_per_s"]
    for label, sps in peers:
        if isinstance(sps, str):
            print(f"{label:40} {sps}")
        else:
            print(f"{label:40} {sps:12,.0f}  zbatch block is {best / sps:,.1f}x faster")
    print(f"\nJSON records with every parameter: {results}/")


if __name__ == "__main__":
    main()
