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

from conftest import zbatch_api
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
