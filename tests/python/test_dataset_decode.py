"""Decode counting of the coalesced reader (DESIGN §3): a request decodes every chunk (or shard
inner chunk) it touches exactly once; a repeat with the decoded-chunk cache on decodes none; the
thread count never changes a batch.

The expected counts are computed here from the array metadata that zarr-python reports (chunk and
inner-chunk shapes) and from X/indptr, independently of zbatch: a sample touches the chunks of
X/data and X/indices that hold [indptr[i], indptr[i+1]) and the chunk of each obs/obsm array that
holds its row (times the column chunks of a 2-D array).
"""
from __future__ import annotations

import math
import warnings

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import zarr

from conftest import zbatch_api

N_OBS, N_VARS = 230, 37


def make_adata():
    rng = np.random.default_rng(7)
    counts = rng.integers(0, 12, N_OBS)
    counts[[0, 17, 18, 19, N_OBS - 1]] = 0  # empty samples
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    indices = np.concatenate([np.sort(rng.choice(N_VARS, c, replace=False)) for c in counts])
    data = rng.integers(1, 500, indptr[-1]).astype(np.float32)  # never the fill value 0
    X = sp.csr_matrix((data, indices.astype(np.int32), indptr), shape=(N_OBS, N_VARS))
    i = np.arange(N_OBS)
    # every column is free of all-fill chunks, so each touched chunk is stored and decoded
    obs = pd.DataFrame(
        {"cell_type": pd.Categorical.from_codes((i * 7 + 3) % 5, list("abcde")),
         "n_counts": counts.astype(np.int32) + 1,
         "score": rng.standard_normal(N_OBS) + 10.0,
         "flag": i % 3 == 0},
        index=[f"c{k}" for k in i])
    emb = rng.standard_normal((N_OBS, 5)).astype(np.float32) + 5.0
    return X, obs, emb


def write_store(path, X, obs, emb, *, fmt, data_chunks, indices_chunks, obs_chunks,
                emb_chunks, data_shards=None, indices_shards=None, obs_shards=None,
                dense_chunks=None, dense_shards=None):
    """An anndata-shaped tree: X written with zarr.create_array (so data and indices can have
    different grids, as annbatch stores do), obs and var through anndata.io.write_elem."""
    root = zarr.open_group(str(path), mode="w", zarr_format=fmt)
    root.attrs.update({"encoding-type": "anndata", "encoding-version": "0.1.0"})
    cfg = {"write_empty_chunks": True}
    if dense_chunks is not None:
        root.create_array("X", data=X.toarray(), chunks=dense_chunks, shards=dense_shards,
                          config=cfg, attributes={"encoding-type": "array",
                                                  "encoding-version": "0.2.0"})
    else:
        g = root.create_group("X", attributes={"encoding-type": "csr_matrix",
                                               "encoding-version": "0.1.0",
                                               "shape": list(X.shape)})
        g.create_array("data", data=X.data, chunks=data_chunks, shards=data_shards, config=cfg)
        g.create_array("indices", data=X.indices, chunks=indices_chunks, shards=indices_shards,
                       config=cfg)
        g.create_array("indptr", data=X.indptr, chunks=(64,), config=cfg)
    kw = {"chunks": obs_chunks, "config": cfg}
    if obs_shards is not None:
        kw["shards"] = obs_shards
    ad.io.write_elem(root, "obs", obs, dataset_kwargs=kw)
    ad.io.write_elem(root, "var", pd.DataFrame(index=[f"g{j}" for j in range(X.shape[1])]))
    obsm = root.create_group("obsm", attributes={"encoding-type": "dict",
                                                 "encoding-version": "0.1.0"})
    obsm.create_array("emb", data=emb, chunks=emb_chunks, config=cfg,
                      attributes={"encoding-type": "array", "encoding-version": "0.2.0"})
    return path


LAYOUTS = {
    "v2_plain": dict(fmt=2, data_chunks=(50,), indices_chunks=(70,), obs_chunks=(16,),
                     emb_chunks=(40, 2)),
    "v3_plain": dict(fmt=3, data_chunks=(64,), indices_chunks=(40,), obs_chunks=(25,),
                     emb_chunks=(30, 5)),
    "v3_sharded": dict(fmt=3, data_chunks=(32,), data_shards=(128,), indices_chunks=(48,),
                       indices_shards=(192,), obs_chunks=(10,), obs_shards=(40,),
                       emb_chunks=(64, 3)),
    "v3_dense_sharded": dict(fmt=3, data_chunks=None, indices_chunks=None, obs_chunks=(30,),
                             emb_chunks=(50, 5), dense_chunks=(24, 16),
                             dense_shards=(48, 48)),
    # shards split along the columns: the reader's row-range path
    "v3_dense_shard_cols": dict(fmt=3, data_chunks=None, indices_chunks=None, obs_chunks=(30,),
                                emb_chunks=(50, 5), dense_chunks=(24, 8), dense_shards=(48, 16)),
}
# Layouts whose X goes through the decoded-chunk cache (the row-range path does not use it).
CACHED = [name for name in LAYOUTS if name != "v3_dense_shard_cols"]


