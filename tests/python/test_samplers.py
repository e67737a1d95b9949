"""zbatch.samplers: coverage, epochs, distributed splits, exact resume across world sizes, the
size-aware guarantee and replacement, multi-dataset policies and shares, block windows, weighted
frequencies, O(1) memory of the random order, rank resolution.

Expected values come from numpy (sizes, limits, counts), scipy.stats (chi-square) and from the
uninterrupted single-rank run of the same sampler (the definition of the global order)."""
from __future__ import annotations

import math
import resource
import time

import numpy as np
import pytest
from scipy import stats

import zbatch
from zbatch import _zbatch
from zbatch import samplers as S

N = 1003


def _skewed_sizes(n, seed=0):
    rng = np.random.default_rng(seed)
    atoms = np.minimum(rng.lognormal(3.0, 0.9, n).astype(np.uint64) + 1, 900)
    edges = np.minimum((8.0 / rng.random(n) ** (1 / 1.3)).astype(np.uint64), 20000)
    return atoms, edges


ATOMS, EDGES = _skewed_sizes(3000)

FACTORIES = {
    "sequential": lambda **kw: S.SequentialSampler(N, 16, **kw),
    "random": lambda **kw: S.RandomSampler(N, 16, seed=kw.pop("seed", 7), **kw),
    "block": lambda **kw: S.BlockSampler(N, 16, block_size=10, blocks_per_window=4,
                                         seed=kw.pop("seed", 7), **kw),
    "weighted": lambda **kw: S.WeightedSampler(np.arange(N) % 7 + 0.5, 16,
                                               seed=kw.pop("seed", 7), **kw),
    "size_aware": lambda **kw: S.SizeAwareSampler(24, num_atoms=ATOMS, num_edges=EDGES,
                                                  max_atoms=1000, max_edges=25000,
                                                  window_size=300, seed=kw.pop("seed", 7), **kw),
    "multi": lambda **kw: S.MultiDatasetBatchSampler([130, 470, 77], 16, replacement=False,
                                                     seed=kw.pop("seed", 7), **kw),
    "multi_replacement": lambda **kw: S.MultiDatasetBatchSampler([130, 470, 77], 16,
                                                                 seed=kw.pop("seed", 7), **kw),
    "multi_sample": lambda **kw: S.MultiDatasetSampler([130, 470, 403], 16, replacement=False,
                                                       seed=kw.pop("seed", 7), **kw),
}
WITHOUT_REPLACEMENT = ["sequential", "random", "block", "size_aware", "multi_sample"]


def _n_of(name):
    return 3000 if name == "size_aware" else N


def _epoch(s, epoch=0):
    s.set_epoch(epoch)
    return [b.copy() for b in s]


def _lockstep(ranks, steps=None):
    """Global batch order of ranks stepped together (step-major, rank-minor)."""
    its = [iter(r) for r in ranks]
    out, t = [], 0
    while steps is None or t < steps:
        got = [next(it, None) for it in its]
        if all(g is None for g in got):
            break
        assert all(g is not None for g in got), "ranks yield unequal batch counts"
        out.extend(g.copy() for g in got)
        t += 1
    return out


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


# ---- coverage, epochs, seeds -------------------------------------------------------------------

@pytest.mark.parametrize("name", WITHOUT_REPLACEMENT)
def test_every_sample_exactly_once_per_epoch(name):
    n = _n_of(name)
    s = FACTORIES[name]()
    for e in range(3):
        ids = np.concatenate(_epoch(s, e))
        assert np.array_equal(np.sort(ids), np.arange(n))
        assert ids.dtype == np.int64


