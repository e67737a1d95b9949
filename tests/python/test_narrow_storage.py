"""Narrow exact storage (issue 19): integer counts stored as uint8/uint16 and gene ids as uint16
are half the bytes of float32/int32 to fetch and decode; the reader widens them as it copies,
so batches equal a float32/int32 store's (scipy and anndata are the oracles), and the writers
choose the narrowest exact types by default."""
from __future__ import annotations

import json
import subprocess
import warnings
from pathlib import Path
from types import SimpleNamespace

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import zarr

import zbatch
from zbatch import write_anndata
from test_dataset_raw import write as write_raw

N_OBS, N_VARS = 300, 700
ROOT = Path(__file__).resolve().parents[2]
ZBATCH = ROOT / "build" / "zbatch"


def make_counts(n_obs=N_OBS, n_vars=N_VARS, hi=250, seed=3, empty_rows=(0, 41, 42)):
    """A CSR matrix of integer counts in [1, hi) (float32, int32 indices), some rows empty."""
    rng = np.random.default_rng(seed)
    k = rng.integers(0, 40, n_obs)
    k[list(empty_rows)] = 0
    indptr = np.concatenate([[0], np.cumsum(k)]).astype(np.int64)
    indices = np.concatenate([np.sort(rng.choice(n_vars, c, replace=False)) for c in k])
    data = rng.integers(1, hi, indptr[-1]).astype(np.float32)
    return sp.csr_matrix((data, indices.astype(np.int32), indptr), shape=(n_obs, n_vars))


def ids_of():
    rng = np.random.default_rng(7)
    return {"sorted": np.sort(rng.choice(N_OBS, 60, replace=False)),
            "shuffled": rng.permutation(N_OBS)[:120],
            "duplicates": np.array([20, 5, 5, 20, N_OBS - 1, 0, 41, 42, 100, 100, 101, 5]),
            "all": np.arange(N_OBS)}


def delivered(b, name):
    """Field `name` of batch b as the C reader delivered it (before scipy may recast it)."""
    return b._array(b._raw["fields"][name])


def check_batch(ds, X, ids, data_dtype=np.float32, index_dtype=np.int32):
    """The batch of `ids` holds X's rows, values and gene ids in the delivered dtypes."""
    b = ds.read_many(ids)
    want = X[ids]
    data, indices = delivered(b, "X/data"), delivered(b, "X/indices")
    assert data.dtype == data_dtype and indices.dtype == index_dtype
    np.testing.assert_array_equal(indices, want.indices)
    np.testing.assert_array_equal(data, want.data.astype(data_dtype))
    np.testing.assert_array_equal(b["X"].indptr, want.indptr)
    return b


def field_dtypes(ds):
    return ds.fields["X/data"]["dtype"], ds.fields["X/indices"]["dtype"]


# ---- the reader: every path, against scipy ---------------------------------------------------

# (writer keyword arguments of test_dataset_raw.write, the path they exercise)
LAYOUTS = {
    "v2-zstd": dict(fmt=2, chunks=(64,), emb_chunks=(64, 6)),  # Zstd added by the fixture
    "v3-plain": dict(fmt=3, chunks=(97,), emb_chunks=(64, 6),
                     compressors=[zarr.codecs.ZstdCodec(level=1)]),
    "v3-shard": dict(fmt=3, chunks=(64,), shards=(512,), emb_chunks=(64, 6),
                     compressors=[zarr.codecs.ZstdCodec(level=1)]),
    "v2-raw": dict(fmt=2, chunks=(128,), emb_chunks=(64, 6)),
    "v3-raw": dict(fmt=3, chunks=(128,), emb_chunks=(64, 6)),
    "v3-shard-raw": dict(fmt=3, chunks=(64,), shards=(1024,), emb_chunks=(64, 6)),
}


