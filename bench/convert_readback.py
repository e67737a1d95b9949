"""What the conversion's final read-back of its output costs, direct against buffered.

    python3 bench/convert_readback.py OUTPUT [--rounds 2]

Reads every file of 64 KiB and more below OUTPUT (a converted collection) in 4 MiB blocks, as
the finishing step does (src/convert/output.c), four ways: with O_DIRECT from a cold page cache
(the files' pages dropped with POSIX_FADV_DONTNEED first), buffered from a cold cache, buffered
again (warm: what a read-back right after a buffered write finds), and with O_DIRECT again.
Prints wall seconds and the process's system and user CPU seconds for each.
"""
from __future__ import annotations

import argparse
import mmap
import os
import resource
import time

BLOCK = 4 << 20


def drop(files):
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def read_all(files, buf, direct: bool) -> str:
    r0, t0, n = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter(), 0
    for f in files:
        fd = os.open(f, os.O_RDONLY | (os.O_DIRECT if direct else 0))
        off = 0
        while True:  # until a short block, as the read-back does
            k = os.preadv(fd, [buf], off)
            n, off = n + k, off + k
            if k < BLOCK:
                break
        os.close(fd)
    t, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    return (f"{n / 1e6:.0f} MB  wall {t:.2f} s  sys {r1.ru_stime - r0.ru_stime:.2f} s  "
            f"user {r1.ru_utime - r0.ru_utime:.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(a.output) for f in fs)
    files = [f for f in files if os.path.getsize(f) >= 64 << 10]
    buf = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT needs
    for _ in range(a.rounds):
        drop(files)
        print("direct, cold     ", read_all(files, buf, True))
        drop(files)
        print("buffered, cold   ", read_all(files, buf, False))
        print("buffered, warm   ", read_all(files, buf, False))
        print("direct again     ", read_all(files, buf, True))
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
