"""The anndata Zarr input of `zbatch convert` (src/convert/src_zarr.c), read through the private
hooks _zbatch._src_info / _src_matrix / _src_column / _src_obs_names.

Stores come from anndata 0.12's write_zarr (zarr-python 3.1): Zarr v2 and v3, consolidated or
not, v3 sharded (auto_shard_zarr_v3), with smallest-dtype indices
(write_csr_csc_indices_with_min_possible_dtype), X as CSR, CSC or dense, raw/X with its own var,
layers, and obs columns of every encoding. anndata 0.7's older categorical encoding is built by
hand with zarr-python, and zbatch's own writer makes one store. The oracle is anndata.read_zarr
(and zarr-python for what anndata does not show: stored dtypes and chunking).
"""
from __future__ import annotations

import concurrent.futures
import json
import shutil
import warnings
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import zarr

from conftest import expect_error, zbatch_api

N_OBS, N_VARS, N_RAW_VARS = 701, 300, 340


def hooks():
    return zbatch_api()._zbatch


# ------------------------------------------------------------------------------------------------
# The AnnData every store holds
# ------------------------------------------------------------------------------------------------
def sparse_with_empty_rows(n, m, density, dtype, seed):
    """A CSR matrix whose first rows and every 7th row are empty (and whose last row is not)."""
    M = sp.random(n, m, density=density, format="csr", dtype=np.float64, random_state=seed)
    M.data = np.round(M.data * 50 + 1)
    keep = np.ones(n)
    keep[:3] = 0
    keep[7::7] = 0
    keep[-1] = 1
    M = (sp.diags(keep) @ M).tocsr()
    M.eliminate_zeros()
    return M.astype(dtype)


def make_adata(seed=0):
    rng = np.random.default_rng(seed)
    n = N_OBS
    raw = sparse_with_empty_rows(n, N_RAW_VARS, 0.08, np.float32, seed)
    X = raw[:, :N_VARS].tocsr()
    dense = X.toarray()
    dense[1, :4] = [-0.0, np.nan, 0.0, 2.5]  # -0.0 is dropped like 0, NaN is kept
    cell_type = rng.choice(["T cell", "B cell", "NK", "monocyte é"], n).astype(object)
    cell_type[::11] = None  # missing: code -1
    nint = pd.array(rng.integers(-5, 1000, n), dtype="Int32")
    nint[::5] = pd.NA
    nbool = pd.array(rng.random(n) > 0.5, dtype="boolean")
    nbool[1::6] = pd.NA
    nstr = pd.array([f"s{i}" for i in range(n)], dtype="string")
    nstr[2::4] = pd.NA
    obs = pd.DataFrame({
        "cell_type": pd.Categorical(cell_type),
        "leiden": pd.Categorical(rng.integers(0, 12, n)),
        "doublet": pd.Categorical(rng.random(n) > 0.7),
        "dose": pd.Categorical(rng.choice([0.5, 1.0, 1e-05], n)),
        "phase": pd.Categorical(rng.choice(["G1", "S", "G2M"], n), categories=["G1", "S", "G2M"],
                                ordered=True),
        "n_counts": rng.integers(0, 10**6, n).astype(np.int32),
        "total": rng.standard_normal(n) * 1e3,
        "frac": rng.random(n).astype(np.float32),
        "small": rng.integers(-128, 128, n).astype(np.int8),
        "u64": rng.integers(0, 2**63, n).astype(np.uint64) * 2,
        "ok": rng.random(n) > 0.5,
        "barcode": [f"AAAC-{i}-日本" for i in range(n)],
        "nint": nint,
        "nbool": nbool,
        "nstr": nstr,
    }, index=[f"cell_{i}" for i in range(n)])
    a = ad.AnnData(X=X, obs=obs, var=pd.DataFrame(index=[f"g{i}" for i in range(N_VARS)]))
    a.raw = ad.AnnData(X=raw, obs=obs[[]],
                       var=pd.DataFrame(index=[f"raw_g{i}" for i in range(N_RAW_VARS)]))
    a.layers["counts"] = X.astype(np.int32)
    a.layers["csc"] = sp.csc_matrix(X.astype(np.float64))
    a.layers["dense"] = dense
    return a


