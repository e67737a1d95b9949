"""Loading over HTTP with latency added to every request, side by side (issue 17).

    .venv/bin/python bench/remote.py [--cells N] [--seconds S] [--latencies 0,5,25]
                                     [--samplers block,random] [--batch-size B] [--threads T]
                                     [--http-threads T,...] [--zarr-workers W,...]
                                     [--epochs E] [--rounds R]
                                     [--no-proxy-check] [--results DIR] [--work DIR] [--keep]
                                     [--quick]

Data: a Tahoe-like cells store (``zbatch synth --kind cells``, the library's default codec and
sharding, consolidated metadata) in a work directory, served by nginx on loopback
(tests/python/remote_servers.py): one nginx per latency, the latency added to every request by
nginx's echo module (``echo_sleep``) before the file handler answers the range request.

Rows, each measured in a fresh Python process for ``--seconds`` of steady state (epochs restart
when the data runs out; the startup, up to the first batch, is reported apart):
- ``zbatch local``: ``zbatch.DataLoader`` on the store's directory;
- ``zbatch http``: the same loader on ``http://127.0.0.1:PORT/cells.zarr`` at each latency, at
  ``--threads`` and at each of ``--http-threads`` (a row whose child fails reports the error
  instead of a figure);
- ``zarr http``: what a user would write with zarr-python 3 and its recommended remote store:
  ``zarr.storage.FsspecStore.from_url`` (fsspec's HTTP filesystem over aiohttp), a map-style
  torch ``Dataset`` whose ``__getitem__`` reads one row of X (``X/indptr`` read once per worker,
  then the row's slices of ``X/data`` and ``X/indices``), and a ``torch.utils.data.DataLoader``
  with ``--zarr-workers`` worker processes (one row per count; the targets use the best), batch size ``--batch-size``, CSR batches
  (``scipy.sparse.csr_matrix``) collated from the rows. ``random``: ``shuffle=True``;
  ``block``: a sampler that yields the rows of blocks of 16 contiguous rows, blocks in a random
  order (the block sampler's order).
Both loaders deliver the same CSR batches (checked for a fixed id list before timing).

Per row: samples/s, and from nginx's access log over the measured window: requests/s, body bytes
per request, and requests in flight (time-weighted mean and maximum).

With ``--epochs E`` the zbatch rows are epochs instead (the zarr-python rows stay timed windows:
an epoch of theirs takes minutes): each child opens the dataset and runs the loader for E whole
epochs; the first epoch is timed from before ``zbatch.open`` to its last batch (everything
fetched for the first time, the startup included), the later ones ("cached": the fetch cache
holds the store) from their first ``set_epoch`` to their last batch, each with the request
figures of its own time span. The first epoch is also split in two: "open" (``zbatch.open`` and
the loader made) and "startup" (from before the open to the first batch: the open's and the first
window's round trips, which no concurrency hides), and "steady" (the samples after the first
batch over the time after it: the epoch's throughput as a rate, its request figures from that
span); use a store whose epoch takes seconds (``--cells 200000``) so that the steady part is most
of it. ``--rounds R`` repeats the local row and the http rows of every
latency R times, alternating (local, http at each latency, local, ...), so load on a shared
machine falls on both; the ratios use the medians over the rounds. Targets (issue 17): at 25
ms, zbatch over HTTP >= 0.8x zbatch local, and >= 10x zarr-python over the same URL.

The proxy check (off with ``--no-proxy-check``): the fault proxy of the tests measured alone,
with no fault set, in front of the 0 ms nginx, against nginx directly, by the same client
(aiohttp, 64 requests in flight, the zbatch rows' bytes per request), then with the largest
latency added by nginx and by the proxy, with aiohttp and with zbatch's ``read_many`` (64
threads) as the client: it shows what the tests' proxy can carry.

Output: a table and one JSON record in ``--results`` (default ``results/``): parameters, every
figure, package versions and the machine.
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
for p in (ROOT, ROOT / "tests" / "python"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

BLOCK_SIZE = 16
TARGET_LOCAL = 0.8
TARGET_ZARR = 10.0


# ------------------------------------------------------------------------------------------------
# The zarr-python peer: a map-style Dataset over zarr.storage.FsspecStore, a torch DataLoader
# ------------------------------------------------------------------------------------------------
class ZarrRows:
    """Rows of the CSR matrix X of an anndata Zarr store at a URL, one ``__getitem__`` per row,
    read through zarr-python 3 and fsspec's HTTP filesystem. Opened lazily in each process (the
    DataLoader's workers are forked)."""

    def __init__(self, url: str, n_rows: int, n_cols: int):
        self.url, self.n_rows, self.n_cols = url, n_rows, n_cols
        self._pid = None

    def __len__(self):
        return self.n_rows

    def _open(self):
        if self._pid == os.getpid():
            return
        import zarr
        store = zarr.storage.FsspecStore.from_url(self.url, read_only=True)
        x = zarr.open_group(store, mode="r")["X"]
        self.data, self.indices = x["data"], x["indices"]
        self.indptr = x["indptr"][:]  # once per worker: what a careful user would do
        self._pid = os.getpid()

    def __getitem__(self, i):
        self._open()
        a, b = int(self.indptr[i]), int(self.indptr[i + 1])
        return self.data[a:b], self.indices[a:b]


