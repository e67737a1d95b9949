"""The reader's raw path: arrays stored uncompressed (bytes codec in native order, no
bytes->bytes codec, no transpose) are read row range by row range straight from their objects,
without reading or decoding whole chunks — from mapped files (store views), or with pread when
views are off (ZBATCH_MMAP_BYTES=0); both are run. Oracles: scipy/numpy arrays the stores were written
from by zarr-python 3.1 and anndata; arrays that are uncompressed but not raw (big-endian,
F order, crc32c on the inner chunks, 2-D chunks split along the columns) go through the general
path and must agree too.
"""
from __future__ import annotations

import os
import warnings

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec

from conftest import zbatch_api

N_OBS, N_VARS = 300, 41


def make_source():
    rng = np.random.default_rng(11)
    counts = rng.integers(0, 15, N_OBS)
    counts[[0, 33, 34, N_OBS - 1]] = 0
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    indices = np.concatenate([np.sort(rng.choice(N_VARS, c, replace=False)) for c in counts])
    data = rng.integers(1, 1000, indptr[-1]).astype(np.float32)
    X = sp.csr_matrix((data, indices.astype(np.int32), indptr), shape=(N_OBS, N_VARS))
    i = np.arange(N_OBS)
    zeros = np.where(i < 64, 0, i).astype(np.int32)  # leading all-fill chunks: not stored
    obs = pd.DataFrame({"n": counts.astype(np.int64) + 1, "z": zeros,
                        "score": rng.standard_normal(N_OBS)},
                       index=[f"c{k}" for k in i])
    emb = rng.standard_normal((N_OBS, 6)).astype(np.float32)
    return X, obs, emb


