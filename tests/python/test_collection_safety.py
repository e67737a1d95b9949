"""Safe collections (issue 19, deliverable 1): MultiDataset, zbatch and annbatch collections
whose children disagree.

- var: children whose var names differ are refused at open, the error naming both stores and
  the first differing position; with ``reorder_vars=True`` children holding the first child's
  genes in another order are delivered in the first child's order.
- categoricals: one category table per column for the whole collection (the children's table
  when they agree, else their sorted union, as anndata.concat does) and codes remapped as
  batches are built, so a code means the same in every batch.
- class_field= (class-balanced sampling) on collections and MultiDataset.

Oracle: ``anndata.concat`` of the in-memory children (labels compared as labels, genes by name).
"""
from __future__ import annotations

import warnings

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from conftest import expect_error, zbatch_api
from test_dataset_collection import write_collection

N_VARS = 12
GENES = [f"gene_{j:02d}" for j in range(N_VARS)]


def make(seed, n, cats, *, genes=GENES, column="cell_type", dense=False, codes=None):
    rng = np.random.default_rng(seed)
    X = sp.random(n, len(genes), density=0.4, format="csr", dtype=np.float32, random_state=rng)
    X.data[:] = rng.integers(1, 50, X.nnz)
    if codes is None:
        codes = rng.integers(-1, len(cats), n)  # -1: missing
    obs = pd.DataFrame({column: pd.Categorical.from_codes(codes, categories=cats),
                        "cluster": pd.Categorical(rng.integers(0, 3, n) + seed % 4),
                        "score": rng.standard_normal(n)},
                       index=[f"s{seed}_c{i}" for i in range(n)])
    a = ad.AnnData(X=X.toarray() if dense else X, obs=obs, var=pd.DataFrame(index=genes))
    return a


def write(path, a, fmt=3):
    with warnings.catch_warnings(), ad.settings.override(zarr_write_format=fmt):
        warnings.simplefilter("ignore")
        a.write_zarr(str(path))
    return str(path)


def labels(ds, b, col):
    """Each cell's label through the dataset's table (None for code -1)."""
    cats = list(ds.categories(col)) + [None]
    return [cats[int(c)] for c in np.asarray(b[col])]


def want_labels(adatas, col, ids):
    whole = pd.concat([a.obs[col].astype(object) for a in adatas], ignore_index=True)
    return [None if pd.isna(v) else v for v in whole.iloc[np.asarray(ids)]]


# ------------------------------------------------------------------------------------------------
# categories
# ------------------------------------------------------------------------------------------------
@pytest.fixture
def differing(tmp_path):
    """Two stores whose cell_type tables differ (['B', 'T'] and ['NK', 'T']): code 0 is 'B' in
    one and 'NK' in the other (the issue's example)."""
    a = make(1, 30, ["B", "T"])
    b = make(2, 20, ["NK", "T"], codes=np.arange(20) % 2)
    return [a, b], [write(tmp_path / "a.zarr", a, 2), write(tmp_path / "b.zarr", b, 3)]


def test_multidataset_codes_mean_one_label(differing):
    zb = zbatch_api()
    adatas, paths = differing
    md = zb.MultiDataset([zb.open(p) for p in paths])
    assert md.categories("obs/cell_type") == ["B", "NK", "T"]   # anndata.concat's table
    assert list(ad.concat(adatas).obs["cell_type"].cat.categories) == ["B", "NK", "T"]
    ids = np.r_[np.arange(50), [31, 0, 49, 30]]
    b = md.read_many(ids)
    assert labels(md, b, "obs/cell_type") == want_labels(adatas, "cell_type", ids)
    # codes, not just labels: NK (code 0 in b.zarr) is code 1 now, T (1 there) code 2
    np.testing.assert_array_equal(b["obs/cell_type"][30:32], [1, 2])
    # integer categories are merged the same way (clusters 1..3 and 2..4)
    assert list(md.categories("obs/cluster")) == [1, 2, 3, 4]
    assert labels(md, b, "obs/cluster") == want_labels(adatas, "cluster", ids)
    # and every child alone still answers with its own table
    assert zb.open(paths[1]).categories("obs/cell_type") == ["NK", "T"]


