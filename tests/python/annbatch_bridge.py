"""annbatch as a peer and an oracle, run in its own interpreter.

annbatch 0.3.1 needs Python >= 3.12; zbatch's .venv is 3.11. scripts/install-annbatch-env.sh
(run by `make`) makes ``.venv-annbatch`` from requirements-annbatch.txt, and this module runs
annbatch there, in a subprocess, never importing it here. The same file is both ends:

- imported in .venv (tests, bench/convert.py): :func:`write_collection`, :func:`load_collection`,
  :func:`open_collection` write a job file, run this file as a script in .venv-annbatch, and
  decode what it left (``result.json`` and ``arrays.npz``);
- run as ``.venv-annbatch/bin/python -I annbatch_bridge.py JOB.json OUT_DIR`` it does the job
  with annbatch, the way annbatch's documentation shows: zarrs' codec pipeline for local files,
  ``DatasetCollection(path).add_adatas(adata_paths=..., shuffle=True, ...)`` to write,
  ``Loader(...).use_collection(DatasetCollection(path))`` under
  ``anndata.settings.override(remove_unused_categories=False)`` to load.

bench/peers/annbatch_peer.py runs annbatch's ``Loader`` as a peer of bench/run.py through two
more jobs: "bench" (the peer's timing loop, bench/peers' ``measure``, run in annbatch's
interpreter; figures back as JSON) and "rows" (one epoch; the rows yielded for chosen ids, for
the content check). Both read one anndata Zarr store through ``Loader.add_adata`` (no
collection needed: X backed with ``anndata.io.sparse_dataset``).

Only numpy crosses the boundary (pandas 2 here, pandas 3 there: no pickles). An obs frame
travels column by column as plain arrays and comes back as a pandas DataFrame whose column kinds
are kept: categoricals as ``pd.Categorical`` (codes and categories as stored), pandas nullable
columns as nullable arrays, numpy columns as they are, strings as object arrays with ``None``
for missing values.

    >>> from annbatch_bridge import write_collection, load_collection, open_collection
    >>> write_collection("c.zarr", ["a.h5ad", "b.h5ad"], dataset_size=100_000, seed=1)
    >>> cells = load_collection("c.zarr", obs_columns=["cell_type"])
    >>> cells.X, cells.obs, cells.obs_names, cells.index     # every yielded cell, in yield order
    >>> obs, keys, sizes = open_collection("c.zarr")         # collection.obs(), dataset keys
    >>> [e] = run_loader({"collection": "c.zarr"}, batch_size=8, shuffle=True, seed=0,
    ...                  return_index=True)                 # annbatch.Loader's batches, per pass
    >>> run_script(source)                                   # a script's `result`, run there

Top-level imports are the standard library only: the worker side imports numpy, pandas and
annbatch from .venv-annbatch.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv-annbatch"
THIS = Path(__file__).resolve()


# ------------------------------------------------------------------------------------------------
# The .venv side
# ------------------------------------------------------------------------------------------------
def python() -> Path:
    """The interpreter of annbatch's environment; an error (never a skip) when it is missing."""
    exe = VENV / "bin" / "python"
    if not exe.exists():
        raise RuntimeError(f"{exe} missing: run `make` (scripts/install-annbatch-env.sh makes "
                           "annbatch's Python 3.12 environment from requirements-annbatch.txt)")
    return exe


def worker_env() -> dict:
    """The environment of a worker: this process's, less what would mix .venv into it."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["PYTHONWARNINGS"] = "ignore"  # anndata/zarr's notes about unstable specs: stderr noise
    return env


def prepare(op: str, out_dir: str | os.PathLike, **params) -> list[str]:
    """Writes the job file for ``op`` ("write", "load", "open", "bench", "rows") into ``out_dir`` and returns the
    command that runs it in .venv-annbatch (for callers that run and measure it themselves, as
    bench/convert.py does; run it with ``env=worker_env()`` and then :func:`collect`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "job.json").write_text(json.dumps({"op": op, **params}))
    # -I: neither PYTHONPATH nor the working directory nor user site-packages leak in
    return [str(python()), "-I", str(THIS), str(out / "job.json"), str(out)]


