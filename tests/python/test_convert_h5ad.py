"""The .h5ad input of `zbatch convert` (src/convert/src_h5ad.c, h5ad_matrix.c, h5ad_io.c), seen
through the private hooks _zbatch._src_info / _src_matrix / _src_column / _src_obs_names.

Files are written by anndata 0.12 (write_h5ad, plain and gzip), re-chunked by h5py where a test
needs other chunk sizes or filters, or built by hand with h5py following anndata 0.7's writer
(categoricals as codes with an object reference to obs/__categories/NAME) and the pre-0.7 h5sparse
attributes. The expected values come from anndata.read_h5ad and from h5py reading the stored
arrays, never from zbatch. Corrupt files must be errors naming the file and the key.
"""
import concurrent.futures
import random
import shutil
import warnings

import anndata as ad
import h5py
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from zbatch import ZbatchError
from zbatch import _zbatch as Z

N_OBS, N_VARS, N_RAW_VARS = 203, 37, 45
# empty ranges, the first and the last row, empty rows inside, most of it, all of it
RANGES = [(0, 0), (5, 5), (N_OBS, N_OBS), (0, 1), (5, 8), (17, 123), (201, 202),
          (N_OBS - 1, N_OBS), (0, N_OBS)]
EMPTY_ROWS = (5, 6, 7, 201)


# ------------------------------------------------------------------------------------------------
# Files
# ------------------------------------------------------------------------------------------------
def rich_adata():
    """Every matrix form and every obs column encoding anndata 0.12 writes."""
    rng = np.random.default_rng(7)
    X = sp.random(N_OBS, N_VARS, density=0.15, format="lil", dtype=np.float32, random_state=7)
    for r in EMPTY_ROWS:
        X[r, :] = 0
    X[N_OBS - 1, 3] = 2.5  # the last row holds something
    X = X.tocsr()
    X.eliminate_zeros()
    dense = rng.standard_normal((N_OBS, N_VARS)).astype(np.float32)
    dense[rng.random(dense.shape) < 0.6] = 0
    dense[0, 0], dense[1, 1], dense[2, 2] = -0.0, np.nan, np.inf  # -0.0 is dropped, NaN kept

    def with_na(values, every=9):
        return [None if i % every == 4 else v for i, v in enumerate(values)]

    pick = lambda options: [options[i % len(options)] for i in rng.permutation(N_OBS)]  # noqa
    obs = pd.DataFrame({
        "cat": pd.Categorical(with_na(pick(["T cell", "B cell", "NK"]))),
        "icat": pd.Categorical(with_na(pick([3, 10, 42]))),
        "bcat": pd.Categorical(with_na(pick([True, False]), every=11)),
        "fcat": pd.Categorical(pick([0.5, 1e-05, 100.0]), categories=[100.0, 0.5, 1e-05],
                               ordered=True),
        "n_i8": rng.integers(-100, 100, N_OBS).astype(np.int8),
        "n_u16": rng.integers(0, 60000, N_OBS).astype(np.uint16),
        "n_i32": rng.integers(-2**31, 2**31 - 1, N_OBS).astype(np.int32),
        "n_i64": rng.integers(-2**62, 2**62, N_OBS),
        "n_f32": rng.standard_normal(N_OBS).astype(np.float32),
        "n_f64": np.where(np.arange(N_OBS) % 13 == 0, np.nan, rng.standard_normal(N_OBS)),
        "flag": rng.random(N_OBS) > 0.5,
        "name": [f"cellule-{i}-é{'x' * (i % 5)}" for i in range(N_OBS)],
        "ni": pd.array(with_na(rng.integers(-5, 5, N_OBS).tolist()), dtype="Int32"),
        "nb": pd.array(with_na((rng.random(N_OBS) > 0.5).tolist()), dtype="boolean"),
        "ns": pd.array(with_na([f"s{i}" for i in range(N_OBS)]), dtype="string"),
    }, index=[f"AAAC-{i:05d}" for i in range(N_OBS)])
    var = pd.DataFrame(index=[f"gene{i}" for i in range(N_VARS)])
    a = ad.AnnData(X=X, obs=obs, var=var)
    raw_X = sp.random(N_OBS, N_RAW_VARS, density=0.2, format="csr", dtype=np.float32,
                      random_state=8)
    a.raw = ad.AnnData(X=raw_X, obs=obs[[]],
                       var=pd.DataFrame(index=[f"raw-gene{i}" for i in range(N_RAW_VARS)]))
    a.layers["counts"] = sp.random(N_OBS, N_VARS, density=0.1, format="csr", random_state=9,
                                   data_rvs=lambda n: rng.integers(1, 50, n)).astype(np.int32)
    a.layers["csc"] = sp.random(N_OBS, N_VARS, density=0.1, format="csc", dtype=np.float64,
                                random_state=10)
    a.layers["dense"] = dense
    return a


