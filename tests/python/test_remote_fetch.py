"""What a remote store fetches (issue 17, remote throughput): a window's units are fetched
exactly (no byte between them at the reader's level), and the fetch cache
(``fetch_cache_bytes``) keeps the units fetched, so over several epochs each inner chunk and
each chunk object goes over the network once; a smaller cache refetches what it evicted,
``0`` refetches for every window; batches are identical to local reads throughout.

The oracles: the same store read locally by zbatch; nginx's access log (what was fetched, by
range); the stores' shard indexes parsed here with numpy (where each inner chunk lies).
"""
from __future__ import annotations

import json
import time
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import zbatch

EPOCHS = 3
NO_GAP = {"coalesce_gap": 0}  # the store's own joining off: the log shows the reader's ranges


def _csr(n_obs, n_vars, seed):
    X = sp.random(n_obs, n_vars, density=0.1, format="csr", random_state=seed,
                  dtype=np.float32)
    X.data = np.round(X.data * 50).astype(np.float32) + 1
    return X


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A sharded v3 store (inner chunks of 256 values, 8 per shard) and an unsharded v2 store
    (each chunk its own object)."""
    r = tmp_path_factory.mktemp("remote_fetch")
    X = _csr(800, 400, 1)
    zbatch.write_anndata(r / "sharded.zarr", X, chunk_size=256, shard_size=2048)
    zbatch.write_anndata(r / "plain.zarr", X, zarr_format=2, chunk_size=512)
    return r


def _inner_chunks(store: Path, array: str) -> dict:
    """{(url path, offset): nbytes} of every stored inner chunk of a sharded 1-d array, from
    its shard indexes (at the end of each shard, a crc32c after them)."""
    meta = json.loads((store / array / "zarr.json").read_text())
    cfg = meta["codecs"][0]["configuration"]
    assert meta["codecs"][0]["name"] == "sharding_indexed" and cfg["index_location"] == "end"
    per = meta["chunk_grid"]["configuration"]["chunk_shape"][0] // cfg["chunk_shape"][0]
    out = {}
    for f in (store / array / "c").iterdir():
        raw = f.read_bytes()
        idx = np.frombuffer(raw[-16 * per - 4:-4], dtype="<u8").reshape(-1, 2)
        for off, n in idx:
            if off != 2**64 - 1:
                out[(f"/{store.name}/{array}/c/{f.name}", int(off))] = int(n)
    return out


def _covers(records, chunks: dict) -> Counter:
    """How many GETs covered each chunk of `chunks` whole."""
    count = Counter()
    for r in records:
        if r.method != "GET" or r.range.startswith("bytes=-"):
            continue  # a suffix range reads a shard's index: no chunk
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", r.range)
        lo, hi = (int(m[1]), int(m[2]) + 1) if m else (0, 1 << 62)
        for (path, off), n in chunks.items():
            if path == r.path and lo <= off and off + n <= hi:
                count[(path, off)] += 1
    return count


def _epochs(ds, sampler, epochs=EPOCHS):
    loader = zbatch.DataLoader(ds, batch_size=50, sampler=sampler, seed=5, output="numpy",
                               num_threads=2, prefetch_factor=2, drop_last=False)
    out = []
    for e in range(epochs):
        loader.set_epoch(e)
        out.append([b["X"].copy() for b in loader])
    loader.close()
    return out


def _assert_same(got, want):
    assert len(got) == len(want)
    for ge, we in zip(got, want):
        assert len(ge) == len(we) > 0
        for g, w in zip(ge, we):
            assert g.shape == w.shape and (g != w).nnz == 0


def _windows(ds, sampler, epochs=EPOCHS, window=100):
    """Each epoch's windows read one after the other by read_many (the loader reads two at
    once: a unit both need that neither found in the cache may be fetched by both)."""
    from zbatch.samplers import make_sampler
    kw = {"block_size": 10, "blocks_per_window": window // 10} if sampler == "block" else {}
    sm = make_sampler(sampler, n=len(ds), batch_size=50, seed=5, **kw)
    out = []
    for e in range(epochs):
        sm.set_epoch(e)
        ids = np.concatenate([np.asarray(b, dtype=np.int64) for b in sm])
        out.append([ds.read_many(ids[i:i + window])["X"].copy()
                    for i in range(0, len(ids), window)])
    return out


@pytest.mark.parametrize("sampler", ["random", "block"])
def test_sharded_each_inner_chunk_fetched_once_over_epochs(root, nginx_serve, sampler):
    store = root / "sharded.zarr"
    server = nginx_serve(root)
    want = _windows(zbatch.open(str(store), num_threads=2), sampler)
    ds = zbatch.open(f"{server.url}/sharded.zarr", storage_options=NO_GAP, num_threads=2)
    got = _windows(ds, sampler)
    _assert_same(got, want)
    chunks = {**_inner_chunks(store, "X/data"), **_inner_chunks(store, "X/indices")}
    log = server.requests()
    count = _covers(log, chunks)
    # every inner chunk was needed (the epochs touch every row) and fetched once
    assert set(count) == set(chunks)
    assert set(count.values()) == {1}
    # X's bytes went over the network once: the inner chunks and the shard indexes, nothing
    # between them
    x_gets = [r for r in log if r.method == "GET" and r.path.startswith("/sharded.zarr/X/")
              and "/indptr/" not in r.path]
    shards = {r.path for r in x_gets}
    assert sum(r.nbytes for r in x_gets) == sum(chunks.values()) + len(shards) * (16 * 8 + 4)


def test_units_in_a_requests_gap_are_kept_not_fetched_again(root, nginx_serve):
    """A window that wants inner chunks 0 and 2 of a shard gets chunk 1 too: the store's one
    request spans the gap between them (its coalesce_gap, 64 KiB by default), and chunk 1 is
    kept in the fetch cache with them (fill_gaps), so a later window that wants chunk 1 fetches
    nothing (before, it fetched chunk 1 again). The rows are picked from X/indptr, each inside
    one inner chunk (256 values) of the first shards; the batches are the local ones."""
    import zarr
    store = root / "sharded.zarr"
    server = nginx_serve(root)
    local = zbatch.open(str(store))
    indptr = zarr.open_group(str(store), mode="r")["X/indptr"][:]
    inside = {k: next(r for r in range(len(indptr) - 1)
                      if 256 * k <= indptr[r] < indptr[r + 1] <= 256 * (k + 1)) for k in (0, 1, 2)}
    chunks = {**_inner_chunks(store, "X/data"), **_inner_chunks(store, "X/indices")}
    first = {a: sorted(o for (p, o) in chunks if p == f"/sharded.zarr/X/{a}/c/0")
             for a in ("data", "indices")}
    ds = zbatch.open(f"{server.url}/sharded.zarr", num_threads=2)
    seen = []
    for ids in ([inside[0], inside[2]], [inside[1]]):
        since = server.log_offset()
        assert (ds.read_many(ids)["X"] != local.read_many(ids)["X"]).nnz == 0
        seen.append(sorted((r.path, r.range) for r in server.requests(since)
                           if r.path.startswith("/sharded.zarr/X/") and "/indptr/" not in r.path))
    # the first window: each shard's index, then chunks 0-2 in one request per array
    want = []
    for a in ("data", "indices"):
        end = first[a][2] + chunks[(f"/sharded.zarr/X/{a}/c/0", first[a][2])]
        assert first[a][0] == 0
        want += [(f"/sharded.zarr/X/{a}/c/0", f"bytes=-{8 * 16 + 4}"),
                 (f"/sharded.zarr/X/{a}/c/0", f"bytes=0-{end - 1}")]
    assert seen[0] == sorted(want)
    assert seen[1] == []  # chunk 1 of both arrays came with the first window's requests


def test_loader_over_http_fetches_each_inner_chunk_at_most_twice(root, nginx_serve):
    """The loader (two windows read at once) over three epochs: local batches, and no inner
    chunk fetched more than twice (once, or once by each of two windows read together)."""
    store = root / "sharded.zarr"
    server = nginx_serve(root)
    want = _epochs(zbatch.open(str(store)), "random")
    got = _epochs(zbatch.open(f"{server.url}/sharded.zarr", storage_options=NO_GAP), "random")
    _assert_same(got, want)
    chunks = {**_inner_chunks(store, "X/data"), **_inner_chunks(store, "X/indices")}
    count = _covers(server.requests(), chunks)
    assert set(count) == set(chunks) and max(count.values()) <= 2


def test_plain_chunk_objects_fetched_once_over_epochs(root, nginx_serve):
    store = root / "plain.zarr"
    server = nginx_serve(root)
    want = _windows(zbatch.open(str(store), num_threads=2), "random")
    got = _windows(zbatch.open(f"{server.url}/plain.zarr", num_threads=2), "random")
    _assert_same(got, want)
    gets = Counter(r.path for r in server.requests() if r.method == "GET")
    objects = {f"/plain.zarr/X/{a}/{p.name}" for a in ("data", "indices")
               for p in (store / "X" / a).iterdir() if not p.name.startswith(".")}
    assert len(objects) > 8
    assert {p: gets[p] for p in objects} == {p: 1 for p in objects}


def test_a_smaller_cache_refetches_and_none_refetches_every_window(root, nginx_serve):
    """The budget bounds what is kept: at a quarter of X's chunk bytes the later epochs fetch
    again (an unbounded cache would fetch nothing after the first), at 0 every epoch fetches
    what the first did; the batches stay those of the local store."""
    store = root / "sharded.zarr"
    server = nginx_serve(root)
    chunks = {**_inner_chunks(store, "X/data"), **_inner_chunks(store, "X/indices")}
    x_bytes = sum(chunks.values())
    want = _epochs(zbatch.open(str(store)), "random")
    per_epoch = {}
    for budget in (None, x_bytes // 4, 0):
        kw = {} if budget is None else {"fetch_cache_bytes": budget}
        ds = zbatch.open(f"{server.url}/sharded.zarr", storage_options=NO_GAP, **kw)
        loader = zbatch.DataLoader(ds, batch_size=50, sampler="random", seed=5,
                                   output="numpy", num_threads=2, prefetch_factor=2)
        fetched, got = [], []
        for e in range(EPOCHS):
            loader.set_epoch(e)
            before = ds.store_stats()["bytes"]
            got.append([b["X"].copy() for b in loader])
            fetched.append(ds.store_stats()["bytes"] - before)
        loader.close()
        _assert_same(got, want)
        per_epoch[budget] = fetched
    default, quarter, none = per_epoch[None], per_epoch[x_bytes // 4], per_epoch[0]
    assert default[0] >= x_bytes and default[1:] == [0] * (EPOCHS - 1)
    assert all(q > x_bytes // 4 for q in quarter[1:])
    # without a cache, each window fetches what it needs: the same chunk in several windows
    assert all(n > default[0] for n in none)


def test_two_window_reads_at_once_share_connections_without_waiting(root, nginx_serve):
    """Two threads reading windows of many small ranges at once through one store (its
    connections shared): every read completes with the local rows. A per-call limit on
    connections to the host counted the other call's connections too, and libcurl 7.88 left
    transfers waiting for them forever (the loader's two window readers hung)."""
    from concurrent.futures import ThreadPoolExecutor
    store = root / "sharded.zarr"
    server = nginx_serve(root)
    local = zbatch.open(str(store))
    ds = zbatch.open(f"{server.url}/sharded.zarr", fetch_cache_bytes=0,
                     storage_options={**NO_GAP, "max_in_flight": 8, "stall_timeout_s": 5})
    rng = np.random.default_rng(3)
    windows = [rng.permutation(len(local))[:200] for _ in range(16)]

    def read(ids):
        return ds.read_many(ids)["X"]

    t = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(read, windows))
    assert time.perf_counter() - t < 20  # each read takes milliseconds; a stall retries in 5 s
    for ids, x in zip(windows, got):
        assert (x != local.read_many(ids)["X"]).nnz == 0
    assert ds.store_stats()["retries"] == 0