@pytest.fixture(scope="module")
def narrow_stores(tmp_path_factory):
    X = make_counts()
    # scipy would recast uint16 indices to int32: the arrays as they are stored
    narrow = SimpleNamespace(data=X.data.astype(np.uint8), indices=X.indices.astype(np.uint16),
                             indptr=X.indptr, shape=X.shape)
    obs = pd.DataFrame({"n": np.arange(N_OBS)}, index=[f"c{i}" for i in range(N_OBS)])
    emb = np.zeros((N_OBS, 6), np.float32)
    base = tmp_path_factory.mktemp("narrow")
    stores = {}
    for name, kw in LAYOUTS.items():
        kw = dict(kw)
        if name == "v2-zstd":
            from numcodecs import Zstd
            kw["compressors"] = [Zstd(level=1)]
        stores[name] = write_raw(base / f"{name}.zarr", narrow, obs, emb, **kw)
    return X, stores


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("request_kind", list(ids_of()))
def test_widened_on_every_path(narrow_stores, layout, request_kind, io):
    """uint8 counts and uint16 gene ids come out as float32/int32 equal to scipy's rows, on the
    decode paths (plain chunks, shard inner chunks) and the raw ones (views and pread)."""
    X, stores = narrow_stores
    ds = zbatch.open(stores[layout])
    assert field_dtypes(ds) == ("float32", "int32")
    b = check_batch(ds, X, ids_of()[request_kind])
    # the same stored bytes decoded as when delivered as stored; 3 + 2 bytes more delivered per
    # value (float32 for uint8, int32 for uint16)
    s = zbatch.open(stores[layout], x_dtype="stored", index_dtype="stored").read_many(
        ids_of()[request_kind]).stats
    nnz = X[ids_of()[request_kind]].nnz
    assert b.stats["bytes_delivered"] - s["bytes_delivered"] == 5 * nnz
    assert b.stats["bytes_decoded"] == s["bytes_decoded"]


@pytest.mark.parametrize("layout", ["v3-shard", "v2-raw", "v3-shard-raw"])
@pytest.mark.parametrize("x_dtype,index_dtype,want", [
    ("stored", "stored", (np.uint8, np.uint16)),
    ("stored", "int32", (np.uint8, np.int32)),   # what annbatch's Loader yields
    ("float64", "int64", (np.float64, np.int64)),
    ("int32", None, (np.int32, np.int32)),
    (np.float32, "int32", (np.float32, np.int32)),
])
def test_dtype_options(narrow_stores, layout, x_dtype, index_dtype, want, io):
    X, stores = narrow_stores
    ds = zbatch.open(stores[layout], x_dtype=x_dtype, index_dtype=index_dtype)
    assert field_dtypes(ds) == (np.dtype(want[0]).name, np.dtype(want[1]).name)
    check_batch(ds, X, ids_of()["shuffled"], *want)


@pytest.mark.parametrize("index_dtype,recast", [("int32", False), ("stored", True)])
def test_loader_in_annbatch_dtypes(tmp_path, index_dtype, recast):
    """x_dtype="stored", index_dtype="int32": the DataLoader's scipy batches carry the stored
    uint8 counts and int32 gene ids, the dtypes annbatch's Loader yields from a narrow store
    (scipy's constructor recasts its uint16 ids to int32), with anndata's rows over one epoch;
    scipy keeps the delivered arrays (no recast copy in Python), which it must copy when the ids
    come as stored (uint16)."""
    X = make_counts()
    p = tmp_path / "n.zarr"
    chosen = write_anndata(p, X, zarr_format=3, chunk_size=64, shard_size=256)
    assert chosen == {"X/data": np.uint8, "X/indices": np.uint16}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = ad.read_zarr(p).X
    assert want.dtype == np.uint8
    ds = zbatch.open(p, x_dtype="stored", index_dtype=index_dtype)
    dl = zbatch.DataLoader(ds, batch_size=64, sampler="block", block_size=16,
                           blocks_per_window=8, prefetch_factor=2, output="scipy", seed=5)
    seen = []
    for b in dl:
        x, idx = b["X"], np.asarray(b["index"], dtype=np.int64)
        assert isinstance(x, sp.csr_matrix) and x.shape == (len(idx), N_VARS)
        assert x.dtype == np.uint8 and x.indices.dtype == np.int32
        assert np.shares_memory(x.data, delivered(b, "X/data"))
        assert np.shares_memory(x.indices, delivered(b, "X/indices")) != recast
        w = want[idx]
        np.testing.assert_array_equal(x.indptr, w.indptr)
        np.testing.assert_array_equal(x.indices, w.indices)
        np.testing.assert_array_equal(x.data, w.data)
        seen.append(idx)
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(N_OBS))