def write(a, path, **kw):
    with warnings.catch_warnings(), ad.settings.override(allow_write_nullable_strings=True):
        warnings.simplefilter("ignore")
        ad.io.write_h5ad(path, a, convert_strings_to_categoricals=False, **kw)
    return path


def rechunk(src, dst, rows, cols=5, **filters):
    """A copy of the h5ad `src` with every non-empty dataset chunked (rows,) or (rows, cols) and
    stored with `filters` (h5py create_dataset arguments; fletcher32 only where libhdf5 allows it,
    not on variable-length strings); groups, attributes and dtypes as they were."""
    with h5py.File(src, "r") as fi, h5py.File(dst, "w") as fo:
        fo.attrs.update(dict(fi.attrs))

        def copy(name, obj):
            if isinstance(obj, h5py.Group):
                fo.require_group(name).attrs.update(dict(obj.attrs))
                return
            data = obj[()]
            chunked = obj.ndim > 0 and obj.size > 0
            chunks = tuple(min(c, s) for c, s in zip((rows, cols), obj.shape)) if chunked else None
            kw = dict(filters) if chunked else {}
            if obj.dtype == object:
                kw.pop("fletcher32", None)
            d = fo.create_dataset(name, data=data, dtype=obj.dtype, chunks=chunks, **kw)
            d.attrs.update(dict(obj.attrs))
        fi.visititems(copy)
    return dst


VARIANTS = {
    # anndata's own output: sparse parts chunked (maxshape None), no filter
    "plain": lambda a, p: write(a, p),
    "gzip": lambda a, p: write(a, p, compression="gzip"),
    # small chunks, so every read crosses chunks (2-d ones included); deflate + shuffle
    "gzip-shuffle-7": lambda a, p: rechunk(write(a, p.with_suffix(".0.h5ad"), compression="gzip"),
                                           p, 7, 5, compression="gzip", shuffle=True),
    "gzip-64": lambda a, p: rechunk(write(a, p.with_suffix(".0.h5ad")), p, 64, 16,
                                    compression="gzip", compression_opts=9),
    "no-filter-11": lambda a, p: rechunk(write(a, p.with_suffix(".0.h5ad")), p, 11, 3),
    # a filter the direct path does not decode: libhdf5 reads it (H5Dread)
    "gzip-fletcher32-13": lambda a, p: rechunk(write(a, p.with_suffix(".0.h5ad")), p, 13, 7,
                                               compression="gzip", fletcher32=True),
}


@pytest.fixture(scope="module")
def adata():
    return rich_adata()


@pytest.fixture(scope="module", params=list(VARIANTS))
def h5ad(request, adata, tmp_path_factory):
    p = tmp_path_factory.mktemp("h5ad") / f"{request.param}.h5ad"
    VARIANTS[request.param](adata, p)
    return p


@pytest.fixture(scope="module")
def oracle(h5ad):
    """What anndata itself reads from the file."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ad.read_h5ad(h5ad)


# ------------------------------------------------------------------------------------------------
# Reading through the hooks
# ------------------------------------------------------------------------------------------------
def read_block(path, key, start, stop):
    m = Z._src_matrix(str(path), key, start, stop)
    dtype = np.dtype(m["dtype"])
    return (m, np.frombuffer(m["indptr"], np.int64), np.frombuffer(m["indices"], np.uint32),
            np.frombuffer(m["data"], dtype))


def stored_block(path, key, start, stop):
    """Pointers (rebased), indices and data of a sparse group's rows/columns as h5py reads them."""
    with h5py.File(path, "r") as f:
        g = f[key]
        indptr = g["indptr"][start:stop + 1].astype(np.int64)
        lo, hi = int(indptr[0]), int(indptr[-1])
        return indptr - lo, g["indices"][lo:hi], g["data"][lo:hi]


def assert_block_is_stored(path, key, start, stop):
    _, indptr, indices, data = read_block(path, key, start, stop)
    want_ptr, want_idx, want_data = stored_block(path, key, start, stop)
    np.testing.assert_array_equal(indptr, want_ptr)
    np.testing.assert_array_equal(indices, want_idx.astype(np.int64))
    np.testing.assert_array_equal(data, want_data)
    assert data.dtype == want_data.dtype


def as_csr(indptr, indices, data, n_cols):
    return sp.csr_matrix((data, indices, indptr), shape=(len(indptr) - 1, n_cols))