def test_connections_stay_open_across_window_reads(root, nginx_serve):
    """Windows read one after another by two threads, at most 8 requests in flight per read:
    every request goes over the connections the first reads opened (nginx's log numbers each
    request's connection). libcurl closed a connection handed back to the shared cache whenever
    the cache held more than four per transfer still running in that call, so as each read's
    last transfers finished it closed the others' (thousands of new connections per epoch)."""
    from concurrent.futures import ThreadPoolExecutor
    store = root / "sharded.zarr"
    server = nginx_serve(root)
    local = zbatch.open(str(store))
    ds = zbatch.open(f"{server.url}/sharded.zarr", fetch_cache_bytes=0,
                     storage_options={**NO_GAP, "max_in_flight": 8})
    rng = np.random.default_rng(4)
    windows = [rng.permutation(len(local))[:100] for _ in range(40)]
    since = server.log_offset()
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda ids: ds.read_many(ids)["X"], windows))
    for ids, x in zip(windows, got):
        assert (x != local.read_many(ids)["X"]).nnz == 0
    log = server.requests(since)
    assert len(log) > 40 * 8
    assert len({r.connection for r in log}) <= 2 * 8, len({r.connection for r in log})

def test_a_window_reads_its_shard_indexes_once_in_one_round(root, nginx_serve):
    """Before a window fetches any inner chunk, the indexes of every shard it touches are read
    in one round: one suffix request each ("bytes=-N": the index's 16 bytes per inner chunk and
    its crc32c; no HEAD for the shard's size), all in flight together; the chunk requests start
    after them; no (object, range) is asked twice; a later window on the same shards reads no
    index again. nginx adds 20 ms to every request, so the rounds show in its log."""
    store = root / "sharded.zarr"
    server = nginx_serve(root, latency_ms=20)
    ds = zbatch.open(f"{server.url}/sharded.zarr", storage_options=NO_GAP, num_threads=2)
    local = zbatch.open(str(store))
    shards = {f"/sharded.zarr/X/{a}/c/{p.name}" for a in ("data", "indices")
              for p in (store / "X" / a / "c").iterdir()}
    assert len(shards) == 32
    since = server.log_offset()
    ids = np.arange(0, 800, 7)  # rows in every shard
    assert (ds.read_many(ids)["X"] != local.read_many(ids)["X"]).nnz == 0
    log = [r for r in server.requests(since) if r.path in shards]
    assert {r.method for r in log} == {"GET"}
    idx = [r for r in log if r.range.startswith("bytes=-")]
    assert sorted(r.path for r in idx) == sorted(shards)  # each shard's index once
    assert {r.range for r in idx} == {f"bytes=-{8 * 16 + 4}"}
    assert max(r.start for r in idx) < min(r.end for r in idx)  # one round
    chunks = [r for r in log if r not in idx]
    assert chunks and min(r.start for r in chunks) >= max(r.end for r in idx) - 0.002
    assert len({(r.path, r.range) for r in chunks}) == len(chunks)
    since = server.log_offset()
    ids = np.arange(3, 800, 7)
    assert (ds.read_many(ids)["X"] != local.read_many(ids)["X"]).nnz == 0
    assert not [r for r in server.requests(since) if r.range.startswith("bytes=-")]


