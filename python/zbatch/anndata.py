"""annbatch's ``Loader`` on zbatch's engine: an annbatch 0.3.1 script is ported by changing
its import line.

    >>> from zbatch.anndata import Loader          # was: from annbatch import Loader
    >>> ds = Loader(batch_size=4096, chunk_size=32, preload_nchunks=256, shuffle=True,
    ...             rng=np.random.default_rng(0), to="torch")
    >>> ds.use_collection(DatasetCollection("collection.zarr"), load_adata=custom_load_func)
    >>> for batch in ds:
    ...     x, obs = batch["X"], batch["obs"]

The sampling is annbatch's, draw for draw: ``shuffle=True`` shuffles the chunks of
``chunk_size`` contiguous cells with ``rng.shuffle``, loads ``preload_nchunks`` chunks at a time
and shuffles each load into batches with the same generator calls annbatch makes, so the same
``rng`` gives the same batches in the same order (``shuffle=False``: sequential). Each load is
one coalesced read through libzbatch (``Dataset.read_many``: every chunk it touches decoded
once, on the dataset's decode threads), read one load ahead on a background thread; the batches
are split out of it as annbatch splits them. Batches are annbatch's dicts: ``X`` (a
``scipy.sparse.csr_matrix`` or ``numpy.ndarray``; with ``to="torch"`` a sparse CSR or dense
``torch.Tensor`` made as annbatch makes them), ``obs`` (a pandas DataFrame of the obs columns
the AnnData carried, indexed by obs names; categoricals stay ``pd.Categorical``), ``var`` and
``index`` (with ``return_index=True``).

What is added: AnnData objects whose X is backed by a Zarr store (``ad.io.sparse_dataset`` of a
zarr group, a ``zarr.Array``, ``ad.experimental.read_elem_lazy`` / ``read_lazy`` arrays), and,
beyond annbatch, store paths and zarr groups. In-memory AnnData (X a scipy matrix or numpy
array) is refused: zbatch reads stores. docs/ANNDATA.md ("Porting from annbatch") lists what
differs.
"""
from __future__ import annotations

import functools
import math
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

__all__ = ["Loader", "DatasetCollection", "RandomSampler", "SequentialSampler"]

if find_spec("torch") is not None:  # annbatch's Loader is a torch IterableDataset when it can be
    from torch.utils.data import IterableDataset as _Base
else:  # pragma: no cover - torch is in zbatch's environment
    _Base = object

#: annbatch's markers of a collection it wrote (annbatch/io.py V1_ENCODING)
_COLLECTION_ATTRS = {"encoding-type": "annbatch-preshuffled", "encoding-version": "0.1.0"}


# ------------------------------------------------------------------------------------------------
# Sampling: annbatch 0.3.1's _ChunkSampler (samplers/_chunk_sampler.py) without replacement,
# num_samples or masks, which its Loader's own samplers never use. The generator calls are
# annbatch's, in annbatch's order, so one seeded Generator gives annbatch's batches.
# ------------------------------------------------------------------------------------------------
def _split_given_size(a: np.ndarray, size: int, *, copy: bool = False) -> list:
    pieces = np.split(a, np.arange(size, len(a), size))
    return [p.copy() for p in pieces] if copy else pieces


def _check_lt_1(vals, names) -> None:
    for v, name in zip(vals, names):
        if v < 1:
            raise ValueError(f"{name} must be greater than 1, got {v}")


def _resolve_rng(rng) -> np.random.Generator:
    if rng is None:
        return np.random.default_rng()
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        warnings.warn(f"Passing a seed as rng is deprecated; pass np.random.default_rng({rng!r}) "
                      "instead.", FutureWarning, stacklevel=4)
        return np.random.default_rng(rng)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}.")
    return rng


def _torch_worker() -> Optional[tuple[int, int]]:
    if find_spec("torch") is None:  # pragma: no cover
        return None
    from torch.utils.data import get_worker_info
    info = get_worker_info()
    return None if info is None else (int(info.id), int(info.num_workers))


