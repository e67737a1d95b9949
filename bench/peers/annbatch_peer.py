"""annbatch 0.3.1's ``Loader`` (the scverse loader) over the anndata Zarr store zbatch reads.

annbatch needs Python >= 3.12 and lives in its own environment, ``.venv-annbatch`` (made by
scripts/install-annbatch-env.sh); it is never imported here. Each call runs one job of
tests/python/annbatch_bridge.py in that interpreter: the timing loop itself runs there (the
same ``measure`` as every peer: steady state from the first batch on, epochs restarted) and its
figures come back as JSON, so no cross-process transfer is timed.

Configuration, as annbatch's documentation shows: zarrs' codec pipeline for local files
(``codec_pipeline.path = "zarrs.ZarrsCodecPipeline"``, ``threading.max_workers`` = the cores
given), ``Loader(batch_size=B, chunk_size=c, preload_nchunks=p, shuffle=True,
preload_to_gpu=False)`` and ``add_adata`` of an AnnData whose X is the store's backed CSR
(``anndata.io.sparse_dataset(group["X"])``, as annbatch's README's ``custom_load_func``) with the
store's var index; obs is not loaded, so batches carry X only, as zbatch's do. A single store
needs no ``DatasetCollection``; ``anndata.experimental.read_lazy`` does not work (its X is a
dask array, which the Loader refuses). annbatch reads Zarr v3 only.

Settings (``chunk_size``, ``preload_nchunks``): annbatch's docstring example is (32, 512) with
``batch_size=4096`` (its README shows (32, 256)); its defaults are (512, 32); the annbatch
paper's throughput sweeps (theislab/annbatch_paper, revision/scripts/30_throughput_sweeps.py)
hold the preload at 16,384 rows (``preload_nchunks = 16384 // chunk_size``) and its benchmark
script uses chunk_size 256. bench/run.py sweeps these and takes annbatch at its best.

Output: ``scipy.sparse.csr_matrix`` batches (annbatch's own output without ``to=``; its
environment has no torch, so no dense torch output is measured for annbatch).

Cores: annbatch runs in one process (its Loader is its own iterator; annbatch advises against
torch DataLoader workers, it is "already multi-threaded"); ``num_workers`` is zarrs' thread
count.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "tests" / "python") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests" / "python"))
import annbatch_bridge as bridge  # noqa: E402

DOCUMENTED = (32, 512)   # annbatch's Loader docstring, with batch_size=4096
DEFAULTS = (512, 32)     # Loader's own defaults
# annbatch's best (chunk_size, preload_nchunks) on this machine, from bench/annbatch_loader.py's
# sweep on 30,000 Tahoe-like cells, batch 4096 (docs/PERFORMANCE.md, issue 19): the demo's
BEST = (1024, 16)


def available() -> bool:
    """Whether annbatch's environment exists (the demo skips annbatch without it)."""
    return (bridge.VENV / "bin" / "python").exists()


def _job(op: str, timeout: float, **params) -> tuple[dict, dict]:
    """Runs one bridge job; a failed one raises RuntimeError with the worker's stderr tail."""
    with tempfile.TemporaryDirectory(prefix=f"annbatch-peer-{op}-") as tmp:
        cmd = bridge.prepare(op, tmp, **params)
        with open(Path(tmp) / "stderr.txt", "w") as err:
            r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=err,
                               env=bridge.worker_env(), cwd=tmp, timeout=timeout)
        if r.returncode or not (Path(tmp) / "result.json").exists():
            tail = (Path(tmp) / "stderr.txt").read_text()[-4000:]
            raise RuntimeError(f"annbatch {op} job failed (exit {r.returncode}):\n{tail}")
        return bridge.collect(tmp)


def run(data: str, batch_size: int, seconds: float, num_workers: int = 2, output: str = "csr",
        seed: int = 0, chunk_size: int = DOCUMENTED[0], preload_nchunks: int = DOCUMENTED[1],
        **_ignored) -> dict:
    if output != "csr":
        raise ValueError("annbatch's environment has no torch: CSR (scipy) output only")
    res, _ = _job("bench", timeout=seconds * 3 + 180, path=str(Path(data).resolve()),
                  batch_size=int(batch_size), chunk_size=int(chunk_size),
                  preload_nchunks=int(preload_nchunks), seed=int(seed), seconds=float(seconds),
                  threads=int(num_workers))
    out = {k: res[k] for k in ("samples", "batches", "seconds", "startup_s", "samples_per_s",
                               "epochs_started", "minflt_per_batch")}
    out.update(loader="annbatch",
               setting=f"chunk_size={chunk_size} preload_nchunks={preload_nchunks} csr "
                       f"[{Path(data).name}]",
               open_s=res["open_s"], batch_types=res["batch_types"],
               config={"tool": "annbatch.Loader", "via": "add_adata(backed X), one store",
                       "store": data, "batch_size": batch_size, "chunk_size": chunk_size,
                       "preload_nchunks": preload_nchunks,
                       "preload_rows": chunk_size * preload_nchunks, "shuffle": True,
                       "preload_to_gpu": False, "zarrs_threads": num_workers,
                       "codec_pipeline": "zarrs.ZarrsCodecPipeline", "seed": seed,
                       "interpreter": str(bridge.python()), "versions": res["versions"]})
    return out


def read_ids(data: str, ids, output: str = "csr", chunk_size: int = DOCUMENTED[0],
             preload_nchunks: int = DOCUMENTED[1], batch_size: int = 256, seed: int = 3,
             **_ignored) -> dict:
    """The rows annbatch's Loader yields for ``ids`` over one shuffled epoch (``return_index``
    tells which cell each yielded row is), in the order of ``ids``. Raises if the epoch missed
    one of them or did not yield every cell exactly once."""
    import scipy.sparse as sp
    if output != "csr":
        raise ValueError("annbatch's environment has no torch: CSR (scipy) output only")
    ids = np.asarray(ids, dtype=np.int64)
    res, arr = _job("rows", timeout=600, path=str(Path(data).resolve()), ids=ids.tolist(),
                    batch_size=int(batch_size), chunk_size=int(chunk_size),
                    preload_nchunks=int(preload_nchunks), seed=int(seed), threads=2)
    if res["missing"]:
        raise RuntimeError(f"annbatch's epoch did not yield cells {res['missing']}")
    if not res["every_cell_once"]:
        raise RuntimeError("annbatch's epoch did not yield every cell exactly once")
    x = sp.csr_matrix((arr["X/data"], arr["X/indices"], arr["X/indptr"]),
                      shape=(len(ids), res["n_vars"]))
    return {"ids": ids, "X": x, "batch_types": res["batch_types"]}
