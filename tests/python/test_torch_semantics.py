"""PyTorch semantics of zbatch's Python package (issue 18, items 1 and 2): independent
iterators, a fresh order per pass, torch's argument rules, torch samplers and batch samplers,
num_workers / collate_fn / device, validated state dicts and arguments, the map-style Dataset
(indexing, pickling) inside torch's own DataLoader, and the IterableDataset adapter split
across workers and ranks.

Oracles: the AnnData object the store was written from (values), torch's own samplers and
DataLoader (ids and argument rules), zbatch's samplers iterated on their own (orders), numpy
set algebra (coverage)."""
import pickle

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch
import torch.utils.data as tud
import zarr

import zbatch
from zbatch.samplers import make_sampler

N, GENES, BS = 600, 40, 50          # 12 batches per epoch


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(3)
    x = sp.random(N, GENES, density=0.2, format="csr", random_state=4, dtype=np.float32)
    counts = sp.random(N, GENES, density=0.1, format="csr", random_state=5, dtype=np.float32)
    obs = pd.DataFrame({"kind": pd.Categorical(rng.choice(["a", "b", "c"], N)),
                        "label": [f"cell-{i}" for i in range(N)],
                        "depth": rng.integers(0, 100, N).astype(np.int64)},
                       index=[f"c{i}" for i in range(N)])
    a = ad.AnnData(X=x, obs=obs, var=pd.DataFrame(index=[f"g{j}" for j in range(GENES)]),
                   layers={"counts": counts})
    p = tmp_path_factory.mktemp("torchsem") / "cells.zarr"
    a.write_zarr(str(p))
    return p, a


def rows(m, ids):
    return sp.csr_matrix(m)[np.asarray(ids, dtype=np.int64)]


def same_csr(x, y):
    x, y = sp.csr_matrix(x), sp.csr_matrix(y)
    return x.shape == y.shape and (x != y).nnz == 0


def ids(batches):
    return [np.asarray(b["index"], dtype=np.int64).copy() for b in batches]


def epoch_order(epoch, name="random", seed=0, batch_size=BS):
    sm = make_sampler(name, n=N, batch_size=batch_size, seed=seed)
    sm.set_epoch(epoch)
    return [np.asarray(b, dtype=np.int64).copy() for b in sm]


# -- iterators ---------------------------------------------------------------------------------
@pytest.mark.parametrize("sampler", ["random", "torch"])
def test_a_second_iterator_does_not_end_the_first(store, sampler):
    """Issue 18: ``next(iter(loader))`` inside ``for b in loader`` ended the outer pass after
    4 of 12 batches. Now the outer pass yields all 12 batches, in the order of an uninterrupted
    pass; the inner iterator is its own pass over the same epoch from its start."""
    p, a = store
    ds = zbatch.open(p)
    if sampler == "torch":
        def make():
            return zbatch.DataLoader(ds, batch_size=BS, sampler=tud.SequentialSampler(ds))
        want = [np.arange(i, i + BS) for i in range(0, N, BS)]
    else:
        def make():
            return zbatch.DataLoader(ds, batch_size=BS, sampler="random", seed=4)
        want = epoch_order(0, seed=4)
    dl = make()
    outer, peeks = [], []
    for i, b in enumerate(dl):
        outer.append(np.asarray(b["index"], dtype=np.int64).copy())
        if i in (3, 7):
            peek = next(iter(dl))
            peeks.append(np.asarray(peek["index"], dtype=np.int64).copy())
            assert same_csr(peek["X"], rows(a.X, peeks[-1]))
        if i == 5:
            assert dl.state_dict()["position"] == 6  # the state follows the outer pass
    assert len(outer) == 12
    for got, w in zip(outer, want):
        np.testing.assert_array_equal(got, w)
    for pk in peeks:
        np.testing.assert_array_equal(pk, want[0])
    # two iterators side by side, advanced alternately, each a whole pass
    dl = make()
    it1, it2 = iter(dl), iter(dl)
    got1, got2 = [], []
    for _ in range(12):
        got1.append(np.asarray(next(it1)["index"], dtype=np.int64).copy())
        got2.append(np.asarray(next(it2)["index"], dtype=np.int64).copy())
    assert next(it1, None) is None and next(it2, None) is None
    np.testing.assert_array_equal(np.concatenate(got1), np.concatenate(want))
    np.testing.assert_array_equal(np.concatenate(got2), np.concatenate(want))


