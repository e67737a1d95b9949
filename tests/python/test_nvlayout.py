"""Reading nvalchemi's own store layout fast (issue 20's performance on nvalchemi's layout):
decoded units served from the cache in place (pinned, not copied), whatever the cache's size.

The oracle is nvalchemi-toolkit 0.2.0's own reader and ``Batch.from_data_list``
(``test_nvbatch.nv_batch``) over a store written by its ``AtomicDataZarrWriter``, soft deletes
included, whose 2-D arrays are then re-chunked by zarr-python into column chunks of 7 rows
(``[7, 1]``): the shape zarr's automatic chunking gives nvalchemi's large stores
(``[313896, 1]`` for ``neighbor_list``), in miniature.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import zarr

from conftest import expect_error, zbatch_api
from test_dataset_atomic import DELETED, make_structures
from test_nvbatch import assert_same_batch, nv_batch

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from nvalchemi.data.datapipes import AtomicDataZarrWriter

IDS = [16, 0, 3, 9, 6, 1, 12, 2, 3, 3, 15]


@pytest.fixture(scope="module")
def nv_store(tmp_path_factory):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        structures = make_structures()
        path = str(tmp_path_factory.mktemp("nvlayout") / "nv.zarr")
        w = AtomicDataZarrWriter(path, config={"core": {"chunk_size": 7}})
        w.write(structures)
        w.delete(DELETED)
        root = zarr.open_group(path, mode="r+")
        for name in list(root["core"].array_keys()):
            a = root["core"][name]
            if a.ndim != 2:
                continue
            data, attrs, codecs = a[:], dict(a.attrs), a.compressors
            del root["core"][name]
            b = root["core"].create_array(name, shape=data.shape, dtype=data.dtype,
                                          chunks=(7, 1), compressors=codecs)
            b[:] = data
            b.attrs.update(attrs)
    return path


# the whole store; a few dozen units, so units are evicted while requests still pin them
@pytest.mark.parametrize("cache_bytes", [64 << 20, 1500])
@pytest.mark.parametrize("threads", [1, 2])
def test_cached_column_chunks_equal_nvalchemis_batch(nv_store, cache_bytes, threads):
    zb = zbatch_api()
    ds = zb.open(nv_store, cache_bytes=cache_bytes, num_threads=threads)
    decoded = cached = 0
    for ids in [IDS, [3, 0], [3, 0, 3], IDS, [9], IDS]:
        assert_same_batch(ds.read_many(ids, output="nvalchemi"), nv_batch(nv_store, ids), ids)
        stats = ds.read_many(ids).stats
        decoded += stats["chunks_decoded"]
        cached += stats["chunks_cached"]
    assert cached > 0
    if cache_bytes > 1 << 20:
        assert decoded == 0   # every unit was decoded by the first nvalchemi read
    else:
        assert decoded > 0

def test_cached_loader_epochs_equal_uncached(nv_store):
    """The size-aware pipeline over a cache: every epoch's batches equal the uncached ones."""
    zb = zbatch_api()

    def epochs(cache_bytes):
        ds = zb.open(nv_store, cache_bytes=cache_bytes, num_threads=2)
        s = zb.samplers.SizeAwareSampler(ds, max_atoms=60, max_batch_size=4, seed=3)
        ld = zb.DataLoader(ds, sampler=s, prefetch_factor=3)
        out = []
        for e in range(2):
            ld.set_epoch(e)
            out.append([{k: np.array(v) for k, v in b.items()} for b in ld])
        return out

    plain, cached = epochs(0), epochs(64 << 20)
    assert len(plain[0]) > 3
    for ep, (a, b) in enumerate(zip(plain, cached)):
        assert len(a) == len(b)
        for i, (x, y) in enumerate(zip(a, b)):
            assert set(x) == set(y)
            for k in x:
                np.testing.assert_array_equal(x[k], y[k], err_msg=f"epoch {ep} batch {i} {k}")


