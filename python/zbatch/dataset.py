"""Datasets and batches: the coalesced reader seen from Python.

    >>> ds = zbatch.open("atlas.zarr")
    >>> len(ds), ds.layout
    (100000, 'anndata')
    >>> b = ds.read_many([5, 2, 9])
    >>> b["X"]                      # scipy.sparse.csr_matrix, 3 x n_vars
    >>> b["obs/cell_line"]          # int codes; ds.categories("obs/cell_line") gives labels
    >>> ds.obs, ds.var              # pandas DataFrames, read on first use

Nullable obs columns (anndata's nullable-integer, -boolean and -string-array) come with their
masks: ``b["obs/NAME/mask"]`` is True where a value is missing, and with ``output="numpy"`` or
``"scipy"`` ``b["obs/NAME"]`` is a ``numpy.ma.MaskedArray`` of the values under that mask (with
``"torch"``, a tensor of the values beside the mask tensor; the value under a mask is
unspecified). String columns and ``obs_names`` are in batches on request
(``zbatch.open(path, load_strings=True)``) as numpy arrays of ``str`` objects.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import numpy as np

from . import _zbatch
from ._remote import is_remote, remote_options

_KINDS = ("per_sample", "ragged", "index")

#: Stands in ``Batch._items`` for an item built on first access.
_LAZY = object()

#: Segment names of the atomic layout and the batch keys their pointer arrays get.
_SEGMENT_KEYS = {"atoms": "atoms_ptr", "edges": "edges_ptr"}


class Batch(Mapping):
    """One batch: a mapping of field name to array, in the requested sample order.

    Arrays share memory with the C batch (no copies) and keep it alive while referenced.
    ``b.stats`` holds the read statistics (chunks decoded, bytes fetched / decoded /
    delivered) and ``b.amplification`` the bytes decoded per byte delivered.
    """

    def __init__(self, raw: dict, layout: str, n_vars: int, output: str):
        self._raw = raw
        self._layout = layout
        self._n_vars = n_vars
        self._output = output
        self._items: dict[str, Any] = {}
        # items built on first access (name -> function; _LAZY in _items until then): the
        # CSR matrix of X, whose construction scans index arrays that are no longer in cache
        # (half a millisecond per 256-cell batch, 17% of the consumer thread at 85k dense
        # cells/s) and which a consumer of X_dense never reads
        self._lazy: dict[str, Callable[[], Any]] = {}
        self.stats: dict[str, int] = raw["stats"]
        self._build()

    @property
    def amplification(self) -> float:
        d = self.stats["bytes_delivered"]
        return self.stats["bytes_decoded"] / d if d else 0.0

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __getitem__(self, key: str) -> Any:
        v = self._items[key]
        if v is _LAZY:
            v = self._items[key] = self._lazy.pop(key)()
        return v

    def _materialize(self) -> None:
        """Builds every item not built yet (for code that walks ``_items``)."""
        for key in list(self._lazy):
            self[key]

    def __repr__(self) -> str:
        self._materialize()
        parts = ", ".join(f"{k}: {getattr(v, 'shape', '?')}" for k, v in self._items.items())
        return f"Batch({self.size} samples; {parts})"

    @property
    def size(self) -> int:
        return len(self._items["index"])

    def _array(self, entry) -> np.ndarray:
        buf, typestr, shape, _kind, _seg = entry
        return np.frombuffer(buf, dtype=np.dtype(typestr)).reshape(shape)

    def _build(self) -> None:
        raw = self._raw
        items = self._items
        segs = {name: np.frombuffer(buf, dtype=np.int64) for name, buf in raw["segments"].items()}
        fields = {name: self._array(e) if not isinstance(e[0], list)
                  else np.array(e[0], dtype=object)          # strings: a list of str
                  for name, e in raw["fields"].items()}
        items["index"] = np.frombuffer(raw["index"], dtype=np.uint64)
        if "dataset" in raw:
            items["dataset"] = np.frombuffer(raw["dataset"], dtype=np.int32)
        torch_out = self._output == "torch"
        if torch_out:
            import torch
        # sparse matrices: X, and layers loaded beside it, each over its own segment
        for name, ptr in segs.items():
            if f"{name}/data" in fields and f"{name}/indices" in fields:
                n_vars = self._n_vars
                shape = (len(items["index"]), n_vars)
                data, indices = fields.pop(f"{name}/data"), fields.pop(f"{name}/indices")
                items[name] = _LAZY
                self._lazy[name] = (lambda d=data, i=indices, p=ptr, s=shape:
                                    _csr(d, i, p, s, torch_out))
        for name, ptr in segs.items():
            if name in _SEGMENT_KEYS:
                items[_SEGMENT_KEYS[name]] = ptr
            elif name not in items:
                items[f"{name}_ptr"] = ptr
        if self._layout == "atomic" and "atoms" in segs:
            ptr = segs["atoms"]
            items["batch_idx"] = np.repeat(np.arange(len(ptr) - 1, dtype=np.int64), np.diff(ptr))
        for name, arr in fields.items():
            mask = fields.get(f"{name}/mask")
            if mask is not None and not torch_out:
                arr = np.ma.MaskedArray(arr, mask=mask)   # nullable: values under their mask
            items[name] = arr
        if torch_out:
            for k, v in list(items.items()):
                if isinstance(v, np.ndarray) and v.dtype != object:
                    items[k] = torch.from_numpy(v) if v.dtype != np.uint64 else \
                        torch.from_numpy(v.astype(np.int64))


def _csr(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, shape: tuple,
         torch_out: bool) -> Any:
    """X of a batch: a scipy CSR matrix or a torch sparse CSR tensor over the batch's arrays."""
    if torch_out:
        import torch
        import warnings
        with warnings.catch_warnings():  # "sparse CSR support is in beta"
            warnings.simplefilter("ignore", UserWarning)
            return torch.sparse_csr_tensor(
                torch.from_numpy(indptr), torch.from_numpy(indices.astype(np.int64, copy=False)),
                torch.from_numpy(data), size=shape, check_invariants=False)
    import scipy.sparse as sp
    return sp.csr_matrix((data, indices, indptr), shape=shape, copy=False)