def test_passes_reshuffle_without_set_epoch_and_resume_exactly(store):
    """Issue 18: every pass repeated one permutation. Pass k of a loader without set_epoch
    is epoch k (a fresh permutation, as torch's shuffle=True); a state saved mid-pass resumes
    it exactly and the passes after it follow as uninterrupted; with set_epoch the epoch
    decides and repeats."""
    p, _ = store
    ds = zbatch.open(p)
    dl = zbatch.DataLoader(ds, batch_size=BS, shuffle=True, seed=9)
    want = [np.concatenate(epoch_order(e, seed=9)) for e in range(4)]
    passes = [np.concatenate(ids(dl)) for _ in range(3)]
    for k in range(3):
        np.testing.assert_array_equal(passes[k], want[k])
        assert sorted(passes[k].tolist()) == list(range(N))
    assert not np.array_equal(passes[0], passes[1])
    # torch's own loader does the same: two passes of shuffle=True differ
    tl = tud.DataLoader(range(N), batch_size=BS, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    assert [t.tolist() for t in tl] != [t.tolist() for t in tl]
    # resume in the middle of pass 1 (epoch 1), then pass 2 follows
    dl = zbatch.DataLoader(ds, batch_size=BS, shuffle=True, seed=9)
    ids(dl)
    it = iter(dl)
    head = [np.asarray(next(it)["index"], dtype=np.int64).copy() for _ in range(5)]
    state = dl.state_dict()
    assert state["epoch"] == 1 and state["position"] == 5 and state["num_samples"] == N
    del it
    dl2 = zbatch.DataLoader(ds, batch_size=BS, shuffle=True, seed=9)
    dl2.load_state_dict(state)
    np.testing.assert_array_equal(np.concatenate(head + ids(dl2)), want[1])
    np.testing.assert_array_equal(np.concatenate(ids(dl2)), want[2])
    # set_epoch: the epoch decides, every pass
    dl2.set_epoch(3)
    np.testing.assert_array_equal(np.concatenate(ids(dl2)), want[3])
    np.testing.assert_array_equal(np.concatenate(ids(dl2)), want[3])


# -- arguments as torch takes them --------------------------------------------------------------
@pytest.mark.parametrize("kw", [
    dict(shuffle=True, sampler="sequential"),
    dict(shuffle=True, sampler="torch-seq"),
    dict(batch_sampler="torch-bs", batch_size=8),
    dict(batch_sampler="torch-bs", shuffle=True),
    dict(batch_sampler="torch-bs", sampler="torch-seq"),
    dict(batch_sampler="torch-bs", drop_last=True),
    dict(num_workers=-1),
])
def test_conflicting_arguments_raise_as_torch_does(store, kw):
    """Issue 18: ``shuffle=True, sampler="sequential"`` silently yielded 0..N-1. Each
    combination torch refuses is refused here with torch's message (the oracle: torch's own
    DataLoader raising ValueError for the same arguments)."""
    p, _ = store
    ds = zbatch.open(p)

    def resolve(kw, torch_side):
        out = dict(kw)
        for k, v in kw.items():
            if v == "torch-seq":
                out[k] = tud.SequentialSampler(range(N))
            elif v == "torch-bs":
                out[k] = tud.BatchSampler(tud.SequentialSampler(range(N)), 8, False)
            elif v == "sequential" and torch_side:
                out[k] = tud.SequentialSampler(range(N))
        return out

    with pytest.raises(ValueError) as theirs:
        tud.DataLoader(range(N), **resolve(kw, True))
    with pytest.raises(ValueError) as ours:
        zbatch.DataLoader(ds, **resolve(kw, False))
    assert str(ours.value) == str(theirs.value)


def test_torch_random_sampler_gives_torchs_ids(store):
    """Issue 18: ``sampler=torch RandomSampler`` failed with AttributeError '_state_dict'.
    Now its ids, batched by batch_size / drop_last, are exactly what torch's DataLoader
    yields with the same generator state, and the values are the AnnData rows."""
    p, a = store
    ds = zbatch.open(p)
    for drop_last in (False, True):
        bs = 64   # 600 = 9 * 64 + 24: a short last batch
        ours = zbatch.DataLoader(ds, batch_size=bs, drop_last=drop_last,
                                 sampler=tud.RandomSampler(ds, generator=torch.Generator()
                                                           .manual_seed(11)))
        theirs = tud.DataLoader(range(N), batch_size=bs, drop_last=drop_last,
                                sampler=tud.RandomSampler(range(N), generator=torch.Generator()
                                                          .manual_seed(11)))
        want = [t.numpy() for t in theirs]
        got = list(ours)
        assert len(got) == len(want) == len(ours) == len(theirs)
        for b, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(b["index"], dtype=np.int64), w)
            assert same_csr(b["X"], rows(a.X, w))
            np.testing.assert_array_equal(b["obs/depth"], a.obs["depth"].values[w])
        # the second pass draws a new permutation from the generator, as torch's does
        np.testing.assert_array_equal(np.concatenate(ids(ours)),
                                      np.concatenate([t.numpy() for t in theirs]))


