"""zbatch: feed training loops from Zarr stores at the speed of decompression.

The engine is the C library libzbatch; this package is a thin layer over it.

    >>> import zbatch
    >>> x = zbatch.read_array("atlas.zarr", "X/data", 0, 1000)   # numpy array
    >>> zbatch.info("atlas.zarr")["layout"]
    'anndata'
"""
from __future__ import annotations

import json as _json
from typing import Any, Optional

import numpy as _np

from . import _zbatch
from ._zbatch import ZbatchError

__version__ = _zbatch.__version__
__all__ = ["open", "Dataset", "MultiDataset", "InMemoryDataset", "Batch", "DataLoader", "samplers", "read_array", "write_array", "write_anndata", "info",
           "AtomicWriter", "ArrayConfig", "WriteConfig", "sample_from_atoms", "ZbatchError",
           "STATUS", "convert", "MultiDatasetSampler", "MultiDatasetBatchSampler"]

#: Status names of libzbatch mapped to their codes (ZbatchError.status / .code).
STATUS: dict[str, int] = _zbatch.status_names()


def _error(status: str, message: str) -> ZbatchError:
    e = ZbatchError(message)
    e.status = status
    e.code = STATUS[status]
    return e


def read_array(store_path: str, array_path: str = "", start: int = 0,
               stop: Optional[int] = None) -> _np.ndarray:
    """Rows ``[start, stop)`` along axis 0 of the Zarr array at ``array_path`` in ``store_path``.

    Works on Zarr v2 and v3 arrays (sharded included) with any codec libzbatch supports.
    Missing chunks read as the fill value. String arrays come back as a numpy array of ``str``;
    a 0-d array as a 0-d numpy array (``start``/``stop`` are then ignored).

    Raises :class:`ZbatchError` (with ``.status`` such as ``"ZB_E_CORRUPT"``) on bad input.

    Example::

        >>> zbatch.read_array("store.zarr", "obs/cell_type/codes", 10, 20).shape
        (10,)
    """
    start = int(start)
    stop_arg = -1 if stop is None else int(stop)
    if start < 0 or (stop is not None and stop_arg < 0):
        raise _error("ZB_E_RANGE", f"index out of range: {array_path or '/'}: rows [{start}, "
                     f"{stop}): negative bounds are not supported")
    data, typestr, shape = _zbatch.read_array(str(store_path), str(array_path), int(start),
                                              stop_arg)
    if isinstance(data, list):
        return _np.array(data, dtype=str).reshape(shape)
    return _np.frombuffer(data, dtype=_np.dtype(typestr)).reshape(shape)


def info(path: str) -> dict[str, Any]:
    """The tree of groups and arrays of the store at ``path``, as ``zbatch info --json`` prints.

    Returns a dict with ``path``, ``zarr_format``, ``layout`` (``"anndata"``, ``"atomic"``,
    ``"annbatch-collection"`` or ``"plain"``), ``consolidated`` and ``nodes``.
    """
    return _json.loads(_zbatch.info_json(str(path)))


