"""An anndata data frame group (shared FORMATS.md §6) read as a pandas DataFrame, the way
``anndata.read_zarr`` reads it: the ``_index`` child as the index, ``column-order`` for the
columns; numbers and booleans as numpy arrays, string arrays as objects, categoricals with their
categories, nullable columns as pandas nullable arrays. Columns of other encodings are left
out. ``Dataset.var`` uses it (obs goes through libzbatch, which merges a collection's children).
"""
from __future__ import annotations

import numpy as np


def read_frame(store: str, group: str):
    import pandas as pd
    from . import info, read_array
    nodes = {n["path"]: n for n in info(store)["nodes"]}
    attrs = nodes[group]["attributes"]
    index_key = attrs.get("_index", "_index")
    index_path = f"{group}/{index_key}"
    name = None if index_key == "_index" else index_key
    if nodes[index_path]["type"] == "group":    # anndata >= 0.13: a nullable-string-array
        index = pd.Index(_nullable_strings(store, index_path), name=name)
    else:
        index = pd.Index(read_array(store, index_path).astype(object), dtype=object, name=name)
    data = {}
    for col in attrs.get("column-order", []):
        path = f"{group}/{col}"
        node = nodes.get(path)
        if node is None:
            continue
        enc = node["attributes"].get("encoding-type")
        if node["type"] == "array":
            values = read_array(store, path)
            if values.ndim != 1:
                continue
            data[col] = values.astype(object) if values.dtype.kind == "U" else values
        elif enc == "categorical":
            cats = read_array(store, f"{path}/categories")
            cats = cats.astype(object) if cats.dtype.kind == "U" else cats
            data[col] = pd.Categorical.from_codes(
                read_array(store, f"{path}/codes").astype(np.int64), categories=pd.Index(cats),
                ordered=bool(node["attributes"].get("ordered", False)))
        elif enc in ("nullable-integer", "nullable-boolean"):
            data[col] = nullable_values(read_array(store, f"{path}/values"),
                                        read_array(store, f"{path}/mask"))
        elif enc == "nullable-string-array":
            data[col] = _nullable_strings(store, path)
    return pd.DataFrame(data, index=index, columns=pd.Index(list(data), dtype=object))


def _nullable_strings(store: str, path: str):
    from . import read_array
    return nullable_strings(read_array(store, f"{path}/values"), read_array(store, f"{path}/mask"))


def nullable_values(values: np.ndarray, mask: np.ndarray):
    """A nullable-integer / nullable-boolean column as pandas holds it (its own copies)."""
    import pandas as pd
    cls = pd.arrays.BooleanArray if values.dtype == bool else pd.arrays.IntegerArray
    return cls(np.array(values), np.array(mask, dtype=bool))


def nullable_strings(values, mask):
    """A nullable-string-array column as pandas' string dtype: NA where the mask is set."""
    import pandas as pd
    return pd.array([None if m else str(v) for v, m in zip(values, mask)], dtype="string")
