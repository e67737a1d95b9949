"""Blosc frames that hold a plain copy (issue 19): blosc stores a chunk it cannot compress (LZ4 on
uniformly spread uint16 gene ids, random uint8 counts) as a 16-byte header flagged
BLOSC_MEMCPYED and the bytes as they are. The reader serves such a unit straight from the fetched
bytes (widened as it copies) instead of decoding it: batches equal scipy's rows on stores that mix
plain-copy and compressed chunks, and a plain-copy frame whose header lies fails as a decoded one
does, naming the chunk."""
from __future__ import annotations

import struct
from pathlib import Path
from types import SimpleNamespace

import numcodecs
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import zarr

import zbatch
from conftest import expect_error
from test_dataset_raw import write as write_raw

N_OBS, N_VARS = 300, 62710
MEMCPYED = 0x02  # c-blosc's BLOSC_MEMCPYED header flag (byte 2)


def make_counts():
    """uint8 counts, uint16 ids: rows 100..199 repeat one gene set and one count (their chunks
    compress), the others draw ids uniformly over 62,710 genes and random counts (plain copies)."""
    rng = np.random.default_rng(19)
    same = np.sort(rng.choice(N_VARS, 40, replace=False))
    idx, dat, k = [], [], []
    for r in range(N_OBS):
        if 100 <= r < 200:
            ids, vals = same, np.full(40, 7)
        else:
            ids = np.sort(rng.choice(N_VARS, int(rng.integers(0, 41)), replace=False))
            vals = rng.integers(1, 250, len(ids))
        idx.append(ids)
        dat.append(vals)
        k.append(len(ids))
    indptr = np.concatenate([[0], np.cumsum(k)]).astype(np.int64)
    X = sp.csr_matrix((np.concatenate(dat).astype(np.float32),
                       np.concatenate(idx).astype(np.int32), indptr), shape=(N_OBS, N_VARS))
    return X, SimpleNamespace(data=X.data.astype(np.uint8), indices=X.indices.astype(np.uint16),
                              indptr=indptr, shape=X.shape)


LAYOUTS = {
    "v2": dict(fmt=2, chunks=(512,), emb_chunks=(64, 6),
               compressors=[numcodecs.Blosc(cname="lz4", clevel=5, shuffle=0)]),
    "v3": dict(fmt=3, chunks=(512,), emb_chunks=(64, 6),
               compressors=[zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="noshuffle")]),
    "v3-shard": dict(fmt=3, chunks=(512,), shards=(2048,), emb_chunks=(64, 6),
                     compressors=[zarr.codecs.BloscCodec(cname="lz4", clevel=5,
                                                         shuffle="noshuffle")]),
}


def frames(store, name, layout):
    """{chunk key: (file, offset, frame bytes)} of X/<name>'s (inner) chunks as written."""
    d = Path(store) / "X" / name
    out = {}
    if layout == "v2":
        files = [p for p in d.iterdir() if not p.name.startswith(".")]
    else:
        files = sorted((d / "c").iterdir())
    for f in files:
        b = f.read_bytes()
        if layout != "v3-shard":
            out[f.name] = (f, 0, b)
            continue
        n = 2048 // 512  # inner chunks per shard; the index: (offset, nbytes) each, no checksum
        for i in range(n):
            off, nb = struct.unpack_from("<QQ", b, len(b) - 16 * n + 16 * i)
            if off != 2**64 - 1:
                out[f"{f.name}[{i}]"] = (f, off, b[off:off + nb])
    return out


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    X, narrow = make_counts()
    obs = pd.DataFrame({"n": np.arange(N_OBS)}, index=[f"c{i}" for i in range(N_OBS)])
    emb = np.zeros((N_OBS, 6), np.float32)
    base = tmp_path_factory.mktemp("plain")
    out = {}
    for name, kw in LAYOUTS.items():
        p = write_raw(base / f"{name}.zarr", narrow, obs, emb, **kw)
        for arr in ("indices", "data"):
            flags = [fr[2][2] & MEMCPYED for fr in frames(p, arr, name).values()]
            # both kinds of frame in every array: the test reads a mixed store
            assert any(flags) and not all(flags), (name, arr, flags)
        out[name] = p
    return X, out


def ids_of():
    rng = np.random.default_rng(5)
    return {"sorted": np.sort(rng.choice(N_OBS, 90, replace=False)),
            "random": rng.permutation(N_OBS)[:150],
            "all": np.arange(N_OBS),
            "block": np.arange(40, 260)}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("kind", list(ids_of()))