def _dtype_option(dtype: Any) -> Optional[str]:
    """x_dtype/index_dtype as the C library reads them: None, "stored", or a dtype's name
    (a numpy dtype or type is accepted: ``np.float32``)."""
    if dtype is None or dtype == "stored":
        return dtype
    return np.dtype(dtype).name


class Dataset:
    """A dataset opened by :func:`zbatch.open`: ``len(ds)`` samples, named ``ds.fields``.

    Parameters:
        path: the store directory (a local path).
        group: the dataset's group inside the store ("" = the root).
        cache_bytes: size of the decoded-chunk cache (LRU, 0 = off), or ``"auto"``: the
            store's decoded size (``ds.decoded_bytes``) plus 5% when its heaviest field holds
            2 or more samples per chunk, the store is local and it fits in
            :data:`AUTO_CACHE_SHARE` of physical memory; else 0 (with a warning when only the
            memory test failed). ``ds.cache_bytes`` is the size chosen (docs/TUNING.md).
        num_threads: decode threads used by :meth:`read_many`.
        load_layers: anndata only: also expose ``layers/NAME`` (as matrices in batches).
        load_strings: anndata only: ``obs_names`` and string obs columns in every batch.
        layer: anndata only: the matrix batches carry as ``X`` (and transforms and densify act
            on): ``None`` / ``"X"``, ``"raw"`` (``raw/X``, with ``raw/var`` as var) or the name
            of a layer (``"counts"``: ``layers/counts``).
        reorder_vars: collections only: children whose var names are the first child's in
            another order are delivered in the first child's order (else refused at open).
        x_dtype: anndata only: the dtype of the values of CSR matrices (``X``, and layers) in
            batches. ``None`` (default):
            ``"float32"`` when they are stored as integers of up to 16 bits (a narrow store of
            counts, as :func:`zbatch.write_anndata` writes by default, reads as its float32
            twin), else as stored; ``"stored"``: as stored; or ``"float32"``, ``"float64"``,
            ``"int32"``, ``"int64"`` (the stored values widened as they are copied; refused at
            open when the dtype does not hold every stored value exactly).
        index_dtype: anndata only: the same for their gene ids (``X/indices``). ``None``
            (default): ``"int32"`` when stored in up to 16 bits (anndata's uint8/uint16
            indices), else as stored; ``"stored"``, ``"int32"`` or ``"int64"``.
            ``x_dtype="stored", index_dtype="int32"`` gives what annbatch's Loader yields from
            a narrow store (uint8 counts, int32 ids), 3 bytes fewer written per value than
            the default, and arrays scipy's ``csr_matrix`` takes without a copy.
        on_invalid: what a read does with a sample whose stored values are invalid (CSR
            column ids outside ``n_vars``, categorical codes outside the categories, pointers
            past their values, edge indices outside their structure): ``"error"`` (default)
            raises :class:`ZbatchError` (``ZB_E_CORRUPT``) naming the sample id, the field and
            the chunk; ``"skip"`` leaves such samples out of the batch and counts them in
            ``batch.stats["samples_skipped"]``.
        max_request_bytes: the cap on one request's batch memory (a ``read_many``, a loader
            window); larger requests raise ``ZB_E_INVALID`` before allocating (16 GiB).
        mmap_bytes: how many bytes of the store's data files may be memory-mapped (read
            without a copy); beyond it reads use pread, and ``0`` reads everything with pread
            (for stores rewritten in place under a reader). ``None`` (default): the environment
            variable ``ZBATCH_MMAP_BYTES`` if set, else 1 GiB.
        storage_options: for ``http(s)://`` and ``s3://`` stores: credentials, endpoint,
            region and tuning (see :func:`zbatch.open` and docs/REMOTE.md).
        fetch_cache_bytes: ``http(s)://`` and ``s3://`` stores: the encoded bytes of the
            (inner) chunks fetched are kept, least recently used out first, up to this many
            bytes, so a chunk later windows need again is not fetched again (a local store's
            reads hit the page cache instead). 256 MiB by default; 0 turns it off. Local
            stores ignore it.

    Example::

        >>> ds = zbatch.open("atlas.zarr", layer="counts", load_strings=True)
        >>> b = ds.read_many([0, 5])
        >>> b["X"], b["obs_names"]

    ``zbatch.Dataset(reader, transforms=[...])`` wraps a reader instead: a zbatch dataset or
    any object with ``read_many(ids)`` and ``__len__`` (a custom backend), with per-sample
    transforms (see :class:`zbatch._backend.ReaderDataset`).
    """

    def __new__(cls, source: Any = None, *args, **kwargs):
        # Dataset(reader, transforms=...): a custom backend or a zbatch dataset, wrapped
        from ._backend import ReaderDataset, is_reader
        if cls is Dataset and is_reader(source):
            return object.__new__(ReaderDataset)
        return object.__new__(cls)

    def __init__(self, path: str, group: str = "", *, cache_bytes: Union[int, str] = 0,
                 num_threads: int = 1, load_layers: bool = False, use_consolidated: bool = True,
                 load_strings: bool = False, layer: Optional[str] = None,
                 reorder_vars: bool = False, x_dtype: Optional[str] = None,
                 index_dtype: Optional[str] = None, on_invalid: str = "error",
                 max_request_bytes: int = 16 << 30, mmap_bytes: Optional[int] = None,
                 storage_options: Optional[dict] = None, fetch_cache_bytes: int = 256 << 20):
        path = _store_path(path)
        _check_threads(num_threads)
        cache = _cache_option(cache_bytes)
        remote = remote_options(path, storage_options)
        self._remember((path, group), dict(cache_bytes=cache_bytes, num_threads=num_threads,
                                           load_layers=load_layers,
                                           use_consolidated=use_consolidated,
                                           load_strings=load_strings, layer=layer,
                                           reorder_vars=reorder_vars, x_dtype=x_dtype,
                                           index_dtype=index_dtype, on_invalid=on_invalid,
                                           max_request_bytes=max_request_bytes,
                                           mmap_bytes=mmap_bytes,
                                           storage_options=storage_options,
                                           fetch_cache_bytes=fetch_cache_bytes))

        def c_open(cache: int) -> Any:
            return _zbatch._Dataset(path, group, cache, int(num_threads), bool(load_layers),
                                    bool(use_consolidated), bool(load_strings),
                                    None if layer is None else str(layer), bool(reorder_vars),
                                    _dtype_option(x_dtype), _dtype_option(index_dtype),
                                    str(on_invalid), int(max_request_bytes),
                                    _mmap_bytes(mmap_bytes), remote, int(fetch_cache_bytes))
        self._c = c_open(0 if cache == "auto" else cache)
        self.path = path
        self._load_info()
        if cache == "auto":
            cache = _auto_cache_bytes(self, remote is not None)
            if cache:
                self._c = c_open(cache)   # the cache is sized at open: open again with it
        #: the decoded-chunk cache's size in bytes (what ``cache_bytes="auto"`` chose)
        self.cache_bytes: int = cache

    # -- pickling and processes ------------------------------------------------------------
    def _remember(self, args: tuple, kwargs: dict) -> None:
        """Keeps what opened this dataset: pickling re-opens it so in the receiving process,
        and a forked child (a worker of torch's DataLoader) re-opens it on first read (the
        parent's C threads do not exist in the child)."""
        self._open_args = (args, kwargs)
        self._pid = os.getpid()

    def __reduce__(self):
        args, kwargs = self._open_args
        kwargs = {**kwargs, "num_threads": self._threads()}
        return (_reopen, (type(self), args, kwargs))

    def store_stats(self) -> dict:
        """The store's counters since it opened: ``requests`` (HTTP requests, each attempt
        counted), ``retries``, ``ranges`` (byte ranges asked for), ``bytes`` received and
        ``max_in_flight``. Zeros for local stores.

        Example::

            >>> ds = zbatch.open("s3://bucket/atlas.zarr", storage_options={"anon": True})
            >>> ds.store_stats()["retries"]
            0
        """
        return dict(self._c.store_stats())

    @property
    def decoded_bytes(self) -> int:
        """The decoded size of the stored values of the fields this dataset reads, from
        metadata (each array's shape times its itemsize; a collection's summed over its
        children): what a decoded-chunk cache holding all of it takes."""
        return sum(int(f["decoded_bytes"]) for f in self.fields.values())

    def _threads(self) -> int:
        return int(self._open_args[1].get("num_threads", 1))

    def _check_process(self) -> None:
        if self._pid != os.getpid():
            self._reopen_here()

    def _reopen_here(self) -> None:
        # the parent's C handle is never freed here: freeing it would join decode threads
        # that do not exist in this process (an extra reference keeps it forever)
        import ctypes
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(self._c))
        args, kwargs = self._open_args
        kwargs = {**kwargs, "num_threads": self._threads()}
        frames = self._frames
        type(self).__init__(self, *args, **kwargs)
        self._frames = frames

    def _read_raw(self, ids: np.ndarray, transforms: Sequence = ()) -> dict:
        """read_many's C result for validated uint64 ids, with the loader's C transforms run
        on it as the C loader runs them (the loader's Python-sampler path)."""
        self._check_process()
        if transforms:
            return _zbatch.read_transformed(self._c, ids, list(transforms))
        return self._c.read_many(ids)

    # -- map-style access (torch.utils.data.Dataset) ---------------------------------------
    def __getitem__(self, key) -> Any:
        """``ds[i]``: one sample, a dict of that sample's values (see :func:`sample_dict`);
        ``ds[[i, j]]``, ``ds[np.array([...])]``, ``ds[a:b]``: a :class:`Batch`, as
        :meth:`read_many`. Negative ids count from the end; out of range is an IndexError."""
        self._check_process()
        n = len(self)
        if isinstance(key, slice):
            return self.read_many(np.arange(*key.indices(n), dtype=np.int64))
        if hasattr(key, "numpy") and not isinstance(key, np.ndarray):  # a torch tensor
            key = key.numpy()
        if isinstance(key, (int, np.integer)) or (isinstance(key, np.ndarray) and key.ndim == 0):
            if isinstance(key, (bool, np.bool_)):
                raise TypeError("a dataset is indexed by an integer, not a bool")
            i = int(key)
            if not -n <= i < n:
                raise IndexError(f"sample id {i} out of range for a dataset of {n} samples")
            return sample_dict(self, self.read_many([i % n]))
        arr = np.asarray(key)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise TypeError(f"a dataset is indexed by an integer, a slice or a 1-d sequence of "
                            f"integers, not {type(key).__name__}")
        if arr.size and (arr.min() < -n or arr.max() >= n):
            bad = arr[(arr < -n) | (arr >= n)][0]
            raise IndexError(f"sample id {bad} out of range for a dataset of {n} samples")
        return self.read_many(np.where(arr < 0, arr + n, arr) if arr.size else arr)

    def __getitems__(self, ids) -> list:
        """torch's batched fetch (``DataLoader`` calls it with a batch's ids): the samples of
        one coalesced read, as a list of sample dicts for ``collate_fn``."""
        b = self[list(ids)]
        return [sample_dict(self, b, k) for k in range(b.size)]

    def _load_info(self) -> None:
        info = self._c.info()
        self.layout: str = info["layout"]
        self.n_vars: int = info["n_vars"]
        self.num_children: int = info["nchildren"]
        #: where the dataset lives (the store and group; for messages)
        self.name: str = info["name"]
        self._var_at = (info["scheme"], info["store"], info["var_group"])
        self._frames: dict[str, Any] = {}
        #: field name -> dict(kind, dtype, row_shape, segment, target, categorical, array, mask,
        #: chunk_rows: rows per stored chunk, or inner chunk, of the first child's array)
        #: decoded_bytes: the field's stored values decoded (shape x itemsize, all children)
        self.fields: dict[str, dict] = {f["name"]: {k: v for k, v in f.items() if k != "name"}
                                        for f in info["fields"]}

    def __len__(self) -> int:
        return self._c.length()

    def segment_lengths(self, segment: str) -> np.ndarray:
        """Per-sample lengths of a segment ("X" nonzeros, "atoms", "edges"), read from the
        pointer arrays only (what size-aware sampling needs)."""
        self._check_process()
        return np.frombuffer(self._c.segment_lengths(segment), dtype=np.uint64)

    def set_num_threads(self, n: int) -> None:
        """Sets the number of decode threads used by reads and loaders (>= 1)."""
        _check_threads(n)
        self._c.set_threads(int(n))
        self._open_args[1]["num_threads"] = int(n)

    def __repr__(self) -> str:
        return f"zbatch.Dataset({self.path!r}, layout={self.layout!r}, n={len(self)})"

    def categories(self, name: str) -> Union[list, np.ndarray]:
        """The category labels of a categorical field (codes index into them; -1 = missing):
        a list of ``str``, or a numpy array for integer, float or boolean categories. For a
        collection, the one table its codes mean in every batch."""
        return _labels(self._c.categories(name)[0])

    def read_field(self, name: str, start: int = 0, stop: Optional[int] = None) -> np.ndarray:
        """Samples ``[start, stop)`` of a per-sample field, as batches carry it (a collection's
        codes in its table), without reading anything else.

            >>> ds.read_field("obs/cell_type")[:5]
        """
        self._check_process()
        stop = len(self) if stop is None else int(stop)
        buf, typestr, shape = self._c.read_field(name, int(start), stop)
        return np.frombuffer(buf, dtype=np.dtype(typestr)).reshape(shape)

    @property
    def obs_names(self):
        """The obs names (pandas Index), read on first use."""
        return self.obs.index

    @property
    def var_names(self):
        """The var names (pandas Index; a collection's are its first child's), the order of
        X's columns."""
        import pandas as pd
        if "var_names" not in self._frames:
            self._frames["var_names"] = pd.Index(self._c.var_names(), dtype=object)
        return self._frames["var_names"]

    @property
    def obs(self):
        """obs as a pandas DataFrame, as ``anndata.read_zarr`` gives it (categoricals with their
        categories, nullable columns as pandas nullable arrays, strings as objects), read on
        first use. A collection's is its children's rows in order, categoricals in the
        collection's table."""
        if "obs" not in self._frames:
            self._frames["obs"] = _obs_frame(self)
        return self._frames["obs"]

    @property
    def var(self):
        """var as a pandas DataFrame (raw/var with ``layer="raw"``), read on first use."""
        if "var" not in self._frames:
            from ._frame import read_frame
            scheme, store, group = self._var_at
            if scheme != "file" or not group:
                raise ValueError(f"{self.name}: var is read from a store directory")
            self._frames["var"] = read_frame(store, group)
        return self._frames["var"]

    def read_many(self, ids: Sequence[int], output: str = "numpy") -> Batch:
        """Reads the samples ``ids`` (any order, duplicates allowed) as one :class:`Batch`.

        Every chunk the request touches is decoded once. ``output`` is ``"numpy"`` or
        ``"scipy"`` (X as ``scipy.sparse.csr_matrix``) or ``"torch"`` (tensors, X as
        ``torch.sparse_csr_tensor``); for atomic stores also ``"nvalchemi"`` (an
        ``nvalchemi.data.Batch``, or a :class:`zbatch.AtomicBatch` without nvalchemi).
        """
        _check_output(output, self.layout)
        arr = np.asarray(ids)
        if arr.size and (arr.dtype.kind not in "iu" or (arr.dtype.kind == "i" and arr.min() < 0)):
            from . import _error
            bad = arr.min() if arr.dtype.kind == "i" else arr.flat[0]
            raise _error("ZB_E_RANGE", f"index out of range: sample id {bad} is not a "
                         "non-negative integer")
        arr = np.ascontiguousarray(arr, dtype=np.uint64).ravel()
        self._check_process()
        raw = self._c.read_many(arr)
        if output == "nvalchemi":
            from ._nvbatch import convert
            return convert(raw)
        return Batch(raw, self.layout, self.n_vars, output)

    def refresh(self) -> None:
        """Opens the store again, so that samples appended or deleted (soft deletes through
        the samples mask) since it was opened are seen; loaders built before keep the
        dataset's former length in their samplers."""
        args, kwargs = self._open_args
        type(self).__init__(self, *args, **kwargs)