class _ChunkSampler:
    """annbatch's chunk sampler: chunks of ``chunk_size`` contiguous rows, ``preload_nchunks``
    of them per load, each load split into batches of ``batch_size``."""

    def __init__(self, chunk_size: int, preload_nchunks: int, batch_size: int, *,
                 shuffle: bool, drop_last: bool = False, rng=None):
        _check_lt_1([chunk_size, preload_nchunks], ["Chunk size", "Preloaded chunks"])
        preload = chunk_size * preload_nchunks
        if batch_size > preload:
            raise ValueError("batch_size cannot exceed chunk_size * preload_nchunks. "
                             f"Got batch_size={batch_size}, but max is {preload}.")
        if preload % batch_size != 0:
            raise ValueError("chunk_size * preload_nchunks must be divisible by batch_size. "
                             f"Got {preload} % {batch_size} = {preload % batch_size}.")
        self._rng = _resolve_rng(rng) if shuffle or rng is not None else None
        self._chunk_size, self._preload_nchunks = int(chunk_size), int(preload_nchunks)
        self._batch_size, self._shuffle, self._drop_last = int(batch_size), bool(shuffle), \
            bool(drop_last)
        self._in_memory_size = preload

    batch_size = property(lambda self: self._batch_size)
    shuffle = property(lambda self: self._shuffle)
    chunk_size = property(lambda self: self._chunk_size)
    preload_nchunks = property(lambda self: self._preload_nchunks)
    drop_last = property(lambda self: self._drop_last)

    @property
    def rng(self) -> Optional[np.random.Generator]:
        return self._rng

    @rng.setter
    def rng(self, value) -> None:
        self._rng = value

    def n_batches(self, n_obs: int) -> int:
        return n_obs // self._batch_size if self._drop_last else math.ceil(n_obs / self._batch_size)

    def validate(self, n_obs: int) -> None:
        if n_obs < 1:
            raise ValueError(f"Number of observations must be greater than 1, got {n_obs}")

    def sample(self, n_obs: int) -> Iterator[dict]:
        self.validate(n_obs)
        worker = _torch_worker()
        if worker is not None and worker[1] > 1:
            if not self._shuffle:
                raise ValueError("Multiple workers are not supported with non-shuffled sampling.")
            if not self._drop_last and self._batch_size > 1:
                raise ValueError("drop_last=False is not supported when using DataLoader with "
                                 "multiple workers and batch_size>1.")
        rng = self._rng
        batch_rng = rng
        if worker is not None and rng is not None:  # annbatch's _spawn_worker_rng
            batch_rng = np.random.default_rng([worker[0], rng.integers(np.iinfo(np.int64).max)])
        slices = self._slices(n_obs, rng)
        if worker is not None:
            slices = np.array_split(slices, worker[1])[worker[0]]
        per_request = _split_given_size(slices, self._preload_nchunks)
        batch_indices = np.arange(self._in_memory_size)
        splits = _split_given_size(batch_indices, self._batch_size)
        for request in per_request[:-1]:
            if self._shuffle:
                batch_rng.shuffle(batch_indices)
                splits = _split_given_size(batch_indices, self._batch_size, copy=True)
            yield {"requests": list(request), "splits": splits}
        final = list(per_request[-1])
        total = int(sum(s.stop - s.start for s in final))
        if self._drop_last:
            if total < self._batch_size:
                return
            total -= total % self._batch_size
        indices = batch_rng.permutation(total) if self._shuffle else np.arange(total)
        yield {"requests": final, "splits": _split_given_size(indices, self._batch_size)}

    def _slices(self, n_obs: int, rng) -> list:
        order = np.arange(math.ceil(n_obs / self._chunk_size))
        if self._shuffle:
            rng.shuffle(order)
        n, pivot = len(order), order[-1]
        offsets = np.ones(n + 1, dtype=int) * self._chunk_size
        offsets[0] = 0
        incomplete = n_obs % self._chunk_size
        offsets[pivot + 1] = incomplete if incomplete else self._chunk_size
        offsets = np.cumsum(offsets)
        starts, stops = offsets[:-1][order], offsets[1:][order]
        return [slice(int(s), int(e)) for s, e in zip(starts, stops)]

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(chunk_size={self._chunk_size}, preload_nchunks="
                f"{self._preload_nchunks}, batch_size={self._batch_size}, drop_last="
                f"{self._drop_last})")


class RandomSampler(_ChunkSampler):
    """annbatch's ``RandomSampler`` (without replacement): chunks in random order, each load
    shuffled into batches."""

    def __init__(self, chunk_size: int, preload_nchunks: int, batch_size: int, *,
                 drop_last: bool = False, rng=None):
        super().__init__(chunk_size, preload_nchunks, batch_size, shuffle=True,
                         drop_last=drop_last, rng=rng)


class SequentialSampler(_ChunkSampler):
    """annbatch's ``SequentialSampler``: every row once, in order."""

    def __init__(self, chunk_size: int, preload_nchunks: int, batch_size: int, *,
                 drop_last: bool = False):
        super().__init__(chunk_size, preload_nchunks, batch_size, shuffle=False,
                         drop_last=drop_last)


# ------------------------------------------------------------------------------------------------
# Where an added object's X lives
# ------------------------------------------------------------------------------------------------
@dataclass
class _Part:
    store: str            # the store directory
    group: str            # the AnnData group in it ("" = root)
    layer: Optional[str]  # None (X), "raw" or a layer name
    ds: Any               # the zbatch Dataset
    obs: Any              # pandas DataFrame or None
    var: Any              # pandas DataFrame or None

    @property
    def where(self) -> str:
        return self.store + (f" (group {self.group!r})" if self.group else "") + \
            (f" (layer {self.layer!r})" if self.layer else "")


def _zarr_node_location(node) -> tuple[str, str]:
    """(store directory, node path) of a zarr-python Group or Array on a local store."""
    store = node.store
    root = getattr(store, "root", None)
    if root is None:
        raise TypeError(f"zbatch.anndata reads local Zarr stores; {node!r} lives in "
                        f"{type(store).__name__}, not a directory")
    return str(root), str(node.path).strip("/")