def test_batch_samplers_torchs_and_plain_lists(store):
    """Issue 18: ``batch_sampler=`` was an unexpected keyword. A torch BatchSampler and a
    plain list of id lists give exactly their batches; a sampler of single ids given as
    batch_sampler is a TypeError; ids out of range an IndexError."""
    p, a = store
    ds = zbatch.open(p)
    bs = tud.BatchSampler(tud.RandomSampler(range(N), generator=torch.Generator()
                                            .manual_seed(2)), 7, drop_last=True)
    want = list(tud.BatchSampler(tud.RandomSampler(range(N), generator=torch.Generator()
                                                   .manual_seed(2)), 7, drop_last=True))
    dl = zbatch.DataLoader(ds, batch_sampler=bs, prefetch_factor=2, depth=2)
    got = ids(dl)
    assert len(dl) == len(want) == len(got) == N // 7
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    lists = [[5, 3, 3], [0], [599, 1]]
    got = list(zbatch.DataLoader(ds, batch_sampler=lists))
    assert [b["index"].tolist() for b in got] == lists
    for b, w in zip(got, lists):
        assert same_csr(b["X"], rows(a.X, w))
    with pytest.raises(TypeError, match="batch_sampler"):
        list(zbatch.DataLoader(ds, batch_sampler=tud.SequentialSampler(range(N))))
    with pytest.raises(IndexError, match="600"):
        list(zbatch.DataLoader(ds, batch_sampler=[[1, 600]]))
    # a zbatch sampler as batch_sampler keeps the C pipeline
    zs = make_sampler("random", n=N, batch_size=BS, seed=1)
    np.testing.assert_array_equal(np.concatenate(ids(zbatch.DataLoader(ds, batch_sampler=zs))),
                                  np.concatenate(epoch_order(0, seed=1)))


def test_python_sampler_state_resumes_with_its_generator(store):
    """A torch RandomSampler with a generator: a state saved mid-pass (with the generator's
    state at the start of the pass) resumes exactly in a loader whose generator was seeded
    differently; a past-the-end position is refused."""
    p, _ = store
    ds = zbatch.open(p)

    def make(seed):
        return zbatch.DataLoader(ds, batch_size=BS, sampler=tud.RandomSampler(
            range(N), generator=torch.Generator().manual_seed(seed)))

    full = ids(make(5))
    dl = make(5)
    it = iter(dl)
    head = [np.asarray(next(it)["index"], dtype=np.int64).copy() for _ in range(4)]
    state = dl.state_dict()
    assert state["kind"] == "python" and state["position"] == 4
    del it
    dl2 = make(123)
    dl2.load_state_dict(state)
    np.testing.assert_array_equal(np.concatenate(head + ids(dl2)), np.concatenate(full))
    with pytest.raises(ValueError, match="position"):
        dl2.load_state_dict({**state, "position": 13})
    with pytest.raises(ValueError, match="kind"):
        dl2.load_state_dict({"kind": "random", "seed": 0, "epoch": 0, "position": 0})