def collect(out_dir: str | os.PathLike) -> tuple[dict, dict]:
    """The result of a finished job: (result.json as a dict, arrays.npz as a dict of arrays)."""
    import numpy as np
    out = Path(out_dir)
    res = json.loads((out / "result.json").read_text())
    npz = out / "arrays.npz"
    arrays = {}
    if npz.exists():
        with np.load(npz, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    return res, arrays


def run(op: str, *, timeout: float = 900, **params) -> tuple[dict, dict]:
    """Runs one job in .venv-annbatch and returns :func:`collect`'s pair. A failed job raises
    RuntimeError with the tail of the worker's stderr."""
    with tempfile.TemporaryDirectory(prefix=f"annbatch-{op}-") as tmp:
        cmd = prepare(op, tmp, **params)
        with open(Path(tmp) / "stderr.txt", "w") as err:
            r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=err, env=worker_env(),
                               cwd=tmp, timeout=timeout)
        if r.returncode or not (Path(tmp) / "result.json").exists():
            tail = (Path(tmp) / "stderr.txt").read_text()[-6000:]
            raise RuntimeError(f"annbatch {op} job failed (exit {r.returncode}):\n{tail}")
        return collect(tmp)


@dataclass
class Cells:
    """Every cell annbatch's Loader yielded, in yield order."""
    X: Any                      # scipy.sparse.csr_matrix, n x n_vars (annbatch's dtypes)
    obs: Any                    # pandas.DataFrame, index = obs names
    obs_names: Any              # numpy str array
    index: Any                  # numpy int64: each cell's row in the collection's row space
    batch_sizes: list           # rows of each yielded batch
    var_names: Any              # numpy str array (the loader's var index)
    info: dict = field(default_factory=dict)   # n_obs, versions, seconds


def write_collection(out: str | os.PathLike, h5ad_paths: Sequence[str | os.PathLike], *,
                     dataset_size: Optional[int | str] = None,
                     shuffle_chunk_size: Optional[int] = None,
                     shard_size: Optional[int | str] = None,
                     n_obs_per_chunk: Optional[int] = None,
                     var_subset: Optional[Sequence[str]] = None, seed: int = 0,
                     timeout: float = 900) -> dict:
    """``DatasetCollection(out).add_adatas(adata_paths=h5ad_paths, shuffle=True, rng=seed, ...)``
    in .venv-annbatch; options left None take annbatch's defaults. The paths go in as absolute
    paths, so ``src_path`` holds absolute paths. Returns {"seconds" (add_adatas alone),
    "dataset_keys", "n_obs", "versions"}."""
    res, _ = run("write", timeout=timeout, out=str(Path(out).resolve()),
                 paths=[str(Path(p).resolve()) for p in h5ad_paths],
                 options=_options(dataset_size=dataset_size, shuffle_chunk_size=shuffle_chunk_size,
                                  shard_size=shard_size, n_obs_per_chunk=n_obs_per_chunk,
                                  var_subset=list(var_subset) if var_subset is not None else None),
                 seed=seed)
    return res


def load_collection(path: str | os.PathLike, *, obs_columns: Optional[Sequence[str]] = None,
                    batch_size: int = 256, chunk_size: int = 64, preload_nchunks: int = 8,
                    shuffle: bool = True, seed: int = 0, timeout: float = 900) -> Cells:
    """Iterates ``annbatch.Loader(batch_size=, chunk_size=, preload_nchunks=, shuffle=, rng=,
    return_index=True, preload_to_gpu=False).use_collection(DatasetCollection(path))`` for one
    epoch and returns every yielded cell. ``obs_columns`` None yields all obs columns (the
    loader's default ``load_adata``); a list yields ``src_path`` and those, through a
    ``load_adata`` like the one in annbatch's README (X backed, obs subset, var index)."""
    res, arr = run("load", timeout=timeout, path=str(Path(path).resolve()),
                   obs_columns=list(obs_columns) if obs_columns is not None else None,
                   batch_size=batch_size, chunk_size=chunk_size, preload_nchunks=preload_nchunks,
                   shuffle=shuffle, seed=seed)
    import scipy.sparse as sp
    n, n_vars = res["n_cells"], res["n_vars"]
    X = sp.csr_matrix((arr["X/data"], arr["X/indices"], arr["X/indptr"]), shape=(n, n_vars))
    obs = decode_frame(res["obs"], arr, "obs/")
    return Cells(X=X, obs=obs, obs_names=arr["obs/names"], index=arr["index"],
                 batch_sizes=res["batch_sizes"], var_names=arr["var_names"],
                 info={k: res[k] for k in ("n_obs", "versions", "seconds")})