#: the values of ``output=`` (``"nvalchemi"``: atomic stores only)
OUTPUTS = ("numpy", "scipy", "torch", "nvalchemi")


def _check_output(output: str, layout: str) -> None:
    if output not in OUTPUTS:
        raise ValueError(f"output must be 'numpy', 'scipy', 'torch' or 'nvalchemi', "
                         f"not {output!r}")
    if output == "nvalchemi" and layout != "atomic":
        raise ValueError(f"output='nvalchemi' gives batches of atomic systems; this dataset's "
                         f"layout is {layout!r}")


def _labels(raw) -> Union[list, np.ndarray]:
    """Category labels as the extension gives them: a list of str, or (buffer, typestr) for
    numeric and boolean categories (copied out of the buffer)."""
    if isinstance(raw, tuple):
        return np.frombuffer(raw[0], dtype=np.dtype(raw[1])).copy()
    return raw


def _obs_frame(ds: Dataset):
    """obs of a dataset through libzbatch's columns (zb_dataset_column)."""
    import pandas as pd
    from ._frame import nullable_strings, nullable_values
    n = len(ds)
    index, data = None, {}
    for name, kind, _dtype in ds._c.columns():
        if kind in ("strings", "nullable_strings"):
            values, missing = ds._c.read_strings(name, 0, n)
            if kind == "strings":
                col = np.array(values, dtype=object)
            else:
                col = nullable_strings(values, np.frombuffer(missing, dtype=bool))
            if name == "obs_names":
                index = pd.Index(col, dtype=object if kind == "strings" else None)
                continue
        elif kind == "categorical":
            labels, ordered = ds._c.categories(name)
            col = pd.Categorical.from_codes(ds.read_field(name).astype(np.int64),
                                            categories=pd.Index(_labels(labels)),
                                            ordered=ordered)
        elif kind == "nullable":
            col = nullable_values(ds.read_field(name), ds.read_field(f"{name}/mask"))
        else:
            col = ds.read_field(name).copy()
        data[name[len("obs/"):]] = col
    return pd.DataFrame(data, index=index if index is not None else pd.RangeIndex(n),
                        columns=pd.Index(list(data), dtype=object))