def test_chunk_aware_size_aware_sampler(nv_store):
    """block_size: windows of whole blocks of consecutive ids, limits kept, each id once, and
    the loader's batches equal read_many of the sampler's ids."""
    zb = zbatch_api()
    ds = zb.open(nv_store)
    n, k = len(ds), 3
    atoms = ds.segment_lengths("atoms")
    s = zb.samplers.SizeAwareSampler(ds, max_atoms=40, max_batch_size=3, block_size=k,
                                     window_size=5, seed=1)   # windows of 2 blocks
    assert s.block_size == k
    batches = [list(b) for b in s]
    assert sorted(i for b in batches for i in b) == list(range(n))
    assert all(len(b) <= 3 and atoms[b].sum() <= 40 for b in batches)
    seen, start, in_window, most = 0, 0, 0, 0
    flat = [i for b in batches for i in b]
    for b in batches:
        seen += len(b)
        in_window += 1
        if seen % (2 * k) == 0 or seen == n:
            most, in_window = max(most, in_window), 0
            blocks = {i // k for i in flat[start:seen]}
            assert sorted(flat[start:seen]) == sorted(
                i for blk in blocks for i in range(blk * k, min(blk * k + k, n)))
            start = seen
    assert start == n
    ld = zb.DataLoader(ds, sampler=s, prefetch_factor=4)
    got = list(ld)
    assert len(got) == len(batches)
    for b, ids in zip(got, batches):
        want = ds.read_many(ids)
        for key in want:
            np.testing.assert_array_equal(np.asarray(b[key]), np.asarray(want[key]), err_msg=key)
    # without prefetch_factor a loader window holds two sampler windows' batches
    assert zb.DataLoader(ds, sampler=s).prefetch_factor >= 2 * most
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        zb.samplers.SizeAwareSampler(ds, max_atoms=40, max_batch_size=3, block_size=0)


@pytest.fixture(scope="module")
def nv_store_200(tmp_path_factory):
    """nvalchemi's writer with 200-row chunks: ~9 structures per neighbor_list chunk."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = str(tmp_path_factory.mktemp("nvlayout200") / "nv.zarr")
        w = AtomicDataZarrWriter(path, config={"core": {"chunk_size": 200}})
        w.write(make_structures())
        w.delete(DELETED)
    return path


@pytest.mark.parametrize("which", ["column_chunks", "chunks_of_200"])
def test_block_size_chunks_is_the_heaviest_fields_samples_per_chunk(nv_store, nv_store_200,
                                                                     which):
    """block_size="chunks": the samples per chunk of the field with the most bytes, computed
    here from zarr-python's view of the store (chunk shapes, pointers, the live mask)."""
    zb = zbatch_api()
    path = nv_store if which == "column_chunks" else nv_store_200
    root = zarr.open_group(path, mode="r")
    live = root["meta"]["samples_mask"][:].astype(bool)
    levels = dict(root.attrs["fields"]["core"])
    seg_total = {}
    for level, ptr in (("atom", "atoms_ptr"), ("edge", "edges_ptr")):
        p = root["meta"][ptr][:]
        seg_total[level] = int(np.diff(p)[live].sum())
    n = int(live.sum())
    best = (-1, None)
    for name, level in levels.items():
        a = root["core"][name]
        total = seg_total.get(level, n)
        nbytes = total * a.dtype.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))
        per_chunk = a.chunks[0] * n / total if level in seg_total else a.chunks[0]
        best = max(best, (nbytes, per_chunk), key=lambda t: t[0])
    want = max(1, round(best[1]))
    ds = zb.open(path)
    assert ds.fields["neighbor_list"]["chunk_rows"] == (7 if which == "column_chunks" else 200)
    if which == "chunks_of_200":
        assert want > 5
    assert zb.samplers.chunk_block_size(ds) == want
    s = zb.samplers.SizeAwareSampler(ds, max_atoms=40, max_batch_size=3, block_size="chunks")
    assert s.block_size == want
    with pytest.raises(ValueError, match="'chunks'"):
        zb.samplers.SizeAwareSampler(ds, max_atoms=40, max_batch_size=3, block_size="chunk")


# ---- unit rows chunked by columns, landed whole (zb__rows_zip) ---------------------------------

def rechunked(src, dst, spec):
    """A copy of nvalchemi's store `src` at `dst` with its 2-d core arrays rewritten by
    zarr-python as spec(name, array) -> create_array keywords (chunks, shards, dtype)."""
    import shutil
    shutil.copytree(src, dst)
    root = zarr.open_group(str(dst), mode="r+")
    for name in list(root["core"].array_keys()):
        a = root["core"][name]
        if a.ndim != 2 or a.shape[1] < 2:
            continue
        kw = dict(chunks=(7, 1), compressors=a.compressors, dtype=a.dtype)
        kw.update(spec(name, a))
        data, attrs = a[:].astype(kw["dtype"]), dict(a.attrs)
        del root["core"][name]
        b = root["core"].create_array(name, shape=data.shape, **kw)
        b[:] = data
        b.attrs.update(attrs)
    return str(dst)


