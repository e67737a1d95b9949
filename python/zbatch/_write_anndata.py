"""write_anndata: an AnnData-layout Zarr store from a matrix and two DataFrames, through libzbatch.

The store is what ``anndata.write_zarr`` (0.12) writes, so ``anndata.read_zarr`` opens it; the
matrix is streamed to the C writer in row blocks (no whole copy of X is made).
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Optional

import numpy as np

from . import _zbatch
from ._remote import writable_options

__all__ = ["write_anndata"]

# Bytes of X handed to the C writer per call: bounds the copies a dtype conversion makes.
_BLOCK_BYTES = 64 << 20
# Rows per chunk of obs columns and X/indptr: the C default, or n_obs when smaller (a chunk
# longer than the column is only padding).
_COLUMN_CHUNK = 1 << 16
# Strings packed per call (names, string columns).
_STRING_BLOCK = 1 << 16

_NUMERIC_KINDS = "biuf"


def _native(dtype: np.dtype) -> np.dtype:
    """The same dtype in native (little-endian) byte order."""
    return dtype.newbyteorder("=") if dtype.byteorder not in ("=", "|") else dtype


class WriteChoices(dict):
    """What :func:`write_anndata` chose: the stored dtype by array (this dict) and, in
    ``codecs``, the codec string each of those arrays was written with."""

    codecs: dict


# Values scanned per step when choosing the narrowest exact dtype (bounds the temporaries).
_SCAN_BLOCK = 1 << 24


def _narrowest_exact(values: np.ndarray, dtype: np.dtype) -> np.dtype:
    """The narrowest dtype that stores every one of ``values`` exactly (issue 19): ``uint8``
    when all are integers in [0, 255], ``uint16`` in [0, 65,535], else ``dtype`` (non-integer,
    negative, NaN or larger values keep it; bool keeps it; no values keep it). Counts are never
    negative, so signed narrow types are not tried: they would only serve unusual data."""
    if values.size == 0 or dtype.kind not in "iuf":
        return dtype
    hi = 0
    for i in range(0, values.size, _SCAN_BLOCK):
        v = values[i:i + _SCAN_BLOCK]
        lo_v, hi_v = v.min(), v.max()
        if not (lo_v >= 0 and hi_v <= 65535):  # NaN fails both
            return dtype
        if dtype.kind == "f" and not np.array_equal(v, np.trunc(v)):
            return dtype
        hi = max(hi, int(hi_v))
    return np.dtype(np.uint8) if hi <= 255 else np.dtype(np.uint16)


def _stored_dtype(M: Any, dtype: np.dtype, data_dtype: Any) -> np.dtype:
    """The dtype a CSR matrix's values are stored in: its own (``"keep"``), ``data_dtype`` when
    given, else the narrowest exact one."""
    if isinstance(data_dtype, str) and data_dtype == "keep":
        return dtype
    if data_dtype is not None:
        return _native(np.dtype(data_dtype))
    ip = np.asarray(M.indptr)
    live = np.asarray(M.data)[int(ip[0]):int(ip[-1])] if len(ip) else np.asarray(M.data)[:0]
    return _narrowest_exact(live, dtype)


def _is_csr(X: Any) -> bool:
    fmt = getattr(X, "format", None)
    return fmt == "csr" and hasattr(X, "indptr") and hasattr(X, "indices")


def _as_strings(values: Any, what: str) -> list:
    out = []
    for v in values:
        if not isinstance(v, str):
            raise TypeError(f"{what}: {v!r} is not a str")
        out.append(v)
    return out


def _append_strings(fn, values, what: str) -> None:
    """Calls fn(list_of_str) over blocks of ``values``."""
    n = len(values)
    for i in range(0, n, _STRING_BLOCK):
        fn(_as_strings(values[i:i + _STRING_BLOCK], what))
    if n == 0:
        fn([])


def _write_csr(append, X, dtype: np.dtype) -> None:
    """Calls append(indptr, indices, data) over row blocks of the CSR matrix ``X`` (once, with
    no rows, when it has none: a layer is created by its first call)."""
    n = X.shape[0]
    if n == 0:
        append(np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, dtype))
        return
    indptr = np.asarray(X.indptr)
    nnz = int(indptr[-1] - indptr[0]) if n else 0
    per_row = max(1, nnz // max(n, 1)) * (dtype.itemsize + 4)
    rows = max(1, min(n, _BLOCK_BYTES // per_row)) if n else 0
    for r0 in range(0, n, rows or 1):
        r1 = min(n, r0 + rows)
        ip = np.ascontiguousarray(indptr[r0:r1 + 1], dtype=np.int64)
        a, b = int(ip[0]), int(ip[-1])
        idx = np.ascontiguousarray(X.indices[a:b], dtype=np.int32)
        data = np.ascontiguousarray(X.data[a:b], dtype=dtype)
        append(ip, idx, data)


def _write_x_dense(w, X, dtype: np.dtype) -> None:
    n, n_vars = X.shape
    rows = max(1, _BLOCK_BYTES // max(1, n_vars * dtype.itemsize))
    for r0 in range(0, n, rows):
        w.append_dense(np.ascontiguousarray(X[r0:r0 + rows], dtype=dtype))


def _write_categorical(w, axis: str, name: str, col) -> None:
    import pandas as pd  # only needed when dataframes are given

    dt = col.dtype
    cats = dt.categories
    if isinstance(cats.dtype, np.dtype) and cats.dtype.kind in _NUMERIC_KINDS:
        # numeric or bool categories (e.g. leiden cluster ids) keep their dtype
        values = np.ascontiguousarray(cats.to_numpy(), dtype=_native(cats.dtype))
        w.define_categorical_values(axis, name, values.dtype.str, values, bool(dt.ordered))
    elif cats.dtype.kind in "OUT" or pd.api.types.is_string_dtype(cats.dtype):
        w.define_categorical(axis, name, _as_strings(cats, f"{axis}/{name} categories"),
                             bool(dt.ordered))
    else:
        raise TypeError(f"{axis}/{name}: categories of dtype {cats.dtype} are not supported "
                        "(str, numeric and bool categories are)")
    codes = np.ascontiguousarray(col.cat.codes.to_numpy())
    w.append_codes(axis, name, codes.dtype.str, codes)


def _is_masked_int_or_bool(dt) -> bool:
    """pandas' nullable Int8..Int64, UInt8..UInt64 and boolean dtypes."""
    import pandas as pd

    return (isinstance(dt, pd.api.extensions.ExtensionDtype)
            and not isinstance(dt, (pd.CategoricalDtype, pd.StringDtype))
            and isinstance(getattr(dt, "numpy_dtype", None), np.dtype)
            and dt.numpy_dtype.kind in "iub"
            and (pd.api.types.is_integer_dtype(dt) or pd.api.types.is_bool_dtype(dt)))