def open_collection(path: str | os.PathLike, columns: Optional[Sequence[str]] = None,
                    timeout: float = 300) -> tuple[Any, list[str], list[int]]:
    """``DatasetCollection(path, mode="r")``: its ``obs(columns)`` (a DataFrame indexed by obs
    names, datasets in order), its dataset keys in annbatch's order (numeric) and each
    dataset's number of rows."""
    res, arr = run("open", timeout=timeout, path=str(Path(path).resolve()),
                   columns=list(columns) if columns is not None else None)
    return decode_frame(res["obs"], arr, "obs/"), res["dataset_keys"], res["dataset_sizes"]


@dataclass
class Batches:
    """Every batch annbatch's Loader yielded, in yield order (:func:`run_loader`)."""
    X: Any                      # all batches' rows stacked: scipy CSR (sparse X) or ndarray
    obs: Any                    # all batches' obs stacked (None when batches carry none)
    index: Any                  # all batches' index stacked (None when batches carry none)
    batch_sizes: list           # rows of each batch
    x_types: list               # per batch: type(X).__name__
    x_dtypes: dict              # first batch: dtypes of X (or of its data, indices, indptr)
    obs_dtypes: list            # per batch: {column: str(dtype)} (empty without obs)
    var_names: Any              # numpy str array (the loader's var index) or None
    n_batches: int              # len(loader)


def run_loader(source: dict, *, epochs: int = 1, timeout: float = 600, **loader_args) -> list:
    """Iterates ``annbatch.Loader(**loader_args, preload_to_gpu=False)`` over ``source`` for
    ``epochs`` passes and returns a :class:`Batches` per pass. ``loader_args`` are the Loader's
    (``chunk_size``, ``preload_nchunks``, ``batch_size``, ``shuffle``, ``drop_last``,
    ``return_index``) plus ``seed`` (``rng=np.random.default_rng(seed)``; absent: no rng).
    ``source``: ``{"collection": path}`` (``use_collection(DatasetCollection(path))``; with
    ``"obs_columns": [...]`` through a README-style ``load_adata`` keeping those columns), or
    ``{"adatas": [store paths]}`` (``add_adatas`` of AnnData objects made as annbatch's
    ``load_all_aligned`` makes them: X backed, obs read, var read; ``"obs_columns"`` subsets
    obs)."""
    res, arr = run("loader", timeout=timeout, source=source, epochs=epochs, args=loader_args)
    import scipy.sparse as sp
    out = []
    for e, r in enumerate(res["epochs"]):
        p = f"e{e}/"
        if r["sparse"]:
            X = sp.csr_matrix((arr[p + "X/data"], arr[p + "X/indices"], arr[p + "X/indptr"]),
                              shape=(r["n_cells"], res["n_vars"]))
        else:
            X = arr[p + "X"]
        out.append(Batches(
            X=X, obs=decode_frame(r["obs"], arr, p + "obs/") if r["obs"] is not None else None,
            index=arr.get(p + "index"), batch_sizes=r["batch_sizes"], x_types=r["x_types"],
            x_dtypes=r["x_dtypes"], obs_dtypes=r["obs_dtypes"],
            var_names=arr.get("var_names"), n_batches=res["n_batches"]))
    return out