# ------------------------------------------------------------------------------------------------
# Stores
# ------------------------------------------------------------------------------------------------
CONFIGS = {
    "v2": dict(fmt=2),
    "v2-unconsolidated": dict(fmt=2, unconsolidate=True),
    "v2-min-dtype": dict(fmt=2, min_dtype=True),
    "v2-dense-X": dict(fmt=2, x="dense"),
    "v2-strings-as-categoricals": dict(fmt=2, convert=True),
    "v3": dict(fmt=3),
    "v3-unconsolidated": dict(fmt=3, unconsolidate=True),
    "v3-sharded-min-dtype": dict(fmt=3, shard=True, min_dtype=True),
    "v3-sharded-csc-X": dict(fmt=3, shard=True, x="csc"),
}


def unconsolidate(path, fmt):
    if fmt == 2:
        (path / ".zmetadata").unlink()
    else:
        doc = json.loads((path / "zarr.json").read_text())
        doc["consolidated_metadata"] = None
        (path / "zarr.json").write_text(json.dumps(doc))


def write_store(path, a, fmt, unconsolidate_=False, min_dtype=False, shard=False, x="csr",
                convert=False):
    if x == "csc":
        a.X = sp.csc_matrix(a.X)
    elif x == "dense":
        a.X = a.X.toarray()
    with warnings.catch_warnings(), ad.settings.override(
            zarr_write_format=fmt, auto_shard_zarr_v3=shard, allow_write_nullable_strings=True,
            write_csr_csc_indices_with_min_possible_dtype=min_dtype):
        warnings.simplefilter("ignore")
        # dense X in 100 x 64 chunks: reads cross chunk borders on both axes
        a.write_zarr(path, chunks=(100, 64) if x == "dense" else None,
                     convert_strings_to_categoricals=convert)
    if unconsolidate_:
        unconsolidate(path, fmt)