def _write_column(w, axis: str, name: str, col) -> None:
    import pandas as pd  # only needed when dataframes are given

    dt = col.dtype
    if isinstance(dt, pd.CategoricalDtype):
        _write_categorical(w, axis, name, col)
    elif isinstance(dt, np.dtype) and dt.kind in _NUMERIC_KINDS:
        values = np.ascontiguousarray(col.to_numpy(), dtype=_native(dt))
        w.append_column(axis, name, values.dtype.str, values)
    elif _is_masked_int_or_bool(dt):
        # nullable-integer / nullable-boolean: a missing value is stored as 0 with its mask set
        values = np.ascontiguousarray(col.to_numpy(dtype=_native(dt.numpy_dtype), na_value=0))
        mask = np.ascontiguousarray(col.isna().to_numpy(), dtype=np.uint8)
        w.append_nullable_column(axis, name, values.dtype.str, values, mask)
    elif isinstance(dt, pd.StringDtype):
        # nullable-string-array, as anndata writes pandas' string arrays (missing: "" + mask)
        values = col.to_numpy(dtype=object, na_value="")
        mask = np.ascontiguousarray(col.isna().to_numpy(), dtype=np.uint8)
        n = len(values)
        for i in range(0, max(n, 1), _STRING_BLOCK):
            w.append_nullable_string_column(
                axis, name, _as_strings(values[i:i + _STRING_BLOCK], f"{axis}/{name}"),
                mask[i:i + _STRING_BLOCK])
    elif dt == object or pd.api.types.is_string_dtype(dt):
        values = col.to_numpy()
        if col.isna().any():
            raise TypeError(f"{axis}/{name}: missing values in a str column of dtype object "
                            "are not supported (use the 'string' dtype or a categorical)")
        _append_strings(lambda block: w.append_string_column(axis, name, block),
                        values, f"{axis}/{name}")
    else:
        raise TypeError(f"{axis}/{name}: columns of dtype {dt} are not supported (numeric, "
                        "bool, str, pandas' nullable Int*/UInt*/boolean/string and categorical "
                        "are)")