def column(path, name, start=0, stop=-1):
    return Z._src_column(str(path), name, start, stop)


def column_info(path, name):
    return next(c for c in Z._src_info(str(path))["columns"] if c["name"] == name)


# ------------------------------------------------------------------------------------------------
# Matrices
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["X", "raw/X", "layers/counts"])
def test_csr_rows_are_the_stored_rows(h5ad, oracle, key):
    want = {"X": oracle.X, "raw/X": oracle.raw.X if oracle.raw else None,
            "layers/counts": oracle.layers["counts"]}[key]
    for start, stop in RANGES:
        assert_block_is_stored(h5ad, key, start, stop)
        m, indptr, indices, data = read_block(h5ad, key, start, stop)
        got = as_csr(indptr, indices, data, m["shape"][1])
        assert (got != want[start:stop]).nnz == 0, (key, start, stop)
    assert m["layout"] == "csr" and m["shape"] == want.shape and m["nnz"] == want.nnz
    assert m["dtype"] == want.dtype.str


def test_empty_rows_read_as_empty(h5ad):
    for r in EMPTY_ROWS:
        _, indptr, indices, data = read_block(h5ad, "X", r, r + 1)
        assert list(indptr) == [0, 0] and len(indices) == 0 and len(data) == 0


def test_csc_reads_columns(h5ad, oracle):
    want = oracle.layers["csc"].tocsc()
    for start, stop in [(0, 0), (0, 1), (3, 20), (N_VARS - 1, N_VARS), (0, N_VARS)]:
        assert_block_is_stored(h5ad, "layers/csc", start, stop)
        m, indptr, indices, data = read_block(h5ad, "layers/csc", start, stop)
        got = sp.csc_matrix((data, indices, indptr), shape=(N_OBS, stop - start))
        assert (got != want[:, start:stop]).nnz == 0
    assert m["layout"] == "csc" and m["shape"] == (N_OBS, N_VARS) and m["dtype"] == "<f8"
    with pytest.raises(ZbatchError) as e:  # columns are counted against n_vars, not n_obs
        Z._src_matrix(str(h5ad), "layers/csc", 0, N_VARS + 1)
    assert e.value.status == "ZB_E_RANGE"


def test_dense_comes_back_as_csr_without_zeros(h5ad, oracle):
    dense = np.asarray(oracle.layers["dense"])
    for start, stop in RANGES:
        m, indptr, indices, data = read_block(h5ad, "layers/dense", start, stop)
        want = sp.csr_matrix(dense[start:stop])  # drops 0 and -0.0, keeps NaN and inf
        np.testing.assert_array_equal(indptr, want.indptr)
        np.testing.assert_array_equal(indices, want.indices)
        np.testing.assert_array_equal(data, want.data)
    assert m["layout"] == "dense" and m["nnz"] == N_OBS * N_VARS and m["dtype"] == "<f4"
    _, _, indices, data = read_block(h5ad, "layers/dense", 0, 3)
    assert 0 not in indices[:1] and np.isnan(data).sum() == 1 and np.isinf(data).sum() == 1


def test_var_names_follow_the_matrix(h5ad, oracle):
    for key in ("X", "layers/counts", "layers/csc", "layers/dense"):
        assert Z._src_matrix(str(h5ad), key, 0, 0)["var_names"] == list(oracle.var_names)
    assert Z._src_matrix(str(h5ad), "raw/X", 0, 0)["var_names"] == list(oracle.raw.var_names)
    assert len(oracle.raw.var_names) == N_RAW_VARS != N_VARS


# ------------------------------------------------------------------------------------------------
# obs
# ------------------------------------------------------------------------------------------------
def test_obs_column_kinds(h5ad, oracle):
    info = Z._src_info(str(h5ad))
    assert info["format"] == "h5ad" and info["n_obs"] == N_OBS
    assert [c["name"] for c in info["columns"]] == list(oracle.obs.columns)
    kinds = {c["name"]: (c["kind"], c["dtype"]) for c in info["columns"]}
    assert kinds == {
        "cat": ("categorical", "|O"), "icat": ("categorical", "<i8"),
        "bcat": ("categorical", "|b1"), "fcat": ("categorical", "<f8"),
        "n_i8": ("numeric", "|i1"), "n_u16": ("numeric", "<u2"), "n_i32": ("numeric", "<i4"),
        "n_i64": ("numeric", "<i8"), "n_f32": ("numeric", "<f4"), "n_f64": ("numeric", "<f8"),
        "flag": ("numeric", "|b1"), "name": ("string", "|O"), "ni": ("nullable", "<i4"),
        "nb": ("nullable", "|b1"), "ns": ("nullable", "|O")}