def test_cached_units_widen_again(narrow_stores):
    """A decoded-chunk cache holds stored bytes: a second read of the same rows (served from
    it) widens them again, equal."""
    X, stores = narrow_stores
    ds = zbatch.open(stores["v3-shard"], cache_bytes=1 << 24)
    ids = ids_of()["duplicates"]
    check_batch(ds, X, ids)
    b = check_batch(ds, X, ids)
    assert b.stats["chunks_cached"] > 0


def test_refuses_inexact(tmp_path):
    """A dtype that does not hold every stored value is refused at open, naming the array."""
    X = make_counts()
    p = tmp_path / "f.zarr"
    write_anndata(p, X, data_dtype="keep", narrow_indices=False)  # float32 / int32
    with pytest.raises(zbatch.ZbatchError, match="x_dtype=int32"):
        zbatch.open(p, x_dtype="int32")
    with pytest.raises(zbatch.ZbatchError, match="expected"):
        zbatch.open(p, x_dtype="uint8")
    with pytest.raises(zbatch.ZbatchError, match="index_dtype"):
        zbatch.open(p, index_dtype="float32")
    q = tmp_path / "d.zarr"
    write_anndata(q, X, data_dtype=np.float64)
    with pytest.raises(zbatch.ZbatchError, match="float64"):
        zbatch.open(q, x_dtype="float32")
    # as stored, and the wide store needs no widening
    assert field_dtypes(zbatch.open(q)) == ("float64", "int32")
    assert field_dtypes(zbatch.open(q, index_dtype="stored")) == ("float64", "uint16")
    assert field_dtypes(zbatch.open(p)) == ("float32", "int32")


@pytest.mark.parametrize("fmt,shard", [(2, None), (3, None), (3, 256)])
def test_written_narrow_reads_as_wide(tmp_path, fmt, shard):
    """write_anndata's default store and its float32/int32 twin give the same batches, and
    anndata reads the narrow one with equal values (in the stored dtypes)."""
    # uint16 values and gene ids past 32,767: a signed widening would fail
    X = make_counts(n_vars=40000, hi=65536)
    narrow, wide = tmp_path / "n.zarr", tmp_path / "w.zarr"
    kw = dict(zarr_format=fmt, chunk_size=64 if shard else None, shard_size=shard)
    chosen = write_anndata(narrow, X, **kw)
    assert chosen == {"X/data": np.uint16, "X/indices": np.uint16}
    write_anndata(wide, X, data_dtype=np.float32, narrow_indices=False, **kw)
    a = ad.read_zarr(narrow)
    assert a.X.dtype == np.uint16 and a.X.indices.dtype == np.uint16
    np.testing.assert_array_equal(a.X.toarray(), X.toarray())
    dn, dw = zbatch.open(narrow), zbatch.open(wide)
    assert field_dtypes(dn) == field_dtypes(dw) == ("float32", "int32")
    ids = ids_of()["shuffled"]
    bn, bw = dn.read_many(ids), dw.read_many(ids)
    for f in ("X",):
        np.testing.assert_array_equal(bn[f].toarray(), bw[f].toarray())
        assert bn[f].dtype == bw[f].dtype == np.float32
    # the stored values decode to fewer bytes for the same delivered ones
    assert bn.stats["bytes_delivered"] == bw.stats["bytes_delivered"]
    assert bn.stats["bytes_decoded"] < bw.stats["bytes_decoded"]