def test_num_workers_collate_fn_and_device(store):
    """Issue 18: num_workers= / collate_fn= were unexpected keywords, and device="cuda",
    pin_memory=True with the default output silently gave numpy arrays on the host."""
    p, a = store
    ds = zbatch.open(p)
    zbatch.DataLoader(ds, batch_size=BS, num_workers=3)
    assert ds._threads() == 3                       # workers are decode threads
    zbatch.DataLoader(ds, batch_size=BS, num_workers=3, num_threads=2)
    assert ds._threads() == 2                       # num_threads wins
    sums = list(zbatch.DataLoader(ds, batch_size=BS, collate_fn=lambda b: b["X"].sum()))
    want = [rows(a.X, np.arange(i, i + BS)).sum() for i in range(0, N, BS)]
    np.testing.assert_allclose(sums, want, rtol=1e-5)
    with pytest.raises(ValueError, match="output='torch'"):
        zbatch.DataLoader(ds, device="cuda", pin_memory=True)
    with pytest.raises(ValueError, match="output='torch'"):
        zbatch.DataLoader(ds, pin_memory=True, output="scipy")
    if torch.cuda.is_available():
        b = next(iter(zbatch.DataLoader(ds, batch_size=BS, device="cuda", output="torch")))
        assert b["obs/depth"].is_cuda
    else:
        with pytest.raises(ValueError, match="cuda"):
            zbatch.DataLoader(ds, device="cuda", output="torch")
    with pytest.raises(TypeError, match="collate_fn"):
        zbatch.DataLoader(ds, collate_fn=42)


def test_state_dicts_and_arguments_are_validated(store):
    """Issue 18: a position past the epoch end was accepted (the pass yielded nothing) and
    num_threads=-1 too. Each bad field is a ValueError naming it, and the loader is left as it
    was."""
    p, _ = store
    ds = zbatch.open(p)
    dl = zbatch.DataLoader(ds, batch_size=BS, sampler="random", seed=1)
    good = dl.state_dict()
    assert good == {"kind": "random", "seed": 1, "epoch": 0, "position": 0, "num_samples": N}
    bad = [({**good, "position": 13}, "position"), ({**good, "kind": "block"}, "kind"),
           ({**good, "num_samples": N + 1}, "num_samples"), ({**good, "epoch": -1}, "epoch"),
           ({k: v for k, v in good.items() if k != "seed"}, "seed"),
           ({**good, "position": "3"}, "position")]
    for state, field in bad:
        with pytest.raises(ValueError, match=field):
            dl.load_state_dict(state)
    dl.load_state_dict({**good, "position": 12})  # the end of the epoch is a valid state
    np.testing.assert_array_equal(np.concatenate(ids(dl)), np.concatenate(epoch_order(1, seed=1)))
    for n in (-1, 0):
        with pytest.raises(ValueError, match="num_threads"):
            zbatch.DataLoader(ds, num_threads=n)
        with pytest.raises(ValueError, match="num_threads"):
            zbatch.open(p, num_threads=n)
        with pytest.raises(ValueError, match="num_threads"):
            ds.set_num_threads(n)


@pytest.mark.parametrize("result", [None, [42], 42])
def test_batch_transforms_must_return_a_batch(store, result):
    """Issue 18: a batch transform returning None (or a list holding 42) was accepted and
    None reached the training loop."""
    p, _ = store
    ds = zbatch.open(p)

    def broken_transform(b):
        return result

    dl = zbatch.DataLoader(ds, batch_size=BS, batch_transforms=[broken_transform])
    with pytest.raises(TypeError, match="broken_transform"):
        next(iter(dl))
    ok = zbatch.DataLoader(ds, batch_size=BS,
                           batch_transforms=[lambda b: {"n": b["index"].size}])
    assert [b["n"] for b in ok] == [BS] * 12


def test_open_refuses_what_is_not_a_path(store):
    """Issue 18: ``zbatch.open(zarr.storage.MemoryStore())`` reported "no such directory"
    with the object's repr. A LocalStore is opened by its root; other objects are a TypeError
    saying what is accepted."""
    p, a = store
    with pytest.raises(TypeError, match="MemoryStore.*path"):
        zbatch.open(zarr.storage.MemoryStore())
    with pytest.raises(TypeError, match="path"):
        zbatch.open(42)
    ds = zbatch.open(zarr.storage.LocalStore(str(p)))
    assert len(ds) == N and same_csr(ds.read_many([3, 1])["X"], rows(a.X, [3, 1]))