class CsrCollate:
    """Rows (data, indices) -> one ``scipy.sparse.csr_matrix`` batch (the DataLoader's
    collate_fn)."""

    def __init__(self, n_cols: int):
        self.n_cols = n_cols

    def __call__(self, rows):
        import scipy.sparse as sp
        indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum([len(d) for d, _ in rows], out=indptr[1:])
        data = np.concatenate([d for d, _ in rows])
        indices = np.concatenate([ix for _, ix in rows])
        return sp.csr_matrix((data, indices, indptr), shape=(len(rows), self.n_cols))


class BlockOrder:
    """The rows of blocks of ``block_size`` contiguous rows, the blocks in a random order per
    epoch (a torch Sampler: ``__iter__`` and ``__len__``)."""

    def __init__(self, n: int, block_size: int, seed: int):
        self.n, self.block_size, self.seed, self.epoch = n, block_size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self):
        return self.n

    def __iter__(self):
        starts = np.arange(0, self.n, self.block_size)
        rng = np.random.default_rng((self.seed, self.epoch))
        for s in rng.permutation(starts):
            yield from range(int(s), min(self.n, int(s) + self.block_size))


def zarr_loader(url: str, shape, batch_size: int, sampler: str, workers: int, seed: int):
    import torch
    from torch.utils.data import DataLoader
    ds = ZarrRows(url, shape[0], shape[1])
    order = BlockOrder(shape[0], BLOCK_SIZE, seed) if sampler == "block" else None
    gen = torch.Generator().manual_seed(seed)
    return order, DataLoader(ds, batch_size=batch_size, shuffle=order is None, sampler=order,
                             generator=gen if order is None else None, num_workers=workers,
                             collate_fn=CsrCollate(shape[1]), persistent_workers=workers > 0,
                             prefetch_factor=2 if workers > 0 else None)


# ------------------------------------------------------------------------------------------------
# One measurement (run in a child process: `remote.py _one SPEC`)
# ------------------------------------------------------------------------------------------------
def zbatch_loader(target: str, batch_size: int, sampler: str, threads: int, seed: int):
    """bench/run.py's zbatch loader (bench/peers/zbatch_peer.py), CSR out, on a path or URL."""
    from bench.peers.zbatch_peer import loader
    _ds, dl, config = loader(target, batch_size, num_workers=threads, output="csr", seed=seed,
                             sampler=sampler, block_size=BLOCK_SIZE, fetch_factor=16,
                             prefetch_factor=16)
    return dl, config