def test_the_loaders_two_windows_fetch_tables_and_indexes_once(tmp_path, nginx_serve):
    """The loader reads two windows at once from the start: the category tables and the shard
    indexes both first windows need are fetched by one of them, once each (the other waits for
    them instead of fetching them too); the category tables of a remote store are read all at
    once (their chunk requests overlap in nginx's log, 10 ms added to each; their metadata is
    the consolidated document's); the batches are the local ones."""
    from conftest import run_cli
    store = tmp_path / "cells.zarr"
    out = run_cli("synth", "--kind", "cells", "--n", "3000", "-o", store, "--seed", "2")
    assert out.returncode == 0, out.stderr
    server = nginx_serve(tmp_path, latency_ms=10)

    def epoch(ds):
        loader = zbatch.DataLoader(ds, batch_size=128, sampler="block", seed=3, output="numpy",
                                   prefetch_factor=4, block_size=16, blocks_per_window=32)
        got = [b["X"].copy() for b in loader]
        loader.close()
        return got

    want = epoch(zbatch.open(str(store)))
    got = epoch(zbatch.open(f"{server.url}/cells.zarr", num_threads=2))
    assert len(got) == len(want) > 4
    for g, w in zip(got, want):
        assert (g != w).nnz == 0
    log = server.requests()
    tables = [r for r in log if "/categories/" in r.path]
    indexes = [r for r in log if r.range.startswith("bytes=-")]
    cats = {p.name for p in (store / "obs").iterdir() if (p / "categories").is_dir()}
    assert len(cats) >= 2
    # each table's chunk once (its metadata comes from the consolidated document, as every
    # other array's does: no request); each shard index once
    assert sorted((r.path, r.range) for r in tables) == sorted(set((r.path, r.range)
                                                                    for r in tables))
    assert {r.path.split("/")[3] for r in tables} == cats
    assert not [r for r in tables if r.path.endswith("zarr.json")]
    assert len(tables) == len(cats)
    assert len({(r.path, r.range) for r in indexes}) == len(indexes) > 0
    assert max(r.start for r in tables) < min(r.end for r in tables)  # all at once


