"""zbatch.open + Dataset.read_many on anndata stores (DESIGN §2, shared FORMATS §6).

The stores are written by anndata 0.12 itself (``AnnData.write_zarr`` in Zarr v2, v3 and v3 with
``auto_shard_zarr_v3``, and ``anndata.io.write_elem`` with explicit chunk and shard shapes), and
by zbatch's own ``write_anndata``. The oracle is the in-memory AnnData: ``adata.X[ids]`` (scipy)
and ``adata.obs.iloc[ids]`` / ``adata.obsm[...][ids]`` (numpy/pandas), never zbatch.
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

N_OBS, N_VARS = 157, 41
CATS = ["B cell", "T cell", "NK", "monocyte", "dendritic"]


def make_adata(seed=0, n_obs=N_OBS, n_vars=N_VARS):
    rng = np.random.default_rng(seed)
    X = sp.random(n_obs, n_vars, density=0.2, format="csr", dtype=np.float32, random_state=rng)
    X.data[:] = rng.integers(1, 1000, X.nnz).astype(np.float32) / 8  # exact, never zero
    X = X.tolil()
    X[[3, 50, n_obs - 1], :] = 0  # empty rows, the last one included
    X = X.tocsr()
    X.eliminate_zeros()
    X.sort_indices()
    obs = pd.DataFrame(
        {
            "cell_type": pd.Categorical.from_codes((np.arange(n_obs) * 7 + 3) % len(CATS), CATS),
            "n_genes": np.diff(X.indptr).astype(np.int64) + 1,
            "score": rng.standard_normal(n_obs),
            "is_doublet": np.arange(n_obs) % 3 == 0,
            "batch": pd.Categorical(rng.choice(["b1", "b2"], n_obs)),
        },
        index=[f"cell_{i}" for i in range(n_obs)],
    )
    var = pd.DataFrame(index=[f"gene_{j}" for j in range(n_vars)])
    obsm = {"X_pca": rng.standard_normal((n_obs, 5)).astype(np.float32),
            "X_umap": rng.standard_normal((n_obs, 2))}
    return ad.AnnData(X=X, obs=obs, var=var, obsm=obsm)


def write_elems(path, adata, *, zarr_format, dense=False, x_chunks=None, x_shards=None,
                obs_chunks=None, obs_shards=None, obsm_chunks=None):
    """An anndata store written element by element through anndata.io.write_elem, with the chunk
    (and shard) shapes given (anndata's write_zarr only lets dense X be chunked)."""
    root = zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
    root.attrs.update({"encoding-type": "anndata", "encoding-version": "0.1.0"})

    def kw(chunks, shards):
        out = {}
        if chunks is not None:
            out["chunks"] = chunks
        if shards is not None:
            out["shards"] = shards
        return out

    X = adata.X.toarray() if dense else adata.X
    ad.io.write_elem(root, "X", X, dataset_kwargs=kw(x_chunks, x_shards))
    ad.io.write_elem(root, "obs", adata.obs, dataset_kwargs=kw(obs_chunks, obs_shards))
    ad.io.write_elem(root, "var", adata.var)
    ad.io.write_elem(root, "obsm", {})
    for name, arr in adata.obsm.items():
        ad.io.write_elem(root["obsm"], name, arr,
                         dataset_kwargs=kw(None if obsm_chunks is None
                                           else (obsm_chunks, arr.shape[1]), None))
    for name in ("layers", "obsp", "varm", "varp", "uns"):
        ad.io.write_elem(root, name, {})
    zarr.consolidate_metadata(str(path))
    return path


def write_zbatch(path, adata):
    from zbatch._write_anndata import write_anndata
    write_anndata(str(path), adata.X, obs=adata.obs, var=adata.var, chunk_size=64,
                  shard_size=256)
    return path


# name -> (writer, has obsm, dense X)
def _writers():
    def wz(fmt, shard=False, min_dtype=False):
        def w(path, adata):
            with ad.settings.override(zarr_write_format=fmt, auto_shard_zarr_v3=shard,
                                      write_csr_csc_indices_with_min_possible_dtype=min_dtype):
                adata.copy().write_zarr(str(path))
            return path
        return w

    def we(**kw):
        return lambda path, adata: write_elems(path, adata, **kw)

    return {
        "write_zarr_v2": (wz(2), True, False),
        "write_zarr_v3": (wz(3), True, False),
        "write_zarr_v3_autoshard": (wz(3, shard=True), True, False),
        "write_zarr_v3_min_indices": (wz(3, min_dtype=True), True, False),
        "elems_v2_csr": (we(zarr_format=2, x_chunks=(97,), obs_chunks=(40,), obsm_chunks=33),
                         True, False),
        "elems_v3_csr_sharded": (we(zarr_format=3, x_chunks=(64,), x_shards=(256,),
                                    obs_chunks=(16,), obs_shards=(64,), obsm_chunks=50),
                                 True, False),
        "elems_v2_dense_colchunks": (we(zarr_format=2, dense=True, x_chunks=(37, 16),
                                        obs_chunks=(40,)), True, True),
        "elems_v3_dense_sharded": (we(zarr_format=3, dense=True, x_chunks=(20, 16),
                                      x_shards=(40, 48)), True, True),
        "elems_v3_dense_shard_cols": (we(zarr_format=3, dense=True, x_chunks=(20, 10),
                                         x_shards=(40, 20)), True, True),
        "zbatch_write_anndata": (write_zbatch, False, False),
    }


WRITERS = _writers()


@pytest.fixture(scope="module")
def adata():
    return make_adata()


@pytest.fixture(scope="module")
def stores(adata, tmp_path_factory):
    base = tmp_path_factory.mktemp("anndata_stores")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {name: (w(base / f"{name}.zarr", adata), obsm, dense)
                for name, (w, obsm, dense) in WRITERS.items()}


def id_lists(n):
    rng = np.random.default_rng(42)
    return {
        "sorted": np.sort(rng.choice(n, 40, replace=False)),
        "shuffled": rng.permutation(n)[:60],
        "duplicates": np.array([5, 3, 5, 5, n - 1, 0, 3, 50, 50, 4]),
        "single": np.array([77]),
        "all": np.arange(n),
        "all_reversed": np.arange(n)[::-1].copy(),
        "empty": np.array([], dtype=np.int64),
    }


def assert_csr_equal(got, want):
    assert isinstance(got, sp.csr_matrix) or isinstance(got, sp.csr_array)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.indptr, want.indptr)
    np.testing.assert_array_equal(got.indices, want.indices)
    assert got.data.dtype == want.data.dtype
    np.testing.assert_array_equal(got.data, want.data)