@pytest.mark.parametrize("name", WITHOUT_REPLACEMENT)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_ranks_disjoint_and_complete(name, world):
    n = _n_of(name)
    ref = _epoch(FACTORIES[name]())
    G = len(ref)
    # pad: equal counts, union complete, duplicates exactly the pad from the epoch start
    per_rank = [_epoch(FACTORIES[name](rank=r, world_size=world)) for r in range(world)]
    counts = {len(b) for b in per_rank}
    assert counts == {math.ceil(G / world)}
    allids = np.concatenate([np.concatenate(b) for b in per_rank])
    hist = np.bincount(allids, minlength=n)
    assert hist.min() == 1
    pad = math.ceil(G / world) * world - G
    pad_ids = np.concatenate([ref[j % G] for j in range(pad)]) if pad else np.array([], int)
    assert np.array_equal(np.sort(np.repeat(np.arange(n), hist - 1)), np.sort(pad_ids))
    # drop: disjoint, equal counts
    per_rank = [_epoch(FACTORIES[name](rank=r, world_size=world, pad_or_drop="drop"))
                for r in range(world)]
    assert {len(b) for b in per_rank} == {G // world}
    allids = np.concatenate([np.concatenate(b) for b in per_rank])
    assert len(np.unique(allids)) == len(allids)


@pytest.mark.parametrize("name", list(FACTORIES))
def test_split_follows_the_global_order(name):
    ref = _epoch(FACTORIES[name](), 2)
    G = len(ref)
    for world in (1, 2, 3, 5):
        ranks = [FACTORIES[name](rank=r, world_size=world) for r in range(world)]
        for r in ranks:
            r.set_epoch(2)
        out = _lockstep(ranks)
        assert len(out) == math.ceil(G / world) * world
        assert len(ranks[0]) == math.ceil(G / world)
        for j, b in enumerate(out):
            assert np.array_equal(b, ref[j if j < G else (j - G) % G])


@pytest.mark.parametrize("name", [n for n in FACTORIES if n != "sequential"])
def test_epochs_differ_and_seeds_repeat(name):
    a = np.concatenate(_epoch(FACTORIES[name](), 0))
    b = np.concatenate(_epoch(FACTORIES[name](), 0))
    c = np.concatenate(_epoch(FACTORIES[name](), 1))
    d = np.concatenate(_epoch(FACTORIES[name](seed=8), 0))
    assert np.array_equal(a, b)
    m = min(len(a), len(c), len(d))
    assert (a[:m] != c[:m]).mean() > 0.5
    assert (a[:m] != d[:m]).mean() > 0.5


def test_sequential_values_and_len():
    s = S.SequentialSampler(10, 3)
    assert [b.tolist() for b in s] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert len(s) == 4
    assert len(S.SequentialSampler(10, 3, drop_last=True)) == 3
    assert [b.tolist() for b in S.SequentialSampler(10, 3, True)] == [[0, 1, 2], [3, 4, 5],
                                                                       [6, 7, 8]]


def test_iterating_again_replays_the_epoch():
    s = S.RandomSampler(50, 8, seed=1)
    first = [b.copy() for b in s]
    partial = []
    for i, b in enumerate(s):
        partial.append(b.copy())
        if i == 2:
            break
    again = [b.copy() for b in s]
    assert _same(first, again)
    assert _same(first[:3], partial)
    s.set_epoch(1)
    assert not _same(first, [b.copy() for b in s])


# ---- resume -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(FACTORIES))
@pytest.mark.parametrize("w1,w2,k", [(4, 3, 3), (1, 4, 5), (3, 1, 2), (2, 2, 4)])
def test_resume_on_another_world_size(name, w1, w2, k):
    ref = _epoch(FACTORIES[name](), 5)
    G = len(ref)
    first = [FACTORIES[name](rank=r, world_size=w1) for r in range(w1)]
    for r in first:
        r.set_epoch(5)
    out = _lockstep(first, k)
    states = [r.state_dict() for r in first]
    assert all(st == states[0] for st in states)
    assert states[0]["position"] == k * w1 and states[0]["epoch"] == 5
    second = [FACTORIES[name](rank=r, world_size=w2, seed=999) for r in range(w2)]
    for r in second:
        r.load_state_dict(states[0])    # brings seed 7 back
    out += _lockstep(second)
    assert G <= len(out) < G + w2
    for j, b in enumerate(out):
        assert np.array_equal(b, ref[j if j < G else (j - G) % G]), j
    assert second[0].state_dict()["position"] == len(out)


def test_state_dict_kind_is_checked():
    st = S.RandomSampler(10, 2).state_dict()
    with pytest.raises(ValueError, match="random"):
        S.BlockSampler(10, 2).load_state_dict(st)


# ---- size-aware ---------------------------------------------------------------------------------

@pytest.mark.parametrize("max_atoms,max_edges,max_batch,window",
                         [(900, 20000, 4, 100), (1500, 30000, 32, 500),
                          (5000, 100000, 128, 8192), (20000, 400000, 7, 999),
                          (2000, 50000, 1000, 2000), (900, 10**6, 500, 8192)])
def test_size_aware_never_exceeds_a_limit(max_atoms, max_edges, max_batch, window):
    atoms, edges = _skewed_sizes(6000, seed=1)
    s = S.SizeAwareSampler(max_batch_size=max_batch, num_atoms=atoms, num_edges=edges,
                           max_atoms=max_atoms, max_edges=max_edges, window_size=window, seed=3)
    for e in range(2):
        batches = _epoch(s, e)
        sizes = np.array([len(b) for b in batches])
        assert sizes.min() >= 1 and sizes.max() <= max_batch
        assert max(atoms[b].sum() for b in batches) <= max_atoms
        assert max(edges[b].sum() for b in batches) <= max_edges
        assert np.array_equal(np.sort(np.concatenate(batches)), np.arange(6000))
        if max_batch >= 500:   # the atoms limit binds: the fullest batch is within 2% of it
            assert max(atoms[b].sum() for b in batches) >= 0.98 * max_atoms
        lower = max(atoms.sum() / max_atoms, edges.sum() / max_edges, 6000 / max_batch)
        assert len(batches) <= 1.05 * lower + 6000 / window + 1


def test_size_aware_nnz_limit_alone():
    rng = np.random.default_rng(5)
    nnz = rng.pareto(1.5, 4000).astype(np.uint64) * 50 + 1
    nnz = np.minimum(nnz, 30000)
    s = S.SizeAwareSampler(512, nnz=nnz, max_nnz=60000, seed=1)
    batches = list(s)
    assert max(nnz[b].sum() for b in batches) <= 60000
    assert np.array_equal(np.sort(np.concatenate(batches)), np.arange(4000))


def test_size_aware_sample_over_a_limit_fails_with_its_id():
    atoms = np.array([3, 4, 51, 2, 1])
    with pytest.raises(zbatch.ZbatchError, match=r"sample 2 has 51 atoms.*max_atoms = 50") as ei:
        S.SizeAwareSampler(4, num_atoms=atoms, max_atoms=50)
    assert ei.value.status == "ZB_E_INVALID"
    with pytest.raises(ValueError, match="needs the num_edges"):
        S.SizeAwareSampler(4, num_atoms=atoms, max_edges=5)


def test_size_aware_request_replacement():
    atoms, edges = ATOMS[:2000], EDGES[:2000]
    make = lambda: S.SizeAwareSampler(16, num_atoms=atoms, num_edges=edges, max_atoms=1200,
                                      max_edges=40000, window_size=512, rank=1, world_size=2)
    mine = np.zeros(2000, bool)
    mine[np.concatenate(list(make()))] = True
    s = make()
    used = np.zeros(2000, bool)
    it = iter(s)
    for _ in range(5):
        used[next(it)] = True
    rng = np.random.default_rng(9)
    found = 0
    for _ in range(150):
        ra, re = int(rng.integers(5, 125)), int(rng.integers(10, 410))
        i = s.request_replacement(ra, re)
        fits = mine & ~used & (atoms <= ra) & (edges <= re)
        if i is None:
            assert not fits.any()
            continue
        assert fits[i]
        assert atoms[i] == atoms[fits].max()   # the largest that fits
        used[i] = True
        found += 1
    assert found > 50
    for b in it:
        assert not used[b].any()
        used[b] = True
        assert atoms[b].sum() <= 1200 and edges[b].sum() <= 40000
    assert np.array_equal(used, mine)
    assert s.request_replacement() is None
    # a new epoch forgets the replacements
    s.set_epoch(0)
    assert np.array_equal(np.sort(np.concatenate(list(s))), np.flatnonzero(mine))


# ---- multi-dataset ------------------------------------------------------------------------------

# (nvalchemi's semantics over a grid, and the bugs of issue 20: test_multi_sampler_nvalchemi.py)

@pytest.mark.parametrize("policy,replacement,batches", [
    ("dataset_size", True, 40), ("min_size", True, 20), ("max_size", True, 60),
    ("dataset_size", False, 20), ("min_size", False, 20)])
def test_multi_epoch_policies(policy, replacement, batches):
    s = S.MultiDatasetBatchSampler([100, 300], 10, balanced=True, epoch_policy=policy,
                                   replacement=replacement, seed=3)
    assert s.samples_per_dataset == (5, 5)
    out = list(s)
    assert len(out) == len(s) == s.num_batches == batches
    for b in out:
        child, local = s.to_local(b)
        assert len(b) == 10 and (child == 0).sum() == 5
        assert local.min() >= 0 and (local[child == 0] < 100).all()
    if not replacement:
        ids = np.concatenate(out)
        assert len(np.unique(ids)) == len(ids)
        assert set(ids[ids < 100].tolist()) == set(range(100))     # child 0 used up exactly


def test_multi_shares_within_three_sigma():
    for replacement in (False, True):
        s = S.MultiDatasetSampler([5000, 2000], 64, weights=[0.7, 0.3],
                                  num_samples=6000, replacement=replacement, seed=4)
        ids = np.concatenate(list(s))
        share = (ids < 5000).mean()
        assert abs(share - 0.7) <= 3 * math.sqrt(0.21 / len(ids))
        assert len(ids) == 6000
        if not replacement:
            assert (ids < 5000).sum() == 4200 and len(np.unique(ids)) == 6000
    assert S.MultiDatasetBatchSampler([5000, 2000], 64, weights=[0.7, 0.3]
                                      ).samples_per_dataset == (45, 19)


def test_multi_counts_and_fractions():
    M = S.MultiDatasetBatchSampler
    assert M([100, 307], 10, samples_per_dataset=[3, 7]).samples_per_dataset == (3, 7)
    assert M([100, 307], 10, samples_per_dataset=[0.3, 0.7]).samples_per_dataset == (3, 7)
    s = M([100, 307], 10)          # proportional: 2.46 / 7.54
    assert s.samples_per_dataset == (2, 8)
    out = list(s)
    assert len(out) == 41 and {len(b) for b in out} == {10}      # ceil(407 / 10), all full
    with pytest.raises(zbatch.ZbatchError, match="sum to 9"):
        M([100, 307], 10, samples_per_dataset=[3, 6])
    with pytest.raises(ValueError, match="child 1"):
        M([100, 0], 10, samples_per_dataset=[3, 7])
    assert M([[0] * 4, range(6)], 2).sizes == (4, 6)


# ---- block --------------------------------------------------------------------------------------

def _windows_hold_whole_blocks(ids, n, bs, bpw):
    nblocks = -(-n // bs)
    block_len = lambda b: n - (nblocks - 1) * bs if b == nblocks - 1 else bs
    windows, cur, start, have = [], [], 0, {}
    for i, row in enumerate(ids):
        b = int(row) // bs
        if b not in have:
            assert len(cur) < bpw, "a window spans more than blocks_per_window blocks"
            cur.append(b)
            have[b] = 0
        have[b] += 1
        whole = all(have[x] == block_len(x) for x in cur)
        if whole and (len(cur) == bpw or i + 1 == len(ids)):
            windows.append(ids[start:i + 1])
            cur, start = [], i + 1
    assert not cur
    assert len(windows) == -(-nblocks // bpw)
    return windows


def test_block_windows_are_whole_blocks_with_rows_permuted():
    n, bs, bpw = 1007, 10, 4
    s = S.BlockSampler(n, 32, block_size=bs, blocks_per_window=bpw, seed=11)
    for e in range(3):
        ids = np.concatenate(_epoch(s, e))
        assert np.array_equal(np.sort(ids), np.arange(n))
        windows = _windows_hold_whole_blocks(ids, n, bs, bpw)
        same = np.mean(np.concatenate([(w[1:] // bs) == (w[:-1] // bs) for w in windows]))
        assert same < 0.4                    # ~9/39 for shuffled rows, ~36/39 in block order
        assert not any((np.diff(w) > 0).all() for w in windows)
        firsts = [w.min() // bs for w in windows]
        assert not (np.diff(firsts) > 0).all()   # blocks are shuffled too


def test_block_windows_stay_aligned_with_a_short_block():
    """With n not a multiple of block_size, every window but the last still spans exactly
    blocks_per_window * block_size stream rows (the short block is the last window's), so a
    loader whose windows are that many rows reads each sampler window in one request."""
    n, bs, bpw = 1037, 10, 4  # 103 full blocks and one of 7
    s = S.BlockSampler(n, 40, block_size=bs, blocks_per_window=bpw, seed=5)
    firsts = []
    for e in range(4):
        ids = np.concatenate(_epoch(s, e))
        assert np.array_equal(np.sort(ids), np.arange(n))
        windows = _windows_hold_whole_blocks(ids, n, bs, bpw)
        assert [len(w) for w in windows] == [bpw * bs] * 25 + [3 * bs + 7]
        assert set(range(1030, 1037)) <= set(windows[-1].tolist())  # the short block
        firsts.append(frozenset((windows[0] // bs).tolist()))
    assert len(set(firsts)) == 4  # the full blocks are shuffled anew every epoch


def test_block_peer_mappings():
    a = S.BlockSampler.from_annbatch(10_000, chunk_size=64, preload_nchunks=8, batch_size=128)
    assert (a.block_size, a.blocks_per_window, a.batch_size) == (64, 8, 128)
    _windows_hold_whole_blocks(np.concatenate(list(a)), 10_000, 64, 8)
    d = S.BlockSampler.from_scdataset(10_000, block_size=4, fetch_factor=16, batch_size=64)
    assert (d.block_size, d.blocks_per_window) == (4, 256)   # 16 * 64 rows per fetch


# ---- weighted -----------------------------------------------------------------------------------

@pytest.mark.parametrize("block_size", [0, 4])
def test_weighted_frequencies_match_weights(block_size):
    w = np.arange(1, 21, dtype=float)
    w[7] = 0
    s = S.WeightedSampler(w, 1000, num_samples=200_000, block_size=block_size, block_draws=8,
                          seed=5)
    assert len(s) == 200
    ids = np.concatenate(list(s))
    counts = np.bincount(ids, minlength=20)
    assert counts[7] == 0
    keep = w > 0
    expected = w[keep] / w.sum() * len(ids)
    assert stats.chisquare(counts[keep], expected).pvalue > 1e-4
    if block_size:
        runs = ids.reshape(-1, 8) // 4
        assert (runs == runs[:, :1]).all()


def test_weighted_class_balanced():
    pd = pytest.importorskip("pandas")
    codes = np.concatenate([np.zeros(900, int), np.ones(90, int), np.full(10, 2),
                            np.full(50, -1)])
    cat = pd.Categorical.from_codes(codes, categories=["a", "b", "c"])
    for class_weights, want in ((None, [1 / 3] * 3), ([2, 1, 1], [0.5, 0.25, 0.25])):
        s = S.WeightedSampler(class_codes=cat, class_weights=class_weights, batch_size=256,
                              num_samples=30_000, seed=17)
        ids = np.concatenate(list(s))
        assert (codes[ids] >= 0).all()
        got = np.bincount(codes[ids], minlength=3)
        for c in range(3):
            sd = math.sqrt(30_000 * want[c] * (1 - want[c]))
            assert abs(got[c] - 30_000 * want[c]) <= 5 * sd
        # inside a class, members are uniform
        members = ids[codes[ids] == 1] - 900
        assert stats.chisquare(np.bincount(members, minlength=90)).pvalue > 1e-4


def test_weighted_rejects_bad_weights():
    with pytest.raises(zbatch.ZbatchError, match="sample 1"):
        S.WeightedSampler([1.0, -1.0, 2.0])
    with pytest.raises(ValueError, match="exactly one"):
        S.WeightedSampler()
    with pytest.raises(ValueError, match="replacement"):
        S.WeightedSampler([1.0], replacement=False)


# ---- random at scale ----------------------------------------------------------------------------

def test_random_sampler_for_a_trillion_samples():
    n = 10**12
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    s = S.RandomSampler(n, 4096, seed=99, rank=5, world_size=8)
    s.set_epoch(12345)
    assert time.perf_counter() - t0 < 0.05
    assert len(s) == math.ceil(math.ceil(n / 4096) / 8)
    it = iter(s)
    ids = np.concatenate([next(it) for _ in range(8)])
    assert len(ids) == 8 * 4096 and ids.min() >= 0 and ids.max() < n
    assert len(np.unique(ids)) == len(ids)
    assert abs((ids >= n // 2).mean() - 0.5) < 5 * math.sqrt(0.25 / len(ids))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 64 * 1024  # KiB


# ---- rank resolution, factory, C handle ---------------------------------------------------------

def test_rank_world_resolution(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert S.resolve_rank_world() == (0, 1)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert S.resolve_rank_world() == (2, 4)
    s = S.RandomSampler(100, 10)
    assert (s.rank, s.world_size, len(s)) == (2, 4, 3)
    assert S.resolve_rank_world(1, 3) == (1, 3)      # explicit arguments win
    assert S.resolve_rank_world(None, 4) == (2, 4)
    with pytest.raises(ValueError, match="rank"):
        S.resolve_rank_world(4, 4)
    with pytest.raises(ValueError, match="pad_or_drop"):
        S.RandomSampler(10, 2, pad_or_drop="even")


@pytest.mark.parametrize("name,kw,cls", [
    ("sequential", {}, S.SequentialSampler), ("random", {"seed": 1}, S.RandomSampler),
    ("block", {"block_size": 8}, S.BlockSampler), ("weighted", {}, S.WeightedSampler),
    ("size_aware", {"num_atoms": np.ones(100, np.int64), "max_atoms": 10, "drop_last": True},
     S.SizeAwareSampler),
    ("multi", {"sizes": [40, 60], "replacement": False}, S.MultiDatasetBatchSampler),
    ("multi_sample", {"sizes": [40, 60]}, S.MultiDatasetSampler)])
def test_make_sampler(name, kw, cls):
    s = S.make_sampler(name, 100, 10, **kw)
    assert isinstance(s, cls) and isinstance(s, S.Sampler)
    assert isinstance(s._c, _zbatch._Sampler)
    assert s.num_samples == 100
    ids = np.concatenate(list(s))
    assert ids.min() >= 0 and ids.max() < 100
    if name == "size_aware":
        assert max(len(b) for b in s) <= 10


def test_make_sampler_errors():
    with pytest.raises(ValueError, match="unknown sampler"):
        S.make_sampler("nope", 10, 2)
    with pytest.raises(ValueError, match="n=50"):
        S.make_sampler("multi", 50, 2, sizes=[10, 20])
