"""Collections (shared FORMATS §7): an annbatch pre-shuffled store, children dataset_0..dataset_11
(each a complete AnnData v3 group written by anndata 0.12 under annbatch's settings) behind one
global index space. Children are written in a scrambled order and have unequal sizes; the global
row space follows the numeric order of the names (dataset_10 after dataset_9). The oracle is the
concatenation of the in-memory AnnData objects in that order.
"""
from __future__ import annotations

import warnings

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import zarr

from conftest import expect_error, zbatch_api

SIZES = [7, 1, 13, 4, 9, 2, 11, 5, 8, 3, 10, 6]  # children 0..11
N_VARS = 30
CATS = ["alpha", "beta", "gamma", "delta"]
SRC = [f"file_{k}.h5ad" for k in range(len(SIZES))]
WRITE_ORDER = [10, 3, 11, 0, 7, 1, 9, 5, 2, 8, 4, 6]


def make_child(k, n, n_vars=N_VARS, cats=CATS):
    rng = np.random.default_rng(100 + k)
    X = sp.random(n, n_vars, density=0.25, format="csr", dtype=np.float32, random_state=rng)
    X.data[:] = rng.integers(1, 100, X.nnz).astype(np.float32)
    obs = pd.DataFrame(
        {"cell_type": pd.Categorical(rng.choice(cats, n), categories=cats),
         "src_path": pd.Categorical([SRC[k]] * n, categories=SRC),
         "total": rng.integers(0, 10**6, n).astype(np.int64),
         "qc": rng.standard_normal(n).astype(np.float32)},
        index=[f"d{k}_c{i}" for i in range(n)])
    var = pd.DataFrame(index=[f"gene_{j}" for j in range(n_vars)])
    return ad.AnnData(X=X, obs=obs, var=var)


def write_collection(path, children):
    """One zarr v3 store: the annbatch root attributes and dataset_k groups written by anndata
    with annbatch's write settings, then consolidated (FORMATS §7.1)."""
    root = zarr.open_group(str(path), mode="w", zarr_format=3)
    root.attrs.update({"encoding-type": "annbatch-preshuffled", "encoding-version": "0.1.0"})
    with warnings.catch_warnings(), ad.settings.override(
            zarr_write_format=3, auto_shard_zarr_v3=True,
            write_csr_csc_indices_with_min_possible_dtype=True):
        warnings.simplefilter("ignore")
        for k in WRITE_ORDER:
            if k < len(children):
                ad.io.write_elem(root, f"dataset_{k}", children[k])
    zarr.consolidate_metadata(str(path))
    return path


@pytest.fixture(scope="module")
def children():
    return [make_child(k, n) for k, n in enumerate(SIZES)]


@pytest.fixture(scope="module")
def collection(children, tmp_path_factory):
    return write_collection(tmp_path_factory.mktemp("coll") / "collection.zarr", children)


@pytest.fixture(scope="module")
def whole(children):
    return ad.concat(children, merge="same")


def starts():
    return np.concatenate([[0], np.cumsum(SIZES)])


def check(ds, b, whole, ids):
    ids = np.asarray(ids, dtype=np.int64)
    np.testing.assert_array_equal(b["index"], ids.astype(np.uint64))
    child = np.searchsorted(starts(), ids, side="right") - 1
    assert b["dataset"].dtype == np.int32
    np.testing.assert_array_equal(b["dataset"], child)
    want = whole.X[ids]
    assert b["X"].shape == want.shape
    np.testing.assert_array_equal(b["X"].indptr, want.indptr)
    np.testing.assert_array_equal(b["X"].indices, want.indices)
    np.testing.assert_array_equal(b["X"].data, want.data)
    obs = whole.obs.iloc[ids]
    for col in ("cell_type", "src_path"):
        labels = np.array(ds.categories(f"obs/{col}"), dtype=object)
        np.testing.assert_array_equal(labels[b[f"obs/{col}"].astype(np.int64)],
                                      obs[col].astype(str).to_numpy())
    np.testing.assert_array_equal(np.array(ds.categories("obs/src_path"))[b["obs/src_path"]],
                                  np.array(SRC)[child])
    for col in ("total", "qc"):
        assert b[f"obs/{col}"].dtype == obs[col].dtype
        np.testing.assert_array_equal(b[f"obs/{col}"], obs[col].to_numpy())