def write(path, X, obs, emb, *, fmt, chunks, shards=None, emb_chunks, serializer="auto",
          compressors=None, order=None, index_location="end"):
    root = zarr.open_group(str(path), mode="w", zarr_format=fmt)
    root.attrs.update({"encoding-type": "anndata", "encoding-version": "0.1.0"})
    kw = {"compressors": compressors, "config": {"write_empty_chunks": False}}
    if fmt == 3:
        kw["serializer"] = serializer
    if order is not None:
        kw["config"]["order"] = order
    g = root.create_group("X", attributes={"encoding-type": "csr_matrix",
                                           "encoding-version": "0.1.0",
                                           "shape": list(X.shape)})
    if shards and fmt == 3:
        from zarr.codecs import ShardingCodec
        inner = [serializer if serializer != "auto" else BytesCodec()]
        if compressors:
            inner += list(compressors)
        # an index without a checksum (so a test can corrupt an entry)
        codec = ShardingCodec(chunk_shape=chunks, codecs=inner, index_location=index_location,
                              index_codecs=[BytesCodec()])
        for name, arr in (("data", X.data), ("indices", X.indices)):
            g.create_array(name, shape=arr.shape, dtype=arr.dtype, chunks=shards,
                           serializer=codec, compressors=None,
                           config={"write_empty_chunks": False})[:] = arr
    else:
        g.create_array("data", data=X.data, chunks=chunks, **kw)
        g.create_array("indices", data=X.indices, chunks=chunks, **kw)
    g.create_array("indptr", data=X.indptr, chunks=(128,), compressors=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # strings need their own serializer: obs takes the layout's codecs but not its
        # serializer
        okw = {k: v for k, v in kw.items() if k != "serializer"}
        ad.io.write_elem(root, "obs", obs, dataset_kwargs={"chunks": (32,), **okw})
    ad.io.write_elem(root, "var", pd.DataFrame(index=[f"g{j}" for j in range(X.shape[1])]))
    obsm = root.create_group("obsm", attributes={"encoding-type": "dict",
                                                 "encoding-version": "0.1.0"})
    obsm.create_array("emb", data=emb, chunks=emb_chunks,
                      attributes={"encoding-type": "array", "encoding-version": "0.2.0"}, **kw)
    return path


LAYOUTS = {  # name: (write arguments, whether X and obsm/emb take the raw path)
    "v2_raw": (dict(fmt=2, chunks=(70,), emb_chunks=(40, 6)), True),
    "v3_raw": (dict(fmt=3, chunks=(64,), emb_chunks=(50, 6)), True),
    "v3_raw_sharded": (dict(fmt=3, chunks=(40,), shards=(160,), emb_chunks=(50, 6)), True),
    "v3_raw_sharded_start": (dict(fmt=3, chunks=(40,), shards=(160,), emb_chunks=(50, 6),
                                  index_location="start"), True),
    "v3_raw_emb_cols": (dict(fmt=3, chunks=(64,), emb_chunks=(50, 4)), True),  # emb: general
    "v3_big_endian": (dict(fmt=3, chunks=(64,), emb_chunks=(50, 6),
                           serializer=BytesCodec(endian="big")), False),
    "v2_order_f": (dict(fmt=2, chunks=(70,), emb_chunks=(40, 6), order="F"), False),
    "v3_sharded_crc": (dict(fmt=3, chunks=(40,), shards=(160,), emb_chunks=(50, 6),
                            compressors=[Crc32cCodec()]), False),
}


@pytest.fixture(scope="module")
def source():
    return make_source()


@pytest.fixture(scope="module")
def stores(source, tmp_path_factory):
    X, obs, emb = source
    base = tmp_path_factory.mktemp("raw")
    return {name: write(base / f"{name}.zarr", X, obs, emb, **kw)
            for name, (kw, _raw) in LAYOUTS.items()}


def requests():
    rng = np.random.default_rng(5)
    return {
        "sorted": np.sort(rng.choice(N_OBS, 40, replace=False)),
        "shuffled": rng.permutation(N_OBS)[:90],
        "duplicates": np.array([20, 5, 5, 20, 299, 0, 33, 34, 100, 100, 101, 5]),
        "single": np.array([150]),
        "empties": np.array([33, 34, 0]),
        "fill_only": np.array([3, 40, 63, 2]),  # obs/z rows that lie in unstored chunks
        "all": np.arange(N_OBS),
        "reversed": np.arange(N_OBS)[::-1].copy(),
    }


def check_batch(b, X, obs, emb, ids):
    got = b["X"]
    assert sp.issparse(got)
    want = X[ids]
    np.testing.assert_array_equal(got.indptr, want.indptr)
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_array_equal(got.data, want.data)
    for col in ("n", "z", "score"):
        np.testing.assert_array_equal(b[f"obs/{col}"], obs[col].to_numpy()[ids], err_msg=col)
    np.testing.assert_array_equal(b["obsm/emb"], emb[ids])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_values_match_the_source(stores, source, name, threads, io):
    zb = zbatch_api()
    X, obs, emb = source
    ds = zb.open(stores[name], num_threads=threads)
    for label, ids in requests().items():
        b = ds.read_many(ids)
        check_batch(b, X, obs, emb, ids)
        # fill-only rows: the leading chunks of obs/z were never written
        if label == "fill_only":
            assert b.stats["chunks_filled"] >= 1, label


def delivered_bytes(X, ids):
    nnz = int(sum(X.indptr[i + 1] - X.indptr[i] for i in ids))
    # X/data f4 + X/indices i4 per nonzero; obs n i8, z i4, score f8; emb 6 x f4 per sample
    return nnz * 8 + len(ids) * (8 + 4 + 8 + 6 * 4)


@pytest.mark.parametrize("name", [n for n, (_kw, raw) in LAYOUTS.items() if raw
                                  and n != "v3_raw_emb_cols"])
def test_raw_reads_only_what_it_delivers(stores, source, name, io):
    """A whole, in-order request over a raw store reads exactly the bytes it delivers (one
    range per run of rows, never a whole chunk beyond the rows)."""
    zb = zbatch_api()
    X, _obs, _emb = source
    ds = zb.open(stores[name])
    ids = np.arange(N_OBS)
    st = ds.read_many(ids).stats
    # obs/z's first two chunks are fill: delivered, never read
    fill = 64 * 4
    assert st["bytes_delivered"] == delivered_bytes(X, ids)
    assert st["bytes_decoded"] == st["bytes_delivered"] - fill
    # a sparse request reads less than the chunks it touches
    sparse_ids = np.arange(0, N_OBS, 37)
    st = ds.read_many(sparse_ids).stats
    assert st["bytes_delivered"] == delivered_bytes(X, sparse_ids)
    assert st["bytes_decoded"] >= st["bytes_delivered"] - fill


def test_general_path_still_decodes_whole_units(stores, source):
    """Big-endian bytes are not raw: whole chunks are read and swapped."""
    zb = zbatch_api()
    X, _obs, _emb = source
    ds = zb.open(stores["v3_big_endian"])
    st = ds.read_many(np.array([1])).stats
    assert st["bytes_decoded"] > st["bytes_delivered"]


def _chunk_file(path, arr, k):
    fmt = zarr.open_array(str(path / arr), mode="r").metadata.zarr_format
    return path / arr / (str(k) if fmt == 2 else f"c/{k}")


def test_truncated_raw_chunk_is_an_error(tmp_path, source, io):
    zb = zbatch_api()
    X, obs, emb = source
    p = write(tmp_path / "t.zarr", X, obs, emb, fmt=3, chunks=(64,), emb_chunks=(50, 6))
    f = _chunk_file(p, "X/data", 1)
    with open(f, "r+b") as fh:
        fh.truncate(os.path.getsize(f) // 2)
    ds = zb.open(p)
    # rows with nonzeros in the lost half of chunk 1 of X/data (elements [96, 128))
    ids = [i for i in range(N_OBS) if X.indptr[i + 1] > 96 and X.indptr[i] < 128
           and X.indptr[i + 1] > X.indptr[i]]
    assert ids
    with pytest.raises(zb.ZbatchError) as e:
        ds.read_many(np.array(ids[-1:]))
    msg = str(e.value)
    assert "X/data/c/1" in msg and "offset" in msg


def test_truncated_raw_shard_is_an_error(tmp_path, source, io):
    zb = zbatch_api()
    X, obs, emb = source
    p = write(tmp_path / "s.zarr", X, obs, emb, fmt=3, chunks=(40,), shards=(160,),
              emb_chunks=(50, 6), index_location="start")
    f = _chunk_file(p, "X/data", 0)
    with open(f, "r+b") as fh:
        fh.truncate(os.path.getsize(f) - 40)  # the last inner chunk loses its tail
    ds = zb.open(p)
    last = [i for i in range(N_OBS) if X.indptr[i] < 160 <= X.indptr[i + 1]
            or (120 <= X.indptr[i] < 160 and X.indptr[i + 1] > X.indptr[i])]
    with pytest.raises(zb.ZbatchError) as e:
        ds.read_many(np.array(last[-1:]))
    assert "X/data/c/0" in str(e.value)


def test_wrong_inner_chunk_size_is_an_error(tmp_path, source, io):
    """An index entry whose length is not the unit's size: corrupt, named, never read as
    rows."""
    zb = zbatch_api()
    X, obs, emb = source
    p = write(tmp_path / "w.zarr", X, obs, emb, fmt=3, chunks=(40,), shards=(160,),
              emb_chunks=(50, 6), index_location="start")
    f = _chunk_file(p, "X/indices", 0)
    raw = bytearray(f.read_bytes())
    # index at the start: (offset, nbytes) little-endian uint64 pairs, 4 inner chunks
    n0 = int.from_bytes(raw[8:16], "little")
    assert n0 == 40 * 4
    raw[8:16] = (n0 - 4).to_bytes(8, "little")
    f.write_bytes(bytes(raw))
    ds = zb.open(p)
    with pytest.raises(zb.ZbatchError) as e:
        ds.read_many(np.array([1, 2]))
    msg = str(e.value)
    assert "X/indices/c/0" in msg and "expected 160" in msg