def run_one(spec: dict) -> dict:
    from bench.peers import measure
    shape = tuple(spec["shape"])
    if spec["tool"] == "zbatch":
        dl, config = zbatch_loader(spec["target"], spec["batch_size"], spec["sampler"],
                                   spec["threads"], spec["seed"])

        def epoch(e):
            dl.set_epoch(e)
            return dl
        close = dl.close
    else:
        order, dl = zarr_loader(spec["target"], shape, spec["batch_size"], spec["sampler"],
                                spec["zarr_workers"], spec["seed"])
        config = {"tool": "zarr-python", "store": "zarr.storage.FsspecStore (fsspec HTTP)",
                  "num_workers": spec["zarr_workers"], "sampler": spec["sampler"]}

        def epoch(e):
            if order is not None:
                order.set_epoch(e)
            return dl
        close = None
    m = measure(epoch, spec["seconds"], lambda b: (b if hasattr(b, "shape") else b["X"]).shape[0])
    t_end = time.time()
    if close is not None:
        close()
    m["window"] = [t_end - m["seconds"], t_end]
    m["config"] = config
    return m


def run_epochs(spec: dict) -> dict:
    """The zbatch loader for spec["epochs"] whole epochs from a fresh open: per epoch its
    samples and its span (time.time(), for the access log): the first from before the open
    (the modules imported first: their import is no part of it)."""
    import scipy.sparse  # noqa: F401
    import torch  # noqa: F401  (the DataLoader imports it: seconds)
    import bench.peers.zbatch_peer  # noqa: F401
    t_open = time.time()
    dl, config = zbatch_loader(spec["target"], spec["batch_size"], spec["sampler"],
                               spec["threads"], spec["seed"])
    open_s = time.time() - t_open
    epochs = []
    for e in range(spec["epochs"]):
        t0 = t_open if e == 0 else time.time()
        dl.set_epoch(e)
        n, t_first, n_first = 0, None, 0
        for b in dl:
            n += b.shape[0] if hasattr(b, "shape") else b["X"].shape[0]
            if t_first is None:
                t_first, n_first = time.time(), n
        t_end = time.time()
        # the steady rate: the samples after the first batch over the time after it (the
        # startup, up to the first batch, apart: the open's and the first window's round trips)
        epochs.append({"samples": n, "span": [t0, t_end], "startup_s": t_first - t0,
                       "steady_span": [t_first, t_end],
                       "steady_per_s": (n - n_first) / max(t_end - t_first, 1e-9)})
    dl.close()
    return {"epochs": epochs, "config": config, "open_s": open_s}


def read_ids_one(spec: dict) -> dict:
    """The CSR rows of spec["ids"] through the tool (for the content check)."""
    ids = np.asarray(spec["ids"], dtype=np.int64)
    if spec["tool"] == "zbatch":
        import zbatch
        x = zbatch.open(spec["target"], num_threads=2).read_many(ids)["X"]
    else:
        ds = ZarrRows(spec["target"], *spec["shape"])
        x = CsrCollate(spec["shape"][1])([ds[int(i)] for i in ids])
    x = x.tocsr()
    return {"indptr": x.indptr.tolist(), "indices": x.indices.tolist(), "data": x.data.tolist()}