def run_script(source: str, timeout: float = 600) -> dict:
    """Runs ``source`` (a script importing annbatch) in .venv-annbatch; returns the JSON-able
    ``result`` it leaves in its namespace."""
    res, _ = run("script", timeout=timeout, source=source)
    return res["result"]


def _options(**kw) -> dict:
    return {k: v for k, v in kw.items() if v is not None}


def decode_frame(spec: dict, arrays: dict, prefix: str):
    """Rebuilds a DataFrame from :func:`encode_frame`'s arrays (either side's pandas)."""
    import numpy as np
    import pandas as pd
    cols = {}
    for name, c in spec["columns"].items():
        p = f"{prefix}{name}/"
        kind = c["kind"]
        if kind == "categorical":
            cols[name] = pd.Categorical.from_codes(arrays[p + "codes"].astype(np.int64),
                                                   categories=arrays[p + "categories"],
                                                   ordered=c["ordered"])
        elif kind == "nullable":
            v, m = arrays[p + "values"], arrays[p + "mask"]
            if v.dtype.kind == "U":
                cols[name] = pd.array(np.where(m, None, v.astype(object)), dtype="string")
            else:
                cols[name] = pd.array(v, dtype=c["dtype"])
                cols[name][m] = pd.NA
        elif kind == "string":
            v, m = arrays[p + "values"], arrays[p + "mask"]
            cols[name] = np.where(m, None, v.astype(object))
        else:
            cols[name] = arrays[p + "values"]
    return pd.DataFrame(cols, index=pd.Index(arrays[prefix + "names"].astype(object)))


# ------------------------------------------------------------------------------------------------
# The .venv-annbatch side (run as a script)
# ------------------------------------------------------------------------------------------------
def encode_frame(df, arrays: dict, prefix: str) -> dict:
    """A DataFrame as plain numpy arrays plus a JSON spec (see the module docstring)."""
    import numpy as np
    import pandas as pd
    arrays[prefix + "names"] = np.array([str(x) for x in df.index], dtype=str)
    spec = {}
    for name in df.columns:
        s = df[name]
        p = f"{prefix}{name}/"
        if isinstance(s.dtype, pd.CategoricalDtype):
            arrays[p + "codes"] = s.cat.codes.to_numpy()
            cats = s.cat.categories
            arrays[p + "categories"] = (np.array([str(x) for x in cats], dtype=str)
                                        if cats.dtype.kind in "OUT" or
                                        isinstance(cats.dtype, pd.StringDtype)
                                        else cats.to_numpy())
            spec[name] = {"kind": "categorical", "ordered": bool(s.cat.ordered),
                          "dtype": "category"}
        elif pd.api.types.is_extension_array_dtype(s.dtype):
            mask = s.isna().to_numpy()
            if isinstance(s.dtype, pd.StringDtype):
                values = np.array(["" if m else str(v) for v, m in zip(s, mask)], dtype=str)
            else:
                values = s.to_numpy(dtype=s.dtype.numpy_dtype, na_value=0)
            arrays[p + "values"], arrays[p + "mask"] = values, mask
            spec[name] = {"kind": "nullable", "dtype": str(s.dtype)}
        elif s.dtype.kind in "biuf":
            arrays[p + "values"] = s.to_numpy()
            spec[name] = {"kind": "numeric", "dtype": str(s.dtype)}
        else:  # object / str: strings, None or NaN for missing
            mask = s.isna().to_numpy()
            arrays[p + "values"] = np.array(["" if m else str(v) for v, m in zip(s, mask)],
                                            dtype=str)
            arrays[p + "mask"] = mask
            spec[name] = {"kind": "string", "dtype": str(s.dtype)}
    return {"columns": spec}


def _versions() -> dict:
    from importlib.metadata import version
    return {p: version(p) for p in ("annbatch", "anndata", "zarr", "zarrs", "numpy", "pandas",
                                    "scipy", "dask")} | {"python": sys.version.split()[0]}