def test_collection_codes_mean_one_label(tmp_path):
    zb = zbatch_api()
    kids = [make(1, 9, ["B", "T"]), make(2, 7, ["NK", "T"]), make(3, 5, ["B", "T"]),
            make(4, 6, ["DC", "B", "T", "NK"])]
    path = write_collection(tmp_path / "c.zarr", kids)
    ds = zb.open(path)
    assert ds.categories("obs/cell_type") == ["B", "DC", "NK", "T"]
    ids = np.random.default_rng(0).permutation(27)
    b = ds.read_many(ids)
    assert b["obs/cell_type"].dtype == np.int8
    assert labels(ds, b, "obs/cell_type") == want_labels(kids, "cell_type", ids)
    # the loader builds the same batches
    dl = zb.DataLoader(ds, batch_size=8, shuffle=True, seed=2, prefetch_factor=2)
    for lb in dl:
        got_ids = lb["index"].astype(np.int64)
        assert labels(ds, lb, "obs/cell_type") == want_labels(kids, "cell_type", got_ids)


def test_merged_codes_widen(tmp_path):
    """Two children with 100 categories each, stored as int8 codes: the union of 200 needs
    int16, and batches carry int16 codes for both."""
    zb = zbatch_api()
    a = make(1, 40, [f"a{k:03d}" for k in range(100)])
    b = make(2, 40, [f"b{k:03d}" for k in range(100)])
    paths = [write(tmp_path / "a.zarr", a), write(tmp_path / "b.zarr", b)]
    assert zb.open(paths[0]).fields["obs/cell_type"]["dtype"] == "int8"
    md = zb.MultiDataset([zb.open(p) for p in paths])
    assert md.fields["obs/cell_type"]["dtype"] == "int16"
    assert len(md.categories("obs/cell_type")) == 200
    ids = np.arange(80)[::-1]
    r = md.read_many(ids)
    assert r["obs/cell_type"].dtype == np.int16
    assert labels(md, r, "obs/cell_type") == want_labels([a, b], "cell_type", ids)


# ------------------------------------------------------------------------------------------------
# var names
# ------------------------------------------------------------------------------------------------
def test_var_order_differs_refused_naming_both(tmp_path):
    zb = zbatch_api()
    a = make(1, 10, ["B", "T"])
    b = make(2, 10, ["B", "T"], genes=GENES[:5] + [GENES[6], GENES[5]] + GENES[7:])
    pa, pb = write(tmp_path / "a.zarr", a), write(tmp_path / "b.zarr", b)
    with expect_error("ZB_E_INVALID", pa, pb, "position 5", "gene_05", "gene_06"):
        zb.MultiDataset([zb.open(pa), zb.open(pb)])
    kids = [a, b]
    path = write_collection(tmp_path / "c.zarr", kids)
    with expect_error("ZB_E_CORRUPT", "dataset_0", "dataset_1", "position 5"):
        zb.open(path)


@pytest.mark.parametrize("dense", [False, True])
def test_reorder_vars_delivers_the_first_childs_order(tmp_path, dense):
    zb = zbatch_api()
    perm = np.random.default_rng(3).permutation(N_VARS)
    a = make(1, 25, ["B", "T"], dense=dense)
    b = make(2, 15, ["B", "T"], genes=[GENES[j] for j in perm], dense=dense)
    pa, pb = write(tmp_path / "a.zarr", a), write(tmp_path / "b.zarr", b)
    md = zb.MultiDataset([zb.open(pa), zb.open(pb)], reorder_vars=True)
    assert list(md.var_names) == GENES
    whole = ad.concat([a, b[:, GENES]])      # b's columns by name, in a's order
    ids = np.r_[np.arange(40)[::-1], [26, 26, 3]]
    got = md.read_many(ids)["X"]
    want = whole.X[ids]
    if dense:
        np.testing.assert_array_equal(got, want)
    else:
        want = sp.csr_matrix(want)
        want.sort_indices()                      # anndata's column subset leaves them unsorted
        # canonical CSR: gene ids ascend in each row, values moved with them
        assert got.has_sorted_indices
        np.testing.assert_array_equal(got.indptr, want.indptr)
        np.testing.assert_array_equal(got.indices, want.indices)
        np.testing.assert_array_equal(got.data, want.data)
    # a collection opened by path takes the same option
    path = write_collection(tmp_path / "c.zarr", [a, b])
    ds = zb.open(path, reorder_vars=True)
    gx = ds.read_many(ids)["X"]
    np.testing.assert_array_equal(gx if dense else gx.toarray(),
                                  want if dense else want.toarray())