def child(spec: dict, timeout: float) -> dict:
    """Runs `spec` in a fresh interpreter; returns its JSON answer or {"error": ...}."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "_one", json.dumps(spec)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "python")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                  if p]))
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        how = (f"killed by signal {-out.returncode}" if out.returncode < 0
               else f"exit status {out.returncode}")
        tail = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": f"{how}: {tail[:300]}"}
    return json.loads(lines[-1])


# ------------------------------------------------------------------------------------------------
# The proxy measured alone
# ------------------------------------------------------------------------------------------------
def proxy_check(nginx_url: str, path: str, size: int, nbytes: int, seconds: float,
                slow_url: str | None = None, latency_ms: float = 0.0,
                concurrency: int = 64) -> dict:
    """Requests/s and MB/s of `concurrency` clients doing range GETs of `nbytes` for `seconds`,
    straight to nginx and through the fault proxy (no fault set); then, if `slow_url` (an nginx
    adding `latency_ms`) is given, that nginx against the proxy adding the same latency."""
    import asyncio

    import aiohttp

    import remote_servers as rs

    async def load(base: str) -> dict:
        rng = np.random.default_rng(0)
        n = got = 0
        deadline = time.perf_counter() + seconds
        conn = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=conn) as s:
            async def worker():
                nonlocal n, got
                while time.perf_counter() < deadline:
                    a = int(rng.integers(0, max(1, size - nbytes)))
                    async with s.get(base + path,
                                     headers={"Range": f"bytes={a}-{a + nbytes - 1}"}) as r:
                        body = await r.read()
                        assert r.status == 206 and len(body) == nbytes, r.status
                    n += 1
                    got += len(body)
            t = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            wall = time.perf_counter() - t
        return {"requests_per_s": n / wall, "mb_per_s": got / wall / 1e6}

    out = {"concurrency": concurrency, "bytes_per_request": nbytes,
           "direct": asyncio.run(load(nginx_url))}
    with rs.FaultProxy(nginx_url) as proxy:
        out["proxy"] = asyncio.run(load(proxy.url))
        st = proxy.stats()
        out["proxy"]["in_flight_max"] = st["in_flight_max"]
        out["proxy"]["injected"] = sum(st["injected"].values())
    if slow_url is not None:
        # The same latency added by nginx (echo_sleep) and by the proxy: at `concurrency` in
        # flight, both should carry concurrency / latency requests a second.
        out["direct_latency"] = asyncio.run(load(slow_url))
        with rs.FaultProxy(nginx_url, latency_s=latency_ms / 1000) as proxy:
            out["proxy_latency"] = asyncio.run(load(proxy.url))
            out["proxy_latency"]["in_flight_max"] = proxy.stats()["in_flight_max"]
        out["latency_ms"] = latency_ms
        out["ideal_requests_per_s"] = concurrency / (latency_ms / 1000)
    return out


def proxy_check_zbatch(store_url_slow: str, nginx_url: str, store_name: str, n_rows: int,
                       latency_ms: float, threads: int = 64, rows: int = 2048) -> dict:
    """zbatch's read_many of the same random rows with `latency_ms` added by nginx and by the
    proxy (in front of the 0 ms nginx), at `threads` decode threads: the proxy's share of the
    time, with zbatch (libcurl) as the client."""
    import zbatch

    import remote_servers as rs
    ids = np.random.default_rng(2).choice(n_rows, min(rows, n_rows), replace=False)

    def timed(url):
        ds = zbatch.open(url, num_threads=threads)
        t = time.perf_counter()
        ds.read_many(ids)
        return len(ids) / (time.perf_counter() - t)

    out = {"threads": threads, "rows": len(ids), "latency_ms": latency_ms,
           "nginx_rows_per_s": timed(store_url_slow)}
    with rs.FaultProxy(nginx_url, latency_s=latency_ms / 1000) as proxy:
        out["proxy_rows_per_s"] = timed(f"{proxy.url}/{store_name}")
        out["proxy_in_flight_max"] = proxy.stats()["in_flight_max"]
    return out


# ------------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------------
def versions() -> dict:
    out = {}
    for name in ("zarr", "fsspec", "aiohttp", "torch", "numpy", "scipy", "zbatch"):
        try:
            out[name] = _md.version(name)
        except _md.PackageNotFoundError:
            out[name] = None
    out["nginx"] = subprocess.run(["/usr/sbin/nginx", "-v"], capture_output=True,
                                  text=True).stderr.strip()
    return out


def machine() -> dict:
    cpu = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "loadavg": os.getloadavg()}


def fmt_row(r: dict) -> str:
    if "error" in r:
        return f"{r['label']:<28} {'error: ' + r['error'][:90]}"
    st = r.get("http", {})
    extra = ""
    if st:
        extra = (f" {st['requests_per_s']:>9.0f} {st['bytes_per_request'] / 1024:>9.1f}"
                 f" {st['in_flight_mean']:>7.1f} {st['in_flight_max']:>5d}")
    return f"{r['label']:<28} {r['samples_per_s']:>11.0f} {r['startup_s']:>7.2f}{extra}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", type=int, default=20000)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--latencies", default="0,5,25")
    ap.add_argument("--samplers", default="block,random")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2, help="zbatch num_threads")
    ap.add_argument("--http-threads", default="",
                    help="more zbatch-over-HTTP rows at these num_threads (a list), beside the "
                         "--threads row")
    ap.add_argument("--zarr-workers", default="2,8",
                    help="zarr-python rows' DataLoader num_workers, a list (one row each)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=0,
                    help="zbatch rows: E whole epochs from a fresh open (first apart from "
                         "cached) instead of a timed window")
    ap.add_argument("--rounds", type=int, default=1,
                    help="with --epochs: the local and http rows R times, alternating")
    ap.add_argument("--no-proxy-check", action="store_true")
    ap.add_argument("--results", default=str(ROOT / "results"))
    ap.add_argument("--work", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--quick", action="store_true", help="2 s per row, 4000 cells")
    args = ap.parse_args(argv)
    if args.quick:
        args.seconds, args.cells, args.zarr_workers = 2.0, 4000, "2"
    latencies = [float(x) for x in args.latencies.split(",") if x]
    samplers = [s for s in args.samplers.split(",") if s]

    import remote_servers as rs
    reason = rs.nginx_missing_reason()
    if reason:
        print(f"bench/remote.py needs nginx: {reason}", file=sys.stderr)
        return 2
    work = Path(args.work or tempfile.mkdtemp(prefix="zb-remote-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    store = work / "cells.zarr"
    if not store.exists():
        subprocess.run([str(CLI), "synth", "--kind", "cells", "--n", str(args.cells), "-o",
                        str(store), "--seed", str(args.seed), "--threads", "2"], check=True)
    meta = json.loads((store / "X" / "zarr.json").read_text())
    shape = meta["attributes"]["shape"]
    zarr_workers = [int(w) for w in str(args.zarr_workers).split(",") if w]
    http_threads = [int(t) for t in str(args.http_threads).split(",") if t]
    base = {"shape": shape, "batch_size": args.batch_size, "seconds": args.seconds,
            "threads": args.threads, "zarr_workers": zarr_workers[0], "seed": args.seed}
    timeout = args.seconds * 6 + 120
    servers = {lat: rs.NginxServer(work, latency_ms=lat, workdir=work / f"nginx-{lat:g}ms")
               for lat in latencies}
    for lat, srv in servers.items():
        srv.workdir.mkdir(exist_ok=True)
        srv.start()
    rows = []
    try:
        # The content check: both tools deliver the same CSR rows for the same ids (the zbatch
        # rows over HTTP are checked when zbatch opens URLs).
        ids = np.random.default_rng(1).choice(shape[0], 64, replace=False).tolist()
        url0 = servers[latencies[0]].url + "/cells.zarr"
        want = child({**base, "tool": "zbatch", "target": str(store), "ids": ids,
                      "mode": "ids"}, timeout)
        for tool, target in (("zarr", url0), ("zbatch", url0)):
            got = child({**base, "tool": tool, "target": target, "ids": ids, "mode": "ids"},
                        timeout)
            ok = "error" not in got and got == want
            print(f"content check {tool} over http vs zbatch local: "
                  f"{'same' if ok else got.get('error', 'DIFFERENT')}", flush=True)
            if tool == "zarr" and not ok:
                raise SystemExit("zarr-python over HTTP read different rows")

        if args.epochs:  # a whole epoch of a big store over HTTP takes minutes
            rows += epoch_rows(args, base, store, servers, samplers, latencies,
                               max(timeout, 300.0 * args.epochs))
        print(f"{'loader':<28} {'samples/s':>11} {'startup':>7} {'req/s':>9} {'KiB/req':>9}"
              f" {'inflt':>7} {'max':>5}", flush=True)
        for sampler in samplers if not args.epochs else []:
            r = child({**base, "tool": "zbatch", "target": str(store), "sampler": sampler},
                      timeout)
            r.update(label=f"zbatch local {sampler}", tool="zbatch", where="local",
                     sampler=sampler, latency_ms=None)
            rows.append(r)
            print(fmt_row(r), flush=True)
        for lat in latencies:
            srv = servers[lat]
            for sampler in samplers:
                runs = ([("zbatch", None, args.threads)] +
                        [("zbatch", None, t) for t in http_threads if t != args.threads]
                        if not args.epochs else [])
                runs += [("zarr", w, None) for w in zarr_workers]
                for tool, workers, threads in runs:
                    offset = srv.log_offset()
                    spec = {**base, "tool": tool, "target": srv.url + "/cells.zarr",
                            "sampler": sampler}
                    label = f"{tool} http {lat:g}ms {sampler}"
                    if workers is not None:
                        spec["zarr_workers"] = workers
                        label += f" w={workers}"
                    if threads is not None and threads != args.threads:
                        spec["threads"] = threads
                        label += f" t={threads}"
                    r = child(spec, timeout)
                    r.update(label=label, tool=tool, where="http", sampler=sampler,
                             latency_ms=lat, workers=workers, threads=threads)
                    if "window" in r:
                        r["http"] = rs.request_stats(srv.requests(offset), tuple(r["window"]))
                    rows.append(r)
                    print(fmt_row(r), flush=True)
        summary = summarize(rows, latencies, samplers, args.threads)
        for line in summary["lines"]:
            print(line)
        proxy = None
        if not args.no_proxy_check:
            per_req = [r["http"]["bytes_per_request"] for r in rows
                       if r.get("tool") == "zbatch" and r.get("http", {}).get("requests")]
            nbytes = int(np.median(per_req)) if per_req else 65536
            shard = store / "X" / "indices" / "c" / "0"
            lat_max = max(latencies)
            proxy = proxy_check(servers[min(latencies)].url, "/cells.zarr/X/indices/c/0",
                                shard.stat().st_size, nbytes, min(args.seconds, 5.0),
                                servers[lat_max].url if lat_max > 0 else None, lat_max)
            print(f"proxy alone ({proxy['concurrency']} in flight, {nbytes} B/request): "
                  f"nginx direct {proxy['direct']['requests_per_s']:.0f} req/s "
                  f"{proxy['direct']['mb_per_s']:.0f} MB/s; through the proxy "
                  f"{proxy['proxy']['requests_per_s']:.0f} req/s "
                  f"{proxy['proxy']['mb_per_s']:.0f} MB/s", flush=True)
            if lat_max > 0:
                proxy["zbatch"] = proxy_check_zbatch(
                    servers[lat_max].url + "/cells.zarr", servers[min(latencies)].url,
                    "cells.zarr", shape[0], lat_max)
                z = proxy["zbatch"]
                print(f"  zbatch read_many of {z['rows']} rows, num_threads={z['threads']}, "
                      f"{lat_max:g} ms: by nginx {z['nginx_rows_per_s']:.0f} rows/s, by the "
                      f"proxy {z['proxy_rows_per_s']:.0f} rows/s "
                      f"(in flight at most {z['proxy_in_flight_max']})", flush=True)
            if "proxy_latency" in proxy:
                print(f"  at {lat_max:g} ms (ideal {proxy['ideal_requests_per_s']:.0f} req/s): "
                      f"nginx echo_sleep {proxy['direct_latency']['requests_per_s']:.0f} req/s, "
                      f"proxy latency_s {proxy['proxy_latency']['requests_per_s']:.0f} req/s",
                      flush=True)
    finally:
        for srv in servers.values():
            srv.stop()
        if not args.keep and args.work is None:
            shutil.rmtree(work, ignore_errors=True)

    record = {"bench": "remote", "when": _dt.datetime.now(_dt.timezone.utc).isoformat(),
              "command": " ".join([Path(sys.executable).name, *sys.argv]),
              "args": vars(args), "rows": rows, "summary": summary["ratios"],
              "proxy_check": proxy, "versions": versions(), "machine": machine()}
    out_dir = Path(args.results)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = out_dir / f"remote-{stamp}.json"
    path.write_text(json.dumps(record, indent=1, default=float))
    print(f"results: {path}")
    return 0


def epoch_rows(args, base, store, servers, samplers, latencies, timeout) -> list:
    """The zbatch rows of --epochs: local and http at each latency, alternating, --rounds
    times; each epoch's request figures from the access log over its span."""
    import remote_servers as rs
    print(f"{'loader (epochs)':<28} {'round':>5} {'first':>9} {'steady':>9} {'cached':>9} "
          f"{'open':>5} {'startup':>7} {'req/s':>8} {'KiB/req':>8} {'inflt':>6} {'max':>4}"
          f"  (first epoch's steady part's requests)", flush=True)
    rows = []
    for rnd in range(args.rounds):
        for sampler in samplers:
            for lat in [None] + latencies:
                srv = servers.get(lat)
                target = str(store) if lat is None else srv.url + "/cells.zarr"
                offset = srv.log_offset() if srv else 0
                r = child({**base, "tool": "zbatch", "target": target, "sampler": sampler,
                           "epochs": args.epochs, "mode": "epochs"}, timeout)
                where = "local" if lat is None else "http"
                label = f"zbatch {where}{'' if lat is None else f' {lat:g}ms'} {sampler}"
                r.update(label=label, tool="zbatch", where=where, sampler=sampler,
                         latency_ms=lat, round=rnd, threads=args.threads)
                if "epochs" in r:
                    eps = r["epochs"]
                    for ep in eps:
                        ep["samples_per_s"] = ep["samples"] / (ep["span"][1] - ep["span"][0])
                        if srv:
                            log = srv.requests(offset)
                            ep["http"] = rs.request_stats(log, tuple(ep["span"]))
                            ep["http_steady"] = rs.request_stats(log, tuple(ep["steady_span"]))
                    r["first_per_s"] = eps[0]["samples_per_s"]
                    r["steady_per_s"] = eps[0]["steady_per_s"]
                    r["startup_s"] = eps[0]["startup_s"]
                    later = eps[1:]
                    r["cached_per_s"] = (sum(e["samples"] for e in later) /
                                         sum(e["span"][1] - e["span"][0] for e in later)
                                         if later else None)
                    st = eps[0].get("http_steady")
                    extra = (f" {st['requests_per_s']:>8.0f} {st['bytes_per_request'] / 1024:>8.1f}"
                             f" {st['in_flight_mean']:>6.1f} {st['in_flight_max']:>4d}"
                             if st else "")
                    cached = r["cached_per_s"] or float("nan")
                    print(f"{label:<28} {rnd:>5} {r['first_per_s']:>9.0f} "
                          f"{r['steady_per_s']:>9.0f} {cached:>9.0f} {r['open_s']:>5.2f} "
                          f"{eps[0]['startup_s']:>7.2f}{extra}", flush=True)
                else:
                    print(f"{label:<28} {rnd:>5} error: {r.get('error', '?')[:90]}", flush=True)
                rows.append(r)
    return rows


