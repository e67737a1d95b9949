"""AnnData fidelity (issue 19, deliverable 2): what an AnnData store holds, zbatch delivers.

- nullable integer / boolean / string columns with their masks: ``b["obs/x/mask"]`` (True =
  missing) beside the values; numpy batches give ``numpy.ma.MaskedArray`` values;
- string obs columns and ``obs_names`` per batch (``load_strings=True``), and ``ds.obs`` /
  ``ds.var`` as pandas DataFrames read on first use;
- categoricals whose categories are integers, floats or booleans: ``ds.categories`` answers
  with their type;
- ``layer="counts"`` / ``layer="raw"``: the matrix batches carry as X, which transforms and
  densify act on; layers loaded beside X come as matrices;
- a CSC X refused at open with the advice to run ``zbatch convert``.

Stores are written by anndata 0.12 (Zarr v2, v3 and sharded v3, CSR and dense X); the oracle is
anndata's own reading of the same store (``anndata.read_zarr``), never zbatch.
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

N_OBS, N_VARS = 131, 23


def make_adata(seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(N_OBS, N_VARS, density=0.3, format="csr", dtype=np.float32, random_state=rng)
    X.data[:] = rng.integers(1, 200, X.nnz) / 4
    counts = sp.random(N_OBS, N_VARS, density=0.3, format="csr", dtype=np.float32,
                       random_state=rng)
    counts.data[:] = rng.integers(1, 200, counts.nnz)
    na = rng.random(N_OBS) < 0.2
    ni = pd.array(rng.integers(-50, 50, N_OBS), dtype="Int32")
    ni[na] = pd.NA
    nb = pd.array(rng.random(N_OBS) < 0.5, dtype="boolean")
    nb[rng.random(N_OBS) < 0.3] = pd.NA
    ns = pd.array([f"donor{k}" for k in rng.integers(0, 9, N_OBS)], dtype="string")
    ns[rng.random(N_OBS) < 0.25] = pd.NA
    obs = pd.DataFrame({
        "n_int": ni,
        "n_bool": nb,
        "n_str": ns,
        "barcode": np.array([f"ACGT{i:05d}-{'x' * (i % 7)}" for i in range(N_OBS)], dtype=object),
        "leiden": pd.Categorical(rng.integers(0, 12, N_OBS)),
        "size_class": pd.Categorical(rng.choice([0.5, 1.5, 2.5], N_OBS)),
        "flagged": pd.Categorical(rng.random(N_OBS) < 0.4),
        "cell_type": pd.Categorical(rng.choice(["B", "T", "NK"], N_OBS)),
        "score": rng.standard_normal(N_OBS),
    }, index=[f"cell_{i}_é" for i in range(N_OBS)])
    var = pd.DataFrame({"symbol": [f"SYM{j}" for j in range(N_VARS)],
                        "highly_variable": rng.random(N_VARS) < 0.5,
                        "mean": rng.random(N_VARS)},
                       index=[f"ENSG{j:05d}" for j in range(N_VARS)])
    a = ad.AnnData(X=X, obs=obs, var=var, layers={"counts": counts})
    raw = ad.AnnData(X=sp.random(N_OBS, N_VARS + 4, density=0.2, format="csr", dtype=np.float32,
                                 random_state=rng),
                     var=pd.DataFrame(index=[f"RAW{j}" for j in range(N_VARS + 4)]))
    a.raw = raw
    return a


def write_store(path, a, *, zarr_format, shards=False, dense=False):
    """The AnnData element by element (AnnData.write_zarr would turn string columns into
    categoricals), under the settings that let anndata write nullable strings."""
    root = zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
    root.attrs.update({"encoding-type": "anndata", "encoding-version": "0.1.0"})
    with warnings.catch_warnings(), ad.settings.override(
            allow_write_nullable_strings=True, zarr_write_format=zarr_format,
            auto_shard_zarr_v3=shards):
        warnings.simplefilter("ignore")
        kw = {"chunks": (40,), "shards": (80,)} if shards else {}
        ad.io.write_elem(root, "X", a.X.toarray() if dense else a.X)
        ad.io.write_elem(root, "obs", a.obs, dataset_kwargs=kw)
        ad.io.write_elem(root, "var", a.var)
        ad.io.write_elem(root, "layers", dict(a.layers))
        ad.io.write_elem(root, "raw", a.raw)
        for name in ("obsm", "obsp", "varm", "varp", "uns"):
            ad.io.write_elem(root, name, {})
    zarr.consolidate_metadata(str(path))
    return str(path)


STORES = {"v2": dict(zarr_format=2), "v3": dict(zarr_format=3),
          "v3_sharded": dict(zarr_format=3, shards=True),
          "v3_dense": dict(zarr_format=3, dense=True)}


@pytest.fixture(scope="module")
def adata():
    return make_adata()


@pytest.fixture(scope="module")
def stores(adata, tmp_path_factory):
    base = tmp_path_factory.mktemp("fidelity")
    out = {}
    for name, kw in STORES.items():
        path = write_store(base / f"{name}.zarr", adata, **kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out[name] = (path, ad.read_zarr(path))
    return out


IDS = np.r_[np.random.default_rng(1).permutation(N_OBS)[:70], [5, 5, 0, N_OBS - 1]]


# ------------------------------------------------------------------------------------------------
# nullable columns
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(STORES))
def test_nullable_columns_keep_their_masks(stores, name):
    zb = zbatch_api()
    path, want = stores[name]
    ds = zb.open(path)
    assert ds.fields["obs/n_int"]["mask"] == "obs/n_int/mask"
    assert ds.fields["obs/n_int/mask"]["dtype"] == "bool"
    b = ds.read_many(IDS)
    for col in ("n_int", "n_bool"):
        w = want.obs[col].iloc[IDS]
        got = b[f"obs/{col}"]
        assert isinstance(got, np.ma.MaskedArray)
        assert got.dtype == w.dtype.numpy_dtype
        np.testing.assert_array_equal(got.mask, w.isna().to_numpy())
        np.testing.assert_array_equal(b[f"obs/{col}/mask"], w.isna().to_numpy())
        np.testing.assert_array_equal(got.compressed(), w.dropna().to_numpy())
    t = ds.read_many(IDS, output="torch")
    import torch
    assert t["obs/n_int"].dtype == torch.int32 and t["obs/n_int/mask"].dtype == torch.bool
    np.testing.assert_array_equal(t["obs/n_int/mask"].numpy(),
                                  want.obs["n_int"].iloc[IDS].isna().to_numpy())


# ------------------------------------------------------------------------------------------------
# strings, obs_names, ds.obs, ds.var
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(STORES))
def test_strings_per_batch_on_request(stores, name):
    zb = zbatch_api()
    path, want = stores[name]
    assert "obs_names" not in zb.open(path).fields     # only on request
    ds = zb.open(path, load_strings=True)
    assert ds.fields["obs_names"]["dtype"] == "string"
    assert ds.fields["obs/barcode"]["dtype"] == "string"
    assert ds.fields["obs/n_str"]["mask"] == "obs/n_str/mask"
    for output in ("numpy", "torch"):
        b = ds.read_many(IDS, output=output)
        assert list(b["obs_names"]) == list(want.obs_names[IDS])
        assert list(b["obs/barcode"]) == list(want.obs["barcode"].iloc[IDS])
        ns = want.obs["n_str"].iloc[IDS]
        got = b["obs/n_str"]
        mask = np.asarray(b["obs/n_str/mask"])
        np.testing.assert_array_equal(mask, ns.isna().to_numpy())
        assert [v for v, m in zip(got, mask) if not m] == list(ns.dropna())
    # the loader's batches (windows cut into views) carry them too
    dl = zb.DataLoader(ds, batch_size=16, shuffle=True, seed=3, prefetch_factor=3)
    for b in dl:
        ids = b["index"].astype(np.int64)
        assert list(b["obs_names"]) == list(want.obs_names[ids])
        assert list(b["obs/barcode"]) == list(want.obs["barcode"].iloc[ids])


@pytest.mark.parametrize("name", list(STORES))
def test_obs_and_var_frames_equal_anndatas(stores, name):
    zb = zbatch_api()
    path, want = stores[name]
    ds = zb.open(path)
    pd.testing.assert_frame_equal(ds.obs, want.obs)
    pd.testing.assert_frame_equal(ds.var, want.var)
    assert list(ds.var_names) == list(want.var_names)
    assert list(ds.obs_names) == list(want.obs_names)


# ------------------------------------------------------------------------------------------------
# categories of any dtype
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(STORES))
def test_categories_of_any_dtype(stores, name):
    zb = zbatch_api()
    path, want = stores[name]
    ds = zb.open(path)
    b = ds.read_many(IDS)
    for col in ("leiden", "size_class", "flagged", "cell_type"):
        cats = ds.categories(f"obs/{col}")
        wc = want.obs[col].cat.categories
        if col == "cell_type":
            assert cats == list(wc)
        else:
            assert isinstance(cats, np.ndarray) and cats.dtype == wc.dtype, col
            np.testing.assert_array_equal(cats, wc.to_numpy())
        np.testing.assert_array_equal(np.asarray(cats, dtype=object)[b[f"obs/{col}"]],
                                      want.obs[col].iloc[IDS].astype(object).to_numpy())


# ------------------------------------------------------------------------------------------------
# layers
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["v2", "v3_sharded"])
def test_layer_selects_the_matrix(stores, name):
    zb = zbatch_api()
    path, want = stores[name]
    ds = zb.open(path, layer="counts")
    b = ds.read_many(IDS)
    assert (b["X"] != want.layers["counts"][IDS]).nnz == 0
    # X-transforms and densify act on the layer
    dl = zb.DataLoader(ds, batch_size=32, prefetch_factor=2, transforms=["log1p", ("densify",)])
    for lb in dl:
        ids = lb["index"].astype(np.int64)
        np.testing.assert_allclose(lb["X_dense"], np.log1p(want.layers["counts"][ids].toarray()),
                                   rtol=1e-6)
    raw = zb.open(path, layer="raw")
    assert raw.n_vars == N_VARS + 4
    assert list(raw.var_names) == list(want.raw.var_names)
    assert (raw.read_many(IDS)["X"] != want.raw.X[IDS]).nnz == 0
    with expect_error("ZB_E_NOTFOUND", "nope"):
        zb.open(path, layer="nope")


def test_loaded_layers_are_matrices(stores):
    zb = zbatch_api()
    path, want = stores["v3"]
    b = zb.open(path, load_layers=True).read_many(IDS)
    assert isinstance(b["layers/counts"], sp.csr_matrix)
    assert (b["layers/counts"] != want.layers["counts"][IDS]).nnz == 0
    assert (b["X"] != want.X[IDS]).nnz == 0


# ------------------------------------------------------------------------------------------------
# CSC
# ------------------------------------------------------------------------------------------------
def test_csc_x_refused_with_convert_advice(tmp_path, adata):
    zb = zbatch_api()
    a = ad.AnnData(X=sp.csc_matrix(adata.X), obs=adata.obs[["cell_type", "score"]],
                   var=adata.var)
    path = tmp_path / "csc.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a.write_zarr(str(path))
    with expect_error("ZB_E_UNSUPPORTED", "CSC", "zbatch convert"):
        zb.open(path)
    # and the advice works: zbatch convert writes it as CSR, the same cells
    out = tmp_path / "csr.zarr"
    zb.convert([str(path)], str(out), shuffle=False, progress=False)
    ds = zb.open(out)
    b = ds.read_many(np.arange(N_OBS))
    assert (b["X"] != sp.csr_matrix(adata.X)).nnz == 0
