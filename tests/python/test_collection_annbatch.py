"""annbatch's own collections read by zbatch, with anndata as the oracle (issue 19).

Three .h5ad files (anndata 0.12) whose categorical tables differ — string labels, integer
clusters — with nullable and string columns, go through annbatch 0.3.1's
``DatasetCollection.add_adatas`` (in .venv-annbatch, tests/python/annbatch_bridge.py). zbatch
opens the collection as one dataset; anndata's ``read_zarr`` of each ``dataset_k`` is the
oracle: every value zbatch delivers — X, codes through ``categories()``, ``ds.obs``, ``ds.var``,
obs names per batch — equals anndata's, and a code means one label in every batch.
"""
from __future__ import annotations

import warnings

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

import annbatch_bridge as bridge
from conftest import zbatch_api

GENES = [f"g{j:02d}" for j in range(40)]
FILES = [(500, ["T", "B", "NK"], [0, 1, 2]),
         (300, ["NK", "mono"], [3, 7]),
         (450, ["B", "T", "DC"], [1, 2, 3, 4])]


def make_file(k, n, cats, clusters, with_count=True):
    rng = np.random.default_rng(70 + k)
    X = sp.random(n, len(GENES), density=0.2, format="csr", dtype=np.float32, random_state=rng)
    X.data[:] = rng.integers(1, 30, X.nnz)
    values = rng.integers(0, 500, n)
    missing = rng.random(n) < 0.1
    count = pd.array(values, dtype="Int64")
    count[missing] = pd.NA
    obs = pd.DataFrame({
        "cell_type": pd.Categorical(rng.choice(cats, n), categories=cats),
        "leiden": pd.Categorical(rng.choice(clusters, n)),
        "barcode": np.array([f"BC{k}_{i:05d}" for i in range(n)], dtype=object),
        "count": count,
        "score": rng.standard_normal(n).astype(np.float32),
    }, index=[f"f{k}_c{i:05d}" for i in range(n)])
    if not with_count:
        del obs["count"]
    return ad.AnnData(X=X, obs=obs, var=pd.DataFrame(index=GENES))


def write(d, name, files, count=True):
    """An annbatch collection of the given FILES entries, and anndata's reading of each of its
    datasets."""
    paths = []
    for k in files:
        p = d / f"in_{k}{'' if count else '_nocount'}.h5ad"
        if not p.exists():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                make_file(k, *FILES[k], with_count=count).write_h5ad(p)
        paths.append(p)
    out = d / name
    written = bridge.write_collection(out, paths, dataset_size=500, shuffle_chunk_size=50, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parts = [ad.read_zarr(out / key) for key in written["dataset_keys"]]
    return str(out), parts


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    return write(tmp_path_factory.mktemp("annbatch_fidelity"), "collection.zarr", [0, 1, 2])


def csr(x):
    with warnings.catch_warnings():   # scipy warns about annbatch's uint8 gene ids
        warnings.simplefilter("ignore")
        return sp.csr_matrix(x)


def as_objects(series):
    return [None if pd.isna(v) else (v.item() if hasattr(v, "item") else v)
            for v in pd.Series(series).astype(object)]


def test_values_equal_anndatas(collection):
    zb = zbatch_api()
    path, parts = collection
    ds = zb.open(path, load_strings=True)
    n = sum(p.n_obs for p in parts)
    assert ds.layout == "collection" and len(ds) == n and ds.num_children == len(parts)
    ids = np.random.default_rng(0).permutation(n)
    b = ds.read_many(ids)
    whole_x = sp.vstack([csr(p.X) for p in parts], format="csr")
    assert (b["X"] != whole_x[ids]).nnz == 0
    obs = pd.concat([p.obs for p in parts])
    assert list(b["obs_names"]) == list(obs.index[ids])
    for col in ("cell_type", "leiden", "src_path"):
        cats = list(ds.categories(f"obs/{col}")) + [None]
        got = [cats[c] for c in b[f"obs/{col}"]]
        assert as_objects(got) == as_objects(obs[col].iloc[ids]), col
    # anndata's concat builds the same table (the children's, or their sorted union)
    for col in ("cell_type", "leiden"):
        want = ad.concat(parts).obs[col].cat.categories
        np.testing.assert_array_equal(np.asarray(ds.categories(f"obs/{col}")), want.to_numpy())
    frame = ds.obs
    assert list(frame.index) == list(obs.index) and list(frame.columns) == list(obs.columns)
    for col in obs.columns:
        assert as_objects(frame[col]) == as_objects(obs[col]), col
        if isinstance(obs[col].dtype, pd.CategoricalDtype):
            assert isinstance(frame[col].dtype, pd.CategoricalDtype)
    pd.testing.assert_frame_equal(ds.var, parts[0].var)


def test_loader_batches_mean_one_label(collection):
    """Every batch of a shuffled pass: codes through the collection's one table give each
    cell's own label (found through its obs name in anndata's reading)."""
    zb = zbatch_api()
    path, parts = collection
    obs = pd.concat([p.obs for p in parts])
    ds = zb.open(path, load_strings=True)
    cats = list(ds.categories("obs/cell_type")) + [None]
    dl = zb.DataLoader(ds, batch_size=128, sampler="block", block_size=16, seed=4,
                       prefetch_factor=2)
    seen = 0
    for b in dl:
        want = obs.loc[list(b["obs_names"]), "cell_type"]
        assert as_objects([cats[c] for c in b["obs/cell_type"]]) == as_objects(want)
        seen += len(b["index"])
    assert seen == len(ds)


def test_annbatch_datasets_with_differing_tables(collection, tmp_path):
    """annbatch unifies the tables inside one collection; datasets of two collections written
    from different files do differ (['B', 'NK', 'T', 'mono'] and ['B', 'DC', 'T']): as children
    of a MultiDataset they get one table, and codes are remapped to it. (Without the nullable
    column: annbatch stores it as float64 where it mixed files and as int64 where it did not,
    which a MultiDataset refuses, naming both.)"""
    zb = zbatch_api()
    a_path, a_parts = write(tmp_path, "a.zarr", [0, 1], count=False)
    b_path, b_parts = write(tmp_path, "b.zarr", [2], count=False)
    kids = [zb.open(a_path, group="dataset_0"), zb.open(b_path, group="dataset_0")]
    assert kids[0].categories("obs/cell_type") != kids[1].categories("obs/cell_type")
    md = zb.MultiDataset(kids)
    parts = [a_parts[0], b_parts[0]]
    assert md.categories("obs/cell_type") == ["B", "DC", "NK", "T", "mono"]
    n = len(md)
    ids = np.random.default_rng(1).permutation(n)
    b = md.read_many(ids)
    obs = pd.concat([p.obs for p in parts])
    for col in ("cell_type", "leiden"):
        cats = list(md.categories(f"obs/{col}")) + [None]
        assert as_objects([cats[c] for c in b[f"obs/{col}"]]) == as_objects(obs[col].iloc[ids])
    whole_x = sp.vstack([csr(p.X) for p in parts], format="csr")
    assert (b["X"] != whole_x[ids]).nnz == 0
    assert list(md.obs.index) == list(obs.index)
    for col in obs.columns:
        assert as_objects(md.obs[col]) == as_objects(obs[col]), col