def _use_zarrs(threads: Optional[int] = None) -> None:
    # "Using zarrs is necessary for local filesystem performance" (annbatch's README);
    # threading.max_workers sizes zarrs' thread pool (None: zarrs' default, one per core)
    import zarr
    zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})
    if threads:
        zarr.config.set({"threading.max_workers": int(threads)})


def _job_write(job: dict, arrays: dict) -> dict:
    import numpy as np
    import annbatch
    _use_zarrs()
    coll = annbatch.DatasetCollection(job["out"])
    t = time.perf_counter()
    coll.add_adatas(adata_paths=job["paths"], shuffle=True, rng=np.random.default_rng(job["seed"]),
                    **job["options"])
    seconds = time.perf_counter() - t
    keys = [g.basename for g in coll]
    n_obs = sum(_n_rows(g["X"]) for g in coll)
    return {"seconds": seconds, "dataset_keys": keys, "n_obs": n_obs, "versions": _versions()}


def _n_rows(x) -> int:
    """Rows of an X node: a sparse group's ``shape`` attribute, or a dense array's shape."""
    shape = x.attrs.get("shape")
    return int(shape[0] if shape is not None else x.shape[0])


def _job_load(job: dict, arrays: dict) -> dict:
    import anndata as ad
    import numpy as np
    import pandas as pd
    import annbatch
    _use_zarrs()
    cols = job["obs_columns"]
    kw = {}
    if cols is not None:
        want = ["src_path"] + [c for c in cols if c != "src_path"]

        def load_adata(g):  # annbatch's README: custom_load_func
            var = g["var"]
            return ad.AnnData(X=ad.io.sparse_dataset(g["X"]), obs=ad.io.read_elem(g["obs"])[want],
                              var=pd.DataFrame(index=pd.Index(
                                  ad.io.read_elem(var[var.attrs.get("_index", "_index")]))))
        kw["load_adata"] = load_adata
    t = time.perf_counter()
    data, indices, indptr, index, obs, sizes = [], [], [np.zeros(1, np.int64)], [], [], []
    nnz = 0
    with ad.settings.override(remove_unused_categories=False):
        loader = annbatch.Loader(batch_size=job["batch_size"], chunk_size=job["chunk_size"],
                                 preload_nchunks=job["preload_nchunks"], shuffle=job["shuffle"],
                                 rng=np.random.default_rng(job["seed"]), return_index=True,
                                 preload_to_gpu=False)
        loader.use_collection(annbatch.DatasetCollection(job["path"], mode="r"), **kw)
        for b in loader:
            x = b["X"].tocsr()
            data.append(x.data)
            indices.append(x.indices.astype(np.int64))
            indptr.append(x.indptr[1:].astype(np.int64) + nnz)
            nnz += int(x.indptr[-1])
            index.append(np.asarray(b["index"], dtype=np.int64))
            if b["obs"] is not None:
                obs.append(b["obs"])
            sizes.append(int(x.shape[0]))
    seconds = time.perf_counter() - t
    arrays["X/data"] = np.concatenate(data) if data else np.zeros(0, np.float32)
    arrays["X/indices"] = np.concatenate(indices) if indices else np.zeros(0, np.int64)
    arrays["X/indptr"] = np.concatenate(indptr)
    arrays["index"] = np.concatenate(index) if index else np.zeros(0, np.int64)
    arrays["var_names"] = np.array([str(v) for v in loader.var.index], dtype=str)
    frame = pd.concat(obs) if obs else pd.DataFrame()
    return {"n_cells": int(sum(sizes)), "n_obs": int(loader.n_obs), "n_vars": int(loader.n_var),
            "batch_sizes": sizes, "obs": encode_frame(frame, arrays, "obs/"),
            "seconds": seconds, "versions": _versions()}


def _backed_adata(g, cols):
    """An AnnData the way annbatch's load_all_aligned makes one (X backed, obs read), var read
    whole (add_adatas compares var frames), obs subset to ``cols`` when given."""
    import anndata as ad
    x = g["X"]
    X = ad.io.sparse_dataset(x) if x.attrs.get("encoding-type") == "csr_matrix" else x
    obs = ad.io.read_elem(g["obs"])
    if cols is not None:
        obs = obs[cols]
    return ad.AnnData(X=X, obs=obs, var=ad.io.read_elem(g["var"]))