def test_a_window_fetches_while_the_window_before_it_is_decoded(tmp_path, nginx_serve):
    """Two windows read at once (the loader's two readers), each big enough to be decoded on
    the pool, which one read drives at a time: the second window's requests go out while the
    first's are still in flight, not once the first is fetched and decoded (it decodes what
    arrived when the pool is free). nginx adds 100 ms to every request: the windows' chunk
    requests make one round in its log, not two; the rows are the local ones."""
    import threading

    from conftest import run_cli
    store = tmp_path / "cells.zarr"
    out = run_cli("synth", "--kind", "cells", "--n", "3000", "-o", store, "--seed", "2")
    assert out.returncode == 0, out.stderr
    server = nginx_serve(tmp_path, latency_ms=100)
    local = zbatch.open(str(store))
    ds = zbatch.open(f"{server.url}/cells.zarr", num_threads=2)
    ds.read_many(np.array([0, len(ds) - 1]))  # tables and shard indexes fetched and cached
    since = server.log_offset()
    windows = [np.arange(64, 576), np.arange(576, 1088)]  # the same shards, other chunks
    got = [None, None]
    go = threading.Barrier(2)

    def read(k):
        go.wait()
        got[k] = ds.read_many(windows[k])["X"]

    threads = [threading.Thread(target=read, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for ids, x in zip(windows, got):
        assert (x != local.read_many(ids)["X"]).nnz == 0
    chunks = [r for r in server.requests(since) if r.method == "GET"]
    assert len(chunks) >= 4 and not [r for r in chunks if r.range.startswith("bytes=-")]
    assert max(r.start for r in chunks) < min(r.end for r in chunks)  # one round, not two



def test_units_found_in_the_fetch_cache_are_not_fetched_when_evicted_before_decoding(
        tmp_path, nginx_serve):
    """A window whose units are all in the fetch cache fetches none of them, even when the
    window read beside it puts so much into a small cache that they are evicted before the
    first window is decoded (it waits for the decode threads, which the other read drives):
    they are pinned when the window is listed. Before, each evicted unit was fetched alone on
    a decode thread, one round trip at a time. nginx adds 100 ms to every request; its log:
    no byte of the small window's inner chunks is asked for again; the rows are the local
    ones."""
    import threading

    from conftest import run_cli
    store = tmp_path / "cells.zarr"
    out = run_cli("synth", "--kind", "cells", "--n", "3000", "-o", store, "--seed", "2")
    assert out.returncode == 0, out.stderr
    server = nginx_serve(tmp_path, latency_ms=100)
    local = zbatch.open(str(store))
    ds = zbatch.open(f"{server.url}/cells.zarr", num_threads=2, fetch_cache_bytes=1 << 20)
    small, big = np.arange(0, 64), np.arange(1000, 2000)
    ds.read_many(small)  # its units fetched and kept: the cache holds them
    ds.read_many(np.array([1500]))  # the tables and shard indexes the big window needs
    since = server.log_offset()
    got = {}

    def read(name, ids):
        got[name] = ds.read_many(ids)["X"]

    a = threading.Thread(target=read, args=("big", big))
    b = threading.Thread(target=read, args=("small", small))
    a.start()
    time.sleep(0.03)  # the big window drives the decode threads first
    b.start()
    a.join()
    b.join()
    for name, ids in (("small", small), ("big", big)):
        assert (got[name] != local.read_many(ids)["X"]).nnz == 0
    # the small window's inner chunks (values [0, nnz) of X/data and X/indices), from the
    # first shard's index: [0, end) of its object
    nnz = int(local.read_many(small)["X"].nnz)
    log = [r for r in server.requests(since) if r.method == "GET"]
    assert len(log) >= 2  # the big window: one request per array
    for a_name in ("data", "indices"):
        meta = json.loads((store / "X" / a_name / "zarr.json").read_text())
        cfg = meta["codecs"][0]["configuration"]
        per = meta["chunk_grid"]["configuration"]["chunk_shape"][0] // cfg["chunk_shape"][0]
        raw = (store / "X" / a_name / "c" / "0").read_bytes()
        idx = np.frombuffer(raw[-16 * per - 4:-4], dtype="<u8").reshape(-1, 2)
        last = (nnz - 1) // cfg["chunk_shape"][0]
        end = int(idx[last, 0] + idx[last, 1])
        path = f"/cells.zarr/X/{a_name}/c/0"
        starts = [int(re.fullmatch(r"bytes=(\d+)-\d+", r.range)[1]) for r in log
                  if r.path == path]
        assert starts and min(starts) >= end, (a_name, end, sorted(starts)[:4])


@pytest.mark.parametrize("sampler", ["random", "block"])
def test_a_store_many_times_the_fetch_cache_reads_as_local_over_epochs(root, nginx_serve,
                                                                       sampler):
    """A fetch cache a sixteenth of X's chunk bytes, churned by the loader's two windows over
    four epochs: its entries' memory is reused for the next units again and again (cache.c),
    units found there are decoded where it holds them, pinned, and the ranges arriving go to
    the decode threads through one queue; every batch is the local store's."""
    store = root / "sharded.zarr"
    server = nginx_serve(root)
    chunks = {**_inner_chunks(store, "X/data"), **_inner_chunks(store, "X/indices")}
    budget = sum(chunks.values()) // 16
    want = _epochs(zbatch.open(str(store)), sampler, epochs=4)
    ds = zbatch.open(f"{server.url}/sharded.zarr", fetch_cache_bytes=budget,
                     storage_options=NO_GAP)
    before = ds.store_stats()["bytes"]
    _assert_same(_epochs(ds, sampler, epochs=4), want)
    # every epoch fetched again most of what it needs (the cache holds a sixteenth)
    assert ds.store_stats()["bytes"] - before > 3 * sum(chunks.values())