def test_collection_children_differ_in_stored_dtype(tmp_path):
    """A collection of a uint8, a uint16 and a float32 child: every child delivered as float32 /
    int32 (as stored, their dtypes differ and the collection is refused)."""
    var = pd.DataFrame(index=[f"g{j}" for j in range(N_VARS)])
    mats = [make_counts(n_obs=n, hi=hi, seed=s, empty_rows=(1,))
            for n, hi, s in ((90, 200, 1), (130, 4000, 2), (80, 100, 3))]
    mats[2].data = mats[2].data + np.float32(0.5)  # a float child: not integer
    root = tmp_path / "coll.zarr"
    dtypes = []
    for k, M in enumerate(mats):
        obs = pd.DataFrame(index=[f"d{k}_c{i}" for i in range(M.shape[0])])
        dtypes.append(write_anndata(root / f"dataset_{k}", M, obs=obs, var=var)["X/data"])
    assert dtypes == [np.uint8, np.uint16, np.float32]
    g = zarr.open_group(str(root), mode="a", zarr_format=3)
    g.attrs.update({"encoding-type": "zbatch-collection", "encoding-version": "0.1.0"})
    ds = zbatch.open(root, use_consolidated=False)
    assert ds.layout == "collection"
    assert field_dtypes(ds) == ("float32", "int32")
    whole = sp.vstack(mats).tocsr()
    rng = np.random.default_rng(4)
    for ids in (rng.permutation(whole.shape[0])[:150], np.arange(whole.shape[0])):
        check_batch(ds, whole, ids)
    with pytest.raises(zbatch.ZbatchError, match="dtype"):
        zbatch.open(root, use_consolidated=False, x_dtype="stored")
    # a concatenation of datasets opened by default: the same
    md = zbatch.MultiDataset([zbatch.open(root / f"dataset_{k}") for k in range(3)])
    check_batch(md, whole, np.arange(whole.shape[0])[::-3])


# ---- the writers: the choice table, anndata as the oracle -------------------------------------

def blosc_shuffle(path):
    """The blosc shuffle an array was written with, as zarr-python reads its metadata."""
    (c,) = zarr.open_array(str(path)).compressors
    sh = c.shuffle  # v3: a BloscShuffle; v2: numcodecs' 0 / 1 / 2
    return sh.value if hasattr(sh, "value") else ("noshuffle", "shuffle", "bitshuffle")[sh]


@pytest.mark.parametrize("fmt,shard", [(2, None), (3, None), (3, 256)])
def test_writer_codec_defaults(tmp_path, fmt, shard):
    """No codec given: a CSR matrix's uint8 / uint16 values and uint16 ids are written without
    byte shuffle (it halves LZ4's decode speed there, docs/PERFORMANCE.md "Codec defaults"),
    a float layer's values, the pointers and the obs columns with it; zarr-python reads that
    metadata and the written values; write_anndata reports what it wrote. A codec given is
    used for every array as given."""
    X = make_counts(hi=250)
    big = make_counts(hi=3000, seed=5)
    flt = X.copy()
    flt.data = flt.data + np.float32(0.5)
    obs = pd.DataFrame({"small": (np.arange(N_OBS) % 100).astype(np.int8)},
                       index=[f"c{i}" for i in range(N_OBS)])
    kw = dict(obs=obs, layers={"big": big, "flt": flt}, zarr_format=fmt,
              chunk_size=64 if shard else None, shard_size=shard)
    want = {"X/data": ("uint8", "noshuffle"), "X/indices": ("uint16", "noshuffle"),
            "layers/big/data": ("uint16", "noshuffle"),
            "layers/big/indices": ("uint16", "noshuffle"),
            "layers/flt/data": ("float32", "shuffle"),
            "layers/flt/indices": ("uint16", "noshuffle")}
    p = tmp_path / "d.zarr"
    chosen = write_anndata(p, X, **kw)
    assert {k: str(v) for k, v in chosen.items()} == {k: t for k, (t, _) in want.items()}
    assert chosen.codecs == {k: f"blosc:lz4:5:{sh}" for k, (_, sh) in want.items()}
    written = {**{k: sh for k, (_, sh) in want.items()}, "X/indptr": "shuffle",
               "layers/big/indptr": "shuffle", "obs/small": "shuffle"}
    for arr, sh in written.items():
        assert blosc_shuffle(p / arr) == sh, arr
    for name, M in (("X", X), ("layers/big", big), ("layers/flt", flt)):
        np.testing.assert_array_equal(zarr.open_array(str(p / name / "data"))[:], M.data)
        np.testing.assert_array_equal(zarr.open_array(str(p / name / "indices"))[:], M.indices)
    q = tmp_path / "e.zarr"
    chosen = write_anndata(q, X, codec="blosc:lz4:5:shuffle", **kw)
    assert set(chosen.codecs.values()) == {"blosc:lz4:5:shuffle"}
    for arr in written:
        assert blosc_shuffle(q / arr) == "shuffle", arr
    r = tmp_path / "z.zarr"
    chosen = write_anndata(r, X, codec="zstd:3", **kw)
    assert set(chosen.codecs.values()) == {"zstd:3"}
    for arr in written:
        (c,) = zarr.open_array(str(r / arr)).compressors
        assert type(c).__name__ in ("ZstdCodec", "Zstd") and c.level == 3, arr
    # a dense X keeps the writer's default; its CSR layers take the narrow rule
    d = tmp_path / "dense.zarr"
    assert write_anndata(d, X.toarray().astype(np.uint8), layers={"big": big.astype(np.uint16)},
                         zarr_format=fmt).codecs == {
        "X": "blosc:lz4:5:shuffle", "layers/big/data": "blosc:lz4:5:noshuffle",
        "layers/big/indices": "blosc:lz4:5:shuffle"}
    assert blosc_shuffle(d / "X") == "shuffle"
    assert blosc_shuffle(d / "layers/big/data") == "noshuffle"
    assert blosc_shuffle(d / "layers/big/indices") == "shuffle"  # int32: dense X, not narrow