@pytest.mark.parametrize("name", ["cat", "icat", "bcat", "fcat"])
def test_categoricals(h5ad, oracle, name):
    want = oracle.obs[name].cat
    c = column_info(h5ad, name)
    cats = want.categories.to_numpy()
    assert c["categories"] == [str(x) for x in cats]  # Python's str() of the numpy scalar
    assert c["ordered"] == want.ordered
    if name == "cat":
        assert c["category_values"] is None
    else:
        assert c["category_values"] == cats.astype(np.dtype(c["dtype"])).tobytes()
    codes = want.codes.to_numpy()
    assert (codes == -1).any() or name == "fcat"
    for start, stop in RANGES:
        got = column(h5ad, name, start, stop)
        assert got["strings"] is None and got["mask"] is None
        np.testing.assert_array_equal(np.frombuffer(got["values"], np.int32), codes[start:stop])


@pytest.mark.parametrize("name", ["n_i8", "n_u16", "n_i32", "n_i64", "n_f32", "n_f64", "flag"])
def test_numeric_columns(h5ad, oracle, name):
    want = oracle.obs[name].to_numpy()
    dtype = np.dtype(column_info(h5ad, name)["dtype"])
    assert dtype == want.dtype
    for start, stop in RANGES:
        got = column(h5ad, name, start, stop)
        assert got["strings"] is None and got["mask"] is None
        np.testing.assert_array_equal(np.frombuffer(got["values"], dtype), want[start:stop])


def test_string_column(h5ad, oracle):
    want = list(oracle.obs["name"])
    for start, stop in RANGES:
        got = column(h5ad, "name", start, stop)
        assert got["values"] is None and got["mask"] is None
        assert got["strings"] == want[start:stop]


@pytest.mark.parametrize("name", ["ni", "nb", "ns"])
def test_nullable_columns(h5ad, oracle, name):
    want = oracle.obs[name].array
    missing = want.isna()
    assert missing.any()
    for start, stop in RANGES:
        got = column(h5ad, name, start, stop)
        mask = np.frombuffer(got["mask"], np.uint8)
        np.testing.assert_array_equal(mask, missing[start:stop].astype(np.uint8))
        keep = ~missing[start:stop]
        if name == "ns":
            strings = np.array(got["strings"], dtype=object)
            assert list(strings[keep]) == list(want[start:stop][keep])
            assert set(strings[~keep]) <= {""}  # a missing string is empty
        else:
            dtype = want.dtype.numpy_dtype
            values = np.frombuffer(got["values"], dtype)
            np.testing.assert_array_equal(values[keep],
                                          want[start:stop][keep].to_numpy(dtype=dtype))


def test_masked_strings_read_empty(tmp_path, adata):
    """Whatever a nullable-string-array stores under its mask reads as an empty string."""
    p = write(adata, tmp_path / "a.h5ad")
    with h5py.File(p, "r+") as f:
        mask = f["obs/ns/mask"][:]
        values = f["obs/ns/values"][:]
        values[mask] = b"junk under the mask"
        f["obs/ns/values"][:] = values
    got = column(p, "ns")
    assert [s for s, m in zip(got["strings"], got["mask"]) if m] == [""] * int(mask.sum())
    assert [s for s, m in zip(got["strings"], got["mask"]) if not m] == \
        [v.decode() for v, m in zip(values, mask) if not m]


def test_obs_names(h5ad, oracle):
    for start, stop in RANGES:
        assert Z._src_obs_names(str(h5ad), start, stop) == list(oracle.obs_names[start:stop])


def test_rows_beyond_n_obs_are_refused(h5ad):
    for call in (lambda: column(h5ad, "n_i8", 0, N_OBS + 1),
                 lambda: Z._src_obs_names(str(h5ad), 3, 2),
                 lambda: Z._src_matrix(str(h5ad), "X", 0, N_OBS + 1)):
        with pytest.raises(ZbatchError) as e:
            call()
        assert e.value.status == "ZB_E_RANGE"


# ------------------------------------------------------------------------------------------------
# Index dtypes, unsorted rows, older layouts
# ------------------------------------------------------------------------------------------------
def small_csr(seed=1, n=60, m=300, density=0.1):
    return sp.random(n, m, density=density, format="csr", dtype=np.float32, random_state=seed)