# -- the map-style Dataset -----------------------------------------------------------------------
def test_dataset_is_a_map_style_dataset(store):
    """Issue 18: a Dataset was not subscriptable. ``ds[i]`` is one sample (X a 1-row CSR,
    scalars for per-sample fields), ``ds[list]`` / ``ds[array]`` / ``ds[slice]`` a batch as
    read_many; negative ids count from the end; out of range is an IndexError."""
    p, a = store
    ds = zbatch.open(p, load_strings=True)
    codes = a.obs["kind"].cat.codes.values
    for i in (0, 17, N - 1, -1, np.int64(5), torch.tensor(9)):
        s = ds[i]
        j = int(i) % N
        assert s["index"] == j
        assert sp.issparse(s["X"]) and s["X"].shape == (1, GENES)
        assert same_csr(s["X"], rows(a.X, [j]))
        assert s["obs/depth"] == a.obs["depth"].values[j]
        assert s["obs/kind"] == codes[j]
        assert s["obs/label"] == f"cell-{j}"
    for key in ([4, 2, 4], np.array([4, 2, 4]), torch.tensor([4, 2, 4])):
        b = ds[key]
        assert isinstance(b, zbatch.Batch)
        assert same_csr(b["X"], rows(a.X, [4, 2, 4]))
    b = ds[10:20:3]
    assert b["index"].tolist() == [10, 13, 16, 19]
    with pytest.raises(IndexError):
        ds[N]
    with pytest.raises(IndexError):
        ds[[0, N]]
    # zbatch.collate: sample dicts back into a batch equal to read_many's
    c = zbatch.collate([ds[i] for i in (3, 8, 1)])
    want = ds.read_many([3, 8, 1])
    assert same_csr(c["X"], want["X"])
    np.testing.assert_array_equal(c["obs/depth"], want["obs/depth"])
    np.testing.assert_array_equal(c["index"], [3, 8, 1])
    assert list(c["obs/label"]) == ["cell-3", "cell-8", "cell-1"]


def test_pickled_datasets_reopen_with_their_options(store):
    """Issue 18: a Dataset could not be pickled. It re-opens by path with the options it was
    opened with (layer, load_strings, cache_bytes, threads...); a MultiDataset pickles its
    children, an InMemoryDataset its source."""
    p, a = store
    ds = zbatch.open(p, layer="counts", load_strings=True, cache_bytes=1 << 20, num_threads=2)
    ds2 = pickle.loads(pickle.dumps(ds))
    assert type(ds2) is zbatch.Dataset and ds2._open_args == ds._open_args
    assert same_csr(ds2[[5, 1]]["X"], rows(a.layers["counts"], [5, 1]))
    assert list(ds2[[5, 1]]["obs/label"]) == ["cell-5", "cell-1"]
    md = zbatch.MultiDataset([zbatch.open(p), zbatch.open(p)])
    md2 = pickle.loads(pickle.dumps(md))
    assert type(md2) is zbatch.MultiDataset and len(md2) == 2 * N and md2.sizes == [N, N]
    b = md2[[1, N + 2]]
    assert same_csr(b["X"], rows(a.X, [1, 2])) and b["dataset"].tolist() == [0, 1]
    mem = zbatch.InMemoryDataset(zbatch.open(p))
    mem2 = pickle.loads(pickle.dumps(mem))
    assert type(mem2) is zbatch.InMemoryDataset and same_csr(mem2[[7]]["X"], rows(a.X, [7]))


@pytest.mark.parametrize("context", [None, "spawn"])
def test_torchs_dataloader_over_a_zbatch_dataset(store, context):
    """torch's own DataLoader (worker processes: forked, and spawned, which pickles the
    dataset) over a zbatch.Dataset with zbatch.collate gives the batches zbatch's loader
    gives."""
    p, a = store
    ds = zbatch.open(p, num_threads=2)
    ds.read_many([0, 1])   # used (threads started) before the workers fork
    kw = dict(num_workers=2, timeout=120)
    if context:
        kw["multiprocessing_context"] = context
    theirs = list(tud.DataLoader(ds, batch_size=BS, collate_fn=zbatch.collate, **kw))
    ours = list(zbatch.DataLoader(ds, batch_size=BS, sampler="sequential"))
    assert len(theirs) == len(ours) == 12
    for t, o in zip(theirs, ours):
        np.testing.assert_array_equal(t["index"], o["index"])
        assert same_csr(t["X"], o["X"])
        np.testing.assert_array_equal(t["obs/kind"], o["obs/kind"])
    # single process, torch tensors out
    t = next(iter(tud.DataLoader(ds, batch_size=4,
                                 collate_fn=lambda s: zbatch.collate(s, output="torch"))))
    assert t["X"].layout == torch.sparse_csr
    np.testing.assert_allclose(t["X"].to_dense().numpy(), rows(a.X, range(4)).toarray())


