"""zbatch's MultiDatasetSampler / MultiDatasetBatchSampler against nvalchemi-toolkit 0.2.0's
(issue 20, item 3).

The oracle is nvalchemi's own samplers over nvalchemi's own ``MultiDataset`` (children are
stand-ins that only have a length: the samplers look at nothing else). Over a grid of child
sizes x batch sizes x ratio forms x ``epoch_policy`` x ``replacement`` x ``shuffle`` both must
raise the same exception type, or give the same number of batches and the same per-child
composition of every batch; without ``shuffle`` the very same ids (nvalchemi's order is then
deterministic). With shuffle the ids come from another random stream, so they are checked for
range, within-epoch uniqueness (without replacement) and coverage instead.
"""
from __future__ import annotations

import inspect
import itertools
import math

import numpy as np
import pytest

import zbatch

nvs = pytest.importorskip("nvalchemi.data.datapipes.samplers")
from nvalchemi.data.datapipes.multidataset import MultiDataset as NvMultiDataset  # noqa: E402

NvBatchSampler = nvs.MultiDatasetBatchSampler
NvSampler = nvs.MultiDatasetSampler


class _Child:
    """A child dataset of a given length: what nvalchemi's MultiDataset requires of one
    (BatchDatasetProtocol); the samplers only call ``len``."""

    field_names = ("positions",)

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        raise AssertionError("samplers never read samples")

    def load_batches(self, *a, **k):
        raise AssertionError

    def prefetch(self, *a, **k):
        pass

    def prefetch_fused_batches(self, *a, **k):
        pass

    def get_fused_batches(self):
        return iter(())

    def has_pending_fused_batches(self):
        return False

    def cancel_prefetch(self, index=None):
        pass

    prefetch_count = 0

    def get_metadata(self, index):
        raise AssertionError

    def close(self):
        pass


def _nv_dataset(sizes):
    return NvMultiDataset(*[_Child(n) for n in sizes])


def _compositions(batches, offsets):
    k = len(offsets) - 1
    return [np.bincount(np.searchsorted(offsets[1:], np.asarray(b), side="right"),
                        minlength=k).tolist() for b in batches]


def _outcome(make):
    """(exception type, None) or (None, list of batches as int lists)."""
    try:
        s = make()
        return None, [list(map(int, b)) for b in s]
    except ValueError:
        return ValueError, None
    except TypeError:
        return TypeError, None