@pytest.fixture(scope="module", params=list(CONFIGS))
def store(request, tmp_path_factory):
    cfg = dict(CONFIGS[request.param])
    path = tmp_path_factory.mktemp(request.param) / "a.zarr"
    write_store(path, make_adata(), cfg.pop("fmt"), unconsolidate_=cfg.pop("unconsolidate", False),
                **cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        oracle = ad.read_zarr(path)
    return request.param, path, oracle


def test_the_stores_are_what_the_configurations_say(store):
    """The features each configuration claims are really on disk (or the tests would prove
    less than they say)."""
    name, path, _ = store
    cfg = CONFIGS[name]
    root = zarr.open_group(str(path), mode="r")
    assert root.metadata.zarr_format == cfg["fmt"]
    x_group = root["layers/counts"]
    assert x_group["indices"].dtype == (np.uint16 if cfg.get("min_dtype") else np.int32)
    assert (x_group["data"].shards is not None) == bool(cfg.get("shard"))
    assert root["layers/csc"].attrs["encoding-type"] == "csc_matrix"
    assert root["X"].attrs["encoding-type"] == {"csr": "csr_matrix", "csc": "csc_matrix",
                                               "dense": "array"}[cfg.get("x", "csr")]
    if cfg.get("x") == "dense":
        assert root["X"].chunks == (100, 64)
    consolidated = (path / ".zmetadata").exists() if cfg["fmt"] == 2 else \
        json.loads((path / "zarr.json").read_text()).get("consolidated_metadata") is not None
    assert consolidated != bool(cfg.get("unconsolidate"))
    enc = root["obs/nstr"].attrs["encoding-type"]
    assert enc == ("categorical" if cfg.get("convert") else "nullable-string-array")
    assert root["obs/nint"].attrs["encoding-type"] == "nullable-integer"
    assert root["obs/leiden/categories"].dtype == np.int64


# ------------------------------------------------------------------------------------------------
# Matrices
# ------------------------------------------------------------------------------------------------
MATRICES = ["X", "raw/X", "layers/counts", "layers/csc", "layers/dense"]


def oracle_matrix(oracle, key):
    if key == "X":
        return oracle.X
    if key == "raw/X":
        return oracle.raw.X
    return oracle.layers[key.split("/", 1)[1]]


def ranges(n):
    """Empty ranges (at 0, inside, at the end), single rows (the first, the last), the whole
    axis, and spans that cross chunk borders."""
    spans = [(0, 0), (n // 2, n // 2), (n, n), (0, 1), (n - 1, n), (0, n), (3, 9),
             (n // 7, n - n // 3), (97, n - 150), (n - 60, n)]
    return [(a, b) for a, b in spans if 0 <= a <= b <= n]


def as_scipy(M, layout):
    """M as a scipy CSR/CSC matrix with int64 indices (scipy warns about anndata's uint16): a
    dense matrix loses its zeros (-0.0 included; NaN stays), a sparse one keeps its stored
    elements in order."""
    if sp.issparse(M):
        M = sp.csr_matrix((M.data, M.indices.astype(np.int64), M.indptr.astype(np.int64)),
                          shape=M.shape) if M.format == "csr" else \
            sp.csc_matrix((M.data, M.indices.astype(np.int64), M.indptr.astype(np.int64)),
                          shape=M.shape)
    return sp.csc_matrix(M) if layout == "csc" else sp.csr_matrix(M)


def expected_block(M, layout, start, stop):
    """The rows (CSC: columns) [start, stop) as scipy returns them."""
    M = as_scipy(M, layout)
    return M[:, start:stop] if layout == "csc" else M[start:stop]


def check_block(got, want, start, stop):
    indptr = np.frombuffer(got["indptr"], np.int64)
    assert len(indptr) == stop - start + 1
    np.testing.assert_array_equal(indptr, want.indptr.astype(np.int64))
    np.testing.assert_array_equal(np.frombuffer(got["indices"], np.uint32), want.indices)
    data = np.frombuffer(got["data"], np.dtype(got["dtype"]))
    assert data.dtype == want.data.dtype
    np.testing.assert_array_equal(data, want.data)


@pytest.mark.parametrize("key", MATRICES)
def test_matrix_blocks_equal_anndata(store, key):
    name, path, oracle = store
    M = oracle_matrix(oracle, key)
    layout = "dense" if isinstance(M, np.ndarray) else M.format
    n_vars = N_RAW_VARS if key == "raw/X" else N_VARS
    var_names = list(oracle.raw.var_names if key == "raw/X" else oracle.var_names)
    n = n_vars if layout == "csc" else N_OBS
    for start, stop in ranges(n):
        got = hooks()._src_matrix(str(path), key, start, stop)
        assert got["layout"] == layout
        assert got["shape"] == (N_OBS, n_vars)
        assert got["nnz"] == (N_OBS * n_vars if layout == "dense" else M.nnz)
        assert got["var_names"] == var_names
        check_block(got, expected_block(M, layout, start, stop), start, stop)


def test_matrix_of_every_row_block_concatenates_to_the_matrix(store):
    """Reading X in consecutive blocks of 37 rows gives the whole matrix back."""
    _, path, oracle = store
    M = oracle.X
    layout = "dense" if isinstance(M, np.ndarray) else M.format
    n = N_VARS if layout == "csc" else N_OBS
    parts = []
    for start in range(0, n, 37):
        got = hooks()._src_matrix(str(path), "X", start, min(start + 37, n))
        indptr = np.frombuffer(got["indptr"], np.int64)
        parts.append(sp.csr_matrix(
            (np.frombuffer(got["data"], np.dtype(got["dtype"])),
             np.frombuffer(got["indices"], np.uint32), indptr),
            shape=(len(indptr) - 1, N_OBS if layout == "csc" else N_VARS)))
    whole = sp.vstack(parts).tocsr()
    want = as_scipy(M, layout)
    want = sp.csr_matrix(want.T) if layout == "csc" else want
    assert (whole != want).nnz == 0


# ------------------------------------------------------------------------------------------------
# obs
# ------------------------------------------------------------------------------------------------
def expected_kind(series):
    dt = series.dtype
    if isinstance(dt, pd.CategoricalDtype):
        return "categorical"
    if isinstance(dt, (pd.StringDtype, pd.BooleanDtype)) or pd.api.types.is_extension_array_dtype(
            dt):
        return "nullable"
    return "string" if dt == object else "numeric"


def test_obs_columns_are_described_as_stored(store):
    _, path, oracle = store
    info = hooks()._src_info(str(path))
    assert info["format"] == "zarr" and info["n_obs"] == N_OBS
    assert [c["name"] for c in info["columns"]] == list(oracle.obs.columns)
    root = zarr.open_group(str(path), mode="r")
    for c in info["columns"]:
        s = oracle.obs[c["name"]]
        assert c["kind"] == expected_kind(s), c["name"]
        if c["kind"] != "categorical":
            assert c["categories"] is None and c["category_values"] is None
            continue
        cats = s.cat.categories.to_numpy()
        stored = root[f"obs/{c['name']}/categories"]
        assert c["ordered"] == s.cat.ordered
        assert c["categories"] == [str(x) for x in cats]
        if stored.dtype.kind in "biuf":
            assert c["dtype"] == stored.dtype.str
            values = np.frombuffer(c["category_values"], np.dtype(c["dtype"]))
            np.testing.assert_array_equal(values, cats.astype(stored.dtype))
        else:
            assert c["dtype"] == "|O" and c["category_values"] is None
    # numeric categories keep their type and read as Python writes them
    by_name = {c["name"]: c for c in info["columns"]}
    assert by_name["dose"]["categories"] == ["1e-05", "0.5", "1.0"]
    assert by_name["doublet"]["categories"] == ["False", "True"]
    assert by_name["phase"]["ordered"] and not by_name["cell_type"]["ordered"]


def buffer(got, field, dtype):
    """A bytes field of a hook's answer as an array; an empty block may leave it None (the
    block's buffers are only allocated for rows), which the length comparison still checks."""
    return np.frombuffer(got[field] or b"", dtype)


def check_column(got, c, series):
    kind = c["kind"]
    if kind == "categorical":
        codes = buffer(got, "values", np.int32)
        np.testing.assert_array_equal(codes, series.cat.codes.to_numpy())
        assert got["mask"] is None and got["strings"] is None
    elif kind == "numeric":
        values = buffer(got, "values", np.dtype(c["dtype"]))
        np.testing.assert_array_equal(values, series.to_numpy())
    elif kind == "string":
        assert got["strings"] == list(series)
    else:
        mask = buffer(got, "mask", np.uint8)
        np.testing.assert_array_equal(mask, series.isna().to_numpy().astype(np.uint8))
        present = ~series.isna().to_numpy()
        if c["dtype"] == "|O":
            assert got["strings"] == ["" if m else v for v, m in zip(series, mask)]
        else:
            values = buffer(got, "values", np.dtype(c["dtype"]))
            np.testing.assert_array_equal(values[present],
                                          series.to_numpy()[present].astype(values.dtype))


def test_obs_columns_equal_anndata(store):
    _, path, oracle = store
    info = hooks()._src_info(str(path))
    for c in info["columns"]:
        for start, stop in ranges(N_OBS):
            got = hooks()._src_column(str(path), c["name"], start, stop)
            check_column(got, c, oracle.obs[c["name"]].iloc[start:stop])


def test_obs_names_equal_anndata(store):
    _, path, oracle = store
    for start, stop in ranges(N_OBS):
        assert hooks()._src_obs_names(str(path), start, stop) == list(
            oracle.obs_names[start:stop])


# ------------------------------------------------------------------------------------------------
# anndata 0.7's encoding, built by hand (the root carries no attributes; a categorical column is
# a codes array whose attribute `categories` names the array `__categories/<column>` beside it,
# which carries `ordered`)
# ------------------------------------------------------------------------------------------------
def _array(group, name, data, **attrs):
    data = np.asarray(data)
    arr = group.create_array(name, shape=data.shape, chunks=(max(1, len(data) // 3),),
                             dtype=str if data.dtype.kind in "UO" else data.dtype)
    arr[...] = data
    arr.attrs.update(attrs)
    return arr


@pytest.fixture(scope="module")
def anndata_0_7(tmp_path_factory):
    path = tmp_path_factory.mktemp("legacy") / "old.zarr"
    rng = np.random.default_rng(7)
    n, m = 40, 9
    X = sparse_with_empty_rows(n, m, 0.3, np.float32, 7)
    root = zarr.open_group(str(path), mode="w", zarr_format=2)
    g = root.create_group("X")
    g.attrs.update({"encoding-type": "csr_matrix", "encoding-version": "0.1.0", "shape": [n, m]})
    _array(g, "data", X.data)
    _array(g, "indices", X.indices.astype(np.int32))
    _array(g, "indptr", X.indptr.astype(np.int32))
    obs = root.create_group("obs")
    obs.attrs.update({"encoding-type": "dataframe", "encoding-version": "0.1.0",
                      "column-order": ["ct", "stage", "n", "label"], "_index": "_index"})
    _array(obs, "_index", [f"c{i}" for i in range(n)])
    cats = obs.create_group("__categories")
    _array(cats, "ct", ["alpha", "beta", "gamma"], ordered=False)
    _array(cats, "stage", ["early", "late"], ordered=True)
    ct = rng.integers(-1, 3, n).astype(np.int8)
    _array(obs, "ct", ct, categories="__categories/ct")
    _array(obs, "stage", rng.integers(0, 2, n).astype(np.int8), categories="__categories/stage")
    _array(obs, "n", rng.integers(0, 100, n))
    _array(obs, "label", [f"l{i % 5}" for i in range(n)])
    var = root.create_group("var")
    var.attrs.update({"encoding-type": "dataframe", "encoding-version": "0.1.0",
                      "column-order": [], "_index": "_index"})
    _array(var, "_index", [f"gene{j}" for j in range(m)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        oracle = ad.read_zarr(path)
    return path, oracle


def test_anndata_0_7_store_reads_as_anndata_reads_it(anndata_0_7):
    path, oracle = anndata_0_7
    assert "encoding-type" not in zarr.open_group(str(path), mode="r").attrs
    info = hooks()._src_info(str(path))
    cols = {c["name"]: c for c in info["columns"]}
    assert list(cols) == ["ct", "stage", "n", "label"]
    assert cols["ct"]["kind"] == "categorical" and cols["ct"]["categories"] == [
        "alpha", "beta", "gamma"]
    assert cols["stage"]["ordered"] and not cols["ct"]["ordered"]
    assert oracle.obs["stage"].cat.ordered
    assert [cols[k]["kind"] for k in ("n", "label")] == ["numeric", "string"]
    for name, c in cols.items():
        for start, stop in ranges(oracle.n_obs):
            check_column(hooks()._src_column(str(path), name, start, stop), c,
                         oracle.obs[name].iloc[start:stop])
    assert (oracle.obs["ct"].cat.codes == -1).any()
    for start, stop in ranges(oracle.n_obs):
        check_block(hooks()._src_matrix(str(path), "X", start, stop),
                    expected_block(oracle.X, "csr", start, stop), start, stop)
    assert hooks()._src_obs_names(str(path), 0, -1) == list(oracle.obs_names)
    assert hooks()._src_matrix(str(path), "X", 0, 0)["var_names"] == list(oracle.var_names)


# ------------------------------------------------------------------------------------------------
# A store written by zbatch's own anndata writer
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("data_dtype", ["keep", None])
@pytest.mark.parametrize("fmt,shard", [(2, None), (3, 2048)])
def test_zbatch_written_store_reads_back_exactly(tmp_path, fmt, shard, data_dtype):
    zb = zbatch_api()
    rng = np.random.default_rng(11)
    X = sparse_with_empty_rows(500, 130, 0.1, np.float32, 11)
    obs = pd.DataFrame({"ct": pd.Categorical(rng.choice(["a", "b", "c"], 500)),
                        "n": rng.integers(0, 9, 500), "ok": rng.random(500) > 0.5,
                        "s": [f"x{i}" for i in range(500)]},
                       index=[f"c{i}" for i in range(500)])
    var = pd.DataFrame(index=[f"g{i}" for i in range(130)])
    path = tmp_path / "zb.zarr"
    # "keep": float32 values; None (the default): integer counts stored narrow (uint8, issue
    # 19), which the source reads as stored
    chosen = zb.write_anndata(str(path), X, obs=obs, var=var, zarr_format=fmt, chunk_size=512,
                              shard_size=shard, data_dtype=data_dtype)
    assert chosen["X/data"] == (np.float32 if data_dtype == "keep" else np.uint8)
    X = X.astype(chosen["X/data"])
    info = hooks()._src_info(str(path))
    assert [(c["name"], c["kind"]) for c in info["columns"]] == [
        ("ct", "categorical"), ("n", "numeric"), ("ok", "numeric"), ("s", "string")]
    for start, stop in ranges(500):
        got = hooks()._src_matrix(str(path), "X", start, stop)
        assert got["var_names"] == list(var.index)
        check_block(got, X[start:stop], start, stop)
        for c in info["columns"]:
            check_column(hooks()._src_column(str(path), c["name"], start, stop), c,
                         obs[c["name"]].iloc[start:stop])
        assert hooks()._src_obs_names(str(path), start, stop) == list(obs.index[start:stop])


# ------------------------------------------------------------------------------------------------
# Concurrent reads
# ------------------------------------------------------------------------------------------------
def test_concurrent_reads_give_the_serial_values(store):
    _, path, _ = store
    blocks = [(s, min(s + 53, N_OBS)) for s in range(0, N_OBS, 53)] * 3
    key = "layers/dense" if CONFIGS[store[0]].get("x") != "csc" else "layers/counts"
    serial = [hooks()._src_matrix(str(path), key, a, b) for a, b in blocks]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        parallel = list(pool.map(lambda r: hooks()._src_matrix(str(path), key, *r), blocks))
    assert parallel == serial


# ------------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------------
@pytest.fixture
def small(tmp_path):
    """A fresh small v2 store (anndata 0.12), to damage."""
    def make(fmt=2, min_dtype=False, **kw):
        a = make_adata()[:120].copy()
        path = tmp_path / f"small{fmt}.zarr"
        write_store(path, a, fmt, min_dtype=min_dtype, **kw)
        return path
    return make


def test_missing_store_and_missing_key(tmp_path, small):
    missing = tmp_path / "nope.zarr"
    with expect_error("ZB_E_NOTFOUND", str(missing)):
        hooks()._src_info(str(missing))
    path = small()
    with expect_error("ZB_E_NOTFOUND", str(path), "layers/nope"):
        hooks()._src_matrix(str(path), "layers/nope", 0, -1)
    with expect_error("ZB_E_NOTFOUND", "no obs column 'nope'"):
        hooks()._src_column(str(path), "nope", 0, -1)
    with expect_error("ZB_E_INVALID", str(path), "obsm/emb", "not a matrix key"):
        hooks()._src_matrix(str(path), "obsm/emb", 0, -1)
    with expect_error("ZB_E_RANGE", str(path), "[100, 121)"):
        hooks()._src_matrix(str(path), "X", 100, 121)
    with expect_error("ZB_E_RANGE", str(path), "obs/total"):
        hooks()._src_column(str(path), "total", 5, 121)


def test_stores_that_are_not_anndata_are_refused_saying_what_they_are(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with expect_error("ZB_E_UNSUPPORTED", str(empty), "not a Zarr store"):
        hooks()._src_info(str(empty))
    arr = tmp_path / "arr.zarr"
    zarr.create_array(str(arr), shape=(3,), dtype="f4")
    with expect_error("ZB_E_UNSUPPORTED", str(arr), "a Zarr array"):
        hooks()._src_info(str(arr))
    plain = tmp_path / "plain.zarr"
    zarr.open_group(str(plain), mode="w").create_array("x", shape=(3,), dtype="f4")
    with expect_error("ZB_E_UNSUPPORTED", str(plain), "no encoding-type"):
        hooks()._src_info(str(plain))
    other = tmp_path / "other.zarr"
    zarr.open_group(str(other), mode="w", attributes={"encoding-type": "annbatch-preshuffled"})
    with expect_error("ZB_E_UNSUPPORTED", str(other), "'annbatch-preshuffled'"):
        hooks()._src_info(str(other))


def _set_attrs(group_path, **attrs):
    g = zarr.open_group(str(group_path), mode="r+", use_consolidated=False)
    g.attrs.update(attrs)


def test_unsupported_encodings_are_named(small):
    path = small()
    (path / ".zmetadata").unlink()  # so the edited attributes are what a reader sees
    _set_attrs(path / "obs" / "nint", **{"encoding-type": "awkward-array"})
    # a column no reader here knows is left out, with its reason; the others are kept
    info = hooks()._src_info(str(path))
    assert "nint" not in [c["name"] for c in info["columns"]] and len(info["columns"]) > 3
    assert len(info["skipped"]) == 1 and info["skipped"][0].startswith("nint\t")
    assert "obs/nint" in info["skipped"][0] and "awkward-array" in info["skipped"][0]
    path = small(fmt=3)
    unconsolidate(path, 3)
    _set_attrs(path / "layers" / "csc", **{"encoding-type": "coo_matrix"})
    with expect_error("ZB_E_UNSUPPORTED", str(path), "layers/csc", "coo_matrix"):
        hooks()._src_matrix(str(path), "layers/csc", 0, -1)
    # a dict group (anndata's empty obsm, copied under layers) is not a matrix either
    shutil.copytree(path / "obsm", path / "layers" / "obsm")
    with expect_error("ZB_E_UNSUPPORTED", str(path), "layers/obsm", "'dict'", "not a matrix"):
        hooks()._src_matrix(str(path), "layers/obsm", 0, -1)


def _edit(path, key, index, value):
    arr = zarr.open_array(str(path / key), mode="r+")
    arr[index] = value
    return arr


@pytest.mark.parametrize("fmt,min_dtype", [(2, False), (3, True)])
def test_index_beyond_n_vars_is_corruption(small, fmt, min_dtype):
    path = small(fmt, min_dtype)
    indptr = zarr.open_array(str(path / "X" / "indptr"), mode="r")[...]
    row = 50
    _edit(path, "X/indices", int(indptr[row]) + 1, N_VARS)
    with expect_error("ZB_E_CORRUPT", str(path), "X/indices", f"row {row}", f"index {N_VARS}"):
        hooks()._src_matrix(str(path), "X", 40, 60)
    # rows that do not hold the bad element still read
    got = hooks()._src_matrix(str(path), "X", 0, row)
    assert len(np.frombuffer(got["indptr"], np.int64)) == row + 1


def test_negative_index_is_corruption(small):
    path = small(2)
    indptr = zarr.open_array(str(path / "X" / "indptr"), mode="r")[...]
    _edit(path, "X/indices", int(indptr[30]), -3)
    with expect_error("ZB_E_CORRUPT", str(path), "X/indices"):
        hooks()._src_matrix(str(path), "X", 30, 31)


def test_decreasing_indptr_is_corruption(small):
    path = small(3)
    indptr = zarr.open_array(str(path / "X" / "indptr"), mode="r")[...]
    k = 61
    assert indptr[k - 1] > 0
    _edit(path, "X/indptr", k, int(indptr[k - 1]) - 1)
    with expect_error("ZB_E_CORRUPT", str(path), "X/indptr", f"position {k}"):
        hooks()._src_matrix(str(path), "X", 50, 70)


def test_indptr_not_ending_at_nnz_is_corruption(small):
    path = small(2)
    indptr = zarr.open_array(str(path / "X" / "indptr"), mode="r")[...]
    _edit(path, "X/indptr", len(indptr) - 1, int(indptr[-1]) - 1)
    with expect_error("ZB_E_CORRUPT", str(path), "X/indptr"):
        hooks()._src_matrix(str(path), "X", 0, 1)


@pytest.mark.parametrize("code", [3, -2])
def test_code_beyond_the_categories_is_corruption(small, code):
    path = small(2)
    _edit(path, "obs/phase/codes", 10, code)
    with expect_error("ZB_E_CORRUPT", str(path), "obs/phase", "row 10", f"code {code}"):
        hooks()._src_column(str(path), "phase", 0, 20)
    # the rows before it read as stored
    got = hooks()._src_column(str(path), "phase", 0, 10)
    assert len(np.frombuffer(got["values"], np.int32)) == 10


@pytest.mark.parametrize("fmt", [2, 3])
def test_missing_chunk_of_indptr_is_corruption(small, fmt):
    """indptr rewritten in chunks of 20 pointers, then one chunk in the middle deleted: a read
    inside that chunk alone, and one across it, are both corruption (a missing chunk reads as
    fill 0, which would otherwise look like rows without elements)."""
    path = small(fmt)
    old = zarr.open_array(str(path / "X" / "indptr"), mode="r")[...]
    shutil.rmtree(path / "X" / "indptr")
    arr = zarr.create_array(str(path / "X" / "indptr"), shape=old.shape, chunks=(20,),
                            dtype=old.dtype, zarr_format=fmt, fill_value=0)
    arr[...] = old
    unconsolidate(path, fmt)
    (path / "X" / "indptr" / ("3" if fmt == 2 else "c/3")).unlink()
    for start, stop in [(62, 70), (50, 90)]:
        with expect_error("ZB_E_CORRUPT", str(path), "X/indptr"):
            hooks()._src_matrix(str(path), "X", start, stop)
    # rows away from the missing chunk still read as stored
    got = hooks()._src_matrix(str(path), "X", 0, 40)
    np.testing.assert_array_equal(np.frombuffer(got["indptr"], np.int64), old[:41])


def test_missing_leading_chunks_of_indptr_are_empty_rows(small):
    """zarr-python 3 skips all-zero chunks: an indptr whose first chunks are all 0 (the first
    rows are empty) is valid, and those rows read as empty."""
    path = small(3)
    old = zarr.open_array(str(path / "X" / "indptr"), mode="r")[...]
    assert old[2] == 0  # sparse_with_empty_rows empties the first three rows
    shutil.rmtree(path / "X" / "indptr")
    arr = zarr.create_array(str(path / "X" / "indptr"), shape=old.shape, chunks=(2,),
                            dtype=old.dtype, zarr_format=3, fill_value=0)
    arr[...] = old
    unconsolidate(path, 3)
    assert not (path / "X" / "indptr" / "c" / "0").exists()
    got = hooks()._src_matrix(str(path), "X", 1, 9)
    np.testing.assert_array_equal(np.frombuffer(got["indptr"], np.int64), old[1:10] - old[1])


def test_masked_strings_read_as_empty_whatever_is_stored_under_the_mask(small):
    """anndata stores "" under the mask of a nullable-string-array; another writer may leave
    anything there, and source.h promises an empty string for a missing one."""
    path = small(3)
    mask = zarr.open_array(str(path / "obs" / "nstr" / "mask"), mode="r")[...]
    values = zarr.open_array(str(path / "obs" / "nstr" / "values"), mode="r+")
    stored = values[...].astype(object)
    stored[mask] = "left over"
    values[...] = stored
    got = hooks()._src_column(str(path), "nstr", 0, -1)
    assert mask.any() and got["strings"] == ["" if m else v for v, m in zip(stored, mask)]
    assert got["mask"] == mask.astype(np.uint8).tobytes()


@pytest.mark.parametrize("indices,indptr,codes", [("int64", "uint64", "int64"),
                                                  ("uint32", "int64", "int16"),
                                                  ("int16", "uint32", "uint8")])
def test_integer_arrays_of_any_type_read_the_same(small, indices, indptr, codes):
    """indices, indptr and codes rewritten (zarr-python) in other integer types read as the
    originals: wider types are narrowed, narrower ones widened."""
    path = small(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        oracle = ad.read_zarr(path)
    for key, dtype in (("X/indices", indices), ("X/indptr", indptr),
                       ("obs/phase/codes", codes)):
        old = zarr.open_array(str(path / key), mode="r")
        values, attrs = old[...], dict(old.attrs)
        shutil.rmtree(path / key)
        new = zarr.create_array(str(path / key), shape=values.shape, chunks=(37,), dtype=dtype,
                                zarr_format=3, attributes=attrs)
        new[...] = values.astype(dtype)
    unconsolidate(path, 3)
    for start, stop in ranges(oracle.n_obs):
        check_block(hooks()._src_matrix(str(path), "X", start, stop),
                    expected_block(oracle.X, "csr", start, stop), start, stop)
        info = {c["name"]: c for c in hooks()._src_info(str(path))["columns"]}
        check_column(hooks()._src_column(str(path), "phase", start, stop), info["phase"],
                     oracle.obs["phase"].iloc[start:stop])
