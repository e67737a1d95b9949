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
__all__ = ["read_array", "info", "ZbatchError", "STATUS"]

#: Status names of libzbatch mapped to their codes (ZbatchError.status / .code).
STATUS: dict[str, int] = _zbatch.status_names()


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
    stop_arg = -1 if stop is None else int(stop)
    if stop is not None and stop_arg < 0:
        stop_arg = -2 ** 62  # a negative stop is out of range; the library says so
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
