"""zbatch.anndata.Loader against annbatch 0.3.1's Loader (issue 19, item 3).

annbatch runs in its own environment (.venv-annbatch) through tests/python/annbatch_bridge.py
(``run_loader``: every batch its Loader yields, in yield order). The facade, given the same
store and the same arguments (and the same seed for its numpy Generator), must yield the same
batches in the same order: X values and types, obs frames (categoricals kept), index, sizes.
"""
from __future__ import annotations

import textwrap
import warnings

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import zarr

import annbatch_bridge as bridge
import zbatch
import zbatch.anndata
from zbatch.anndata import Loader

GENES = [f"g{j:02d}" for j in range(30)]
# (rows, cell-type table): the tables differ between stores
FILES = [(230, ["T", "B", "NK"]), (170, ["NK", "mono"]), (201, ["B", "T", "DC"])]


def make_adata(k, n, cats, genes=GENES, dense=False):
    rng = np.random.default_rng(40 + k)
    X = sp.random(n, len(genes), density=0.25, format="csr", dtype=np.float32, random_state=rng)
    X.data[:] = rng.integers(1, 40, X.nnz)
    count = pd.array(rng.integers(0, 300, n), dtype="Int64")
    count[rng.random(n) < 0.1] = pd.NA
    obs = pd.DataFrame({
        "cell_type": pd.Categorical(rng.choice(cats, n), categories=cats),
        "batch": pd.Categorical(rng.choice(["b1", "b2"], n), categories=["b1", "b2"]),
        "count": count,
        "score": rng.standard_normal(n).astype(np.float32),
    }, index=[f"s{k}_c{i:04d}" for i in range(n)])
    a = ad.AnnData(X=X.toarray() if dense else X, obs=obs, var=pd.DataFrame(index=genes))
    a.layers["counts"] = X.copy()
    return a


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("anndata_loader")
    stores, h5ads = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k, (n, cats) in enumerate(FILES):
            a = make_adata(k, n, cats)
            a.write_zarr(d / f"s{k}.zarr")
            a.write_h5ad(d / f"s{k}.h5ad")
            stores.append(str(d / f"s{k}.zarr"))
            h5ads.append(str(d / f"s{k}.h5ad"))
        make_adata(0, *FILES[0], dense=True).write_zarr(d / "dense.zarr")
        make_adata(5, 60, ["T"], genes=[f"h{j:02d}" for j in range(30)]).write_zarr(d / "other.zarr")
    coll = d / "collection.zarr"
    bridge.write_collection(coll, h5ads, dataset_size=250, shuffle_chunk_size=20, seed=5)
    zarr.open_group(str(d / "plain.zarr"), mode="w").create_array("x", shape=(4,), dtype="f4")
    return {"dir": d, "stores": stores, "h5ads": h5ads, "collection": str(coll),
            "dense": str(d / "dense.zarr"), "other": str(d / "other.zarr"),
            "plain": str(d / "plain.zarr")}


def facade_pass(loader):
    """One pass of the facade, in annbatch_bridge.Batches' shape."""
    xs, obs, index, sizes, types = [], [], [], [], []
    for b in loader:
        assert set(b) == {"X", "obs", "var", "index"}
        xs.append(b["X"])
        types.append(type(b["X"]).__name__)
        sizes.append(b["X"].shape[0])
        if b["obs"] is not None:
            obs.append(b["obs"])
        if b["index"] is not None:
            index.append(b["index"])
    X = sp.vstack(xs, format="csr") if sp.issparse(xs[0]) else \
        np.concatenate(xs) if isinstance(xs[0], np.ndarray) else None   # (torch: None)
    return X, obs, (np.concatenate(index) if index else None), sizes, types, xs


def assert_x_equal(mine, theirs):
    if sp.issparse(theirs):
        assert sp.issparse(mine)
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
        assert (mine != theirs).nnz == 0
    else:
        assert isinstance(mine, np.ndarray) and mine.dtype == theirs.dtype
        np.testing.assert_array_equal(mine, theirs)


def assert_obs_equal(mine: pd.DataFrame, theirs: pd.DataFrame, exact_dtypes=True):
    assert list(mine.columns) == list(theirs.columns)
    assert list(mine.index) == list(theirs.index)
    for c in theirs.columns:
        a, b = mine[c], theirs[c]
        if exact_dtypes:
            assert str(a.dtype) == str(b.dtype), c
        if isinstance(b.dtype, pd.CategoricalDtype):
            assert list(a.cat.categories) == list(b.cat.categories), c
            np.testing.assert_array_equal(a.cat.codes.to_numpy(), b.cat.codes.to_numpy())
        else:
            assert [None if pd.isna(v) else v for v in a.astype(object)] == \
                   [None if pd.isna(v) else v for v in b.astype(object)], c