@pytest.fixture(scope="module")
def source():
    return make_adata()


@pytest.fixture(scope="module")
def stores(source, tmp_path_factory):
    X, obs, emb = source
    base = tmp_path_factory.mktemp("decode")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {name: write_store(base / f"{name}.zarr", X, obs, emb, **kw)
                for name, kw in LAYOUTS.items()}


def field_array(group, name):
    """The zarr array behind a zbatch field name (categoricals: their codes)."""
    node = group[name]
    return node if isinstance(node, zarr.Array) else group[f"{name}/codes"]


def touched_units(path, ds, indptr, ids):
    """The set of (field, unit) pairs a request touches, from zarr-python's metadata."""
    g = zarr.open_group(str(path), mode="r")
    units = set()
    for name, info in ds.fields.items():
        arr = field_array(g, name)
        inner = arr.chunks  # for a sharded array: the inner chunk shape
        other = math.prod(math.ceil(s / c) for s, c in zip(arr.shape[1:], inner[1:]))
        rows = set()
        for i in ids:
            if info["kind"] == "per_sample":
                rows.add(int(i) // inner[0])
            else:
                a, b = int(indptr[i]), int(indptr[i + 1])
                if b > a:
                    rows.update(range(a // inner[0], (b - 1) // inner[0] + 1))
        units.update((name, r, k) for r in rows for k in range(other))
    return units


def delivered_bytes(ds, indptr, ids):
    total = 0
    nnz = int(sum(indptr[i + 1] - indptr[i] for i in ids))
    for info in ds.fields.values():
        row = np.dtype(info["dtype"]).itemsize * math.prod(info["row_shape"])
        total += row * (len(ids) if info["kind"] == "per_sample" else nnz)
    return total


def requests():
    rng = np.random.default_rng(3)
    return {
        "sorted": np.sort(rng.choice(N_OBS, 30, replace=False)),
        "shuffled": rng.permutation(N_OBS)[:50],
        "duplicates": np.array([20, 5, 5, 20, 229, 0, 17, 18, 100, 100, 101]),
        "single": np.array([121]),
        "empties": np.array([17, 18, 19]),
        "all": np.arange(N_OBS),
    }


def batch_arrays(b):
    """Every array of a batch, X split into its CSR parts."""
    out = {}
    for k, v in b.items():
        if sp.issparse(v):
            out[k + ".indptr"], out[k + ".indices"], out[k + ".data"] = v.indptr, v.indices, v.data
        else:
            out[k] = np.asarray(v)
    return out


def assert_same_batch(a, b):
    xa, xb = batch_arrays(a), batch_arrays(b)
    assert xa.keys() == xb.keys()
    for k in xa:
        assert xa[k].dtype == xb[k].dtype, k
        np.testing.assert_array_equal(xa[k], xb[k], err_msg=k)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_each_touched_chunk_decoded_once(stores, source, name):
    zb = zbatch_api()
    X, obs, emb = source
    ds = zb.open(stores[name])
    for label, ids in requests().items():
        b = ds.read_many(ids)
        want = touched_units(stores[name], ds, X.indptr, ids)
        assert b.stats["chunks_decoded"] == len(want), label
        assert b.stats["chunks_cached"] == 0
        assert b.stats["chunks_filled"] == 0
        assert b.stats["bytes_delivered"] == delivered_bytes(ds, X.indptr, ids), label
        assert b.stats["bytes_fetched"] > 0 and b.stats["range_reads"] > 0
        # the batch itself is right
        got_x = b["X"] if isinstance(b["X"], np.ndarray) else b["X"].toarray()
        np.testing.assert_array_equal(got_x, X[ids].toarray())
        np.testing.assert_array_equal(b["obs/n_counts"], obs["n_counts"].to_numpy()[ids])
        np.testing.assert_array_equal(b["obsm/emb"], emb[ids])


@pytest.mark.parametrize("name", CACHED)
def test_cache_serves_repeats(stores, source, name):
    zb = zbatch_api()
    X, _obs, _emb = source
    ds = zb.open(stores[name], cache_bytes=64 << 20)
    reqs = requests()
    first = reqs["shuffled"]
    units = touched_units(stores[name], ds, X.indptr, first)
    b1 = ds.read_many(first)
    assert b1.stats["chunks_decoded"] == len(units)
    assert b1.stats["chunks_cached"] == 0
    b2 = ds.read_many(first)
    assert b2.stats["chunks_decoded"] == 0
    assert b2.stats["chunks_cached"] == len(units)
    assert b2.stats["bytes_fetched"] == 0 and b2.stats["range_reads"] == 0
    assert b2.stats["bytes_delivered"] == b1.stats["bytes_delivered"]
    assert_same_batch(b1, b2)
    # a second request decodes only what the first left out
    second = reqs["sorted"]
    more = touched_units(stores[name], ds, X.indptr, second)
    b3 = ds.read_many(second)
    assert b3.stats["chunks_decoded"] == len(more - units)
    assert b3.stats["chunks_cached"] == len(more & units)
    assert_same_batch(b3, zb.open(stores[name]).read_many(second))


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_two_threads_same_batches(stores, name):
    zb = zbatch_api()
    one = zb.open(stores[name], num_threads=1)
    two = zb.open(stores[name], num_threads=2)
    for label, ids in requests().items():
        a, b = one.read_many(ids), two.read_many(ids)
        assert_same_batch(a, b)
        assert a.stats["chunks_decoded"] == b.stats["chunks_decoded"], label
        assert a.stats["bytes_delivered"] == b.stats["bytes_delivered"]


# Rows of every width the reader copies with a fixed-size move (1 to 64 bytes) and some it
# does not, from decoded units of a power-of-two size (shift and mask) and of other sizes
# (division), plain and sharded; requested shuffled, with duplicates and runs that cross unit
# bounds. Oracle: the numpy arrays the store was written from.
ROW_FIELDS = {
    "b1": ("uint8", ()), "b2": ("int16", ()), "b4": ("float32", ()), "b8": ("int64", ()),
    "b12": ("float32", (3,)), "b16": ("int32", (4,)), "b20": ("float32", (5,)),
    "b24": ("float64", (3,)), "b32": ("int16", (16,)), "b48": ("float32", (12,)),
    "b64": ("float32", (16,)), "b72": ("float64", (9,)),
}


@pytest.mark.parametrize("chunks,shards", [(16, None), (7, None), (8, 32), (6, 24)])
def test_rows_of_every_width_from_decoded_units(tmp_path, chunks, shards):
    n = 203
    rng = np.random.default_rng(5)
    root = zarr.open_group(str(tmp_path / "w.zarr"), mode="w", zarr_format=3)
    arrays = {}
    for name, (dtype, shape) in ROW_FIELDS.items():
        a = rng.integers(1, 120, (n, *shape)).astype(dtype)
        arrays[name] = a
        root.create_array(name, data=a, chunks=(chunks, *shape),
                          shards=None if shards is None else (shards, *shape),
                          compressors=zarr.codecs.ZstdCodec(level=1))
    root.attrs["zbatch"] = {"fields": {k: {"array": k, "kind": "per_sample"}
                                       for k in ROW_FIELDS}}
    ds = zbatch_api().open(str(tmp_path / "w.zarr"))
    requests = [rng.permutation(n), np.arange(n), np.array([5, 5, 6, 7, 8, 9, 200, 0, 1]),
                np.concatenate([np.arange(30, 70), rng.permutation(n)[:40]])]
    for ids in requests:
        b = ds.read_many(ids)
        for name, a in arrays.items():
            np.testing.assert_array_equal(np.asarray(b[name]), a[ids], err_msg=name)


# A request whose batch outgrows the cache (util/stream.h ZB_STREAM_MIN_BATCH_BYTES, 8 MiB) has
# its row copies streamed past the cache: lines start at every offset modulo 64 and have every
# length around the streamed minimum (256 bytes) and the 64-byte line, from decoded units
# (plain, sharded, units of a size that is not a power of two) and from uncompressed chunks
# read in place. Oracle: scipy's rows of the matrix the store was written from.
@pytest.mark.parametrize("chunks,shards,codec", [(4096, None, "zstd"), (1000, 8000, "zstd"),
                                                 (65536, None, None)])
def test_large_csr_batches_are_exact(tmp_path, chunks, shards, codec):
    n_obs, n_vars = 1600, 50000
    rng = np.random.default_rng(11)
    # lengths 0..4000 with many just around 16, 64 and 256 bytes' worth of float32
    counts = np.concatenate([rng.integers(0, 4000, n_obs - 400),
                             rng.integers(60, 70, 200), rng.integers(0, 20, 200)])
    rng.shuffle(counts)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    nnz = int(indptr[-1])
    assert nnz * 8 > 2 * (8 << 20)  # data + indices of one request of all cells: streamed
    indices = rng.integers(0, n_vars, nnz).astype(np.int32)
    data = (rng.random(nnz, dtype=np.float32) + 1.0).astype(np.float32)
    X = sp.csr_matrix((data, indices, indptr), shape=(n_obs, n_vars))
    root = zarr.open_group(str(tmp_path / "big.zarr"), mode="w", zarr_format=3)
    root.attrs.update({"encoding-type": "anndata", "encoding-version": "0.1.0"})
    g = root.create_group("X", attributes={"encoding-type": "csr_matrix",
                                           "encoding-version": "0.1.0", "shape": [n_obs, n_vars]})
    comp = zarr.codecs.ZstdCodec(level=1) if codec else None
    for name, arr in (("data", data), ("indices", indices)):
        g.create_array(name, data=arr, chunks=(chunks,), shards=None if shards is None else
                       (shards,), compressors=comp)
    g.create_array("indptr", data=indptr, chunks=(4096,))
    ad.io.write_elem(root, "obs", pd.DataFrame(index=[f"c{k}" for k in range(n_obs)]))
    ad.io.write_elem(root, "var", pd.DataFrame(index=[f"g{j}" for j in range(n_vars)]))
    ds = zbatch_api().open(str(tmp_path / "big.zarr"), num_threads=2)
    for ids in (rng.permutation(n_obs), np.arange(n_obs)[::-1], rng.permutation(n_obs)[:900]):
        got = ds.read_many(ids)["X"]
        want = X[ids]
        np.testing.assert_array_equal(got.indptr, want.indptr)
        np.testing.assert_array_equal(got.indices, want.indices)
        np.testing.assert_array_equal(got.data, want.data)


# Index fields (neighbour lists) are re-based by the read tasks as their rows land in the batch,
# on every reader path: units of whole rows (plain, sharded), column units of a [E, 2] array
# (each task shifts its column), uncompressed units read in place (mapped views and pread), and
# shards split along the columns (read by row bands). Stored store-global and sample-local,
# int64 and int32; and a [E, 2, 1] field in units of one column (re-based after the tasks, by
# the serial pass). Oracle: the batch computed here from the numpy source (local atom k ->
# batch row of the sample's first atom + k); and one value outside its sample is an error
# naming the sample and the value.
INDEX_LAYOUTS = {
    "rows": dict(chunks=(6, 2), shards=None, zstd=True),
    "rows_sharded": dict(chunks=(4, 2), shards=(16, 2), zstd=True),
    "columns": dict(chunks=(5, 1), shards=None, zstd=True),
    "columns_sharded": dict(chunks=(4, 1), shards=(16, 1), zstd=True),
    "raw": dict(chunks=(7, 2), shards=None, zstd=False),
    "raw_sharded": dict(chunks=(4, 2), shards=(12, 2), zstd=False),
    "3d_columns": dict(chunks=(5, 1, 1), shards=None, zstd=True),
}


def write_index_store(path, atoms, nbr_local, *, chunks, shards, zstd, dtype, glob,
                      corrupt=None):
    aptr = np.concatenate([[0], np.cumsum(atoms)]).astype(np.int64)
    eptr = aptr.copy()  # one edge per atom: k -> (k + 1) % count
    nbr = nbr_local.copy()
    if glob:
        nbr += np.repeat(aptr[:-1], atoms)[:, None]
    if corrupt is not None:
        at, value = corrupt
        nbr[at] = value
    root = zarr.open_group(str(path), mode="w", zarr_format=3)
    comp = zarr.codecs.ZstdCodec(level=1) if zstd else None
    root.create_array("aptr", data=aptr, chunks=(8,))
    root.create_array("eptr", data=eptr, chunks=(8,))
    root.create_array("pos", data=np.arange(aptr[-1], dtype=np.float32), chunks=(16,))
    if len(chunks) == 3:
        nbr = nbr[:, :, None]
    root.create_array("nbr", data=nbr.astype(dtype), chunks=chunks, shards=shards,
                      compressors=comp)
    root.attrs["zbatch"] = {
        "segments": {"atoms": "aptr", "edges": "eptr"},
        "fields": {"pos": {"array": "pos", "kind": "ragged", "segment": "atoms"},
                   "nbr": {"array": "nbr", "kind": "index", "segment": "edges",
                           "target": "atoms", "global": glob}}}
    return aptr


def want_nbr(atoms, ids):
    """The batch's neighbour list, by hand: local atom k -> (k + 1) % count, plus the sample's
    first atom row in the batch."""
    counts = atoms[np.asarray(ids)]
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return np.concatenate([np.stack([np.arange(c), (np.arange(c) + 1) % c], 1) + f
                           for c, f in zip(counts, first) if c])


@pytest.mark.parametrize("mmap", [True, False])
@pytest.mark.parametrize("layout", list(INDEX_LAYOUTS))
def test_index_fields_rebased_on_every_path(tmp_path, monkeypatch, layout, mmap):
    if not mmap:
        monkeypatch.setenv("ZBATCH_MMAP_BYTES", "0")
    rng = np.random.default_rng(3)
    n = 40
    atoms = rng.integers(0, 6, n)
    atoms[[0, 17, n - 1]] = 0  # empty samples
    atoms[9] = 4  # the sample corrupted below
    nbr_local = np.concatenate([np.stack([np.arange(c), (np.arange(c) + 1) % c], 1)
                                for c in atoms if c] or [np.zeros((0, 2))]).astype(np.int64)
    ids = np.concatenate([rng.permutation(n), [5, 5, 6, 7, 8, 9, 3]])
    want = want_nbr(atoms, ids)
    zb = zbatch_api()
    for dtype in ("int64", "int32"):
        for glob in (True, False):
            p = tmp_path / f"{layout}-{dtype}-{glob}.zarr"
            aptr = write_index_store(p, atoms, nbr_local, dtype=dtype, glob=glob,
                                     **INDEX_LAYOUTS[layout])
            b = zb.open(str(p)).read_many(ids)
            got = np.asarray(b["nbr"])
            assert got.dtype == np.dtype(dtype)
            if layout.startswith("3d"):
                assert got.shape[2:] == (1,)
                got = got[:, :, 0]
            np.testing.assert_array_equal(got, want, err_msg=f"{dtype} global={glob}")
            np.testing.assert_array_equal(
                np.asarray(b["pos"]), np.concatenate([np.arange(aptr[i], aptr[i + 1])
                                                      for i in ids]).astype(np.float32))
            # sample 9's second edge points one atom past its last (column 1), then its
            # first edge one atom before its first (column 0)
            k9 = int(aptr[9])
            for at, local in (((k9 + 1, 1), int(atoms[9])), ((k9, 0), -1)):
                q = tmp_path / f"bad-{layout}-{dtype}-{glob}-{local}.zarr"
                write_index_store(q, atoms, nbr_local, dtype=dtype, glob=glob,
                                  corrupt=(at, local + (k9 if glob else 0)),
                                  **INDEX_LAYOUTS[layout])
                ds = zb.open(str(q))
                pos9 = "|".join(str(k) for k in np.flatnonzero(ids == 9))  # 9 is there twice
                with pytest.raises(zb.ZbatchError,
                                   match=rf"sample 9 \(row ({pos9}) of the request\): field nbr: "
                                         rf"value {local} is outside "
                                         rf"its {atoms[9]} atoms"):
                    ds.read_many(ids)
                rest = [i for i in range(n) if i != 9]  # the other samples read as before
                got = np.asarray(ds.read_many(rest)["nbr"])
                if layout.startswith("3d"):
                    got = got[:, :, 0]
                np.testing.assert_array_equal(got, want_nbr(atoms, rest))


def test_index_field_of_another_type_is_an_error(tmp_path):
    """Index values must be int32 or int64: a store with an int16 neighbour list is refused when
    opened, with an error naming the field and its type (never read as 4-byte values)."""
    atoms = np.array([2, 3, 1])
    nbr_local = np.concatenate([np.stack([np.arange(c), (np.arange(c) + 1) % c], 1)
                                for c in atoms]).astype(np.int64)
    p = tmp_path / "i16.zarr"
    write_index_store(p, atoms, nbr_local, dtype="int16", glob=True, **INDEX_LAYOUTS["rows"])
    zb = zbatch_api()
    with pytest.raises(zb.ZbatchError,
                       match=r"nbr: index fields must be int32 or int64 \(nbr is int16\)"):
        zb.open(str(p))