def _write_frame(w, axis: str, df, n: int) -> None:
    if df is None:
        return  # anndata's defaults: names "0", "1", ..., no columns
    if len(df) != n:
        what = "n_obs (X.shape[0])" if axis == "obs" else "n_vars (X.shape[1])"
        raise ValueError(f"{axis} has {len(df)} rows, {what} is {n}")

    _append_strings(lambda block: w.append_names(axis, block),
                    [str(v) for v in df.index], f"{axis}.index")
    for name in df.columns:
        if not isinstance(name, str):
            raise TypeError(f"{axis} column names must be str, not {name!r}")
        _write_column(w, axis, name, df[name])


def _as_csr(X: Any) -> Any:
    """``X`` as a CSR matrix if it is any scipy.sparse matrix, else None."""
    if _is_csr(X):
        return X
    try:
        import scipy.sparse as sp
    except ImportError:  # pragma: no cover - scipy is a dependency of anndata
        return None
    return X.tocsr() if sp.issparse(X) else None


def _check_layers(layers: Optional[Mapping[str, Any]], shape: tuple) -> dict:
    out = {}
    for name, M in (layers or {}).items():
        if not isinstance(name, str):
            raise TypeError(f"layer names must be str, not {name!r}")
        csr = _as_csr(M)
        if csr is None:
            raise TypeError(f"layers[{name!r}]: only scipy.sparse matrices are supported "
                            f"(got {type(M).__name__}); they are written as CSR")
        if tuple(csr.shape) != shape:
            raise ValueError(f"layers[{name!r}] has shape {tuple(csr.shape)}, X has {shape}")
        dtype = np.dtype(csr.dtype)
        if dtype.kind not in _NUMERIC_KINDS:
            raise TypeError(f"layers[{name!r}] has dtype {dtype}; a numeric or bool dtype is "
                            "needed")
        out[name] = (csr, _native(dtype))
    return out