@pytest.mark.parametrize("form", ["int64", "int32", "min-dtype"])
def test_pointer_and_index_dtypes(tmp_path, form):
    X = small_csr()
    if form == "int64":  # scipy keeps what it is given once set on the matrix
        X.indices, X.indptr = X.indices.astype(np.int64), X.indptr.astype(np.int64)
    a = ad.AnnData(X=X)
    with ad.settings.override(write_csr_csc_indices_with_min_possible_dtype=form == "min-dtype"):
        p = write(a, tmp_path / "a.h5ad", compression="gzip")
    with h5py.File(p) as f:
        stored = (f["X/indices"].dtype, f["X/indptr"].dtype)
    assert stored == {"int64": (np.int64, np.int64), "int32": (np.int32, np.int32),
                      "min-dtype": (np.uint16, np.int32)}[form]
    for start, stop in [(0, 60), (13, 14), (59, 60), (30, 30)]:
        assert_block_is_stored(p, "X", start, stop)
        _, indptr, indices, data = read_block(p, "X", start, stop)
        assert (as_csr(indptr, indices, data, 300) != X[start:stop]).nnz == 0


def test_unsorted_rows_keep_their_stored_order(tmp_path):
    X = small_csr(seed=2)
    rng = np.random.default_rng(2)
    for r in range(X.shape[0]):  # reverse-shuffle every row's entries
        lo, hi = X.indptr[r], X.indptr[r + 1]
        order = rng.permutation(hi - lo)
        X.indices[lo:hi], X.data[lo:hi] = X.indices[lo:hi][order], X.data[lo:hi][order]
    X.has_sorted_indices = False
    p = write(ad.AnnData(X=X), tmp_path / "a.h5ad")
    _, indptr, indices, data = read_block(p, "X", 0, 60)
    assert any((np.diff(indices[indptr[r]:indptr[r + 1]].astype(np.int64)) < 0).any()
               for r in range(60))
    np.testing.assert_array_equal(indices, X.indices)
    np.testing.assert_array_equal(data, X.data)


def test_h5sparse_form_before_anndata_07(tmp_path):
    """X as h5sparse wrote it (h5sparse_format / h5sparse_shape, no encoding-type); anndata 0.12
    still reads it."""
    X = small_csr(seed=3)
    p = write(ad.AnnData(X=X), tmp_path / "a.h5ad")
    with h5py.File(p, "r+") as f:
        g = f["X"]
        for k in ("encoding-type", "encoding-version", "shape"):
            del g.attrs[k]
        g.attrs["h5sparse_format"] = "csr"
        g.attrs["h5sparse_shape"] = X.shape
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = ad.read_h5ad(p).X
    assert (want != X).nnz == 0
    m, indptr, indices, data = read_block(p, "X", 0, 60)
    assert m["layout"] == "csr" and m["shape"] == X.shape
    assert (as_csr(indptr, indices, data, 300) != X).nnz == 0


def write_anndata_07(path, X, obs, var_names):
    """An .h5ad laid out the way anndata 0.7's writer did it: dataframe encoding-version 0.1.0,
    bare column datasets, a categorical as its codes with an object reference to
    __categories/NAME (which carries `ordered`), sparse parts with maxshape (None,)."""
    vlen = h5py.string_dtype("utf-8")
    with h5py.File(path, "w") as f:
        g = f.create_group("X")
        g.attrs.update({"encoding-type": "csr_matrix", "encoding-version": "0.1.0",
                        "shape": X.shape})
        for k in ("data", "indices", "indptr"):
            g.create_dataset(k, data=getattr(X, k), maxshape=(None,))

        def frame(name, index, columns):
            d = f.create_group(name)
            d.attrs.update({"encoding-type": "dataframe", "encoding-version": "0.1.0",
                            "_index": "_index", "column-order": list(columns)})
            d.create_dataset("_index", data=np.array(index, dtype=object), dtype=vlen)
            for key, s in columns.items():
                if isinstance(s.dtype, pd.CategoricalDtype):
                    cats = s.cat.categories.to_numpy()
                    d.create_dataset(f"__categories/{key}",
                                     data=cats.astype(vlen) if cats.dtype == object else cats)
                    d.create_dataset(key, data=s.cat.codes.to_numpy())
                    d[key].attrs["categories"] = d[f"__categories/{key}"].ref
                    d[f"__categories/{key}"].attrs["ordered"] = s.cat.ordered
                elif s.dtype == object:
                    d.create_dataset(key, data=s.to_numpy(), dtype=vlen)
                else:
                    d[key] = s.to_numpy()
        frame("obs", obs.index, {c: obs[c] for c in obs.columns})
        frame("var", var_names, {})