class MultiDataset(Dataset):
    """Several datasets behind one index space (samples of child k follow those of k-1);
    batches carry ``b["dataset"]``, the child of each sample. Pair it with
    ``DataLoader(md, sampler="multi", weights=...)`` for per-child ratios (the child lengths,
    ``md.sizes``, are filled in).

    The children must offer the same fields and, for anndata stores, the same var names:
    otherwise the error names both stores and the first difference. ``reorder_vars=True``
    accepts children holding the first child's genes in another order and delivers them in
    the first child's order. Categorical columns get one table (``categories()``: the
    children's when they agree, else their sorted union, as ``anndata.concat``) and every
    child's codes are remapped to it as batches are built.

    ``output_strict=False`` accepts children with different fields: batches carry the
    fields every child has (the others are left out), read through Python
    (:mod:`zbatch._backend`). Children that are custom backends
    (``zbatch.Dataset(reader)``) or carry Python transforms are read that way too."""

    def __new__(cls, datasets: Sequence[Dataset] = (), *args, output_strict: bool = True,
                **kwargs):
        from ._backend import MultiReaderDataset, needs_python_multi
        if cls is MultiDataset and needs_python_multi(list(datasets), output_strict):
            return object.__new__(MultiReaderDataset)
        return object.__new__(cls)

    def __init__(self, datasets: Sequence[Dataset], *, cache_bytes: Union[int, str] = 0,
                 num_threads: int = 1, reorder_vars: bool = False,
                 output_strict: bool = True):
        self.children = list(datasets)
        if not self.children:
            raise ValueError("MultiDataset needs at least one dataset")
        _check_threads(num_threads)
        for d in self.children:
            d._check_process()
        from ._backend import check_same_fields
        check_same_fields(self.children)
        cache = _cache_option(cache_bytes)
        self._remember((self.children,), dict(cache_bytes=cache_bytes, num_threads=num_threads,
                                              reorder_vars=reorder_vars))

        def c_concat(cache: int) -> Any:
            return _zbatch.concat_datasets([d._c for d in self.children], int(num_threads),
                                           cache, bool(reorder_vars))
        self._c = c_concat(0 if cache == "auto" else cache)
        self.path = self.children[0].path
        self._load_info()
        if cache == "auto":
            # one budget for all children: their summed decoded size against the share
            cache = _auto_cache_bytes(self, any(is_remote(d.path) for d in self.children))
            if cache:
                self._c = c_concat(cache)
        self.cache_bytes = cache
        #: the length of every child, in order (the "multi" sampler's ``sizes``)
        self.sizes = [len(d) for d in self.children]

    def __repr__(self) -> str:
        return f"zbatch.MultiDataset({len(self.children)} datasets, n={len(self)})"