# -- the IterableDataset adapter ------------------------------------------------------------------
@pytest.mark.parametrize("pad_or_drop", [None, "pad"])
def test_iterable_loader_splits_across_workers_and_ranks(store, pad_or_drop):
    """zbatch.IterableLoader in torch's DataLoader with 2 workers on each of 2 (simulated)
    ranks: every id exactly once per epoch across the 4 parts (11 global batches, not a
    multiple of 4), with the AnnData values; "pad" gives every part the same count."""
    p, a = store
    ds = zbatch.open(p)
    bs = 56   # 600 = 10 * 56 + 40: 11 global batches
    seen, counts = [], []
    for rank in (0, 1):
        it = zbatch.IterableLoader(ds, batch_size=bs, sampler="random", seed=3, rank=rank,
                                   world_size=2, pad_or_drop=pad_or_drop, prefetch_factor=2)
        it.set_epoch(1)
        assert isinstance(it, tud.IterableDataset)
        got = list(tud.DataLoader(it, batch_size=None, num_workers=2, timeout=120))
        for b in got:
            i = np.asarray(b["index"], dtype=np.int64)
            assert same_csr(b["X"], rows(a.X, i))
            seen.append(i)
        counts.append(len(got))
    allids = np.concatenate(seen)
    if pad_or_drop is None:
        assert sorted(allids.tolist()) == list(range(N))
        # the same ids as the epoch's order, as batches of it
        want = {tuple(b) for b in epoch_order(1, seed=3, batch_size=bs)}
        assert {tuple(s) for s in seen} == want
        assert counts == [6, 5]
    else:
        assert set(allids.tolist()) == set(range(N))
        assert counts == [6, 6]


def test_atomic_samples_and_their_batched_fetch(tmp_path):
    """Atomic samples: ``ds[i]`` holds sample i's per-atom and per-edge rows, with neighbour
    indices local to the sample; ``__getitems__`` (torch's batched fetch, one read) gives the
    same samples as reading each alone, and a sample equals a batch of one (read_many)."""
    import subprocess
    from pathlib import Path
    cli = Path(__file__).resolve().parents[2] / "build" / "zbatch"
    p = tmp_path / "atoms.zarr"
    subprocess.run([str(cli), "synth", "--kind", "atoms", "--n", "40", "-o", str(p), "--seed",
                    "2"], check=True, capture_output=True)
    ds = zbatch.open(p)
    many = ds.__getitems__([7, 3, 7])
    for k, i in enumerate([7, 3, 7]):
        one = ds[i]
        assert set(one) == set(many[k])
        for key in one:
            np.testing.assert_array_equal(np.asarray(one[key]), np.asarray(many[k][key]))
        nat = len(one["positions"])
        assert one["neighbor_list"].min() >= 0 and one["neighbor_list"].max() < nat
        assert len(one["atomic_numbers"]) == nat == len(one["forces"])
        assert len(one["shifts"]) == len(one["neighbor_list"])
    b = ds.read_many([3])
    np.testing.assert_array_equal(ds[3]["positions"], b["positions"])
    np.testing.assert_array_equal(ds[3]["neighbor_list"], b["neighbor_list"])
    sizes = [len(ds[i]["positions"]) for i in range(len(ds))]
    j = next(i for i in range(len(ds)) if sizes[i] != sizes[0])
    with pytest.raises(ValueError, match="different shapes"):
        zbatch.collate([ds[0], ds[j]])