def summarize(rows, latencies, samplers, threads: int) -> dict:
    """zbatch over HTTP against zbatch local and against zarr-python, per latency and sampler."""
    def rate(tool, where, sampler, lat=None):
        """The row's samples/s (zbatch over HTTP: at the local row's num_threads; zarr-python:
        its best worker count), None if it did not run."""
        got = [r["samples_per_s"] for r in rows
               if (r.get("tool"), r.get("where"), r.get("sampler"), r.get("latency_ms")) ==
               (tool, where, sampler, lat) and "samples_per_s" in r
               and r.get("threads") in (None, threads)]
        return max(got) if got else None

    def median(tool, where, sampler, lat, key):
        got = sorted(r[key] for r in rows
                     if (r.get("tool"), r.get("where"), r.get("sampler"), r.get("latency_ms"))
                     == (tool, where, sampler, lat) and r.get(key))
        return got[len(got) // 2] if got else None

    lines, ratios = [], []
    for sampler in samplers:
        for lat in latencies:  # --epochs rows: first epoch and cached apart
            f_loc = median("zbatch", "local", sampler, None, "first_per_s")
            f_http = median("zbatch", "http", sampler, lat, "first_per_s")
            if not (f_loc and f_http):
                continue
            c_loc = median("zbatch", "local", sampler, None, "cached_per_s")
            c_http = median("zbatch", "http", sampler, lat, "cached_per_s")
            s_loc = median("zbatch", "local", sampler, None, "steady_per_s")
            s_http = median("zbatch", "http", sampler, lat, "steady_per_s")
            u_loc = median("zbatch", "local", sampler, None, "startup_s")
            u_http = median("zbatch", "http", sampler, lat, "startup_s")
            zr = rate("zarr", "http", sampler, lat)
            first, cached = f_http / f_loc, (c_http / c_loc if c_loc and c_http else None)
            steady = s_http / s_loc if s_loc and s_http else None
            ratios.append({"sampler": sampler, "latency_ms": lat, "first_http_over_local": first,
                           "steady_http_over_local": steady,
                           "cached_http_over_local": cached,
                           "startup_s_local": u_loc, "startup_s_http": u_http,
                           "first_zbatch_over_zarr": f_http / zr if zr else None})

            def verdict(x):
                return "met" if x and x >= TARGET_LOCAL else "NOT met"
            met = "" if lat != 25 else (
                f" (target >= {TARGET_LOCAL}x: first {verdict(first)}, steady {verdict(steady)}"
                f", cached {verdict(cached)})")
            lines.append(f"{sampler} {lat:g} ms, medians of the rounds: zbatch http / local = "
                         f"{first:.2f}x first epoch, {steady or float('nan'):.2f}x its steady "
                         f"part, {cached or float('nan'):.2f}x cached; startup "
                         f"{u_loc or float('nan'):.2f} s local, {u_http or float('nan'):.2f} s "
                         f"http; first epoch / zarr-python = "
                         f"{f_http / zr if zr else float('nan'):.1f}x{met}")
        local = rate("zbatch", "local", sampler)
        if local is None and any("first_per_s" in r for r in rows):
            continue  # --epochs: above
        for lat in latencies:
            zh, zr = rate("zbatch", "http", sampler, lat), rate("zarr", "http", sampler, lat)
            vs_local = zh / local if zh and local else None
            vs_zarr = zh / zr if zh and zr else None
            ratios.append({"sampler": sampler, "latency_ms": lat, "http_over_local": vs_local,
                           "zbatch_over_zarr": vs_zarr})
            if vs_local is None:
                lines.append(f"{sampler} {lat:g} ms: zbatch over HTTP did not run")
                continue
            met_local = "met" if vs_local >= TARGET_LOCAL else "NOT met"
            met_zarr = "met" if vs_zarr and vs_zarr >= TARGET_ZARR else "NOT met"
            goal = "" if lat != 25 else (
                f" (targets: >= {TARGET_LOCAL}x local: {met_local}; >= {TARGET_ZARR:g}x "
                f"zarr-python at its best worker count: {met_zarr})")
            lines.append(f"{sampler} {lat:g} ms: zbatch http / local = {vs_local:.2f}x, "
                         f"zbatch / zarr-python = {vs_zarr or float('nan'):.1f}x{goal}")
    return {"lines": lines, "ratios": ratios}


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "_one":
        spec = json.loads(sys.argv[2])
        try:
            mode = spec.get("mode")
            res = (read_ids_one(spec) if mode == "ids" else
                   run_epochs(spec) if mode == "epochs" else run_one(spec))
        except Exception:  # noqa: BLE001 - the parent reports the last line
            traceback.print_exc()
            sys.exit(1)
        print(json.dumps(res, default=float))
        sys.exit(0)
    sys.exit(main())