class InMemoryDataset(Dataset):
    """A dataset decoded once into memory (uncompressed, small chunks), with the same
    interface: batches are then copies from memory, with no decoding and no I/O.

        >>> mem = zbatch.InMemoryDataset(zbatch.open("small.zarr"))
    """

    def __init__(self, source: Union[Dataset, str], *, cache_bytes: int = 0,
                 num_threads: int = 1):
        src = source if isinstance(source, Dataset) else Dataset(source)
        _check_threads(num_threads)
        src._check_process()
        cache = _cache_option(cache_bytes)
        if cache == "auto":
            raise ValueError("InMemoryDataset: cache_bytes='auto' sizes a cache of decoded "
                             "chunks; an in-memory copy decodes nothing: give bytes or 0")
        self._remember((src,), dict(cache_bytes=cache_bytes, num_threads=num_threads))
        self._c = _zbatch.in_memory(src._c, int(num_threads), cache)
        self.cache_bytes = cache
        self.path = src.path
        self._load_info()
        self._var_at = src._var_at  # the copy lives in memory: var is read from the source

    def __repr__(self) -> str:
        return f"zbatch.InMemoryDataset({self.path!r}, layout={self.layout!r}, n={len(self)})"


def open(path: str, group: str = "", **kwargs) -> Dataset:  # noqa: A001 - the product's name
    """Opens the dataset in the store at ``path`` (a ``str`` / ``os.PathLike`` local
    directory, an ``http(s)://`` or ``s3://bucket/prefix`` URL, or a
    ``zarr.storage.LocalStore``); the layout (anndata, atomic, collection, generic) is
    detected from the store's attributes. ``storage_options`` takes the keys fsspec/s3fs
    users know (``anon``, ``key``, ``secret``, ``token``, ``endpoint_url``,
    ``client_kwargs={"region_name": ...}``) plus zbatch's tuning keys (docs/REMOTE.md); without
    them the ``AWS_*`` environment variables apply. See :class:`Dataset` for other options.

    Example::

        >>> ds = zbatch.open("s3://bucket/atlas.zarr",
        ...                  storage_options={"endpoint_url": "http://127.0.0.1:9000"})"""
    return Dataset(path, group, **kwargs)