def _x_node_to_group(store: str, path: str) -> tuple[str, str, Optional[str]]:
    """An X node's path -> (store, AnnData group, layer)."""
    parts = [p for p in path.split("/") if p]
    if parts and parts[-1] == "X":
        if len(parts) >= 2 and parts[-2] == "raw":
            return store, "/".join(parts[:-2]), "raw"
        return store, "/".join(parts[:-1]), None
    if len(parts) >= 2 and parts[-2] == "layers":
        return store, "/".join(parts[:-2]), parts[-1]
    raise ValueError(f"{store}: the matrix at {path!r} is not an AnnData X, raw/X or "
                     "layers/NAME; zbatch reads the matrices of AnnData stores")


def _backing_of_dask(x) -> Any:
    """The CSRDataset or zarr.Array an unmodified ``read_elem_lazy`` dask array reads."""
    graph = dict(x.__dask_graph__())
    if len(getattr(x.__dask_graph__(), "layers", {None: 0})) != 1:
        raise ValueError("X is a lazy (dask) array with operations on it (a subset, a "
                         "computation): zbatch reads the stored matrix itself; pass the AnnData "
                         "before subsetting, or write the subset to a store")
    seen = 0
    for task in graph.values():
        seen += 1
        stack = [task]
        while stack:
            o = stack.pop()
            o = getattr(o, "value", o)
            if isinstance(o, functools.partial):
                stack.extend(o.args)
                stack.extend(o.keywords.values())
            elif _is_csr_dataset(o) or _is_zarr_array(o):
                if tuple(o.shape) != tuple(x.shape):
                    raise ValueError("X is a lazy (dask) array of part of a stored matrix")
                return o
            elif isinstance(o, (tuple, list)):
                stack.extend(o)
            else:
                stack.extend(getattr(o, "args", ()) or ())
                kw = getattr(o, "kwargs", None)
                if isinstance(kw, dict):
                    stack.extend(kw.values())
        if seen > 4:
            break
    raise TypeError("X is a lazy (dask) array that does not read a Zarr store zbatch can find "
                    "(an .h5ad behind it?); zbatch reads Zarr stores")


def _where(node) -> str:
    store, path = _zarr_node_location(node)
    return store + (f" (group {path!r})" if path else "")


def _instance_of(o, module: str, path: str) -> bool:
    """isinstance(o, module.path) when that package is importable (anndata and zarr are not
    zbatch's dependencies: without them no object can be theirs)."""
    import importlib
    try:
        cls = importlib.import_module(module)
        for name in path.split("."):
            cls = getattr(cls, name)
    except (ImportError, AttributeError):  # pragma: no cover - depends on the environment
        return False
    return isinstance(o, cls)


def _is_csr_dataset(o) -> bool:
    return _instance_of(o, "anndata", "abc.CSRDataset")


def _is_zarr_array(o) -> bool:
    return _instance_of(o, "zarr", "Array")


def _is_zarr_group(o) -> bool:
    return _instance_of(o, "zarr", "Group")


def _is_anndata(o) -> bool:
    return _instance_of(o, "anndata", "AnnData")


def _locate_matrix(x) -> tuple[str, str, Optional[str]]:
    """(store, group, layer) behind a backed matrix: a CSRDataset, a zarr.Array, a dask array
    of either."""
    if type(x).__module__.startswith("dask"):
        x = _backing_of_dask(x)
    if _is_csr_dataset(x):
        if getattr(x, "backend", "zarr") != "zarr":
            raise TypeError("X is backed by an .h5ad file: zbatch reads Zarr stores (annbatch "
                            "refuses h5ad-backed X too); convert it with `zbatch convert` or "
                            "`adata.write_zarr`")
        return _x_node_to_group(*_zarr_node_location(x.group))
    if _is_zarr_array(x):
        return _x_node_to_group(*_zarr_node_location(x))
    import scipy.sparse as sp
    if isinstance(x, np.ndarray) or sp.issparse(x):
        raise TypeError(f"X is in memory ({type(x).__module__}.{type(x).__name__}), with no "
                        "store behind it: zbatch reads Zarr stores. Write it with "
                        "`adata.write_zarr(path)` and add the path, or open it backed: "
                        "`ad.AnnData(X=ad.io.sparse_dataset(zarr.open_group(path)['X']), "
                        "obs=...)`")
    raise TypeError(f"cannot read X of type {type(x).__module__}.{type(x).__name__}: zbatch "
                    "reads X backed by a Zarr store (ad.io.sparse_dataset, zarr.Array, "
                    "read_elem_lazy / read_lazy)")


def _to_frame(obs):
    """An obs as a pandas DataFrame (a lazy read_lazy Dataset2D is read into memory)."""
    import pandas as pd
    if obs is None or isinstance(obs, pd.DataFrame):
        return obs
    if hasattr(obs, "to_memory"):  # anndata's Dataset2D (read_lazy)
        if hasattr(obs, "true_index"):
            obs.index = obs.true_index
        df = obs.to_memory()
        if "_index" in df.columns:
            df.index = df.pop("_index")
        return df
    raise TypeError(f"obs must be a pandas DataFrame, not {type(obs).__name__}")