def test_reorder_vars_needs_the_same_genes(tmp_path):
    zb = zbatch_api()
    a = make(1, 10, ["B", "T"])
    b = make(2, 10, ["B", "T"], genes=GENES[:-1] + ["other"])
    pa, pb = write(tmp_path / "a.zarr", a), write(tmp_path / "b.zarr", b)
    with expect_error("ZB_E_INVALID", pa, pb, "other"):
        zb.MultiDataset([zb.open(pa), zb.open(pb)], reorder_vars=True)


def test_errors_name_both_stores(tmp_path):
    """`differ between  and `: errors about children name the stores."""
    zb = zbatch_api()
    a = make(1, 10, ["B", "T"])
    b = make(2, 10, ["B", "T"], genes=GENES + ["extra"])
    pa, pb = write(tmp_path / "a.zarr", a), write(tmp_path / "b.zarr", b)
    with expect_error("ZB_E_INVALID", pa, pb):
        zb.MultiDataset([zb.open(pa), zb.open(pb)])
    c = make(3, 10, ["B", "T"])
    c.obs["cell_type"] = c.obs["score"]          # a number where the others have codes
    pc = write(tmp_path / "c.zarr", c)
    with expect_error("ZB_E_INVALID", pa, pc, "obs/cell_type"):
        zb.MultiDataset([zb.open(pa), zb.open(pc)])


# ------------------------------------------------------------------------------------------------
# class-balanced sampling
# ------------------------------------------------------------------------------------------------
def _class_balanced(zb, ds, n):
    dl = zb.DataLoader(ds, sampler="weighted", class_field="obs/cell_type", batch_size=1000,
                       num_samples=n, seed=5)
    return [lab for b in dl for lab in labels(ds, b, "obs/cell_type")]


def test_class_field_on_multidataset_and_collection(tmp_path):
    """B is rare in the first store, NK only in the second, T common in both: balanced draws
    give each *label* a third, which only holds when codes are merged."""
    zb = zbatch_api()
    a = make(1, 300, ["B", "T"], codes=(np.arange(300) % 30 == 0).astype(int) ^ 1)
    b = make(2, 100, ["NK", "T"], codes=(np.arange(100) % 4 != 0).astype(int))
    pa, pb = write(tmp_path / "a.zarr", a), write(tmp_path / "b.zarr", b)
    md = zb.MultiDataset([zb.open(pa), zb.open(pb)])
    n = 30000
    for ds in (md, zb.open(write_collection(tmp_path / "c.zarr", [a, b]))):
        got = pd.Series(_class_balanced(zb, ds, n)).value_counts()
        assert set(got.index) == {"B", "NK", "T"}
        assert np.all(np.abs(got.to_numpy() - n / 3) < 5 * np.sqrt(n / 3)), got


@pytest.mark.parametrize("orders", [(True, True), (True, False), (False, True)])
def test_ordered_only_when_every_child_is_ordered(tmp_path, orders):
    """A collection's categorical is ordered only when every child's is, with one table: the
    rule zbatch convert applies to its inputs (anndata.concat gives up the categorical and
    returns strings when the flags differ; the labels are the same either way)."""
    zb = zbatch_api()
    kids = []
    for seed, o in enumerate(orders):
        a = make(seed, 6, ["lo", "mid", "hi"], codes=np.arange(6) % 3)
        a.obs["cell_type"] = a.obs["cell_type"].cat.as_ordered() if o else \
            a.obs["cell_type"].cat.as_unordered()
        kids.append(a)
    paths = [write(tmp_path / f"k{i}.zarr", a) for i, a in enumerate(kids)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = ad.concat(kids).obs["cell_type"]
    for ds in (zb.MultiDataset([zb.open(p) for p in paths]),
               zb.open(write_collection(tmp_path / "c.zarr", kids))):
        col = ds.obs["cell_type"]
        assert list(col.cat.categories) == ["lo", "mid", "hi"]   # the children's order kept
        assert col.cat.ordered == all(orders)
        assert list(col.astype(object)) == list(whole.astype(object))
        if all(orders):
            assert whole.cat.ordered