def _ratio_forms(k, b):
    """The ways of giving the composition: (label, kwargs)."""
    counts = [b // k] * k
    counts[0] += b - sum(counts)
    rates = [float(i + 1) for i in range(k)]
    return [("default", {}), ("weights", {"weights": rates}),
            ("counts", {"samples_per_dataset": counts}),
            ("float_counts", {"samples_per_dataset": [r / 10 for r in rates]}),
            ("balanced", None)]


SIZES = [[13], [10, 10, 10], [400, 150, 38], [100, 0, 25], [7, 60], [5, 5, 5, 5, 200]]


def _check_ids(zb, sizes, replacement, case):
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    ids = np.concatenate([np.asarray(b) for b in zb]) if zb else np.zeros(0, np.int64)
    assert ids.min() >= 0 and ids.max() < offsets[-1], case
    if not replacement:
        assert len(np.unique(ids)) == len(ids), f"{case}: an id repeats within the epoch"


@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_batch_sampler_matches_nvalchemi_grid(sizes):
    nv_ds = _nv_dataset(sizes)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    compared = raised = 0
    for b, policy, replacement, shuffle in itertools.product(
            (4, 12, 7), ("dataset_size", "min_size", "max_size"), (True, False), (True, False)):
        for label, kw in _ratio_forms(len(sizes), b):
            common = dict(batch_size=b, epoch_policy=policy, replacement=replacement,
                          shuffle=shuffle, seed=3)
            if kw is None:
                nv = _outcome(lambda: NvBatchSampler.balanced(nv_ds, **common))
                zb = _outcome(lambda: zbatch.MultiDatasetBatchSampler.balanced(sizes, **common))
            else:
                nv = _outcome(lambda: NvBatchSampler(nv_ds, **common, **kw))
                zb = _outcome(lambda: zbatch.MultiDatasetBatchSampler(nv_ds, **common, **kw))
            case = f"sizes={sizes} {label} {common}"
            assert nv[0] == zb[0], f"{case}: nvalchemi raised {nv[0]}, zbatch {zb[0]}"
            if nv[0] is not None:
                raised += 1
                continue
            compared += 1
            assert len(zb[1]) == len(nv[1]), case
            assert _compositions(zb[1], offsets) == _compositions(nv[1], offsets), case
            if not shuffle:
                assert zb[1] == nv[1], f"{case}: unshuffled order differs"
            _check_ids(zb[1], sizes, replacement, case)
    assert compared >= 30 and (raised > 0 or len(sizes) == 1)   # both outcomes are covered


@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_sampler_matches_nvalchemi_grid(sizes):
    """Per-sample MultiDatasetSampler: nvalchemi's emits ids, zbatch's the same ids cut into
    batches; per-epoch counts per child are exact except with replacement and shuffle."""
    nv_ds = _nv_dataset(sizes)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    k = len(sizes)
    weight_forms = (None, [1.0] * k, [float(i + 1) for i in range(k)], [0.0] * k,
                    [-1.0] + [1.0] * (k - 1))
    for weights, num_samples, replacement, shuffle in itertools.product(
            weight_forms, (None, 9, 40), (True, False), (True, False)):
        common = dict(weights=weights, num_samples=num_samples, replacement=replacement,
                      shuffle=shuffle, seed=5)
        case = f"sizes={sizes} {common}"
        zb = _outcome(lambda: zbatch.MultiDatasetSampler(nv_ds, 8, **common))
        try:
            nv = _outcome(lambda: [NvSampler(nv_ds, **common)])
        except RuntimeError:
            # nvalchemi 0.2.0 crashes drawing from an empty child of weight 0 with replacement
            # (torch.randint(0, (0,))); zbatch never draws from it
            assert 0 in sizes and replacement and shuffle and zb[0] is None, case
            _check_ids(zb[1], sizes, replacement, case)
            continue
        assert nv[0] == zb[0], f"{case}: nvalchemi raised {nv[0]}, zbatch {zb[0]}"
        if nv[0] is not None:
            continue
        nv_ids = nv[1][0]
        assert [len(b) for b in zb[1]] == [len(nv_ids[i:i + 8]) for i in range(0, len(nv_ids), 8)]
        zb_ids = [i for b in zb[1] for i in b]
        if not shuffle:
            assert zb_ids == nv_ids, case
        elif not replacement:
            assert _compositions([zb_ids], offsets) == _compositions([nv_ids], offsets), case
        _check_ids(zb[1], sizes, replacement, case)


def test_sampler_shares_with_replacement_follow_weights():
    s = zbatch.MultiDatasetSampler([500, 100, 50], 64, weights=[0.2, 0.5, 0.3],
                                   num_samples=20000, seed=1)
    ids = np.concatenate(list(s))
    share = np.bincount(s.to_local(ids)[0], minlength=3) / len(ids)
    for got, p in zip(share, (0.2, 0.5, 0.3)):
        assert abs(got - p) <= 4 * math.sqrt(p * (1 - p) / len(ids))
    per_batch = {tuple(np.bincount(s.to_local(b)[0], minlength=3)) for b in s}
    assert len(per_batch) > 10       # compositions vary per batch (nvalchemi's MultiDatasetSampler)


# ---- the bugs of issue 20, each first reproduced against the old sampler ----------------------

def test_bug_single_child_without_replacement_is_a_permutation():
    # was: 12 twice and never 10
    s = zbatch.MultiDatasetBatchSampler([13], 4, seed=0, replacement=False)
    ids = np.concatenate(list(s))
    assert len(s) == 3 and len(ids) == 12 and len(np.unique(ids)) == 12   # floor(13 / 4) batches
    s = zbatch.MultiDatasetSampler([13], 4, seed=0, replacement=False)
    assert sorted(np.concatenate(list(s)).tolist()) == list(range(13))


def test_bug_no_short_final_batch():
    # was: [10, 10, 10] at batch 12 ended with a (1, 3, 2) batch and 27 of 30 samples
    s = zbatch.MultiDatasetBatchSampler([10, 10, 10], 12, seed=0)
    assert [tuple(np.bincount(s.to_local(b)[0], minlength=3)) for b in s] == [(4, 4, 4)] * 3
    s = zbatch.MultiDatasetBatchSampler([10, 10, 10], 12, seed=0, replacement=False)
    batches = list(s)
    assert len(batches) == 2 and all(len(b) == 12 for b in batches)


def test_bug_min_size_with_replacement_gives_full_batches():
    # was: a short (4, 2, 0) last batch; nvalchemi gives 38 full (8, 3, 1) batches
    s = zbatch.MultiDatasetBatchSampler([400, 150, 38], 12, epoch_policy="min_size", seed=0)
    comp = {tuple(np.bincount(s.to_local(b)[0], minlength=3)) for b in s}
    assert len(s) == 38 and comp == {(8, 3, 1)}
    # min ceil(len_i / c_i) = ceil(100 / 3) = 34 full batches (the old rule ended on (2, 1, 1))
    s = zbatch.MultiDatasetBatchSampler([300, 100, 37], 12, epoch_policy="min_size", seed=0)
    comp = {tuple(np.bincount(s.to_local(b)[0], minlength=3)) for b in s}
    assert len(s) == 34 and comp == {(8, 3, 1)}


def test_bug_counts_without_replacement():
    # was: 40 batches for dataset_size; nvalchemi: min floor(len_i / count_i)
    s = zbatch.MultiDatasetBatchSampler([100, 307], 10, replacement=False)
    assert s.samples_per_dataset == (2, 8) and len(s) == min(100 // 2, 307 // 8) == 38
    ids = np.concatenate(list(s))
    assert len(np.unique(ids)) == len(ids) == 380


def test_bug_max_size_without_replacement_raises():
    # was: cycled through the smaller child
    with pytest.raises(ValueError, match="max_size needs replacement"):
        zbatch.MultiDatasetBatchSampler([100, 300], 10, balanced=True, epoch_policy="max_size",
                                        replacement=False)
    with pytest.raises(ValueError, match="at most 20 complete batches"):
        zbatch.MultiDatasetBatchSampler([100, 300], 10, balanced=True, num_batches=21,
                                        replacement=False)


def test_bug_replacement_defaults_to_true():
    for ours, theirs in ((zbatch.MultiDatasetBatchSampler, NvBatchSampler),
                         (zbatch.MultiDatasetSampler, NvSampler)):
        assert inspect.signature(ours).parameters["replacement"].default is True
        assert inspect.signature(theirs).parameters["replacement"].default is True
    # with replacement, [13] at batch 4 has ceil(13 / 4) full batches
    assert [len(b) for b in zbatch.MultiDatasetBatchSampler([13], 4)] == [4] * 4


def test_bug_balanced_constructor():
    s = zbatch.MultiDatasetBatchSampler.balanced([100, 300, 30], batch_size=9, seed=2)
    nv = NvBatchSampler.balanced(_nv_dataset([100, 300, 30]), batch_size=9)
    assert s.samples_per_dataset == tuple(nv.samples_per_dataset) == (3, 3, 3)
    assert len(s) == len(nv) == 48
    with pytest.raises(ValueError, match="child 1 has a positive rate but no samples"):
        zbatch.MultiDatasetBatchSampler.balanced([100, 0], batch_size=4)


def test_errors_name_what_is_wrong():
    M = zbatch.MultiDatasetBatchSampler
    with pytest.raises(ValueError, match="sum to 9, not batch_size 10"):
        M([100, 307], 10, samples_per_dataset=[3, 6])
    with pytest.raises(ValueError, match="child 1 contributes 7 samples per batch"):
        M([100, 0], 10, samples_per_dataset=[3, 7])
    with pytest.raises(TypeError, match="integral counts, got True"):
        M([100, 10], 2, samples_per_dataset=[True, 1])
    with pytest.raises(ValueError, match="mutually exclusive"):
        M([1, 1], 2, weights=[1, 1], samples_per_dataset=[1, 1])
    with pytest.raises(ValueError, match="child 0 has rate nan"):
        M([1, 1], 2, weights=[float("nan"), 1.0])
    with pytest.raises(zbatch.ZbatchError):      # still a ZbatchError too
        M([1, 1], 2, weights=[-1.0, 1.0])
    with pytest.raises(TypeError, match="use MultiDatasetBatchSampler"):
        zbatch.MultiDatasetSampler([10, 10], 4, epoch_policy="min_size")
    with pytest.raises(ValueError, match="child 0 cannot give 20 samples"):
        zbatch.MultiDatasetSampler([10, 30], 8, weights=[1.0, 1.0], replacement=False)


# ---- zbatch's own properties: resume, ranks, the C path -----------------------------------------

@pytest.mark.parametrize("make", [
    lambda: zbatch.MultiDatasetBatchSampler([130, 470, 77], 16, replacement=False, seed=9),
    lambda: zbatch.MultiDatasetBatchSampler([130, 470, 77], 16, epoch_policy="max_size", seed=9),
    lambda: zbatch.MultiDatasetSampler([130, 470, 77], 16, seed=9),
    lambda: zbatch.MultiDatasetSampler([130, 470, 77], 16, replacement=False, seed=9),
], ids=["batch", "batch_replacement", "sample", "sample_without"])
def test_resume_mid_epoch_gives_the_same_remaining_batches(make):
    full = make()
    full.set_epoch(2)
    expected = [b.copy() for b in full]
    first = make()
    first.set_epoch(2)
    it = iter(first)
    for _ in range(5):
        next(it)
    state = first.state_dict()
    assert state["position"] == 5 and state["epoch"] == 2
    resumed = make()
    resumed.load_state_dict(state)
    rest = [b.copy() for b in resumed]
    assert len(rest) == len(expected) - 5
    assert all(np.array_equal(a, b) for a, b in zip(rest, expected[5:]))


@pytest.mark.parametrize("world,drop_last", [(2, False), (3, False), (3, True), (4, True)])
def test_ranks_split_the_epoch_without_overlap(world, drop_last):
    sizes = [130, 470, 77]
    one = [b.tolist() for b in zbatch.MultiDatasetBatchSampler(sizes, 16, replacement=False,
                                                               seed=4, rank=0, world_size=1)]
    nv = NvBatchSampler(_nv_dataset(sizes), batch_size=16, replacement=False, num_replicas=world,
                        rank=0, drop_last=drop_last)
    per_rank = []
    for r in range(world):
        s = zbatch.MultiDatasetBatchSampler(sizes, 16, replacement=False, seed=4, rank=r,
                                            num_replicas=world, drop_last=drop_last)
        per_rank.append([b.tolist() for b in s])
        assert len(s) == len(per_rank[-1]) == len(nv)          # nvalchemi's per-rank count
    # global batch g goes to rank g % world; padding repeats the epoch's first batches
    flat = [per_rank[g % world][g // world] for g in range(len(nv) * world)]
    assert flat[:min(len(flat), len(one))] == one[:len(flat)]
    assert flat[len(one):] == one[:max(0, len(flat) - len(one))]
    covered = flat[:len(one)]
    ids = np.concatenate(covered)
    assert len(np.unique(ids)) == len(ids)                     # no sample on two ranks


def test_huge_children_cost_nothing():
    """O(children) memory and O(batch) work per batch: a 10^12-sample child is instant."""
    s = zbatch.MultiDatasetBatchSampler([10**12, 5], 6, samples_per_dataset=[5, 1],
                                        epoch_policy="max_size")
    assert len(s) == 2 * 10**11
    b = next(iter(s))
    child, local = s.to_local(b)
    assert sorted(child.tolist()) == [0, 0, 0, 0, 0, 1] and local.max() < 10**12
    s = zbatch.MultiDatasetSampler([10**12, 10**12], 4, num_samples=10**9, replacement=False)
    assert len(s) == 25 * 10**7


def test_nvalchemi_arguments_generator_and_distributed_manager():
    torch = pytest.importorskip("torch")

    class Manager:           # nvalchemi's DistributedManager, as the samplers use it
        world_size, rank = 3, 2

        def is_initialized(self):
            return True

    gen = torch.Generator().manual_seed(11)
    a = zbatch.MultiDatasetBatchSampler([50, 70], 6, generator=gen,
                                        distributed_manager=Manager())
    b = zbatch.MultiDatasetBatchSampler([50, 70], 6, seed=11, rank=2, world_size=3)
    assert (a.rank, a.world_size, a.seed) == (2, 3, 11)
    assert [x.tolist() for x in a] == [x.tolist() for x in b]
    nv = NvBatchSampler(_nv_dataset([50, 70]), batch_size=6, num_replicas=3, rank=2)
    assert len(a) == len(nv) == 7