LAYOUTS = {
    # [7, 1] chunks in shards of 14 rows holding every column
    "sharded": lambda name, a: dict(shards=(14, a.shape[1])),
    # neighbor_list stored as int32: the narrow index re-based in the same pass
    "int32_index": lambda name, a: dict(dtype=np.int32) if name == "neighbor_list" else {},
    # [N, 3] fields in chunks of two columns, the second cut at the row's end
    "two_columns": lambda name, a: dict(chunks=(5, 2)) if a.shape[1] == 3 else {},
    # chunk boundaries at every third row: a structure's edges span several chunk rows
    "three_rows": lambda name, a: dict(chunks=(3, 1)),
}

# runs of consecutive ids land as one copy spanning several structures
RUN_IDS = [4, 5, 6, 7, 8, 0, 1, 2, 15, 16]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_column_chunked_layouts_equal_nvalchemis_batch(nv_store, tmp_path, layout):
    """Every unit of a row cached: the row's columns land whole in one pass (index fields
    re-based in it), equal to nvalchemi's batch; and the same as units served one by one."""
    zb = zbatch_api()
    path = rechunked(nv_store, tmp_path / "s.zarr", LAYOUTS[layout])
    arrays = zarr.open_group(path, mode="r")["core"]
    if layout == "int32_index":
        assert arrays["neighbor_list"].dtype == np.int32
    ds = zb.open(path, cache_bytes=64 << 20, num_threads=2)
    plain = zb.open(path, num_threads=2)
    for ids in [IDS, RUN_IDS, [9]]:
        want = nv_batch(path, ids)
        if layout == "int32_index":
            assert want["neighbor_list"].dtype == torch_int32()
        assert_same_batch(ds.read_many(ids, output="nvalchemi"), want, (layout, ids))
        again = ds.read_many(ids, output="nvalchemi")   # every unit from the cache now
        assert_same_batch(again, want, (layout, ids))
        assert_same_batch(plain.read_many(ids, output="nvalchemi"), want, (layout, ids))
        assert ds.read_many(ids).stats["chunks_decoded"] == 0


def torch_int32():
    import torch
    return torch.int32


def physical(path, logical):
    """The physical row of a logical sample id, and its atom and edge ranges (store-global)."""
    meta = zarr.open_group(path, mode="r")["meta"]
    phys = int(np.flatnonzero(meta["samples_mask"][:])[logical])
    ap, ep = meta["atoms_ptr"][:], meta["edges_ptr"][:]
    return phys, (int(ap[phys]), int(ap[phys + 1])), (int(ep[phys]), int(ep[phys + 1]))


@pytest.mark.parametrize("dtype,shards", [(np.int64, None), (np.int32, None), (np.int64, (6, 2))])
def test_column_chunked_edge_outside_its_structure_error_and_skip(nv_store, tmp_path, dtype,
                                                                 shards):
    """issue 21's checks on the one-pass path: an edge index one atom past its structure, in
    the second column of a chunk row inside the structure, is refused naming the sample id
    and field, from the cache as from the store; on_invalid="skip" leaves the sample out and
    re-bases the rest as nvalchemi does. (Sharded: units one by one until cached.)"""
    zb = zbatch_api()
    spec = (lambda name, a: dict(chunks=(3, 1), dtype=dtype, shards=shards)
            if name == "neighbor_list" else {})
    path = rechunked(nv_store, tmp_path / "s.zarr", spec)
    bad = 6
    _, (a0, a1), (e0, e1) = physical(path, bad)
    assert e1 - e0 > 4
    nl = zarr.open_array(path + "/core/neighbor_list", mode="r+")
    v = nl[:]
    v[e0 + 4, 1] = a1                                 # store-global: atom a1 - a0 of a1 - a0
    nl[:] = v
    n = a1 - a0
    ds = zb.open(path, cache_bytes=64 << 20)
    for _ in range(2):                                # units decoded, then all cached
        with expect_error("ZB_E_CORRUPT", f"sample {bad}", "neighbor_list",
                          f"value {n} is outside its {n} atoms"):
            ds.read_many([2, bad, 3])
    skip = zb.open(path, cache_bytes=64 << 20, on_invalid="skip")
    for _ in range(2):
        b = skip.read_many([5, 6, 7, 0], output="nvalchemi")
        assert_same_batch(b, nv_batch(path, [5, 7, 0]), "skip")
        assert skip.read_many([5, 6, 7, 0]).stats["samples_skipped"] == 1