def _job_loader(job: dict, arrays: dict) -> dict:
    import anndata as ad
    import numpy as np
    import scipy.sparse as sp
    import zarr
    import annbatch
    _use_zarrs()
    src, args = job["source"], dict(job["args"])
    seed = args.pop("seed", None)
    if seed is not None:
        args["rng"] = np.random.default_rng(seed)
    cols = src.get("obs_columns")
    epochs = []
    with ad.settings.override(remove_unused_categories=False):
        loader = annbatch.Loader(**args, preload_to_gpu=False)
        if "collection" in src:
            kw = {}
            if cols is not None:
                kw["load_adata"] = lambda g: _backed_adata(g, cols)
            loader.use_collection(annbatch.DatasetCollection(src["collection"], mode="r"), **kw)
        else:
            loader.add_adatas([_backed_adata(zarr.open_group(p, mode="r"), cols)
                               for p in src["adatas"]])
        for e in range(job["epochs"]):
            p = f"e{e}/"
            xs, obs, index, sizes, types, obs_dtypes = [], [], [], [], [], []
            first = None
            for b in loader:
                x = b["X"]
                types.append(type(x).__name__)
                if first is None:
                    first = ({"data": str(x.data.dtype), "indices": str(x.indices.dtype),
                              "indptr": str(x.indptr.dtype)} if sp.issparse(x)
                             else {"X": str(x.dtype)})
                xs.append(x)
                sizes.append(int(x.shape[0]))
                if b["obs"] is not None:
                    obs.append(b["obs"])
                    obs_dtypes.append({c: str(t) for c, t in b["obs"].dtypes.items()})
                if b["index"] is not None:
                    index.append(np.asarray(b["index"]))
            sparse = bool(xs) and sp.issparse(xs[0])
            if sparse:
                X = sp.vstack(xs, format="csr")
                arrays[p + "X/data"], arrays[p + "X/indices"] = X.data, X.indices
                arrays[p + "X/indptr"] = X.indptr
            else:
                arrays[p + "X"] = np.concatenate(xs) if xs else np.zeros((0, loader.n_var))
            if index:
                arrays[p + "index"] = np.concatenate(index)
            import pandas as pd
            epochs.append({"n_cells": int(sum(sizes)), "batch_sizes": sizes, "x_types": types,
                           "x_dtypes": first, "sparse": sparse, "obs_dtypes": obs_dtypes,
                           "obs": encode_frame(pd.concat(obs), arrays, p + "obs/")
                           if obs else None})
    if loader.var is not None:
        arrays["var_names"] = np.array([str(v) for v in loader.var.index], dtype=str)
    return {"epochs": epochs, "n_vars": int(loader.n_var), "n_batches": len(loader),
            "versions": _versions()}


def _job_script(job: dict, arrays: dict) -> dict:
    _use_zarrs()
    ns = {"__name__": "__main__"}
    exec(compile(job["source"], "<script>", "exec"), ns)
    return {"result": ns["result"]}


def _store_loader(job: dict):
    """annbatch's Loader over one anndata Zarr store (no collection): ``add_adata`` of an
    AnnData whose X is the store's backed CSR (``anndata.io.sparse_dataset``, the form
    annbatch's README's ``custom_load_func`` and its ``load_all_aligned`` use) and var the
    store's var index; obs left out, so batches carry X (and the index) only, as zbatch's do.
    ``anndata.experimental.read_lazy`` is no way in: its X is a dask array, which the Loader
    refuses (it takes CSRDataset, zarr.Array, scipy CSR or numpy)."""
    import anndata as ad
    import numpy as np
    import pandas as pd
    import zarr
    import annbatch
    g = zarr.open_group(job["path"], mode="r")
    var = g["var"]
    adata = ad.AnnData(X=ad.io.sparse_dataset(g["X"]), var=pd.DataFrame(index=pd.Index(
        ad.io.read_elem(var[var.attrs.get("_index", "_index")]))))
    loader = annbatch.Loader(batch_size=job["batch_size"], chunk_size=job["chunk_size"],
                             preload_nchunks=job["preload_nchunks"], shuffle=True,
                             rng=np.random.default_rng(job["seed"]),
                             return_index=bool(job.get("return_index", False)),
                             preload_to_gpu=False)
    return loader.add_adata(adata)