def check_batch(ds, b, adata, ids, *, has_obsm, dense):
    ids = np.asarray(ids, dtype=np.int64)
    np.testing.assert_array_equal(b["index"], ids.astype(np.uint64))
    want_x = adata.X[ids]
    if dense:
        assert isinstance(b["X"], np.ndarray)
        assert b["X"].shape == (len(ids), N_VARS)
        assert b["X"].dtype == np.float32
        np.testing.assert_array_equal(b["X"], want_x.toarray())
    else:
        assert_csr_equal(b["X"], want_x)
        assert (b["X"] != want_x).nnz == 0
    obs = adata.obs.iloc[ids]
    for col in ("cell_type", "batch"):
        codes = b[f"obs/{col}"]
        assert codes.shape == (len(ids),)
        np.testing.assert_array_equal(codes, obs[col].cat.codes.to_numpy())
        labels = np.array(ds.categories(f"obs/{col}"), dtype=object)
        assert list(labels) == list(adata.obs[col].cat.categories)
        np.testing.assert_array_equal(labels[codes.astype(np.int64)],
                                      obs[col].astype(str).to_numpy())
    for col in ("n_genes", "score", "is_doublet"):
        got, want = b[f"obs/{col}"], obs[col].to_numpy()
        assert got.dtype == want.dtype, col
        np.testing.assert_array_equal(got, want)
    if has_obsm:
        for name, arr in adata.obsm.items():
            got = b[f"obsm/{name}"]
            assert got.dtype == arr.dtype and got.shape == (len(ids), arr.shape[1])
            np.testing.assert_array_equal(got, arr[ids])


@pytest.mark.parametrize("name", list(WRITERS))
def test_read_many_matches_adata(stores, adata, name):
    zb = zbatch_api()
    path, has_obsm, dense = stores[name]
    ds = zb.open(path)
    assert ds.layout == "anndata"
    assert len(ds) == N_OBS
    assert ds.n_vars == N_VARS
    want_fields = {"obs/cell_type", "obs/n_genes", "obs/score", "obs/is_doublet", "obs/batch"}
    want_fields |= {"X"} if dense else {"X/data", "X/indices"}
    if has_obsm:
        want_fields |= {"obsm/X_pca", "obsm/X_umap"}
    assert set(ds.fields) == want_fields
    assert ds.fields["obs/cell_type"]["categorical"] and not ds.fields["obs/score"]["categorical"]
    for label, ids in id_lists(N_OBS).items():
        b = ds.read_many(ids)
        check_batch(ds, b, adata, ids, has_obsm=has_obsm, dense=dense)
        assert b.size == len(ids), label


def test_dense_column_chunks_read_whole_rows_from_the_cache(stores, adata):
    """Dense X in chunks of 16 of its 41 columns (the third cut at 9): units served one by one
    (first read: 64-byte row parts are not decoded side by side, ZIP_FETCH_BYTES), then every
    unit of a row pinned in the cache and each row landed whole; equal to the AnnData."""
    zb = zbatch_api()
    path, has_obsm, dense = stores["elems_v2_dense_colchunks"]
    assert zarr.open_array(str(path / "X"), mode="r").chunks == (37, 16)
    ds = zb.open(path, cache_bytes=64 << 20, num_threads=2)
    for label, ids in id_lists(N_OBS).items():
        for _ in range(2):
            b = ds.read_many(ids)
            check_batch(ds, b, adata, ids, has_obsm=has_obsm, dense=dense)
        assert b.stats["chunks_decoded"] == 0, label
        assert b.stats["chunks_cached"] >= 3 * (len(ids) > 0), label