@pytest.mark.parametrize("name,kw", [
    ("block", {"block_size": 16, "blocks_per_window": 3}),
    ("weighted", {"class_field": "obs/kind"}),
    ("size_aware", {"max_nnz": 400}),
    ("multi", {"sizes": [200, 400], "balanced": True}),
])
def test_side_iterators_of_every_sampler_kind(store, name, kw):
    """A second live iterator clones the loader's sampler (its kind and options): it yields
    the epoch the main pass runs, from its start, while the main pass goes on untouched.
    Oracle: the same pass without the second iterator."""
    p, _ = store
    ds = zbatch.open(p)

    def make():
        return zbatch.DataLoader(ds, batch_size=BS, sampler=name, seed=6, **kw)

    ref = make()
    ids(ref)
    want = ids(ref)            # pass 1 (epoch 1)
    dl = make()
    ids(dl)
    main, side = [], None
    for i, b in enumerate(dl):
        main.append(np.asarray(b["index"], dtype=np.int64).copy())
        if i == 1:
            side = ids(iter(dl))
    assert len(main) == len(want)
    for g, w in zip(main + side, want + want):
        np.testing.assert_array_equal(g, w)


def test_torchs_dataloader_over_a_multidataset_in_forked_workers(store):
    """A MultiDataset in forked torch workers: re-opened (with its children) in each worker;
    the batches equal read_many's in the parent."""
    p, a = store
    md = zbatch.MultiDataset([zbatch.open(p, num_threads=2), zbatch.open(p)], num_threads=2)
    md.read_many([0, N + 1])
    got = list(tud.DataLoader(md, batch_size=100, collate_fn=zbatch.collate, num_workers=2,
                              timeout=120))
    assert len(got) == 12
    for k, b in enumerate(got):
        want = np.arange(k * 100, (k + 1) * 100)
        np.testing.assert_array_equal(b["index"], want)
        assert same_csr(b["X"], rows(a.X, want % N))
        np.testing.assert_array_equal(b["dataset"], want // N)


def normalized_log1p(m, ids, target=1e4):
    """scanpy's normalize_total then log1p of the rows `ids`, in float64 (the oracle)."""
    x = sp.csr_matrix(m)[np.asarray(ids, dtype=np.int64)].astype(np.float64).toarray()
    sums = x.sum(axis=1, keepdims=True)
    x = np.divide(x * target, sums, out=np.zeros_like(x), where=sums > 0)
    return np.log1p(x)


TRANSFORMS = [("normalize_total", 1e4), "log1p"]


@pytest.mark.parametrize("how", ["batch_sampler", "torch_sampler"])
def test_transforms_run_on_python_sampler_batches(store, how):
    """A loader fed by a Python sampler or batch sampler runs the C transforms on its batches
    as the C pipeline does (they were skipped: raw counts reached the training loop)."""
    p, a = store
    ds = zbatch.open(p)
    if how == "batch_sampler":
        dl = zbatch.DataLoader(ds, batch_sampler=[[0, 1, 2], [599, 5, 3, 42]],
                               transforms=TRANSFORMS)
    else:
        dl = zbatch.DataLoader(ds, batch_size=64, sampler=tud.SequentialSampler(range(N)),
                               transforms=TRANSFORMS)
    n = 0
    for b in dl:
        i = np.asarray(b["index"], dtype=np.int64)
        np.testing.assert_allclose(sp.csr_matrix(b["X"]).toarray(), normalized_log1p(a.X, i),
                                   rtol=1e-5, atol=1e-6)
        n += len(i)
    assert n == (7 if how == "batch_sampler" else N)


def test_iterable_loader_transforms_every_batch(store):
    """The leftover batches of an exact split (11 global batches over 2 workers) get the
    transforms too."""
    p, a = store
    ds = zbatch.open(p)
    it = zbatch.IterableLoader(ds, batch_size=56, sampler="random", seed=3, transforms=TRANSFORMS,
                               prefetch_factor=2)
    it.set_epoch(0)
    got = list(tud.DataLoader(it, batch_size=None, num_workers=2, timeout=120))
    assert sum(len(b["index"]) for b in got) == N
    for b in got:
        i = np.asarray(b["index"], dtype=np.int64)
        np.testing.assert_allclose(sp.csr_matrix(b["X"]).toarray(), normalized_log1p(a.X, i),
                                   rtol=1e-5, atol=1e-6)