@pytest.mark.parametrize("values,dtype,want", [
    ([1, 2, 255], np.float32, np.uint8),
    ([0, 256], np.float32, np.uint16),
    ([1, 65535], np.float32, np.uint16),
    ([1, 65536], np.float32, np.float32),
    ([1, 2.5], np.float32, np.float32),
    ([-1, 2], np.float32, np.float32),  # negative: kept (counts are never negative)
    ([1, np.nan], np.float32, np.float32),
    ([1, np.inf], np.float32, np.float32),
    ([3, 300], np.int64, np.uint16),
    ([3, 70000], np.int32, np.int32),
    ([1, 2], np.float64, np.uint8),
    ([7, 200], np.uint8, np.uint8),
    ([1, 0], np.bool_, np.bool_),
])
def test_writer_choice_table(tmp_path, values, dtype, want):
    """The narrowest exact dtype over the whole input (the extreme value sits in the last row,
    past the first block of rows); anndata reads the values back equal."""
    n = 40
    X = sp.lil_matrix((n, 30), dtype=dtype)
    for i in range(n - 1):
        X[i, i % 30] = values[0]
    X[n - 1, 29] = values[1]
    X = X.tocsr()
    p = tmp_path / "c.zarr"
    chosen = write_anndata(p, X)
    assert chosen["X/data"] == want
    assert chosen["X/indices"] == np.uint8  # 30 columns
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = ad.read_zarr(p)
    assert a.X.dtype == want
    np.testing.assert_array_equal(a.X.toarray(), X.toarray().astype(want))
    np.testing.assert_array_equal(a.X.toarray().astype(np.float64), X.toarray().astype(np.float64))
    # opt-out: as given
    q = tmp_path / "k.zarr"
    assert write_anndata(q, X, data_dtype="keep")["X/data"] == np.dtype(dtype)