def _select(obs, keys, where):
    if obs is None or keys is None:
        return obs
    missing = [k for k in keys if k not in obs.columns]
    if missing:
        raise KeyError(f"{where}: obs has no column {missing[0]!r} (it has "
                       f"{list(obs.columns)})")
    return obs[list(keys)]


# ------------------------------------------------------------------------------------------------
# annbatch's DatasetCollection, the reading side
# ------------------------------------------------------------------------------------------------
class DatasetCollection:
    """annbatch's ``DatasetCollection`` for reading a collection annbatch (or ``zbatch
    convert``) wrote: ``use_collection`` takes it, ``iter()`` gives its ``dataset_k`` zarr
    groups in annbatch's order, ``is_empty`` and ``obs(columns)`` are annbatch's. Writing
    (``add_adatas``) is annbatch's or ``zbatch convert``'s job, not this class's."""

    def __init__(self, group, *, mode: str = "r", is_collection_h5ad: bool = False):
        import zarr
        if is_collection_h5ad:
            raise ValueError("h5ad collections cannot be loaded: zbatch reads Zarr collections")
        if mode not in ("r", "a", "r+"):
            raise ValueError(f"mode must be 'r', 'a' or 'r+', not {mode!r}")
        if _is_zarr_group(group):
            self._group = group
        elif isinstance(group, (str, os.PathLike)):
            if not Path(group).exists():
                raise FileNotFoundError(f"{group}: no such collection")
            self._group = zarr.open_group(str(group), mode="r")
        else:
            raise TypeError("Group must either be a zarr group or a path")

    @property
    def _dataset_keys(self) -> list:
        return sorted((k for k in self._group.keys() if k.startswith("dataset_")
                       and k.split("_", 1)[1].isdigit()), key=lambda k: int(k.split("_")[1]))

    def __iter__(self):
        for k in self._dataset_keys:
            yield self._group[k]

    @property
    def is_empty(self) -> bool:
        return not (_COLLECTION_ATTRS.items() <= dict(self._group.attrs).items()) or \
            not self._dataset_keys

    def obs(self, columns: Optional[Sequence[str]] = None):
        """The datasets' obs, concatenated (as annbatch's, read through zbatch)."""
        import pandas as pd
        import zbatch
        if columns is not None and len(columns) == 0:
            return pd.DataFrame()
        store, base = _zarr_node_location(self._group)
        frames = []
        for k in self._dataset_keys:
            obs = zbatch.open(store, group="/".join(p for p in (base, k) if p)).obs
            frames.append(obs if columns is None else obs[[c for c in columns
                                                          if c in obs.columns]])
        return pd.concat(frames) if frames else pd.DataFrame()

    def add_adatas(self, *args, **kwargs):
        raise NotImplementedError("zbatch.anndata.DatasetCollection reads collections; write "
                                  "one with `zbatch convert` or annbatch's DatasetCollection")


