"""``cache_bytes="auto"``: the decoded-chunk cache sized from the store's metadata.

Oracles: zarr-python's shapes and itemsizes for the decoded size D; the rule (D x 1.05 when the
heaviest field holds >= 2 samples per chunk, the store is local and D fits the share of physical
memory; else 0) checked branch by branch with the physical-memory figure stubbed; an uncached
loader's batches for the values.
"""
from __future__ import annotations

import os
import warnings

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import zarr

import zbatch
import zbatch.dataset as zd
from test_dataset_atomic import make_structures

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from nvalchemi.data.datapipes import AtomicDataZarrWriter


def _nv_store(path, config=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        AtomicDataZarrWriter(str(path), config=config).write(make_structures())
    return str(path)


@pytest.fixture(scope="module")
def nv_store(tmp_path_factory):
    """nvalchemi's defaults: one chunk per array, so every structure shares its chunks."""
    return _nv_store(tmp_path_factory.mktemp("auto") / "nv.zarr")


@pytest.fixture(scope="module", params=[7, 32])
def nv_thin(tmp_path_factory, request):
    """Core chunks of 7 or 32 rows: the heaviest field (neighbor_list, ~21 edges a structure)
    holds 0.3 or 1.5 structures a chunk."""
    return _nv_store(tmp_path_factory.mktemp("auto") / "thin.zarr",
                     {"core": {"chunk_size": request.param}})


def _cells(path, n=300, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(n, 50, density=0.2, format="csr", random_state=seed, dtype=np.float32)
    obs = pd.DataFrame({"label": pd.Categorical(rng.choice(["a", "b", "c"], n)),
                        "depth": rng.normal(size=n)}, index=[f"c{i}" for i in range(n)])
    zbatch.write_anndata(str(path), X, obs=obs, chunk_size=64, shard_size=1024)
    return str(path)


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    root = tmp_path_factory.mktemp("auto")
    return _cells(root / "a.zarr"), _cells(root / "b.zarr", n=200, seed=1)


def _nbytes(a) -> int:
    return int(np.prod(a.shape, dtype=np.int64)) * a.dtype.itemsize


@pytest.fixture
def memory(monkeypatch):
    """Stubs the physical memory figure: memory(n) makes this machine hold n bytes."""
    def set_memory(n):
        monkeypatch.setattr(zd, "_physical_memory", lambda: int(n))
    return set_memory


def test_decoded_size_of_an_nvalchemi_store_is_zarrs(nv_store):
    core = zarr.open_group(nv_store, mode="r")["core"]
    ds = zbatch.open(nv_store)
    for name, info in ds.fields.items():
        assert info["decoded_bytes"] == _nbytes(core[name]), name
    assert ds.decoded_bytes == sum(_nbytes(a) for _, a in core.arrays())
    assert ds.cache_bytes == 0


def test_decoded_size_of_a_cells_store_is_zarrs(cells):
    root = zarr.open_group(cells[0], mode="r")
    ds = zbatch.open(cells[0], x_dtype="float64")   # delivered wider: D stays the stored size
    want = {"X/data": _nbytes(root["X/data"]), "X/indices": _nbytes(root["X/indices"]),
            "obs/label": _nbytes(root["obs/label/codes"]), "obs/depth": _nbytes(root["obs/depth"])}
    got = {name: info["decoded_bytes"] for name, info in ds.fields.items()}
    assert got == want
    assert ds.decoded_bytes == sum(want.values())


def test_decoded_size_of_a_collection_sums_its_children(tmp_path, memory):
    from test_dataset_collection import SIZES, make_child, write_collection
    path = str(write_collection(tmp_path / "coll.zarr",
                                [make_child(k, n) for k, n in enumerate(SIZES)]))
    root = zarr.open_group(path, mode="r")
    arrays = ["X/data", "X/indices", "obs/cell_type/codes", "obs/src_path/codes", "obs/total",
              "obs/qc"]
    want = sum(_nbytes(root[f"dataset_{k}/{a}"]) for k in range(len(SIZES)) for a in arrays)
    ds = zbatch.open(path)
    assert ds.num_children == len(SIZES) and ds.decoded_bytes == want
    memory(4 * want)
    assert zbatch.open(path, cache_bytes="auto").cache_bytes == int(want * 1.05)


def test_qualifies_caches_the_decoded_size(nv_store, cells, memory):
    for path in (nv_store, cells[0]):
        d = zbatch.open(path).decoded_bytes
        memory(4 * d)                       # exactly the share: fits
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ds = zbatch.open(path, cache_bytes="auto")
        assert ds.cache_bytes == int(d * 1.05), path
        ids = np.arange(len(ds))[::-1].copy()
        first, second = ds.read_many(ids), ds.read_many(ids)
        assert first.stats["chunks_decoded"] > 0
        assert second.stats["chunks_decoded"] == 0 and second.stats["chunks_cached"] > 0


def test_too_big_for_memory_is_no_cache_and_a_warning(nv_store, memory, monkeypatch):
    d = zbatch.open(nv_store).decoded_bytes
    memory(4 * d - 4)
    with pytest.warns(UserWarning) as rec:
        ds = zbatch.open(nv_store, cache_bytes="auto")
    assert ds.cache_bytes == 0
    msg = str(rec[0].message)
    assert f"{d / 2**30:.2f} GiB" in msg and "0.25" in msg and "block_size='chunks'" in msg
    assert ds.read_many([0, 1]).stats["chunks_cached"] == 0
    monkeypatch.setattr(zd, "AUTO_CACHE_SHARE", 0.5)      # the knob
    assert zbatch.open(nv_store, cache_bytes="auto").cache_bytes == int(d * 1.05)


def test_less_than_two_samples_per_chunk_is_no_cache(nv_thin, memory):
    ds = zbatch.open(nv_thin)
    edges = zarr.open_group(nv_thin, mode="r")["core/neighbor_list"].shape[0]
    chunk = ds.fields["neighbor_list"]["chunk_rows"]
    per_chunk = zbatch.samplers.samples_per_chunk(ds)
    assert per_chunk == pytest.approx(chunk * len(ds) / edges) and per_chunk < 2
    memory(1 << 50)
    assert zbatch.open(nv_thin, cache_bytes="auto").cache_bytes == 0
    memory(1)                               # too big as well: the chunk test decides, silently
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert zbatch.open(nv_thin, cache_bytes="auto").cache_bytes == 0


def test_remote_store_is_no_cache(cells, nginx_serve, memory):
    memory(1 << 50)
    local = cells[0]
    assert zbatch.open(local, cache_bytes="auto").cache_bytes > 0
    server = nginx_serve(os.path.dirname(local))
    remote = zbatch.open(f"{server.url}/a.zarr", cache_bytes="auto")
    assert remote.cache_bytes == 0 and remote.decoded_bytes == zbatch.open(local).decoded_bytes


def test_cached_epochs_equal_uncached(nv_store, memory):
    memory(1 << 40)

    def epochs(cache_bytes):
        ds = zbatch.open(nv_store, cache_bytes=cache_bytes, num_threads=2)
        s = zbatch.samplers.SizeAwareSampler(ds, max_atoms=40, max_batch_size=4, seed=5)
        ld = zbatch.DataLoader(ds, sampler=s, prefetch_factor=2)
        out, cached = [], 0
        for e in range(2):
            ld.set_epoch(e)
            for b in ld:
                out.append({k: np.asarray(b[k]).copy() for k in b})
                cached += b.stats["chunks_cached"]
        return ds.cache_bytes, out, cached

    size, auto, cached = epochs("auto")
    _, plain, uncached = epochs(0)
    assert size > 0 and cached > 0 and uncached == 0
    assert len(auto) == len(plain) > 2
    for a, p in zip(auto, plain):
        assert sorted(a) == sorted(p)
        for k in p:
            np.testing.assert_array_equal(a[k], p[k], err_msg=k)


def test_multidataset_children_share_one_budget(cells, memory):
    a, b = (zbatch.open(p) for p in cells)
    total = a.decoded_bytes + b.decoded_bytes
    memory(4 * total)
    md = zbatch.MultiDataset([a, b], cache_bytes="auto")
    assert md.decoded_bytes == total and md.cache_bytes == int(total * 1.05)
    # each child fits the share alone, both together do not: no cache for the collection
    memory(4 * max(a.decoded_bytes, b.decoded_bytes))
    assert zbatch.open(cells[0], cache_bytes="auto").cache_bytes > 0
    with pytest.warns(UserWarning, match="AUTO_CACHE_SHARE"):
        md = zbatch.MultiDataset([a, b], cache_bytes="auto")
    assert md.cache_bytes == 0
    ids = np.arange(len(md))
    np.testing.assert_array_equal(md.read_many(ids)["obs/depth"],
                                  np.concatenate([a.read_field("obs/depth"),
                                                  b.read_field("obs/depth")]))


@pytest.mark.parametrize("bad", ["autox", "AUTO", -1, 1.5, True, None])
def test_bad_values_are_refused(cells, bad):
    a = zbatch.open(cells[0])
    with pytest.raises(ValueError, match="cache_bytes must be an integer >= 0 .* or 'auto'"):
        zbatch.open(cells[0], cache_bytes=bad)
    with pytest.raises(ValueError, match="cache_bytes must be"):
        zbatch.MultiDataset([a], cache_bytes=bad)


def test_bad_share_and_in_memory_auto_are_refused(cells, monkeypatch):
    with pytest.raises(ValueError, match="InMemoryDataset: cache_bytes='auto'"):
        zbatch.InMemoryDataset(zbatch.open(cells[0]), cache_bytes="auto")
    monkeypatch.setattr(zd, "AUTO_CACHE_SHARE", 0)
    with pytest.raises(ValueError, match=r"AUTO_CACHE_SHARE must be a number in \(0, 1\]"):
        zbatch.open(cells[0], cache_bytes="auto")