def test_writer_empty_and_layers(tmp_path):
    """No values: the input dtype is kept; layers are narrowed each by its own values."""
    X = sp.csr_matrix((5, 9), dtype=np.float32)
    assert write_anndata(tmp_path / "e.zarr", X)["X/data"] == np.float32
    M = make_counts(n_obs=50, n_vars=60, seed=8, empty_rows=())
    L = M.copy()
    L.data = L.data * 1000
    chosen = write_anndata(tmp_path / "l.zarr", M, layers={"big": L, "same": M.copy()})
    assert chosen["layers/big/data"] == np.float32  # up to 249,000
    assert chosen["layers/same/data"] == np.uint8
    a = ad.read_zarr(tmp_path / "l.zarr")
    np.testing.assert_array_equal(a.layers["same"].toarray(), M.toarray())
    ds = zbatch.open(tmp_path / "l.zarr", load_layers=True)
    assert ds.fields["layers/same/data"]["dtype"] == "float32"
    assert ds.fields["layers/same/indices"]["dtype"] == "int32"


def test_writer_bytes_identical_across_threads(tmp_path):
    X = make_counts(hi=3000)
    a, b = tmp_path / "a.zarr", tmp_path / "b.zarr"
    write_anndata(a, X, num_threads=1, zarr_format=3, chunk_size=64, shard_size=256)
    write_anndata(b, X, num_threads=4, zarr_format=3, chunk_size=64, shard_size=256)
    files = sorted(q.relative_to(a) for q in a.rglob("*") if q.is_file())
    assert files == sorted(q.relative_to(b) for q in b.rglob("*") if q.is_file())
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


@pytest.mark.skipif(not ZBATCH.exists(), reason="the CLI is not built")
def test_synth_default_is_narrow_and_reads_in_anndata(tmp_path):
    """zbatch synth --kind cells: uint8 counts and uint16 gene ids by default (printed), equal
    values to the float32/int32 store of --data-dtype float32 --index-dtype int32, in anndata
    and in zbatch's batches."""
    n, w = tmp_path / "n.zarr", tmp_path / "w.zarr"
    common = ["synth", "--kind", "cells", "--n", "300", "--genes", "5000", "--seed", "9"]
    out = subprocess.run([ZBATCH, *common, "-o", n, "--threads", "3"], check=True,
                         capture_output=True, text=True).stdout
    assert ("X/data uint8 (blosc:lz4:5:noshuffle), X/indices uint16 (blosc:lz4:5:noshuffle)"
            in out)
    out = subprocess.run([ZBATCH, *common, "-o", w, "--data-dtype", "float32",
                          "--index-dtype", "int32"], check=True, capture_output=True,
                         text=True).stdout
    assert "X/data float32 (blosc:lz4:5:shuffle), X/indices int32 (blosc:lz4:5:shuffle)" in out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        an, aw = ad.read_zarr(n), ad.read_zarr(w)
    assert an.X.dtype == np.uint8 and an.X.indices.dtype == np.uint16
    assert aw.X.dtype == np.float32
    np.testing.assert_array_equal(an.X.indptr, aw.X.indptr)
    np.testing.assert_array_equal(an.X.indices, aw.X.indices)
    np.testing.assert_array_equal(an.X.data.astype(np.float32), aw.X.data)
    ids = np.random.default_rng(1).permutation(300)[:100]
    check_batch(zbatch.open(n), aw.X, ids)
    meta = json.loads((n / "X" / "data" / "zarr.json").read_text())
    assert meta["data_type"] == "uint8"
    assert blosc_shuffle(n / "X/data") == blosc_shuffle(n / "X/indices") == "noshuffle"
    assert blosc_shuffle(w / "X/data") == blosc_shuffle(w / "X/indices") == "shuffle"
    # a codec given is used as given
    e = tmp_path / "e.zarr"
    out = subprocess.run([ZBATCH, *common, "-o", e, "--codec", "blosc:lz4:5:shuffle"], check=True,
                         capture_output=True, text=True).stdout
    assert "X/data uint8 (blosc:lz4:5:shuffle), X/indices uint16 (blosc:lz4:5:shuffle)" in out
    assert blosc_shuffle(e / "X/data") == blosc_shuffle(e / "X/indices") == "shuffle"
    np.testing.assert_array_equal(zarr.open_array(str(e / "X/indices"))[:], an.X.indices)
    np.testing.assert_array_equal(zarr.open_array(str(n / "X/indices"))[:], an.X.indices)