def test_collection_opens(collection):
    zb = zbatch_api()
    ds = zb.open(collection)
    assert ds.layout == "collection"
    assert ds.num_children == len(SIZES)
    assert len(ds) == sum(SIZES)
    assert ds.n_vars == N_VARS
    assert set(ds.fields) == {"X/data", "X/indices", "obs/cell_type", "obs/src_path",
                              "obs/total", "obs/qc"}
    assert ds.categories("obs/cell_type") == CATS
    assert ds.categories("obs/src_path") == SRC


def test_batches_span_children(collection, whole):
    zb = zbatch_api()
    ds = zb.open(collection)
    s = starts()
    total = int(s[-1])
    boundary = sorted({int(x) for b in s[1:-1] for x in (b - 1, b)})
    rng = np.random.default_rng(5)
    for ids in (boundary,                               # both sides of every boundary
                boundary[::-1],
                [total - 1, 0, 7, 7, 8, 6, 7],          # duplicates around dataset_1 (one row)
                rng.permutation(total),                 # everything, shuffled
                np.arange(total),
                [int(s[10]), int(s[9]), int(s[11])],    # dataset_10 after dataset_9
                [int(s[1])],                            # the one-row child
                []):
        check(ds, ds.read_many(ids), whole, ids)


def test_collection_threads_and_cache(collection, whole):
    zb = zbatch_api()
    ids = np.random.default_rng(9).integers(0, sum(SIZES), 50)
    one = zb.open(collection).read_many(ids)
    ds = zb.open(collection, num_threads=2, cache_bytes=8 << 20)
    two = ds.read_many(ids)
    again = ds.read_many(ids)
    for b in (two, again):
        check(ds, b, whole, ids)
        for k in ("obs/cell_type", "obs/total", "obs/qc", "dataset", "index"):
            np.testing.assert_array_equal(b[k], one[k])
        assert (b["X"] != one["X"]).nnz == 0
    assert again.stats["chunks_decoded"] == 0
    assert again.stats["chunks_cached"] == two.stats["chunks_decoded"] > 0


def test_out_of_range(collection):
    zb = zbatch_api()
    ds = zb.open(collection)
    with expect_error("ZB_E_RANGE", str(sum(SIZES))):
        ds.read_many([0, sum(SIZES)])


def test_children_with_different_n_vars_are_rejected(tmp_path):
    zb = zbatch_api()
    kids = [make_child(k, n) for k, n in enumerate(SIZES[:4])]
    kids[2] = make_child(2, SIZES[2], n_vars=N_VARS + 1)
    path = write_collection(tmp_path / "bad.zarr", kids)
    with expect_error("ZB_E_CORRUPT", "dataset_2"):
        zb.open(path)


def test_children_with_different_categories(tmp_path):
    """Codes only mean something with their own table: children whose tables differ (here in
    order) get one table, the sorted union anndata.concat builds, and their codes are remapped
    to it, so every batch's codes point at the right labels (test_collection_safety.py has the
    rest)."""
    zb = zbatch_api()
    kids = [make_child(k, n) for k, n in enumerate(SIZES[:3])]
    kids[1] = make_child(1, SIZES[1], cats=CATS[::-1])
    path = write_collection(tmp_path / "cats.zarr", kids)
    ds = zb.open(path)
    assert ds.categories("obs/cell_type") == sorted(CATS)
    assert ds.categories("obs/src_path") == SRC
    whole = ad.concat(kids, merge="same")
    ids = np.arange(sum(SIZES[:3]))[::-1]
    b = ds.read_many(ids)
    check(ds, b, whole, ids)
    np.testing.assert_array_equal(b["dataset"], np.searchsorted(starts()[:4], ids, "right") - 1)