_ZB_DTYPES = {
    "b": {1: "bool"},
    "i": {1: "int8", 2: "int16", 4: "int32", 8: "int64"},
    "u": {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"},
    "f": {2: "float16", 4: "float32", 8: "float64"},
}


def _rows_of(value, shape, what):
    """Rows along axis 0 from an int or a chunk-shape tuple (other axes must be whole)."""
    if value is None:
        return 0
    if isinstance(value, (int, _np.integer)):
        return int(value)
    value = tuple(int(v) for v in value)
    if len(value) != len(shape) or tuple(value[1:]) != tuple(shape[1:]):
        raise ValueError(f"{what}={value}: zbatch chunks along axis 0 only; the other axes "
                         f"must be whole ({tuple(shape[1:])})")
    return value[0]


def write_array(store: str, path: str, data, chunks=None, shards=None, codec: Optional[str] = None,
                zarr_format: int = 3, *, fill_value=None, write_empty_chunks: bool = True,
                num_threads: int = 1, attributes: Optional[dict] = None,
                shard_index_location: str = "end",
                storage_options: Optional[dict] = None) -> None:
    """Writes ``data`` (a numpy array, or a sequence of ``str``) as a Zarr array at ``path`` in
    the store ``store``: a directory, or an ``s3://bucket/prefix`` URL (``storage_options`` as
    for :func:`zbatch.open`; docs/REMOTE.md).

    The chunks go first, then the array's metadata, then the group documents of the root and
    of every group above ``path`` that has none: a write that fails part-way leaves no node
    that opens (on S3, where nothing is renamed, as on disk).

    ``chunks`` / ``shards`` are rows along axis 0 (an int, or a shape whose other axes are
    whole); ``shards`` needs ``zarr_format=3``. ``codec`` is a codec string such as
    ``"zstd:3"``, ``"blosc:lz4:5:shuffle"``, ``"lz4"``, ``"gzip:1"``, ``"zlib:1"`` or ``"none"``.

    Example::

        >>> zbatch.write_array("out.zarr", "x", np.arange(10.0), chunks=4, codec="zstd:3")
    """
    import os
    from ._remote import writable_options
    store = os.fspath(store)
    remote = writable_options(store, storage_options)
    arr = data if isinstance(data, _np.ndarray) else _np.asarray(data)
    if arr.ndim == 0:
        raise ValueError("write_array needs at least one dimension")
    offsets = None
    if arr.dtype.kind in "UOS":
        if arr.ndim != 1:
            raise ValueError("string arrays must be 1-d")
        try:
            encoded = [str(v).encode("utf-8") for v in arr.tolist()]
        except UnicodeEncodeError as e:  # lone surrogates: no UTF-8 for them, none stored
            raise ValueError(f"write_array: a string is not valid Unicode text ({e.reason}): "
                             "strings are stored as UTF-8") from None
        lens = _np.fromiter((len(b) for b in encoded), dtype=_np.uint64, count=len(encoded))
        offsets = _np.zeros(len(encoded) + 1, dtype=_np.uint64)
        _np.cumsum(lens, out=offsets[1:])
        buf = b"".join(encoded)
        dtype_name = "string"
    else:
        names = _ZB_DTYPES.get(arr.dtype.kind, {})
        if arr.dtype.itemsize not in names:
            raise TypeError(f"write_array: unsupported dtype {arr.dtype}")
        dtype_name = names[arr.dtype.itemsize]
        native = arr.dtype.newbyteorder("=")
        buf = _np.ascontiguousarray(arr, dtype=native)
    fill = None
    if fill_value is not None and dtype_name != "string":
        fill = _np.array(fill_value, dtype=arr.dtype.newbyteorder("=")).tobytes()
    if remote is None:
        os.makedirs(store, exist_ok=True)
    _zbatch.write_array(str(store), str(path), dtype_name, tuple(arr.shape), buf,
                        _rows_of(chunks, arr.shape, "chunks"),
                        _rows_of(shards, arr.shape, "shards"), codec, int(zarr_format),
                        int(num_threads), None if attributes is None else _json.dumps(attributes),
                        bool(write_empty_chunks), fill, shard_index_location == "start", offsets,
                        remote)


from .dataset import Batch, Dataset, InMemoryDataset, MultiDataset, open  # noqa: E402
from ._write_anndata import write_anndata  # noqa: E402
from ._atomic import ArrayConfig, AtomicWriter, WriteConfig, sample_from_atoms  # noqa: E402
from . import samplers  # noqa: E402
from .samplers import MultiDatasetBatchSampler, MultiDatasetSampler  # noqa: E402
from . import transforms  # noqa: E402
from .loader import DataLoader  # noqa: E402
from ._convert import convert  # noqa: E402
from ._neighbors import neighbor_list  # noqa: E402
from ._ase import convert_ase  # noqa: E402
from ._lmdb import convert_lmdb  # noqa: E402
from ._repair import repair  # noqa: E402
from ._nvbatch import AtomicBatch, AtomicReader, estimate_max_atoms  # noqa: E402

__all__ += ["neighbor_list", "convert_ase", "convert_lmdb", "repair", "IterableLoader", "collate",
            "transforms", "AtomicBatch", "AtomicReader", "estimate_max_atoms"]


def __getattr__(name: str) -> Any:
    # torch's adapter loads on first use: importing torch takes seconds, and `python -m zbatch`
    # (the command) imports this package without needing it.
    if name in ("IterableLoader", "collate"):
        from . import _torch
        return getattr(_torch, name)
    raise AttributeError(f"module 'zbatch' has no attribute {name!r}")
