"""The loader over HTTP for a fixed number of samples, from before the open (issue 17): A/B of
two builds, one after the other, on the same store.

    .venv/bin/python bench/remote_loader.py STORE_DIR [--latency-ms 25] [--sampler block]
                                            [--samples 100000] [--root TREE]

STORE_DIR holds ``cells.zarr`` (``zbatch synth --kind cells``); nginx on loopback serves it with
``--latency-ms`` added to every request (tests/python/remote_servers.py). The loader is
bench/remote.py's (``bench.peers.zbatch_peer.loader``: 2 threads, windows of 16 batches of 256,
CSR out) on the store's URL; ``--root`` takes zbatch and the loader from another checkout's
``python/`` and ``bench/`` (a build of another commit, dev-installed there). Prints samples/s,
the process's CPU microseconds per sample (user + sys, every thread), its page faults per sample
(minor: memory touched for the first time, or again after it went back to the kernel), its
waits per sample (voluntary context switches: a thread blocked, e.g. on a futex), and the store's
counters
(requests, retries, most requests in flight).
"""
from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("store_dir")
    ap.add_argument("--latency-ms", type=float, default=25.0)
    ap.add_argument("--sampler", default="block")
    ap.add_argument("--samples", type=int, default=100000)
    ap.add_argument("--root", default=str(HERE), help="the checkout whose zbatch is measured")
    args = ap.parse_args()
    root = Path(args.root).resolve()
    sys.path[:0] = [str(root / "python"), str(HERE / "tests" / "python"), str(root)]
    import remote_servers as rs
    from bench.peers.zbatch_peer import loader
    with rs.NginxServer(args.store_dir, latency_ms=args.latency_ms) as srv:
        t0, c0 = time.perf_counter(), time.process_time()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        ds, dl, _ = loader(srv.url + "/cells.zarr", 256, num_workers=2, output="csr", seed=0,
                           sampler=args.sampler, block_size=16, fetch_factor=16,
                           prefetch_factor=16)
        n = 0
        dl.set_epoch(0)
        for b in dl:
            n += b.shape[0] if hasattr(b, "shape") else b["X"].shape[0]
            if n >= args.samples:
                break
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        faults, switches = r1.ru_minflt - r0.ru_minflt, r1.ru_nvcsw - r0.ru_nvcsw
        st = ds.store_stats()
        dl.close()
    print(f"{root.name} {args.latency_ms:g} ms {args.sampler}: {n} samples {n / wall:.0f}/s, "
          f"CPU {cpu / n * 1e6:.1f} us/sample, page faults {faults / n:.2f}/sample, "
          f"waits {switches / n:.2f}/sample, requests {st['requests']}, retries "
          f"{st['retries']}, most in flight {st['max_in_flight']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