# ------------------------------------------------------------------------------------------------
# The loader
# ------------------------------------------------------------------------------------------------
class Loader(_Base):
    """annbatch 0.3.1's ``Loader`` on zbatch: same arguments, same defaults
    (``Loader._COMMON_SAMPLER_ARGS``), same batches.

    Parameters:
        chunk_size: rows of contiguous data per chunk (default 512).
        preload_nchunks: chunks loaded together, one coalesced read (default 32).
        batch_size: rows per batch (default 1).
        shuffle: ``True``: chunks in random order, each load shuffled (annbatch's
            RandomSampler); else sequential.
        return_index: batches carry ``index``, each row's position over the added data.
        drop_last: drop the last incomplete batch.
        rng: a ``numpy.random.Generator`` (an int seed is deprecated, as in annbatch).
        to: ``None`` (scipy / numpy) or ``"torch"``.
        batch_sampler: an annbatch-style sampler (``sample(n_obs)`` yielding load requests of
            ``requests`` and ``splits``, ``n_batches(n_obs)``), instead of the arguments above.
        preload_to_gpu: ``True`` needs ``to="torch"`` and CUDA: tensors are moved with
            ``.cuda(non_blocking=True)`` (annbatch's cupy arrays are not made).
        num_threads: (zbatch) decode threads; default: the CPUs.
    """

    _COMMON_SAMPLER_ARGS = {"chunk_size": 512, "preload_nchunks": 32, "batch_size": 1,
                            "drop_last": False}

    def __init__(self, *, batch_sampler=None, chunk_size: Optional[int] = None,
                 preload_nchunks: Optional[int] = None, shuffle: Optional[bool] = None,
                 return_index: bool = False, batch_size: Optional[int] = None,
                 preload_to_gpu: bool = False, drop_last: Optional[bool] = None,
                 to: Optional[str] = None, rng: Optional[np.random.Generator] = None,
                 num_threads: Optional[int] = None):
        core = {"chunk_size": chunk_size, "preload_nchunks": preload_nchunks,
                "batch_size": batch_size, "drop_last": drop_last}
        given = {**core, "rng": rng, "shuffle": shuffle}
        if batch_sampler is not None:
            provided = [k for k, v in given.items() if v is not None]
            if provided:
                raise ValueError(f"Cannot specify {', '.join(provided)} when providing a custom "
                                 "sampler. These parameters are controlled by the sampler.")
            if not (hasattr(batch_sampler, "sample") and hasattr(batch_sampler, "n_batches")):
                raise TypeError("batch_sampler must have sample(n_obs) and n_batches(n_obs) "
                                "(annbatch's Sampler interface)")
            self._batch_sampler = batch_sampler
        else:
            resolved = {k: self._COMMON_SAMPLER_ARGS[k] if v is None else v
                        for k, v in core.items()}
            if shuffle:
                self._batch_sampler = RandomSampler(**resolved, rng=rng)
            else:
                self._batch_sampler = SequentialSampler(**resolved)
        if to not in (None, "torch"):
            raise ValueError(f"to={to!r}: zbatch.anndata.Loader yields scipy/numpy (to=None) or "
                             "torch (to='torch') batches; jax is not supported")
        if to == "torch" and find_spec("torch") is None:  # pragma: no cover
            raise ImportError("Could not find torch dependency. Try `pip install torch`.")
        if preload_to_gpu:
            if to != "torch":
                raise ValueError("preload_to_gpu=True: zbatch.anndata.Loader does not make cupy "
                                 "arrays; use to='torch' (tensors are moved to CUDA) or leave "
                                 "preload_to_gpu=False")
            import torch
            if not torch.cuda.is_available():
                raise RuntimeError("preload_to_gpu=True needs a CUDA device, and torch finds "
                                   "none; leave preload_to_gpu=False")
        self._return_index = bool(return_index)
        self._preload_to_gpu = bool(preload_to_gpu)
        self._to = to
        self._threads = int(num_threads) if num_threads else (os.cpu_count() or 1)
        self._parts: list[_Part] = []
        self._obs_present: Optional[bool] = None
        self._var = None
        self._collection_added = False
        self._num_open_iters = 0
        self._engine_cache = None
        self._obs_cache = None

    # -- what annbatch's Loader exposes ----------------------------------------------------------
    def __len__(self) -> int:
        return self._batch_sampler.n_batches(self.n_obs)

    @property
    def n_obs(self) -> int:
        return sum(len(p.ds) for p in self._parts)

    @property
    def n_var(self) -> int:
        if not self._parts:
            raise ValueError("No datasets added yet")
        return self._parts[0].ds.n_vars

    @property
    def var(self):
        return self._var

    @property
    def batch_sampler(self):
        return self._batch_sampler

    @property
    def dataset(self):
        """(zbatch) The zbatch Dataset batches are read from (a MultiDataset for several)."""
        return self._engine()

    # -- adding data -----------------------------------------------------------------------------
    def use_collection(self, collection, *, load_adata: Optional[Callable] = None,
                       obs_keys: Optional[Sequence[str]] = None) -> "Loader":
        """The datasets of an annbatch collection: a ``DatasetCollection`` (anything holding
        its zarr group as ``._group``), a zarr group, or a path. ``load_adata(group)`` makes
        each dataset's AnnData as in annbatch (default: X, all obs columns, var names);
        ``obs_keys`` (zbatch) keeps only those obs columns. Only one collection per loader."""
        coll = DatasetCollection(self._collection_group(collection))
        root, keys = coll._group, coll._dataset_keys
        if coll.is_empty:
            raise ValueError(f"DatasetCollection is empty ({_where(root)}: no dataset_k groups "
                             "under annbatch's collection marker)")
        if self._collection_added:
            raise RuntimeError("You should not add multiple collections, independently shuffled "
                               "- please preshuffle multiple collections, or use `add_adatas` "
                               "manually if you know what you are doing.")
        if load_adata is None:
            store, base = _zarr_node_location(root)
            items = [(store, "/".join(p for p in (base, k) if p), None) for k in keys]
            self._add_parts([self._part_from_store(s, g, l, obs_keys) for s, g, l in items])
        else:
            self.add_adatas([load_adata(root[k]) for k in keys], obs_keys=obs_keys)
        self._collection_added = True
        return self

    @staticmethod
    def _collection_group(collection):
        import zarr
        if _is_zarr_group(collection):
            return collection
        if isinstance(collection, (str, os.PathLike)):
            p = Path(collection)
            if not p.exists():
                raise FileNotFoundError(f"{p}: no such collection")
            return zarr.open_group(str(p), mode="r")
        g = getattr(collection, "_group", None)
        if _is_zarr_group(g):
            return g
        if isinstance(g, (str, os.PathLike)):
            raise ValueError("an h5ad DatasetCollection cannot be loaded (annbatch cannot "
                             "either): zbatch reads Zarr collections")
        path = getattr(collection, "path", None)
        if isinstance(path, (str, os.PathLike)):
            return zarr.open_group(str(path), mode="r")
        raise TypeError(f"use_collection takes an annbatch DatasetCollection, a zarr group or a "
                        f"path, not {type(collection).__name__}")

    def add_adatas(self, adatas: Sequence, *, obs_keys: Optional[Sequence[str]] = None
                   ) -> "Loader":
        """Appends AnnData objects backed by Zarr stores, store paths or zarr groups (all
        checked before any is added)."""
        adatas = list(adatas)
        _check_lt_1([len(adatas)], ["Number of adatas"])
        self._add_parts([self._part_of(a, obs_keys) for a in adatas])
        return self

    def add_adata(self, adata, *, obs_keys: Optional[Sequence[str]] = None) -> "Loader":
        """Appends one AnnData (X backed by a Zarr store), store path or zarr group."""
        return self.add_adatas([adata], obs_keys=obs_keys)

    def add_datasets(self, datasets: Sequence, obs: Optional[Sequence] = None,
                     var: Optional[Sequence] = None) -> "Loader":
        """Appends backed matrices (``ad.io.sparse_dataset``, ``zarr.Array``) or store paths,
        with their obs and var frames."""
        datasets = list(datasets)
        obs = [None] * len(datasets) if obs is None else list(obs)
        var = [None] * len(datasets) if var is None else list(var)
        if not (len(datasets) == len(obs) == len(var)):
            raise ValueError("datasets, obs and var must have the same length")
        parts = []
        for d, o, v in zip(datasets, obs, var):
            if isinstance(d, (str, os.PathLike)) or _is_zarr_group(d):
                part = self._part_of(d, None)
            else:
                part = self._part_from_store(*_locate_matrix(d), None, read_obs=False)
            part.obs, part.var = self._checked_frame(_to_frame(o), part, "obs"), \
                self._checked_frame(v, part, "var")
            parts.append(part)
        self._add_parts(parts)
        return self

    def add_dataset(self, dataset, obs=None, var=None) -> "Loader":
        """Appends one backed matrix (or store path) with its obs and var frames."""
        return self.add_datasets([dataset], [obs], [var])

    @staticmethod
    def _checked_frame(frame, part: _Part, what: str):
        import pandas as pd
        if frame is None:
            return None
        if not isinstance(frame, pd.DataFrame):
            raise TypeError(f"{what} must be a pandas DataFrame")
        n = len(part.ds) if what == "obs" else part.ds.n_vars
        if len(frame) != n:
            raise ValueError(f"{part.where}: {what} has {len(frame)} rows, the matrix {n}")
        return frame

    def _part_of(self, obj, obs_keys) -> _Part:
        if isinstance(obj, (str, os.PathLike)):
            return self._part_from_store(str(obj), "", None, obs_keys)
        if _is_zarr_group(obj):
            store, group = _zarr_node_location(obj)
            return self._part_from_store(store, group, None, obs_keys)
        if _is_anndata(obj):
            if getattr(obj, "isbacked", False) and not _is_csr_dataset(obj.X) and \
                    not _is_zarr_array(obj.X):
                raise TypeError("an AnnData backed by an .h5ad file: zbatch reads Zarr stores "
                                "(annbatch refuses h5ad-backed X too); convert it with "
                                "`zbatch convert` or `adata.write_zarr`")
            if getattr(obj, "is_view", False):
                raise ValueError("a view of an AnnData (a subset): zbatch reads whole stored "
                                 "matrices; add the AnnData itself or write the subset")
            part = self._part_from_store(*_locate_matrix(obj.X), None, read_obs=False)
            if tuple(obj.shape) != (len(part.ds), part.ds.n_vars):
                raise ValueError(f"{part.where}: the AnnData is {obj.shape[0]} x {obj.shape[1]}, "
                                 f"its stored X {len(part.ds)} x {part.ds.n_vars}")
            obs = _to_frame(obj.obs)
            obs = _select(obs, obs_keys, part.where)
            part.obs = obs if obs is not None and len(obs.columns) else None
            part.var = _to_frame(obj.var)
            return part
        if _is_csr_dataset(obj) or _is_zarr_array(obj) or type(obj).__module__.startswith("dask"):
            return self._part_from_store(*_locate_matrix(obj), None, read_obs=False)
        raise TypeError(f"cannot add {type(obj).__module__}.{type(obj).__name__}: zbatch.anndata "
                        "takes AnnData objects backed by Zarr stores, store paths and zarr groups")

    def _part_from_store(self, store: str, group: str, layer: Optional[str], obs_keys,
                         read_obs: bool = True) -> _Part:
        import pandas as pd
        import zbatch
        p = Path(store)
        where = str(p) + (f" (group {group!r})" if group else "")
        if not p.exists():
            raise FileNotFoundError(f"{where}: no such store")
        try:
            ds = self._open(str(p), group, layer, "stored")
        except zbatch.ZbatchError as e:
            raise ValueError(f"{where}: not an AnnData store zbatch can read: {e}") from e
        if ds.layout != "anndata":
            raise ValueError(f"{where}: not an AnnData store (zbatch sees a {ds.layout!r} "
                             "layout); an annbatch collection goes to use_collection")
        part = _Part(str(p), group, layer, ds, None, None)
        if read_obs:   # annbatch's load_all_aligned: every obs column, var's index
            obs = _select(ds.obs, obs_keys, where)
            part.obs = obs if len(obs.columns) else None
            part.var = pd.DataFrame(index=ds.var_names)
        return part

    def _open(self, store: str, group: str, layer: Optional[str], x_dtype: str):
        """A part's zbatch Dataset. Its values as stored and its gene ids as int32, as annbatch
        yields them (scipy's csr_matrix recasts uint16 ids to int32, not uint8 counts)."""
        import zbatch
        return zbatch.open(store, group=group, layer=layer, num_threads=self._threads,
                           x_dtype=x_dtype, index_dtype="int32")

    def _common_x_dtype(self, parts: list) -> list:
        """CSR parts whose stored values differ in dtype (uint8 counts beside float32) are read
        as one dtype: numpy's promotion of theirs, as far as the reader widens (float32 or
        float64, int32 or int64)."""
        if any("X/data" not in p.ds.fields for p in parts):   # dense X: delivered as stored
            return parts
        stored = {np.dtype(p.ds.fields["X/data"]["dtype"]) for p in parts}
        if len(stored) < 2:
            return parts
        r = np.result_type(*stored)
        if r.kind == "f":
            want = "float32" if r.itemsize <= 4 else "float64"
        else:
            want = "int32" if r.itemsize <= 2 or r == np.int32 else "int64"
        return [p if np.dtype(p.ds.fields["X/data"]["dtype"]) == np.dtype(want) else
                replace(p, ds=self._open(p.store, p.group, p.layer, want))
                for p in parts]

    def _add_parts(self, parts: list) -> None:
        if self._num_open_iters > 0:
            raise RuntimeError("Cannot add datasets while the loader is being iterated. Finish "
                               "or close the iterator first.")
        have = list(self._parts)
        var = self._var
        obs_present = self._obs_present
        for part in parts:
            if have:
                first = have[0]
                if obs_present and part.obs is None:
                    raise ValueError(f"{part.where}: has no obs columns, the datasets added "
                                     "before have")
                if obs_present is False and part.obs is not None:
                    raise ValueError(f"{part.where}: has obs columns, the datasets added before "
                                     "have none")
                if (var is None) != (part.var is None):
                    raise ValueError(f"{part.where}: " + ("has var, the datasets added before "
                                     "have none" if var is None else "has no var, the datasets "
                                     "added before have"))
                if part.ds.n_vars != first.ds.n_vars:
                    raise ValueError(f"All datasets must have the same number of variables: "
                                     f"{first.where} has {first.ds.n_vars}, {part.where} "
                                     f"{part.ds.n_vars}")
                if var is not None and not var.equals(part.var):
                    raise ValueError(f"All datasets must have identical var DataFrames: the var "
                                     f"of {part.where} differs from that of {first.where}")
            else:
                obs_present = part.obs is not None
                var = part.var
            have.append(part)
        if len(have) > 1:   # the engine's own check (var names, fields) before anything changes
            import zbatch
            have = self._common_x_dtype(have)
            try:
                engine = zbatch.MultiDataset([p.ds for p in have], num_threads=self._threads)
            except zbatch.ZbatchError as e:
                raise ValueError(f"the datasets cannot be read together: {e}") from e
        else:
            engine = have[0].ds if have else None
        self._parts, self._var, self._obs_present = have, var, obs_present
        self._engine_cache, self._obs_cache = engine, None

    # -- reading ---------------------------------------------------------------------------------
    def _engine(self):
        if self._engine_cache is None:
            raise ValueError("Number of datasets must be greater than 1, got 0")
        return self._engine_cache

    def _obs_columns(self):
        """obs of all parts as (index values, {name: (kind, array, dtype)}), built once."""
        if self._obs_cache is not None or not self._obs_present:
            return self._obs_cache
        import pandas as pd
        from pandas.api.types import union_categoricals
        frames = [p.obs for p in self._parts]
        names = list(frames[0].columns)
        for f in frames[1:]:
            names += [c for c in f.columns if c not in names]
        cols = {}
        for name in names:
            series = [f[name] if name in f.columns else
                      pd.Series(np.full(len(f), np.nan), index=f.index) for f in frames]
            if all(isinstance(s.dtype, pd.CategoricalDtype) for s in series):
                cats = [s.array for s in series]
                if all(c.dtype == cats[0].dtype for c in cats):
                    dtype = cats[0].dtype
                    codes = np.concatenate([c.codes for c in cats])
                else:   # differing tables: their union, sorted when it can be (anndata.concat)
                    try:
                        u = union_categoricals(cats, sort_categories=True)
                    except TypeError:
                        u = union_categoricals(cats)
                    dtype, codes = u.dtype, u.codes
                cols[name] = ("cat", np.ascontiguousarray(codes), dtype)
            else:
                s = pd.concat(series, ignore_index=True) if len(series) > 1 else series[0]
                arr = s.array if pd.api.types.is_extension_array_dtype(s.dtype) else s.to_numpy()
                cols[name] = ("arr", arr, None)
        index = np.concatenate([np.asarray(f.index, dtype=object) for f in frames]) \
            if len(frames) > 1 else np.asarray(frames[0].index, dtype=object)
        index_name = frames[0].index.name
        self._obs_cache = (index, index_name, cols)
        return self._obs_cache

    def _obs_batch(self, ids: np.ndarray):
        import pandas as pd
        cache = self._obs_columns()
        if cache is None:
            return None
        index, index_name, cols = cache
        data = {}
        for name, (kind, arr, dtype) in cols.items():
            if kind == "cat":
                data[name] = pd.Categorical.from_codes(arr[ids], dtype=dtype, validate=False)
            else:
                data[name] = arr.take(ids)
        return pd.DataFrame(data, index=pd.Index(index[ids], dtype=object, name=index_name),
                            columns=list(cols))

    def _convert(self, x):
        if self._to is None:
            return x
        x = _to_torch(x)
        return x.cuda(non_blocking=True) if self._preload_to_gpu else x

    def __iter__(self) -> Iterator[dict]:
        """One pass: batches as annbatch yields them (dicts of X, obs, var, index)."""
        self._num_open_iters += 1
        try:
            yield from self._iter()
        finally:
            self._num_open_iters -= 1

    def _iter(self) -> Iterator[dict]:
        engine = self._engine()
        n_obs = self.n_obs
        _check_lt_1([len(self._parts), n_obs], ["Number of datasets", "Number of observations"])
        self._obs_columns()
        requests = self._batch_sampler.sample(n_obs)

        def ids_of(request) -> np.ndarray:
            req = request.get("requests")
            if req is None:
                raise KeyError("load_request must contain either 'requests'.")
            if isinstance(req, np.ndarray) and np.issubdtype(req.dtype, np.integer):
                return req.astype(np.int64, copy=False)
            return np.concatenate([np.arange(s.start, s.stop, dtype=np.int64) for s in req])

        def read(ids: np.ndarray):
            return engine.read_many(ids, output="scipy")["X"]

        sampler = self._batch_sampler
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="zbatch-anndata") as pool:
            pending = None
            try:
                for request in requests:
                    ids = ids_of(request)
                    if "splits" not in request:
                        # annbatch's Sampler.sample fills them, from numpy's global generator
                        # (not the sampler's rng): the same here, so custom samplers match
                        idx = np.random.permutation(len(ids)) if sampler.shuffle \
                            else np.arange(len(ids))
                        request["splits"] = _split_given_size(idx, sampler.batch_size)
                    # the load is read in batch order, so each batch is a run of its rows
                    # (views of the load's arrays), not a fancy-indexed copy
                    sizes = [len(s) for s in request["splits"]]
                    rows = ids[np.concatenate(request["splits"])] if sizes else ids[:0]
                    future = pool.submit(read, rows)
                    if pending is not None:
                        yield from self._split(*pending)
                    pending = (sizes, rows, future)
                if pending is not None:
                    yield from self._split(*pending)
                    pending = None
            finally:
                if pending is not None:
                    pending[2].cancel()
                close = getattr(requests, "close", None)
                if close is not None:
                    close()

    def _split(self, sizes: list, rows: np.ndarray, future) -> Iterator[dict]:
        import scipy.sparse as sp
        X = future.result()
        obs = self._obs_batch(rows)   # the load's obs, once; batches are row ranges of it
        at = 0
        for n in sizes:
            ids = rows[at:at + n]
            if sp.issparse(X):
                p = X.indptr[at:at + n + 1]
                x = sp.csr_matrix((X.data[p[0]:p[-1]], X.indices[p[0]:p[-1]], p - p[0]),
                                  shape=(n, X.shape[1]))
            else:
                x = X[at:at + n]
            frame = None if obs is None else obs.iloc[at:at + n]
            at += n
            yield {"X": self._convert(x),
                   "obs": frame,
                   "var": self._var,
                   "index": ids if self._return_index else None}

    def __repr__(self) -> str:
        return (f"zbatch.anndata.Loader({len(self._parts)} datasets, n_obs="
                f"{self.n_obs if self._parts else 0}, sampler={self._batch_sampler!r})")


def _to_torch(x):
    """annbatch 0.3.1's utils._to_torch for host arrays: a CSR matrix as a sparse CSR tensor
    over its arrays, an ndarray through ``torch.from_numpy``."""
    import torch
    import scipy.sparse as sp
    if sp.issparse(x):
        with torch.sparse.check_sparse_tensor_invariants(enable=False):
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta state",
                                        UserWarning)
                if x.nnz == 0:
                    indptr = torch.from_numpy(x.indptr)
                    return torch.sparse_csr_tensor(indptr, torch.tensor([], dtype=indptr.dtype),
                                                   torch.tensor([]), size=x.shape,
                                                   dtype=torch.from_numpy(x.data).dtype)
                return torch.sparse_csr_tensor(torch.from_numpy(x.indptr),
                                               torch.from_numpy(x.indices),
                                               torch.from_numpy(x.data), size=x.shape)
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x)
    raise TypeError(f"Cannot convert {type(x)} to torch.Tensor")