def write_anndata(store: "str | os.PathLike[str]", X: Any, obs: Optional[Any] = None,
                  var: Optional[Any] = None, zarr_format: int = 3, codec: Optional[str] = None,
                  chunk_size: Optional[int] = None, shard_size: Optional[int] = None,
                  num_threads: int = 1, layers: Optional[Mapping[str, Any]] = None,
                  narrow_indices: Optional[bool] = None,
                  data_dtype: Optional[Any] = None,
                  storage_options: Optional[Mapping[str, Any]] = None) -> dict:
    """Writes ``X`` (with ``obs``, ``var`` and ``layers``) as an AnnData Zarr store at ``store``.

    The layout is the one ``anndata.write_zarr`` 0.12 produces (``anndata.read_zarr`` opens
    it): CSR ``X`` as ``data``/``indices`` (int32)/``indptr`` (int64), dense ``X`` as one
    array, ``obs``/``var`` dataframes, CSR ``layers``, empty ``obsm``/``obsp``/``varm``/
    ``varp``/``uns``, and consolidated metadata. The store is marked incomplete until the last
    write, so a crash never leaves a store that looks whole. The same inputs always give the
    same bytes, whatever ``num_threads`` is.

    Parameters
    ----------
    store
        Directory to write (created if missing; it must not already hold a Zarr node).
    X
        A ``scipy.sparse`` CSR matrix/array or a 2-D numpy array (any numeric dtype). It is
        streamed to the writer in row blocks; other sparse formats are converted to CSR first.
    obs, var
        ``pandas.DataFrame`` with ``X.shape[0]`` / ``X.shape[1]`` rows and a str index.
        Columns may be numeric, bool or str (object dtype, no missing values); categorical,
        with str, integer, float or bool categories (stored with their dtype, so integer
        cluster ids come back as integers); or one of pandas' nullable dtypes ``Int8`` ..
        ``Int64``, ``UInt8`` .. ``UInt64``, ``boolean`` and ``string``, which may hold
        ``pd.NA`` and are written as anndata writes them (``nullable-integer``,
        ``nullable-boolean``, ``nullable-string-array``: values plus a mask). ``None`` gives
        anndata's defaults (names ``"0"``, ``"1"``, ..., no columns).
    zarr_format
        3 (default) or 2.
    codec
        Codec string of every array, e.g. ``"blosc:lz4:5:shuffle"``, ``"zstd:3"``, ``"none"``.
        ``None`` (default): ``"blosc:lz4:5:noshuffle"`` for a CSR matrix's data and indices of
        1- or 2-byte integers (uint8 counts, uint16 gene ids: byte shuffle there makes the LZ4
        decode about twice as slow for ~20% fewer bytes), ``"blosc:lz4:5:shuffle"`` for every
        other array.
    chunk_size
        CSR: elements per chunk of ``X/data`` and ``X/indices`` and of each layer's (default
        4096, or the largest nnz when smaller); dense: rows per chunk of ``X`` (default about
        1 MiB of rows).
    shard_size
        Zarr v3 only: elements (CSR) or rows (dense) per shard of X, a multiple of
        ``chunk_size``. ``None``: not sharded.
    num_threads
        Compression threads per X or layer array.
    layers
        ``{name: matrix}``: ``scipy.sparse`` matrices of ``X``'s shape (any numeric dtype),
        written as CSR under ``layers/NAME`` (other sparse formats are converted first).
    narrow_indices
        ``True``: store the column ids of ``X`` and of the layers in the smallest unsigned type
        that holds ``n_vars`` (``uint8`` up to 255 columns, ``uint16`` up to 65,535, else
        ``uint32``), as anndata does with its ``write_csr_csc_indices_with_min_possible_dtype``
        setting. ``False``: ``int32``. ``None`` (default): narrow when that gives ``uint8`` or
        ``uint16`` (up to 65,535 columns; Tahoe's 62,710 genes fit), else ``int32``.
    data_dtype
        The dtype of the stored values of a CSR ``X`` and of the layers. ``None`` (default): the
        narrowest that holds every value exactly: ``uint8`` when all are integers in [0, 255]
        (raw counts), ``uint16`` in [0, 65,535], else the matrix's own dtype (a float matrix
        with a non-integer, negative or larger value stays as it is). Narrow values are half or
        a quarter of the bytes to store, read and decode; ``anndata.read_zarr`` gives them
        back in that dtype (equal values), and :func:`zbatch.open` delivers them as float32
        by default (its ``x_dtype``). ``"keep"``: each matrix keeps its own dtype (what
        anndata writes). A dtype (``np.float32``: a float32 store): every matrix's values are
        converted to it as numpy's ``astype`` does. A dense ``X`` keeps its dtype unless a
        dtype is given.

    Returns
    -------
    dict
        The dtypes chosen, by array: ``{"X/data": dtype("uint8"), "X/indices":
        dtype("uint16"), "layers/NAME/data": ..., ...}`` (``{"X": dtype}`` for a dense X); its
        ``codecs`` attribute holds the codec string of each of those arrays
        (``{"X/data": "blosc:lz4:5:noshuffle", ...}``).

    Raises
    ------
    ZbatchError
        From libzbatch, with ``.status`` (e.g. ``"ZB_E_INVALID"`` for a bad codec string or an
        existing store).
    TypeError, ValueError
        For inputs the layout cannot hold.

    Example
    -------
    >>> import numpy as np, pandas as pd, scipy.sparse as sp
    >>> X = sp.random(100, 50, density=0.1, format="csr", dtype=np.float32)
    >>> obs = pd.DataFrame({"cell_type": pd.Categorical(["T", "B"] * 50),
    ...                     "leiden": pd.Categorical(np.arange(100) % 7),
    ...                     "n_umi": pd.array([None] + list(range(99)), dtype="Int64")},
    ...                    index=[f"cell_{i}" for i in range(100)])
    >>> write_anndata("cells.zarr", X, obs=obs, layers={"counts": X.copy()},
    ...               codec="blosc:lz4:5:shuffle", narrow_indices=True)
    {'X/data': dtype('float32'), 'X/indices': dtype('uint8'), 'layers/counts/data': ...}
    """
    csr_x = _as_csr(X)
    csr = csr_x is not None
    if csr:
        X = csr_x
    else:
        X = np.asarray(X)
        if X.ndim != 2:
            raise ValueError(f"X must be 2-D, not {X.ndim}-D")
    dtype = np.dtype(X.dtype)
    if dtype.kind not in _NUMERIC_KINDS:
        raise TypeError(f"X has dtype {dtype}; a numeric or bool dtype is needed")
    dtype = _native(dtype)
    n_obs, n_vars = (int(X.shape[0]), int(X.shape[1]))
    checked_layers = _check_layers(layers, (n_obs, n_vars))
    if csr:
        dtype = _stored_dtype(X, dtype, data_dtype)
        checked_layers = {name: (M, _stored_dtype(M, mdtype, data_dtype))
                          for name, (M, mdtype) in checked_layers.items()}
    elif data_dtype is not None and not (isinstance(data_dtype, str) and data_dtype == "keep"):
        dtype = _native(np.dtype(data_dtype))
    if narrow_indices is None:
        narrow_indices = csr and n_vars <= 65535
    index_dtype = np.dtype(np.int32)
    if narrow_indices:
        index_dtype = np.dtype(np.uint8 if n_vars <= 255 else
                               np.uint16 if n_vars <= 65535 else np.uint32)
    chosen = WriteChoices({"X/data": dtype, "X/indices": index_dtype} if csr else {"X": dtype})
    for name, (_, mdtype) in checked_layers.items():
        chosen[f"layers/{name}/data"] = mdtype
        chosen[f"layers/{name}/indices"] = index_dtype
    # a dense X takes the writer's codec; every CSR data / indices array the narrow rule
    chosen.codecs = {key: (codec or _zbatch.DEFAULT_CODEC) if key == "X" else
                     _zbatch.AnndataWriter.csr_codec(codec, dt.str) for key, dt in chosen.items()}

    x_chunk = int(chunk_size or 0)
    if not x_chunk and not shard_size:
        # the C defaults (ZB_ANNDATA_DEFAULT_X_CHUNK elements; about 1 MiB of rows), but no
        # chunk longer than the largest of X and the layers
        if csr:
            nnz = max([int(X.indptr[-1]) if n_obs else 1] +
                      [int(M.indptr[-1]) for M, _ in checked_layers.values() if n_obs])
            x_chunk = min(_zbatch.ANNDATA_DEFAULT_X_CHUNK, max(1, nnz))
        else:
            x_chunk = min(max(1, (1 << 20) // max(1, n_vars * dtype.itemsize)), max(1, n_obs))

    path = os.fspath(store)
    remote = writable_options(path, storage_options)
    if remote is None:
        os.makedirs(path, exist_ok=True)
    w = _zbatch.AnndataWriter(path, n_vars, "csr" if csr else "dense", dtype.str,
                              zarr_format=int(zarr_format), codec=codec,
                              x_chunk=x_chunk, x_shard=int(shard_size or 0),
                              column_chunk=min(_COLUMN_CHUNK, max(1, n_obs)),
                              num_threads=int(num_threads),
                              narrow_indices=bool(narrow_indices), remote=remote)
    try:
        if csr:
            _write_csr(w.append_csr, X, dtype)
        else:
            _write_x_dense(w, X, dtype)
        for name, (M, mdtype) in checked_layers.items():
            _write_csr(lambda ip, idx, data, name=name, mdtype=mdtype:
                       w.append_layer_csr(name, mdtype.str, ip, idx, data), M, mdtype)
        _write_frame(w, "obs", obs, n_obs)
        _write_frame(w, "var", var, n_vars)
        w.commit()
    finally:
        w.close()
    return chosen