@pytest.mark.parametrize("dtypes", [(None, None, np.float32, np.int32),
                                    ("stored", "stored", np.uint8, np.uint16),
                                    ("stored", "int32", np.uint8, np.int32)])
def test_plain_frames_read_equal(stores, layout, kind, dtypes, io):
    """Widened (float32 / int32) and stored (uint8 / uint16) values equal scipy's rows."""
    X, paths = stores
    x_dtype, index_dtype, want_data, want_idx = dtypes
    kw = {} if x_dtype is None else dict(x_dtype=x_dtype, index_dtype=index_dtype)
    ds = zbatch.open(paths[layout], **kw)
    ids = ids_of()[kind]
    b = ds.read_many(ids)
    want = X[ids]
    data = b._array(b._raw["fields"]["X/data"])
    indices = b._array(b._raw["fields"]["X/indices"])
    assert data.dtype == want_data and indices.dtype == want_idx
    np.testing.assert_array_equal(indices, want.indices)
    np.testing.assert_array_equal(data, want.data.astype(want_data))
    np.testing.assert_array_equal(b["X"].indptr, want.indptr)


def test_plain_frames_through_the_cache(stores):
    """Plain-copy units go into the decoded-chunk cache too: a second read served from it is
    equal."""
    X, paths = stores
    ds = zbatch.open(paths["v3"], cache_bytes=1 << 24)
    ids = ids_of()["random"]
    for _ in range(2):
        b = ds.read_many(ids)
        np.testing.assert_array_equal(b["X"].indices, X[ids].indices)
        np.testing.assert_array_equal(b["X"].data, X[ids].data)
    assert b.stats["chunks_cached"] > 0


def _plain_chunk(path, layout):
    """A plain-copy frame of X/indices: (file, offset in it, frame, its key as errors name it)."""
    for key, (f, off, fr) in frames(path, "indices", layout).items():
        if fr[2] & MEMCPYED:
            return f, off, fr, (f"indices/{f.name}" if layout == "v2" else f"indices/c/{f.name}")
    raise AssertionError("no plain-copy frame")


def _compressed_chunk(path, layout):
    for key, (f, off, fr) in frames(path, "indices", layout).items():
        if not fr[2] & MEMCPYED:
            return f, off, fr, (f"indices/{f.name}" if layout == "v2" else f"indices/c/{f.name}")
    raise AssertionError("no compressed frame")


def _patch(f, off, new):
    b = bytearray(f.read_bytes())
    b[off:off + len(new)] = new
    f.write_bytes(bytes(b))


@pytest.mark.parametrize("layout", ["v2", "v3", "v3-shard"])
@pytest.mark.parametrize("lie,status", [
    ("nbytes", "ZB_E_CORRUPT"),        # declares 2 bytes less than the chunk holds
    ("cbytes-short", "ZB_E_CORRUPT"),  # declares less than the object's length
    ("cbytes-long", "ZB_E_TRUNCATED"),  # declares more: the object was cut
    ("short", "ZB_E_CORRUPT"),         # flag set, cbytes == length, but nbytes + 16 != length
    ("flag", "ZB_E_CORRUPT"),          # a compressed frame flagged as a plain copy
])
def test_lying_plain_frame_fails_naming_the_chunk(tmp_path, stores, layout, lie, status):
    import shutil
    X, paths = stores
    p = tmp_path / "s.zarr"
    shutil.copytree(paths[layout], p)
    pick = _compressed_chunk if lie == "flag" else _plain_chunk
    f, off, fr, key = pick(p, layout)
    nbytes, cbytes = struct.unpack_from("<II", fr, 4)[0], struct.unpack_from("<I", fr, 12)[0]
    assert cbytes == len(fr) and (lie == "flag" or nbytes + 16 == len(fr))
    if lie == "nbytes":
        _patch(f, off + 4, struct.pack("<I", nbytes - 2))
    elif lie == "cbytes-short":
        _patch(f, off + 12, struct.pack("<I", cbytes - 2))
    elif lie == "cbytes-long":
        _patch(f, off + 12, struct.pack("<I", cbytes + 100))
    elif lie == "flag":
        _patch(f, off + 2, bytes([fr[2] | MEMCPYED]))
    else:  # the same frame two bytes shorter, its cbytes saying so
        if layout == "v3-shard":
            pytest.skip("an inner chunk's length is its index entry's: covered by 'cbytes-short'")
        f.write_bytes(fr[:12] + struct.pack("<I", len(fr) - 2) + fr[16:-2])
    ds = zbatch.open(p, x_dtype="stored", index_dtype="int32")
    with expect_error(status, key):
        ds.read_many(np.arange(N_OBS))
