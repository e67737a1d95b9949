"""Writing into S3 next to writing into a local directory (issue 17).

    .venv/bin/python bench/s3_write.py [--rounds R]

The S3 endpoint is moto's server on loopback with SigV4 checked (tests/python/remote_servers.py),
a Python process: the figures bound what moto sustains, not what S3 does; they show what the
S3 path adds on the client (signing, requests, the convert's read-back check) against the same
write into a directory. Rounds alternate local and S3, each a fresh output.

- ``write_array``: a 64 MB float32 array [2,000,000 x 8], chunks of 32,768 rows in shards of
  262,144 rows, zstd:1, two threads.
- ``convert``: ``zbatch convert`` of three h5ad inputs of 20,000 cells x 2,000 genes (6% dense,
  integer counts) into datasets of 20,000 cells, ``--threads 2 --memory 256M``.

Prints one JSON line: seconds per round for each.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "python"))
sys.path.insert(0, str(REPO / "python"))

import anndata as ad  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import scipy.sparse as sp  # noqa: E402

import remote_servers as rs  # noqa: E402
import zbatch  # noqa: E402

CLI = REPO / "build" / "zbatch"


def inputs(d: str) -> list[str]:
    paths = []
    for k in range(3):
        X = sp.random(20000, 2000, density=0.06, format="csr", random_state=k, dtype=np.float32)
        X.data = np.round(X.data * 30) + 1
        obs = pd.DataFrame({"c": pd.Categorical(np.arange(20000) % 5)},
                           index=[f"c{k}_{i}" for i in range(20000)])
        a = ad.AnnData(X=X, obs=obs, var=pd.DataFrame(index=[f"g{i}" for i in range(2000)]))
        p = f"{d}/in{k}.h5ad"
        a.write_h5ad(p)
        paths.append(p)
    return paths


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    res: dict[str, list[float]] = {}
    with rs.MotoServer() as m, tempfile.TemporaryDirectory() as d:
        m.client().create_bucket(Bucket="bench")
        so = m.storage_options()
        x = np.random.default_rng(0).random((2_000_000, 8), dtype=np.float32)
        paths = inputs(d)
        env = dict(os.environ, AWS_ACCESS_KEY_ID=m.access_key,
                   AWS_SECRET_ACCESS_KEY=m.secret_key, AWS_ENDPOINT_URL=m.endpoint_url,
                   AWS_REGION=m.region, TMPDIR=d)
        for rnd in range(args.rounds):
            for where in ("local", "s3"):
                url = f"{d}/w{rnd}.zarr" if where == "local" else f"s3://bench/w{rnd}.zarr"
                t = time.perf_counter()
                zbatch.write_array(url, "x", x, chunks=32768, shards=262144, codec="zstd:1",
                                   num_threads=2, storage_options=so if where == "s3" else None)
                res.setdefault(f"write_array {where}", []).append(time.perf_counter() - t)
                out = f"{d}/c{rnd}.zarr" if where == "local" else f"s3://bench/c{rnd}.zarr"
                t = time.perf_counter()
                r = subprocess.run([str(CLI), "convert", *paths, "-o", out, "--quiet",
                                    "--threads", "2", "--dataset-size", "20000",
                                    "--memory", "256M"], env=env, capture_output=True, text=True)
                if r.returncode:
                    raise SystemExit(r.stderr)
                res.setdefault(f"convert {where}", []).append(time.perf_counter() - t)
    print(json.dumps({k: [round(v, 2) for v in vs] for k, vs in res.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
