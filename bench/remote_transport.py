"""The transport alone: nginx + libcurl on loopback at a request size (issue 17).

    .venv/bin/python bench/remote_transport.py [--sizes 65536,1310720] [--mb 1024]
                                               [--parallel 64] [--work DIR]

For each size, the ``curl`` command (libcurl, the library zbatch reads through) fetches ``--mb``
MB as random byte ranges of that size of one 64 MiB file served by nginx (no added latency),
``--parallel`` transfers at once over reused connections, bodies to /dev/null. Per size: GB/s of
wall time, and CPU seconds per GB of the client (curl's user + sys) and of nginx (its processes'
user + sys from /proc): the ceiling of what zbatch's remote path can receive on this machine,
before any copying or decoding.
"""
from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))
sys.path.insert(0, str(ROOT / "bench"))

SIZE = 64 << 20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="65536,1310720")
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--parallel", type=int, default=64)
    ap.add_argument("--work", default=None)
    args = ap.parse_args(argv)
    import remote_servers as rs
    from remote_fetch import nginx_pids, proc_cpu
    work = Path(args.work or tempfile.mkdtemp(prefix="zb-transport-"))
    (work / "www").mkdir(parents=True, exist_ok=True)
    blob = work / "www" / "blob.bin"
    if not blob.exists() or blob.stat().st_size != SIZE:
        blob.write_bytes(np.random.default_rng(0).integers(0, 256, SIZE, np.uint8).tobytes())
    print(f"{'bytes/request':>13} {'requests':>8} {'GB/s':>6} {'curl CPU s/GB':>13} "
          f"{'nginx CPU s/GB':>14}")
    with rs.NginxServer(work / "www") as srv:
        for size in [int(s) for s in args.sizes.split(",") if s]:
            n = max(1, args.mb * 1000_000 // size)
            rng = np.random.default_rng(size)
            starts = rng.integers(0, SIZE - size, n)
            cfg = work / f"curl-{size}.cfg"
            with open(cfg, "w") as f:
                for a in starts:
                    f.write(f'url = "{srv.url}/blob.bin"\nrange = {a}-{a + size - 1}\n'
                            f'output = "/dev/null"\n')
            ng0 = proc_cpu(nginx_pids(srv._proc.pid))
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            subprocess.run(["curl", "-s", "--no-progress-meter", "--parallel", "--parallel-max", str(args.parallel),
                            "-K", str(cfg)], check=True)
            wall = time.perf_counter() - t
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            ng = proc_cpu(nginx_pids(srv._proc.pid)) - ng0
            gb = n * size / 1e9
            cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
            print(f"{size:>13} {n:>8} {gb / wall:>6.2f} {cpu / gb:>13.3f} {ng / gb:>14.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