def test_stores_give_identical_batches(stores, adata):
    """Dense, CSR, v2, v3 and sharded v3 stores of the same data give the same batch."""
    zb = zbatch_api()
    ids = np.array([150, 2, 2, 77, 3, 0, 156, 99, 98, 97, 50])
    ref = None
    for name, (path, has_obsm, dense) in stores.items():
        b = zb.open(path).read_many(ids)
        X = b["X"] if dense else b["X"].toarray()
        cols = {k: np.asarray(b[k]) for k in b if k.startswith("obs/")}
        if has_obsm:
            cols.update({k: np.asarray(b[k]) for k in b if k.startswith("obsm/")})
        if ref is None:
            ref = (X, cols)
            continue
        np.testing.assert_array_equal(X, ref[0], err_msg=name)
        for k, v in cols.items():
            assert v.dtype == ref[1][k].dtype, (name, k)
            np.testing.assert_array_equal(v, ref[1][k], err_msg=f"{name}: {k}")
    np.testing.assert_array_equal(ref[0], adata.X[ids].toarray())


@pytest.mark.parametrize("name", ["write_zarr_v2", "elems_v3_csr_sharded",
                                  "write_zarr_v3_min_indices"])
def test_torch_output(stores, adata, name):
    import torch
    zb = zbatch_api()
    path, _obsm, _dense = stores[name]
    ds = zb.open(path)
    ids = np.array([10, 3, 150, 10, 0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: "sparse CSR support is in beta"
        t = ds.read_many(ids, output="torch")
    s = ds.read_many(ids, output="scipy")
    X = t["X"]
    assert isinstance(X, torch.Tensor) and X.layout == torch.sparse_csr
    assert tuple(X.shape) == (len(ids), N_VARS)
    np.testing.assert_array_equal(X.crow_indices().numpy(), s["X"].indptr)
    np.testing.assert_array_equal(X.col_indices().numpy(), s["X"].indices)
    np.testing.assert_array_equal(X.values().numpy(), s["X"].data)
    np.testing.assert_array_equal(X.to_dense().numpy(), adata.X[ids].toarray())
    assert isinstance(t["obs/score"], torch.Tensor)
    np.testing.assert_array_equal(t["obs/score"].numpy(), adata.obs["score"].to_numpy()[ids])
    np.testing.assert_array_equal(t["obs/cell_type"].numpy(),
                                  adata.obs["cell_type"].cat.codes.to_numpy()[ids])
    np.testing.assert_array_equal(t["index"].numpy(), ids)
    # the empty request in torch too
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        e = ds.read_many([], output="torch")
    assert tuple(e["X"].shape) == (0, N_VARS) and e["X"]._nnz() == 0


def test_dense_torch_output(stores, adata):
    import torch
    zb = zbatch_api()
    path, _obsm, dense = stores["elems_v3_dense_sharded"]
    assert dense
    t = zb.open(path).read_many([4, 1, 4], output="torch")
    assert isinstance(t["X"], torch.Tensor) and t["X"].layout == torch.strided
    np.testing.assert_array_equal(t["X"].numpy(), adata.X[[4, 1, 4]].toarray())


@pytest.mark.parametrize("name", ["write_zarr_v2", "elems_v3_csr_sharded",
                                  "elems_v2_dense_colchunks"])
def test_out_of_range_ids(stores, name):
    zb = zbatch_api()
    ds = zb.open(stores[name][0])
    with expect_error("ZB_E_RANGE", str(N_OBS)):
        ds.read_many([0, N_OBS, 1])
    with expect_error("ZB_E_RANGE", "1000000"):
        ds.read_many([1000000])
    with expect_error("ZB_E_RANGE", "-3"):
        ds.read_many([1, -3])
    # the dataset still serves after the errors
    assert ds.read_many([N_OBS - 1]).size == 1


def test_non_integer_ids_refused(stores):
    zb = zbatch_api()
    ds = zb.open(stores["write_zarr_v3"][0])
    with expect_error("ZB_E_RANGE"):
        ds.read_many([1.5, 2.0])
    with pytest.raises(ValueError):
        ds.read_many([1], output="pandas")


def test_csc_x_is_unsupported(tmp_path, adata):
    zb = zbatch_api()
    a = adata.copy()
    a.X = sp.csc_matrix(a.X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a.write_zarr(str(tmp_path / "csc.zarr"))
    with expect_error("ZB_E_UNSUPPORTED", "CSC"):
        zb.open(tmp_path / "csc.zarr")


def test_indptr_not_ending_at_nnz_is_corrupt(tmp_path, adata):
    """FORMATS §6: indptr must end at len(data); a store that disagrees is refused on open."""
    zb = zbatch_api()
    path = tmp_path / "bad.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with ad.settings.override(zarr_write_format=3):
            adata.copy().write_zarr(str(path))
    g = zarr.open_group(str(path), mode="r+")
    indptr = g["X/indptr"][:]
    indptr[-1] -= 1
    g["X/indptr"][:] = indptr
    with expect_error("ZB_E_CORRUPT", "X/indptr"):
        zb.open(path)
