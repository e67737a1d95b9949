"""What one epoch moves: bytes decoded locally against bytes fetched over HTTP (issue 17).

    .venv/bin/python bench/remote_fetch.py [--cells N] [--samplers block,random] [--epochs E]
                                           [--batch-size B] [--prefetch P] [--threads T]
                                           [--coalesce-gap BYTES] [--fetch-cache-bytes BYTES]
                                           [--latency-ms MS] [--work DIR] [--json FILE]

The same store (``zbatch synth --kind cells``), the same sampler and windows as bench/remote.py's
loader (``batch_size x prefetch_factor`` samples a window, ``block_size`` 16), each window read by
one ``read_many`` (what the loader does per window), for ``--epochs`` epochs: once on the store's
directory, once over ``http://`` from an nginx on loopback (``--latency-ms`` added to every
request by nginx's ``echo_sleep``; none by default). Per row:

- bytes decoded, bytes fetched (the reader's counters) and CPU seconds (user + sys of this
  process, every thread, over the read_many calls only) per delivered sample;
- over HTTP, from nginx's access log: requests (GET / HEAD), body bytes per sample, bytes per
  request, nginx's CPU seconds per sample (its processes' user + sys from /proc);
- epoch 0 (cold) and the later epochs (warm) apart: samples/s, CPU microseconds and bytes
  received over the network (the store's counter) per sample;
- how often each fetched inner chunk of ``X/data`` and ``X/indices`` was fetched over the epochs
  (a chunk counts as fetched by a request whose range covers all of its bytes, found through the
  shard indexes), and the bytes fetched that no delivered sample needed (fetched / the distinct
  chunk bytes).

Batches over HTTP are compared with the local ones (equal, or the script fails).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT / "python", ROOT / "tests" / "python"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

BLOCK_SIZE = 16


def proc_cpu(pids) -> float:
    """User + sys CPU seconds of processes `pids` (from /proc/PID/stat)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def nginx_pids(master: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout
    return [master] + [int(x) for x in out.split()]


def shard_chunks(store: Path, array: str) -> dict:
    """{(path, offset, nbytes)} of every inner chunk of a sharded 1-d array, from its shards'
    indexes (index at the end, crc32c after it)."""
    meta = json.loads((store / array / "zarr.json").read_text())
    cfg = meta["codecs"][0]["configuration"]
    per = meta["chunk_grid"]["configuration"]["chunk_shape"][0] // cfg["chunk_shape"][0]
    out = []
    for f in sorted((store / array / "c").iterdir(), key=lambda p: int(p.name)):
        raw = f.read_bytes()
        idx = np.frombuffer(raw[len(raw) - 16 * per - 4:len(raw) - 4], dtype="<u8").reshape(-1, 2)
        path = f"/cells.zarr/{array}/c/{f.name}"
        out += [(path, int(o), int(n)) for o, n in idx if o != 2**64 - 1]
    return out


def windows(sampler: str, n: int, batch_size: int, prefetch: int, epoch: int, seed: int):
    from zbatch.samplers import make_sampler
    kw = {"block_size": BLOCK_SIZE, "blocks_per_window": -(-16 * batch_size // BLOCK_SIZE)} \
        if sampler == "block" else {}
    sm = make_sampler(sampler, n=n, batch_size=batch_size, seed=seed, **kw)
    sm.set_epoch(epoch)
    batches = [np.asarray(b, dtype=np.int64) for b in sm]
    for w in range(0, len(batches), prefetch):
        yield np.concatenate(batches[w:w + prefetch])


def one(target: str, sampler: str, args, server=None, chunks=None, want=None) -> dict:
    import zbatch
    so = {"coalesce_gap": args.coalesce_gap} if server and args.coalesce_gap is not None else None
    kw = {} if args.fetch_cache_bytes is None else {"fetch_cache_bytes": args.fetch_cache_bytes}
    ds = zbatch.open(target, num_threads=args.threads, storage_options=so, **kw)
    n = len(ds)
    tot = Counter()
    got = []
    since = server.log_offset() if server else 0
    ng0 = proc_cpu(nginx_pids(server._proc.pid)) if server else 0.0
    # epoch 0 (cold: nothing fetched yet) and the later epochs (warm) counted apart
    phases = [Counter(), Counter()]
    for e in range(args.epochs):
        ph = phases[min(e, 1)]
        b0 = ds.store_stats()["bytes"]
        for ids in windows(sampler, n, args.batch_size, args.prefetch, e, args.seed):
            # only the read is timed (the comparison below is not)
            t0, c0 = time.perf_counter(), time.process_time()
            b = ds.read_many(ids)
            ph["cpu"] += time.process_time() - c0
            ph["seconds"] += time.perf_counter() - t0
            for k, v in b.stats.items():
                tot[k] += int(v)
            tot["samples"] += len(ids)
            ph["samples"] += len(ids)
            if want is not None or len(got) < 2:
                x = b["X"].tocsr()
                got.append((x.indptr.copy(), x.indices.copy(), x.data.copy()))
        ph["net"] += ds.store_stats()["bytes"] - b0
    s = tot["samples"]
    row = {"target": "http" if server else "local", "sampler": sampler, "samples": s,
           "seconds": sum(p["seconds"] for p in phases),
           "cpu_s_per_sample": sum(p["cpu"] for p in phases) / s,
           "decoded_per_sample": tot["bytes_decoded"] / s,
           "fetched_per_sample": tot["bytes_fetched"] / s,
           "delivered_per_sample": tot["bytes_delivered"] / s,
           "range_reads": tot["range_reads"], "chunks_decoded": tot["chunks_decoded"]}
    for name, p in zip(("cold", "warm"), phases):
        if p["samples"]:
            row[name] = {"samples": p["samples"], "samples_per_s": p["samples"] / p["seconds"],
                         "cpu_us_per_sample": p["cpu"] / p["samples"] * 1e6,
                         "net_bytes_per_sample": p["net"] / p["samples"]}
    if want is not None:
        for a, b in zip(want, got):
            for u, v in zip(a, b):
                if not np.array_equal(u, v):
                    raise SystemExit(f"{sampler}: batches over HTTP differ from local ones")
    if server:
        row["nginx_cpu_s_per_sample"] = (proc_cpu(nginx_pids(server._proc.pid)) - ng0) / s
        row["store"] = ds.store_stats()
        time.sleep(0.2)  # the access log is written as each request ends
        recs = server.requests(since)
        gets = [r for r in recs if r.method == "GET"]
        row["requests"] = len(recs)
        row["heads"] = sum(r.method == "HEAD" for r in recs)
        row["body_bytes_per_sample"] = sum(r.nbytes for r in gets) / s
        row["bytes_per_request"] = sum(r.nbytes for r in gets) / max(1, len(gets))
        row.update(chunk_fetches(gets, chunks))
    return row, got


def chunk_fetches(gets, chunks) -> dict:
    """How many requests covered each inner chunk; fetched bytes of X against distinct chunk
    bytes."""
    by_path = {}
    for path, o, nb in chunks:
        by_path.setdefault(path, []).append((o, nb))
    count = Counter()
    x_bytes = 0
    for r in gets:
        if r.path not in by_path:
            continue
        x_bytes += r.nbytes
        if r.range.startswith("bytes=-"):
            continue  # a shard index (the shard's last bytes): no chunk
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", r.range)
        lo, hi = (int(m[1]), int(m[2]) + 1) if m else (0, 1 << 62)
        for o, nb in by_path[r.path]:
            if lo <= o and o + nb <= hi and nb:
                count[(r.path, o)] += 1
    sizes = {(p, o): nb for p, o, nb in chunks}
    distinct = sum(sizes[k] for k in count)
    hist = Counter(count.values())
    return {"chunks_fetched": len(count), "chunk_fetches": sum(count.values()),
            "fetches_per_chunk": sum(count.values()) / max(1, len(count)),
            "fetch_count_histogram": dict(sorted(hist.items())),
            "x_bytes_fetched": x_bytes, "x_distinct_chunk_bytes": distinct,
            "x_overfetch": x_bytes / max(1, distinct)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", type=int, default=20000)
    ap.add_argument("--samplers", default="block,random")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--prefetch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--coalesce-gap", type=int, default=None,
                    help="the HTTP store's coalesce_gap (storage_options); default: its own")
    ap.add_argument("--fetch-cache-bytes", type=int, default=None,
                    help="the datasets' fetch_cache_bytes; default: zbatch's own")
    ap.add_argument("--latency-ms", type=float, default=0.0,
                    help="added to every request by nginx (echo_sleep)")
    ap.add_argument("--work", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import remote_servers as rs
    work = Path(args.work or tempfile.mkdtemp(prefix="zb-remote-fetch-"))
    work.mkdir(parents=True, exist_ok=True)
    store = work / "cells.zarr"
    if not store.exists():
        subprocess.run([str(ROOT / "build" / "zbatch"), "synth", "--kind", "cells", "--n",
                        str(args.cells), "-o", str(store), "--seed", str(args.seed),
                        "--threads", "2"], check=True)
    chunks = shard_chunks(store, "X/data") + shard_chunks(store, "X/indices")
    rows = []
    with rs.NginxServer(work, latency_ms=args.latency_ms) as srv:
        for sampler in [s for s in args.samplers.split(",") if s]:
            local, want = one(str(store), sampler, args)
            remote, _ = one(srv.url + "/cells.zarr", sampler, args, srv, chunks, want)
            rows += [local, remote]
    hdr = (f"{'sampler':<7} {'target':<6} {'decoded/s.':>10} {'fetched/s.':>10} "
           f"{'body/s.':>9} {'requests':>8} {'HEAD':>5} {'KiB/req':>8} {'fetch/chunk':>11} "
           f"{'overfetch':>9} {'CPU us/s.':>9} {'nginx us/s.':>11}")
    print(hdr)
    for r in rows:
        http = r["target"] == "http"
        print(f"{r['sampler']:<7} {r['target']:<6} {r['decoded_per_sample']:>10.0f} "
              f"{r['fetched_per_sample']:>10.0f} "
              + (f"{r['body_bytes_per_sample']:>9.0f} {r['requests']:>8d} {r['heads']:>5d} "
                 f"{r['bytes_per_request'] / 1024:>8.1f} {r['fetches_per_chunk']:>11.2f} "
                 f"{r['x_overfetch']:>9.2f} " if http else f"{'':>9} {'':>8} {'':>5} {'':>8} "
                 f"{'':>11} {'':>9} ")
              + f"{r['cpu_s_per_sample'] * 1e6:>9.2f} "
              + (f"{r['nginx_cpu_s_per_sample'] * 1e6:>11.2f}" if http else ""))
    print(f"\n{'sampler':<7} {'target':<6} {'phase':<5} {'samples/s':>10} {'CPU us/sample':>13} "
          f"{'net B/sample':>12}")
    for r in rows:
        for name in ("cold", "warm"):
            if name in r:
                p = r[name]
                print(f"{r['sampler']:<7} {r['target']:<6} {name:<5} {p['samples_per_s']:>10.0f} "
                      f"{p['cpu_us_per_sample']:>13.2f} {p['net_bytes_per_sample']:>12.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