def _store_path(path: Any) -> str:
    """The directory of a store argument: a str / bytes / os.PathLike path or an
    ``http(s)://`` / ``s3://`` URL, or a ``zarr.storage.LocalStore`` (its ``root``); anything
    else is a TypeError."""
    if isinstance(path, (str, os.PathLike)):
        p = os.fspath(path)
        return p if isinstance(p, str) else os.fsdecode(p)
    if isinstance(path, bytes):
        return os.fsdecode(path)
    cls = type(path)
    name = f"{cls.__module__}.{cls.__qualname__}"
    if cls.__name__ == "LocalStore" and hasattr(path, "root"):
        return os.fspath(path.root)
    accepted = ("zbatch opens a store directory: give a path (str or os.PathLike) or a "
                "zarr.storage.LocalStore")
    if "zarr" in cls.__module__:
        raise TypeError(f"{name} is not a local store directory; {accepted} (stores held in "
                        "memory or behind a URL are not read by zbatch: write them to a "
                        "directory first)")
    raise TypeError(f"expected a store path, got {name}; {accepted}")


def _mmap_bytes(value: Optional[int]) -> Optional[int]:
    """The mapping budget a store opens with: ``value``, else ``ZBATCH_MMAP_BYTES`` from the
    environment (read here: the C library reads none), else None (the library's 1 GiB)."""
    where = "mmap_bytes"
    if value is None:
        env = os.environ.get("ZBATCH_MMAP_BYTES", "")
        if not env:
            return None
        where = "ZBATCH_MMAP_BYTES"
        try:
            value = int(env, 10)
        except ValueError:
            raise ValueError(f"ZBATCH_MMAP_BYTES={env!r}: not a number of bytes") from None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{where} must be an integer >= 0 (bytes), got {value!r}")
    return int(value)