ARGS = dict(chunk_size=16, preload_nchunks=4, batch_size=8)


@pytest.mark.parametrize("shuffle", [False, True])
def test_collection_same_batches_as_annbatch(data, shuffle):
    """use_collection on an annbatch-written collection: the same batches, in the same order,
    for two passes (the generator carries on between passes in both)."""
    kw = dict(ARGS, shuffle=shuffle, return_index=True)
    theirs = bridge.run_loader({"collection": data["collection"]}, epochs=2, seed=11, **kw)
    loader = Loader(**kw, rng=np.random.default_rng(11)).use_collection(
        zbatch.anndata.DatasetCollection(data["collection"]))
    assert len(loader) == theirs[0].n_batches == -(-sum(n for n, _ in FILES) // 8)
    assert list(loader.var.index) == list(theirs[0].var_names)
    for epoch in theirs:
        X, obs, index, sizes, types, _ = facade_pass(loader)
        assert sizes == epoch.batch_sizes and types == epoch.x_types
        assert_x_equal(X, epoch.X)
        np.testing.assert_array_equal(index, epoch.index)
        assert_obs_equal(pd.concat(obs), epoch.obs)
        assert all(isinstance(o["cell_type"].dtype, pd.CategoricalDtype) for o in obs)
    if shuffle:
        assert not np.array_equal(theirs[0].index, theirs[1].index)
        assert not np.array_equal(theirs[0].index, np.sort(theirs[0].index))


def test_collection_custom_load_adata(data):
    """use_collection(load_adata=...) as annbatch's README writes it: the columns it keeps,
    the matrix it points at (layers/counts here, X in the collection: equal values)."""
    def load_adata(g):
        return ad.AnnData(X=ad.io.sparse_dataset(g["X"]),
                          obs=ad.io.read_elem(g["obs"])[["cell_type", "count"]],
                          var=ad.io.read_elem(g["var"]))
    kw = dict(ARGS, shuffle=True, return_index=True)
    [theirs] = bridge.run_loader({"collection": data["collection"],
                                  "obs_columns": ["cell_type", "count"]}, seed=3, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = Loader(**kw, rng=np.random.default_rng(3)).use_collection(
            data["collection"], load_adata=load_adata)
        X, obs, index, sizes, _, _ = facade_pass(loader)
    assert sizes == theirs.batch_sizes
    assert_x_equal(X, theirs.X)
    np.testing.assert_array_equal(index, theirs.index)
    assert_obs_equal(pd.concat(obs), theirs.obs)
    assert list(theirs.obs.columns) == ["cell_type", "count"]


def backed(path, cols=None, matrix="X"):
    g = zarr.open_group(path, mode="r")
    obs = ad.io.read_elem(g["obs"])
    x = g[matrix]
    X = ad.io.sparse_dataset(x) if x.attrs.get("encoding-type") == "csr_matrix" else x
    return ad.AnnData(X=X, obs=obs if cols is None else obs[cols], var=ad.io.read_elem(g["var"]))


@pytest.mark.parametrize("shuffle", [False, True])
def test_adatas_same_batches_as_annbatch(data, shuffle):
    """add_adatas over three stores whose cell-type tables differ. annbatch concatenates each
    load's obs with pandas, so a load spanning stores gets an object column; the facade keeps
    pd.Categorical over the union table. The labels are the same."""
    kw = dict(ARGS, shuffle=shuffle, return_index=True)
    [theirs] = bridge.run_loader({"adatas": data["stores"]}, seed=7, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = Loader(**kw, rng=np.random.default_rng(7)).add_adatas(
            [backed(p) for p in data["stores"]])
    X, obs, index, sizes, _, xs = facade_pass(loader)
    assert sizes == theirs.batch_sizes
    assert_x_equal(X, theirs.X)
    np.testing.assert_array_equal(index, theirs.index)
    mine = pd.concat(obs)
    for o in obs:
        assert list(o["cell_type"].cat.categories) == ["B", "DC", "NK", "T", "mono"]
    # annbatch: a load spanning stores gets plain strings ("str" under pandas 3)
    assert {d["cell_type"] for d in theirs.obs_dtypes} - {"category"}
    assert list(mine["cell_type"].astype(str)) == list(theirs.obs["cell_type"].astype(str))
    assert_obs_equal(mine.drop(columns="cell_type"), theirs.obs.drop(columns="cell_type"))
    # every row's values equal anndata's reading of its store
    ref = ad.concat([ad.read_zarr(p) for p in data["stores"]])
    np.testing.assert_array_equal(X.toarray(), ref.X[index].toarray())


def test_add_inputs_of_every_kind(data):
    """Paths, zarr groups, backed AnnData (sparse_dataset, layers/counts), read_elem_lazy
    AnnData and a dense zarr.Array: the same batches as annbatch over backed AnnData."""
    kw = dict(ARGS, shuffle=True, return_index=True)
    s0, s1, s2 = data["stores"]
    [theirs] = bridge.run_loader({"adatas": data["stores"]}, seed=2, **kw)
    g1 = zarr.open_group(s1, mode="r")
    g2 = zarr.open_group(s2, mode="r")
    lazy = ad.AnnData(X=ad.experimental.read_elem_lazy(g2["X"]), obs=ad.io.read_elem(g2["obs"]),
                      var=ad.io.read_elem(g2["var"]))
    variants = {
        "paths": [s0, s1, s2],
        "groups": [zarr.open_group(p, mode="r") for p in data["stores"]],
        "mixed": [s0, backed(s1, matrix="layers/counts"), lazy],
        "add_adata": None,
    }
    for name, items in variants.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loader = Loader(**kw, rng=np.random.default_rng(2))
            if items is None:
                loader.add_adata(s0).add_adata(g1).add_adata(backed(s2))
            else:
                loader.add_adatas(items)
        X, obs, index, sizes, _, _ = facade_pass(loader)
        assert sizes == theirs.batch_sizes, name
        assert_x_equal(X, theirs.X)
        np.testing.assert_array_equal(index, theirs.index)
        assert list(pd.concat(obs).index) == list(theirs.obs.index), name
    # dense X (a zarr.Array): numpy batches, as annbatch's
    [dense] = bridge.run_loader({"adatas": [data["dense"]]}, seed=2, **kw)
    loader = Loader(**kw, rng=np.random.default_rng(2)).add_adata(backed(data["dense"]))
    X, obs, index, sizes, types, _ = facade_pass(loader)
    assert types == dense.x_types and set(types) == {"ndarray"}
    assert_x_equal(X, dense.X)
    assert_obs_equal(pd.concat(obs), dense.obs)
    # add_dataset: a backed matrix and its frames
    g0 = zarr.open_group(s0, mode="r")
    loader = Loader(**kw, rng=np.random.default_rng(2)).add_dataset(
        ad.io.sparse_dataset(g0["X"]), obs=ad.io.read_elem(g0["obs"])[["batch"]])
    X, obs, index, _, _, _ = facade_pass(loader)
    ref = ad.read_zarr(s0)
    np.testing.assert_array_equal(X.toarray(), ref.X[index].toarray())
    assert list(pd.concat(obs)["batch"]) == list(ref.obs["batch"].iloc[index])


def test_obs_keys_selects_columns(data):
    loader = Loader(**ARGS, return_index=True).add_adatas(data["stores"][:2],
                                                          obs_keys=["score"])
    _, obs, index, _, _, _ = facade_pass(loader)
    ref = pd.concat([ad.read_zarr(p).obs for p in data["stores"][:2]])
    got = pd.concat(obs)
    assert list(got.columns) == ["score"]
    np.testing.assert_array_equal(got["score"].to_numpy(), ref["score"].to_numpy()[index])


def test_to_torch_as_annbatch_makes_it(data):
    """annbatch's utils._to_torch: a scipy CSR batch becomes torch.sparse_csr_tensor over the
    matrix's own indptr / indices / data; a dense batch torch.from_numpy. Same values."""
    import torch
    kw = dict(ARGS, shuffle=True)
    [theirs] = bridge.run_loader({"adatas": data["stores"]}, seed=4, **kw)
    loader = Loader(**kw, rng=np.random.default_rng(4), to="torch").add_adatas(data["stores"])
    _, _, _, sizes, _, xs = facade_pass(loader)
    plain = Loader(**kw, rng=np.random.default_rng(4)).add_adatas(data["stores"])
    scipy_batches = [b["X"] for b in plain]
    assert sizes == theirs.batch_sizes
    for t, s in zip(xs, scipy_batches):
        assert isinstance(t, torch.Tensor) and t.layout == torch.sparse_csr
        assert t.crow_indices().numpy().dtype == s.indptr.dtype
        assert t.col_indices().numpy().dtype == s.indices.dtype
        assert t.values().numpy().dtype == np.dtype(theirs.x_dtypes["data"])
    dense = torch.cat([t.to_dense() for t in xs]).numpy()
    np.testing.assert_array_equal(dense, theirs.X.toarray())
    # dense store: dense tensors
    loader = Loader(**kw, rng=np.random.default_rng(4), to="torch").add_adata(data["dense"])
    _, _, _, _, _, xs = facade_pass(loader)
    assert all(isinstance(t, torch.Tensor) and t.layout == torch.strided for t in xs)
    plain = Loader(**kw, rng=np.random.default_rng(4)).add_adata(data["dense"])
    np.testing.assert_array_equal(torch.cat(xs).numpy(),
                                  np.concatenate([b["X"] for b in plain]))


@pytest.mark.parametrize("shuffle", [False, True])
def test_drop_last_and_return_index(data, shuffle):
    kw = dict(chunk_size=16, preload_nchunks=2, batch_size=32, shuffle=shuffle, drop_last=True)
    [theirs] = bridge.run_loader({"collection": data["collection"]}, seed=9, **kw)
    loader = Loader(**kw, rng=np.random.default_rng(9)).use_collection(data["collection"])
    X, obs, index, sizes, _, _ = facade_pass(loader)
    n = sum(n for n, _ in FILES)
    assert sizes == theirs.batch_sizes == [32] * (n // 32)
    assert len(loader) == theirs.n_batches == n // 32
    assert index is None and theirs.index is None
    assert_x_equal(X, theirs.X)
    assert list(pd.concat(obs).index) == list(theirs.obs.index)
    loader = Loader(**kw, rng=np.random.default_rng(9), return_index=True).use_collection(
        data["collection"])
    _, obs, index, _, _, _ = facade_pass(loader)
    # index: each row's position over the collection, whose obs names it names
    names = np.asarray(zbatch.open(data["collection"]).obs_names)
    np.testing.assert_array_equal(names[index], np.asarray(pd.concat(obs).index))


def test_bad_input_named(data, tmp_path):
    missing = str(tmp_path / "missing.zarr")
    with pytest.raises(FileNotFoundError, match="missing.zarr: no such store"):
        Loader().add_adata(missing)
    with pytest.raises(ValueError, match="plain.zarr.*not an AnnData store"):
        Loader().add_adata(data["plain"])
    with pytest.raises(ValueError, match="other.zarr.*identical var|var"):
        Loader().add_adatas([data["stores"][0], data["other"]])
    loader = Loader().add_adata(data["stores"][0])
    with pytest.raises(ValueError, match="other.zarr"):
        loader.add_adata(data["other"])
    assert loader.n_obs == FILES[0][0]          # the refused store was not added
    with pytest.raises(TypeError, match="in memory.*write_zarr"):
        Loader().add_adata(ad.read_zarr(data["stores"][0]))
    with pytest.raises(TypeError, match="h5ad"):
        Loader().add_adata(ad.read_h5ad(data["h5ads"][0], backed="r"))
    with pytest.raises(ValueError, match="DatasetCollection is empty"):
        Loader().use_collection(data["stores"][0])
    with pytest.raises(ValueError, match="annbatch collection goes to use_collection"):
        Loader().add_adata(data["collection"])
    with pytest.raises(ValueError, match="jax is not supported"):
        Loader(to="jax")
    with pytest.raises(ValueError, match="Cannot specify chunk_size"):
        Loader(batch_sampler=zbatch.anndata.SequentialSampler(4, 2, 4), chunk_size=4)
    with pytest.raises(ValueError, match="divisible by batch_size"):
        Loader(chunk_size=10, preload_nchunks=1, batch_size=3)
    with pytest.raises(ValueError, match="Number of datasets"):
        list(Loader())


PORT_SCRIPT = """
import anndata as ad
import numpy as np
import zarr
{import_line}

def custom_load_func(g):
    return ad.AnnData(X=ad.io.sparse_dataset(g["X"]),
                      obs=ad.io.read_elem(g["obs"])[["cell_type"]])

collection = DatasetCollection({path!r})
with ad.settings.override(remove_unused_categories=False):
    ds = Loader(batch_size=16, chunk_size=8, preload_nchunks=4, shuffle=True,
                rng=np.random.default_rng(0))
    ds = ds.use_collection(collection, load_adata=custom_load_func)

sums, labels = [], []
for batch in ds:
    x, obs = batch["X"], batch["obs"]
    sums.append(float(x.sum()))
    labels += [str(v) for v in obs["cell_type"]]
result = {{"sums": sums, "labels": labels, "n_batches": len(ds)}}
"""


def test_porting_changes_one_import_line(data):
    """annbatch's README loop, run by annbatch and then by zbatch with only the import line
    changed: the same batches."""
    theirs = bridge.run_script(PORT_SCRIPT.format(
        import_line="from annbatch import DatasetCollection, Loader", path=data["collection"]))
    ns = {"__name__": "__main__"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(PORT_SCRIPT.format(import_line="from zbatch.anndata import DatasetCollection, Loader",
                                path=data["collection"]), ns)
    mine = ns["result"]
    assert mine["n_batches"] == theirs["n_batches"] == -(-sum(n for n, _ in FILES) // 16)
    assert mine["labels"] == theirs["labels"]
    np.testing.assert_allclose(mine["sums"], theirs["sums"], rtol=1e-6)


@pytest.fixture(scope="module")
def narrow(tmp_path_factory):
    """Two stores of counts written by zbatch.write_anndata with its narrow defaults (uint8
    values, uint16 gene ids) and one by anndata (float32 values, int32 ids)."""
    d = tmp_path_factory.mktemp("anndata_loader_narrow")
    paths = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k, (n, cats) in enumerate(FILES):
            a = make_adata(k, n, cats)
            path = d / f"n{k}.zarr"
            if k < 2:
                zbatch.write_anndata(str(path), a.X, obs=a.obs[["score"]],
                                     var=pd.DataFrame(index=GENES))
            else:
                a.obs = a.obs[["score"]]
                del a.layers["counts"]
                a.write_zarr(path)
            paths.append(str(path))
    stored = [str(zarr.open_group(p, mode="r")["X/data"].dtype) for p in paths]
    assert stored == ["uint8", "uint8", "float32"]
    return paths


@pytest.mark.parametrize("which", [[0, 1], [0]])
def test_values_in_annbatchs_dtypes(narrow, which):
    """The facade yields what annbatch's Loader yields, dtypes included: the stored uint8
    counts (not zbatch's float32 default) and int32 gene ids (scipy recasts annbatch's uint8
    and uint16 ids)."""
    stores = [narrow[i] for i in which]
    kw = dict(ARGS, shuffle=True, return_index=True)
    [theirs] = bridge.run_loader({"adatas": stores}, seed=3, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = Loader(**kw, rng=np.random.default_rng(3)).add_adatas(
            [backed(p) for p in stores])
    X, _, index, sizes, _, xs = facade_pass(loader)
    assert sizes == theirs.batch_sizes
    np.testing.assert_array_equal(index, theirs.index)
    assert theirs.x_dtypes["data"] == "uint8"
    assert {str(x.dtype) for x in xs} == {"uint8"}
    assert {str(x.indices.dtype) for x in xs} == {theirs.x_dtypes["indices"]} == {"int32"}
    assert_x_equal(X, theirs.X)
    ref = ad.concat([ad.read_zarr(p) for p in stores])
    np.testing.assert_array_equal(X.toarray(), ref.X[index].toarray())


def test_mixed_dtypes_are_promoted(narrow):
    """A uint8 store beside a float32 one: every batch float32 (numpy's promotion), values
    equal to anndata's. (annbatch 0.3.1 itself fails on this pair: an OverflowError when a
    load concatenates the two stores' parts, so anndata is the oracle here.)"""
    stores = narrow[1:]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = Loader(**ARGS, shuffle=True, return_index=True,
                        rng=np.random.default_rng(3)).add_adatas([backed(p) for p in stores])
    X, _, index, sizes, _, xs = facade_pass(loader)
    assert {str(x.dtype) for x in xs} == {"float32"}
    assert sorted(index) == list(range(sum(sizes)))
    ref = ad.concat([ad.read_zarr(p) for p in stores])
    np.testing.assert_array_equal(X.toarray(), ref.X[index].toarray().astype(np.float32))