def test_anndata_07_layout(tmp_path):
    X = small_csr(seed=4, n=40, m=25)
    obs = pd.DataFrame({
        "cell_type": pd.Categorical(["a", "b", None, "c"] * 10),
        "cluster": pd.Categorical([7, 3, 5, 3] * 10, categories=[3, 5, 7], ordered=True),
        "depth": np.linspace(0, 1, 40), "ok": np.arange(40) % 3 == 0,
        "barcode": [f"bc{i}" for i in range(40)]}, index=[f"c{i}" for i in range(40)])
    p = tmp_path / "old.h5ad"
    write_anndata_07(p, X, obs, [f"g{i}" for i in range(25)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = ad.read_h5ad(p)  # anndata reads the 0.7 form: the oracle
    pd.testing.assert_frame_equal(want.obs, obs)

    info = Z._src_info(str(p))
    kinds = {c["name"]: (c["kind"], c["dtype"], c["categories"], c["ordered"])
             for c in info["columns"]}
    assert kinds == {"cell_type": ("categorical", "|O", ["a", "b", "c"], False),
                     "cluster": ("categorical", "<i8", ["3", "5", "7"], True),
                     "depth": ("numeric", "<f8", None, False),
                     "ok": ("numeric", "|b1", None, False),
                     "barcode": ("string", "|O", None, False)}
    for start, stop in [(0, 40), (2, 3), (39, 40), (10, 10)]:
        for name in ("cell_type", "cluster"):
            np.testing.assert_array_equal(
                np.frombuffer(column(p, name, start, stop)["values"], np.int32),
                want.obs[name].cat.codes.to_numpy()[start:stop])
        np.testing.assert_array_equal(np.frombuffer(column(p, "depth", start, stop)["values"]),
                                      obs["depth"].to_numpy()[start:stop])
        np.testing.assert_array_equal(
            np.frombuffer(column(p, "ok", start, stop)["values"], np.bool_),
            obs["ok"].to_numpy()[start:stop])
        assert column(p, "barcode", start, stop)["strings"] == list(obs["barcode"][start:stop])
        assert Z._src_obs_names(str(p), start, stop) == list(want.obs_names[start:stop])
    m, indptr, indices, data = read_block(p, "X", 0, 40)
    assert (as_csr(indptr, indices, data, 25) != want.X).nnz == 0
    assert m["var_names"] == list(want.var_names)


@pytest.mark.parametrize("filters", [{}, {"compression": "gzip", "shuffle": True}])
def test_big_endian_arrays(tmp_path, filters):
    """Arrays stored big-endian (h5py writes whatever byte order it is given) read as numbers."""
    X = small_csr(seed=12)
    p = write(ad.AnnData(X=X, obs=pd.DataFrame({"v": np.arange(60) * 1.5},
                                              index=[f"c{i}" for i in range(60)])),
              tmp_path / "a.h5ad")
    with h5py.File(p, "r+") as f:
        for key, dtype in (("X/data", ">f4"), ("X/indices", ">i4"), ("X/indptr", ">i8"),
                           ("obs/v", ">f8")):
            values, attrs = f[key][:], dict(f[key].attrs)
            del f[key]
            f.create_dataset(key, data=values.astype(dtype), chunks=(16,), **filters)
            f[key].attrs.update(attrs)
        assert f["X/data"].dtype == np.dtype(">f4")
    _, indptr, indices, data = read_block(p, "X", 0, 60)
    assert (as_csr(indptr, indices, data, 300) != X).nnz == 0
    assert column_info(p, "v")["dtype"] == "<f8"
    np.testing.assert_array_equal(np.frombuffer(column(p, "v", 7, 41)["values"]),
                                  np.arange(7, 41) * 1.5)


def test_chunks_never_written_read_as_the_fill_value(tmp_path):
    p = write(ad.AnnData(X=small_csr(seed=13)), tmp_path / "a.h5ad")
    with h5py.File(p, "r+") as f:
        d = f["obs"].create_dataset("filled", shape=(60,), dtype="i4", chunks=(10,),
                                    compression="gzip", fillvalue=-5)
        d[20:35] = np.arange(15)  # chunks 2 and 3 only
        d.attrs.update({"encoding-type": "array", "encoding-version": "0.2.0"})
        f["obs"].attrs["column-order"] = ["filled"]
        want = d[:]
    assert (want == -5).sum() == 45
    for start, stop in [(0, 60), (15, 38), (59, 60)]:
        np.testing.assert_array_equal(
            np.frombuffer(column(p, "filled", start, stop)["values"], np.int32), want[start:stop])


def test_fixed_length_byte_strings(tmp_path):
    """Fixed-length ASCII strings (h5py's 'S' dtype; pre-0.7 files and hand-written ones) read
    without their padding."""
    p = write(ad.AnnData(X=small_csr(n=4, m=3, density=0.5)), tmp_path / "a.h5ad")
    names = np.array([b"a", b"bb", b"", b"dddd"], dtype="S4")
    with h5py.File(p, "r+") as f:
        del f["obs/_index"]
        f["obs"].create_dataset("_index", data=names)
        f["obs"].create_dataset("tag", data=np.array([b"x", b"yy", b"zzz", b""], dtype="S3"))
        f["obs"].attrs["column-order"] = ["tag"]
    assert Z._src_obs_names(str(p), 0, 4) == ["a", "bb", "", "dddd"]
    assert column(p, "tag")["strings"] == ["x", "yy", "zzz", ""]


# ------------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------------
@pytest.fixture()
def plain(tmp_path):
    """An uncompressed file (with a copy of its X) to damage."""
    X = small_csr(seed=5)
    obs = pd.DataFrame({"cat": pd.Categorical(list("abc") * 20)},
                       index=[f"c{i}" for i in range(60)])
    return write(ad.AnnData(X=X, obs=obs), tmp_path / "plain.h5ad"), X


def expect_error(call, status, *needles):
    with pytest.raises(ZbatchError) as e:
        call()
    assert e.value.status == status, str(e.value)
    for n in needles:
        assert str(n) in str(e.value), (n, str(e.value))
    return str(e.value)


def test_index_beyond_n_vars(plain):
    p, X = plain
    row = 12
    with h5py.File(p, "r+") as f:
        f["X/indices"][X.indptr[row] + 1] = 300
    expect_error(lambda: Z._src_matrix(str(p), "X", 10, 20), "ZB_E_CORRUPT", p, "X/indices",
                 f"row {row}", "300")
    assert Z._src_matrix(str(p), "X", 13, 20)["nnz"] > 0  # rows after it still read


def test_negative_index(plain):
    p, X = plain
    with h5py.File(p, "r+") as f:
        f["X/indices"][X.indptr[3]] = -1
    expect_error(lambda: Z._src_matrix(str(p), "X", 0, 60), "ZB_E_CORRUPT", p, "X/indices", "-1")


def test_decreasing_indptr(plain):
    p, X = plain
    with h5py.File(p, "r+") as f:
        f["X/indptr"][20] = X.indptr[19] - 1
    expect_error(lambda: Z._src_matrix(str(p), "X", 15, 25), "ZB_E_CORRUPT", p, "X/indptr",
                 "position 20")


def test_indptr_beyond_nnz(plain):
    p, X = plain
    with h5py.File(p, "r+") as f:
        f["X/indptr"][30] = X.nnz + 7
    expect_error(lambda: Z._src_matrix(str(p), "X", 29, 31), "ZB_E_CORRUPT", p, "X/indptr",
                 "position 30", X.nnz + 7)


def test_indptr_not_ending_at_nnz(plain):
    p, X = plain
    with h5py.File(p, "r+") as f:
        f["X/indptr"][60] = X.nnz - 1
    expect_error(lambda: Z._src_matrix(str(p), "X", 0, 1), "ZB_E_CORRUPT", p, "X/indptr")


def test_index_beyond_32_bits(tmp_path):
    X = small_csr(seed=6)
    X.indices, X.indptr = X.indices.astype(np.int64), X.indptr.astype(np.int64)
    p = write(ad.AnnData(X=X), tmp_path / "a.h5ad")
    with h5py.File(p, "r+") as f:
        f["X/indices"][5] = 2**32 + 1  # would wrap to 1 if narrowed blindly
    expect_error(lambda: Z._src_matrix(str(p), "X", 0, 60), "ZB_E_CORRUPT", p, "X/indices",
                 2**32 + 1)


def test_code_beyond_categories(plain):
    p, _ = plain
    with h5py.File(p, "r+") as f:
        f["obs/cat/codes"][3] = 7
    expect_error(lambda: column(p, "cat", 0, 10), "ZB_E_CORRUPT", p, "obs/cat/codes", "row 3",
                 "code 7")
    np.testing.assert_array_equal(np.frombuffer(column(p, "cat", 4, 7)["values"], np.int32),
                                  [1, 2, 0])


def test_truncated_file(plain, tmp_path):
    p, _ = plain
    cut = tmp_path / "cut.h5ad"
    data = p.read_bytes()
    cut.write_bytes(data[:len(data) * 2 // 3])
    expect_error(lambda: Z._src_info(str(cut)), "ZB_E_CORRUPT", cut, "truncated")


@pytest.mark.parametrize("variant", ["gzip-shuffle-7", "gzip-fletcher32-13"])
def test_damaged_chunk(adata, tmp_path, variant, capfd):
    """A chunk of X/data with garbage in it: decoded by zbatch (deflate + shuffle) or by libhdf5
    (fletcher32), the error names the file and X/data, and libhdf5 prints nothing."""
    p = VARIANTS[variant](adata, tmp_path / "a.h5ad")
    with h5py.File(p, "r") as f:
        info = f["X/data"].id.get_chunk_info(2)
        first_row = int(np.searchsorted(f["X/indptr"][:], info.chunk_offset[0], side="right")) - 1
    with open(p, "r+b") as fh:
        fh.seek(info.byte_offset + info.size // 2 - 4)
        fh.write(b"\xde\xad\xbe\xef" * 2)
    capfd.readouterr()
    message = expect_error(lambda: Z._src_matrix(str(p), "X", 0, N_OBS), "ZB_E_CORRUPT", p,
                           "X/data")
    assert "HDF5-DIAG" not in capfd.readouterr().err
    # deflate + shuffle chunks are decoded by zbatch (outside the libhdf5 lock), the rest by
    # libhdf5 itself
    assert ("does not inflate" in message) == (variant == "gzip-shuffle-7"), message
    assert Z._src_matrix(str(p), "X", 0, max(first_row - 1, 0))["nnz"] >= 0


def test_missing_file_and_keys(plain, tmp_path):
    p, _ = plain
    expect_error(lambda: Z._src_info(str(tmp_path / "nope.h5ad")), "ZB_E_NOTFOUND", "nope.h5ad")
    expect_error(lambda: Z._src_matrix(str(p), "layers/nope", 0, 1), "ZB_E_NOTFOUND", p,
                 "layers/nope")
    expect_error(lambda: Z._src_matrix(str(p), "raw/X", 0, 1), "ZB_E_NOTFOUND", p, "raw/X")
    expect_error(lambda: Z._src_matrix(str(p), "obsm/X_pca", 0, 1), "ZB_E_INVALID", "obsm/X_pca")
    expect_error(lambda: column(p, "nope"), "ZB_E_NOTFOUND", "nope")


def test_unsupported_encodings(plain):
    p, _ = plain
    with h5py.File(p, "r+") as f:
        f["layers"].create_group("ragged").attrs.update(
            {"encoding-type": "awkward-array", "encoding-version": "0.1.0"})
    expect_error(lambda: Z._src_matrix(str(p), "layers/ragged", 0, 1), "ZB_E_UNSUPPORTED", p,
                 "layers/ragged", "awkward-array")
    with h5py.File(p, "r+") as f:
        g = f["obs"].create_group("odd")
        g.attrs.update({"encoding-type": "awkward-array", "encoding-version": "0.1.0"})
        f["obs"].attrs["column-order"] = ["cat", "odd"]
    # a column no reader here knows is left out, with its reason; the others are kept
    info = Z._src_info(str(p))
    assert [c["name"] for c in info["columns"]] == ["cat"]
    assert len(info["skipped"]) == 1 and info["skipped"][0].startswith("odd\t")
    assert "obs/odd" in info["skipped"][0] and "awkward-array" in info["skipped"][0]


def test_structured_obs_before_anndata_07(plain):
    p, _ = plain
    with h5py.File(p, "r+") as f:
        del f["obs"]
        f["obs"] = np.array([(b"c0", 1.0)] * 60, dtype=[("index", "S2"), ("n", "f8")])
    expect_error(lambda: Z._src_info(str(p)), "ZB_E_UNSUPPORTED", p, "obs", "0.7")


def test_not_hdf5(tmp_path):
    p = tmp_path / "a.h5ad"
    p.write_bytes(b"PK\x03\x04 not an hdf5 file" * 10)
    expect_error(lambda: Z._src_info(str(p)), "ZB_E_UNSUPPORTED", p)


# ------------------------------------------------------------------------------------------------
# Threads
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["plain", "gzip-shuffle-7", "gzip-fletcher32-13"])
def test_reads_from_many_threads_agree(tmp_path, variant):
    n, m = 3000, 400
    X = sp.random(n, m, density=0.05, format="csr", dtype=np.float32, random_state=11)
    a = ad.AnnData(X=X, obs=pd.DataFrame({"k": np.arange(n) % 7}, index=[f"c{i}" for i in
                                                                      range(n)]))
    p = VARIANTS[variant](a, tmp_path / "a.h5ad")
    ranges = [(s, min(s + 97, n)) for s in range(0, n, 97)] * 3
    random.Random(1).shuffle(ranges)

    def work(r):
        _, indptr, indices, data = read_block(p, "X", *r)
        return r, as_csr(indptr, indices, data, m)

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        for (start, stop), got in ex.map(work, ranges):
            assert (got != X[start:stop]).nnz == 0, (start, stop)
            assert got.nnz == X[start:stop].nnz