#: The share of physical memory ``cache_bytes="auto"`` may take: a store (or all children of
#: a MultiDataset together) whose decoded size exceeds it gets no cache. Change it before
#: opening: ``zbatch.dataset.AUTO_CACHE_SHARE = 0.5``.
AUTO_CACHE_SHARE = 0.25


def _physical_memory() -> int:
    """This machine's physical memory in bytes (the tests stub it)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _cache_option(value: Any) -> Union[int, str]:
    """cache_bytes as given: an integer >= 0, or "auto"."""
    if isinstance(value, str) and value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"cache_bytes must be an integer >= 0 (bytes) or 'auto', "
                         f"got {value!r}")
    return int(value)


def _auto_cache_bytes(ds: Dataset, remote: bool) -> int:
    """What ``cache_bytes="auto"`` gives an opened dataset (docs/TUNING.md): its decoded size D
    times 1.05 when its heaviest field holds >= 2 samples per chunk (random windows then
    decode many times what they deliver), it is local, and D is at most AUTO_CACHE_SHARE of
    physical memory; else 0, with a warning when only the memory test failed."""
    from .samplers import samples_per_chunk
    share = AUTO_CACHE_SHARE
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise ValueError(f"zbatch.dataset.AUTO_CACHE_SHARE must be a number in (0, 1], "
                         f"got {share!r}")
    if remote or samples_per_chunk(ds) < 2:
        return 0
    d, mem = ds.decoded_bytes, _physical_memory()
    if d > share * mem:
        import warnings
        warnings.warn(f"cache_bytes='auto': {ds.name} decodes to {d / 2**30:.2f} GiB, more than "
                      f"{share:g} of this machine's {mem / 2**30:.1f} GiB of memory "
                      f"(zbatch.dataset.AUTO_CACHE_SHARE); opened without a cache. For random "
                      f"windows pack by chunk instead: "
                      f"SizeAwareSampler(ds, ..., block_size='chunks')", stacklevel=3)
        return 0
    return int(d * 1.05)


def _check_threads(n: Any) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"num_threads must be an integer >= 1, got {n!r}")


def _reopen(cls, args: tuple, kwargs: dict) -> Dataset:
    """Unpickles a dataset: opens it again with the options it was opened with."""
    return cls(*args, **kwargs)


def sample_dict(ds: Dataset, batch: Batch, k: int = 0) -> dict:
    """Sample ``k`` of ``batch`` as a dict, the value of ``ds[i]``: per-sample fields as that
    sample's value (a numpy scalar, or a row array for fields with a row shape), ragged
    fields (atomic positions, edges) as that sample's rows, ``X`` and layers as a 1-row
    ``scipy.sparse.csr_matrix`` (1 x n_vars), ``index`` (and ``dataset`` for a collection)
    as ints; a nullable field's value and its ``/mask`` are separate entries. Pointer arrays
    and ``batch_idx`` are left out (:func:`zbatch.collate` rebuilds a batch)."""
    import scipy.sparse as sp
    out: dict[str, Any] = {}
    segs = {name: np.frombuffer(buf, dtype=np.int64)
            for name, buf in batch._raw["segments"].items()}
    for key in list(batch._items):
        v = batch[key]
        if key in ("index", "dataset"):
            out[key] = int(v[k])
            continue
        if sp.issparse(v):
            out[key] = v[k:k + 1]
            continue
        info = ds.fields.get(key)
        if info is None:
            continue  # pointer arrays, batch_idx
        v = np.ma.getdata(v)
        if info["kind"] == "per_sample":
            out[key] = v[k]
        else:
            seg = segs.get(info.get("segment") or "")
            if seg is None:
                continue
            rows = v[seg[k]:seg[k + 1]]
            if info["kind"] == "index":
                target = segs.get(info.get("target") or "")
                if target is not None:
                    rows = rows - target[k]   # indices local to the sample
            out[key] = rows
    return out