def _job_bench(job: dict, arrays: dict) -> dict:
    """The peer's timing loop, here in annbatch's interpreter: bench/peers' ``measure`` (the
    same steady-state rule as every peer: from the first batch on, epochs restarted, the
    loader's RNG running on) over ``Loader`` batches, counted by ``batch["X"].shape[0]``."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # bench.peers: standard library + numpy only
    from bench.peers import measure
    _use_zarrs(job.get("threads"))
    t = time.perf_counter()
    loader = _store_loader(job)
    open_s = time.perf_counter() - t
    kinds: set = set()

    def count(b):
        if len(kinds) < 2:
            kinds.add(f"{type(b['X']).__module__}.{type(b['X']).__name__}")
        return b["X"].shape[0]

    m = measure(lambda _e: loader, job["seconds"], count)
    return {**m, "open_s": open_s, "batch_types": sorted(kinds), "n_obs": int(loader.n_obs),
            "n_vars": int(loader.n_var), "versions": _versions()}


def _job_rows(job: dict, arrays: dict) -> dict:
    """One epoch of the Loader (``return_index=True``); the rows it yielded for ``ids``, in the
    order asked, and whether the epoch yielded every cell exactly once."""
    import numpy as np
    _use_zarrs(job.get("threads"))
    loader = _store_loader(dict(job, return_index=True))
    want = np.asarray(job["ids"], dtype=np.int64)
    seen = np.zeros(loader.n_obs, dtype=np.int64)
    rows: dict = {}
    kinds: set = set()
    for b in loader:
        idx = np.asarray(b["index"], dtype=np.int64)
        np.add.at(seen, idx, 1)
        kinds.add(f"{type(b['X']).__module__}.{type(b['X']).__name__}")
        hit = np.flatnonzero(np.isin(idx, want))
        if hit.size:
            x = b["X"].tocsr()
            for k in hit:
                rows[int(idx[k])] = x[int(k)]
    import scipy.sparse as sp
    missing = [int(i) for i in want if int(i) not in rows]
    if not missing:
        x = sp.vstack([rows[int(i)] for i in want], format="csr")
        arrays["X/data"], arrays["X/indices"], arrays["X/indptr"] = x.data, x.indices, x.indptr
    return {"n_obs": int(loader.n_obs), "n_vars": int(loader.n_var), "missing": missing,
            "every_cell_once": bool((seen == 1).all()), "batch_types": sorted(kinds),
            "versions": _versions()}


def _job_open(job: dict, arrays: dict) -> dict:
    import annbatch
    _use_zarrs()
    coll = annbatch.DatasetCollection(job["path"], mode="r")
    keys = [g.basename for g in coll]
    sizes = [_n_rows(g["X"]) for g in coll]
    obs = coll.obs(job["columns"])
    return {"dataset_keys": keys, "dataset_sizes": sizes, "is_empty": bool(coll.is_empty),
            "obs": encode_frame(obs, arrays, "obs/"), "versions": _versions()}


def _worker(job_path: str, out_dir: str) -> int:
    import numpy as np
    job = json.loads(Path(job_path).read_text())
    arrays: dict = {}
    res = {"write": _job_write, "load": _job_load, "open": _job_open, "loader": _job_loader,
           "script": _job_script, "bench": _job_bench, "rows": _job_rows}[job["op"]](job, arrays)
    out = Path(out_dir)
    if arrays:
        np.savez(out / "arrays.npz", **arrays)
    (out / "result.json").write_text(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1], sys.argv[2]))
