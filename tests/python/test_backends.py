"""Issue 20 item 6: custom read_many backends (HDF5 through h5py, LMDB) behind zbatch's
samplers and loader, batched as zbatch's native atomic batches of the same samples; resume;
backend errors naming the sample ids. Item 4: Dataset(reader, transforms=[...])."""
import pickle

import h5py
import lmdb
import numpy as np
import pytest

import zbatch

N = 40
FIELDS = ["positions", "atomic_numbers", "forces", "energy", "cell", "pbc", "neighbor_list",
          "shifts", "charge_q"]


def make_samples(n=N, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        a = int(rng.integers(1, 12))
        e = int(rng.integers(0, 3 * a)) if i % 7 else 0   # some samples without edges
        out.append({
            "positions": rng.normal(size=(a, 3)).astype(np.float32),
            "atomic_numbers": rng.integers(1, 90, a).astype(np.int64),
            "forces": rng.normal(size=(a, 3)).astype(np.float32),
            "energy": np.array([rng.normal()], dtype=np.float32),
            "cell": (np.eye(3) * rng.uniform(3, 9)).astype(np.float32),
            "pbc": np.array([True, i % 2 == 0, False]),
            "neighbor_list": rng.integers(0, a, (e, 2)).astype(np.int64),
            "shifts": rng.normal(size=(e, 3)).astype(np.float32),
            "charge_q": rng.normal(size=a).astype(np.float32),
        })
    return out


class H5Reader:
    """One group per sample in an HDF5 file."""

    field_levels = {"charge_q": "atom"}

    def __init__(self, path):
        self.path = str(path)
        self.f = h5py.File(path, "r")

    def __len__(self):
        return len(self.f)

    def read_many(self, ids):
        return [{k: g[k][()] for k in g} for g in (self.f[f"s{i:05d}"] for i in ids)]


class LMDBReader:
    """Pickled dicts keyed by sample id, as fairchem-style LMDBs hold them; returns
    nvalchemi's (dict, metadata) pairs."""

    field_levels = {"charge_q": "atom"}

    def __init__(self, path):
        self.env = lmdb.open(str(path), readonly=True, lock=False, subdir=False)
        with self.env.begin() as t:
            self.n = t.stat()["entries"]

    def __len__(self):
        return self.n

    def read_many(self, ids):
        with self.env.begin() as t:
            return [(pickle.loads(t.get(str(i).encode())), {"source": "lmdb"}) for i in ids]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    base = tmp_path_factory.mktemp("backends")
    samples = make_samples()
    zpath = base / "s.zarr"
    zbatch.AtomicWriter(zpath, levels={"charge_q": "atom"}).write(samples)
    with h5py.File(base / "s.h5", "w") as f:
        for i, s in enumerate(samples):
            g = f.create_group(f"s{i:05d}")
            for k, v in s.items():
                g[k] = v
    env = lmdb.open(str(base / "s.lmdb"), map_size=1 << 26, subdir=False)
    with env.begin(write=True) as t:
        for i, s in enumerate(samples):
            t.put(str(i).encode(), pickle.dumps(s))
    env.close()
    return samples, zbatch.open(zpath), base


_READERS: dict = {}


def readers(base):
    """One reader of each kind per store (an LMDB environment is opened once per process)."""
    if base not in _READERS:
        _READERS[base] = {"h5": H5Reader(base / "s.h5"), "lmdb": LMDBReader(base / "s.lmdb")}
    return _READERS[base]


def assert_batches_equal(native, other):
    assert sorted(native) == sorted(other)
    for k in native:
        a, b = np.asarray(native[k]), np.asarray(other[k])
        assert a.dtype == b.dtype and a.shape == b.shape, k
        np.testing.assert_array_equal(a, b, err_msg=k)


def hand_batch(samples, ids):
    """The collation computed here: neighbour lists offset by the atoms before them."""
    chosen = [samples[i] for i in ids]
    nat = np.array([len(s["positions"]) for s in chosen])
    ptr = np.concatenate([[0], np.cumsum(nat)])
    return {"neighbor_list": np.concatenate([s["neighbor_list"] + ptr[k]
                                             for k, s in enumerate(chosen)]),
            "atoms_ptr": ptr, "batch_idx": np.repeat(np.arange(len(ids)), nat),
            "energy": np.stack([s["energy"] for s in chosen])}


@pytest.mark.parametrize("kind", ["h5", "lmdb"])
def test_read_many_equals_native_and_hand(stores, kind):
    samples, native, base = stores
    ds = zbatch.Dataset(readers(base)[kind])
    assert len(ds) == N
    ids = [17, 3, 3, 0, N - 1, 7, 14]   # duplicates; 0, 7 and 14 have no edges
    got = ds.read_many(ids)
    assert_batches_equal(native.read_many(ids), got)
    for k, v in hand_batch(samples, ids).items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


@pytest.mark.parametrize("kind", ["h5", "lmdb"])
@pytest.mark.parametrize("sampler,kw", [("random", {"batch_size": 6}),
                                        ("size_aware", {"batch_size": 8, "max_atoms": 30})])
def test_loader_batches_and_resume_equal_native(stores, kind, sampler, kw):
    _, native, base = stores
    ds = zbatch.Dataset(readers(base)[kind], num_workers=3)
    mk = lambda d: zbatch.DataLoader(d, sampler=sampler, seed=5, prefetch_factor=2,  # noqa
                                     **kw)
    nl = mk(native)
    want = [list(nl) for _ in range(2)]      # epochs 0 and 1
    loader = mk(ds)
    got = [list(loader) for _ in range(2)]
    assert [len(w) for w in want] == [len(g) for g in got]
    assert [b["index"].tolist() for b in want[0]] != [b["index"].tolist() for b in want[1]]
    for w, g in zip(want[0] + want[1], got[0] + got[1]):
        assert_batches_equal(w, g)
    # resume in the middle of epoch 1 in a fresh loader: the same remaining batches
    loader = mk(ds)
    next(iter(loader))
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["position"] == 3
    fresh = mk(ds)
    with pytest.raises(ValueError, match="past the end of epoch 1"):
        fresh.load_state_dict({**state, "position": 10 ** 6})
    fresh.load_state_dict(state)
    rest = list(fresh)
    assert len(rest) == len(want[1]) - 3
    for w, g in zip(want[1][3:], rest):
        assert_batches_equal(w, g)


def test_backend_errors_name_sample_ids(stores):
    _, _, base = stores

    class Broken(H5Reader):
        def read_many(self, ids):
            if 13 in ids:
                raise KeyError("s00013 is damaged")
            return super().read_many(ids)

    ds = zbatch.Dataset(Broken(base / "s.h5"))
    with pytest.raises(RuntimeError, match=r"Broken.read_many failed for sample ids "
                                           r"\[12, 13\].*s00013 is damaged"):
        ds.read_many([12, 13])
    loader = zbatch.DataLoader(ds, batch_size=4)
    with pytest.raises(RuntimeError, match=r"sample ids \[12, 13, 14, 15\]"):
        list(loader)

    class Short(H5Reader):
        def read_many(self, ids):
            return super().read_many(ids)[:-1]

    with pytest.raises(ValueError, match=r"returned 1 samples for 2 ids \[4, 5\]"):
        zbatch.Dataset(Short(base / "s.h5")).read_many([4, 5])

    class BadField(H5Reader):
        def read_many(self, ids):
            out = super().read_many(ids)
            out[-1]["forces"] = out[-1]["forces"][:1]
            return out

    with pytest.raises(ValueError, match=r"sample 9: atom field 'forces' has shape \(1, 3\)"):
        zbatch.Dataset(BadField(base / "s.h5")).read_many([8, 9])


def test_path_form_still_opens(stores):
    _, native, _ = stores
    again = zbatch.Dataset(native.path)
    assert type(again) is zbatch.Dataset and len(again) == N


def shift(sample: dict, metadata):
    sample["positions"] = sample["positions"] + np.float32(1.5)
    metadata["seen"] = metadata["index"]
    return sample, metadata


def double_charge(sample, metadata):   # unannotated: takes the sample kind
    sample["charge_q"] = sample["charge_q"] * 2
    return sample, metadata


@pytest.mark.parametrize("kind", ["h5", "native"])
def test_sample_transforms_run_on_samples(stores, kind):
    samples, native, base = stores
    reader = native if kind == "native" else readers(base)["h5"]
    ds = zbatch.Dataset(reader, transforms=[shift, double_charge])
    ids = [5, 1, 30]
    want = native.read_many(ids)
    got = ds.read_many(ids)
    np.testing.assert_array_equal(got["positions"], want["positions"] + np.float32(1.5))
    np.testing.assert_array_equal(got["charge_q"], want["charge_q"] * 2)
    np.testing.assert_array_equal(got["neighbor_list"], want["neighbor_list"])
    loader = zbatch.DataLoader(ds, batch_size=16, sampler="random", seed=1)
    for b in loader:
        w = native.read_many(b["index"].astype(np.int64))
        np.testing.assert_array_equal(b["positions"], w["positions"] + np.float32(1.5))
    with pytest.raises(RuntimeError, match=r"transform\[0\].*raised KeyError") as e:
        zbatch.Dataset(reader, transforms=[lambda s, m: (s, m["absent"])]).read_many([0])
    assert isinstance(e.value.__cause__, KeyError)


def test_c_transforms_on_a_zbatch_reader_stay_in_c(stores):
    _, native, _ = stores
    ds = zbatch.Dataset(native, transforms=[("cast", "positions", "float64")])
    assert ds._python_pipeline is False
    b = next(iter(zbatch.DataLoader(ds, batch_size=4)))
    assert b["positions"].dtype == np.float64
    np.testing.assert_array_equal(b["positions"], native.read_many([0, 1, 2, 3])["positions"])
    with pytest.raises(ValueError, match="come first"):
        zbatch.Dataset(native, transforms=[shift, "log1p"])
    with pytest.raises(ValueError, match="C transforms"):
        zbatch.Dataset(H5Reader(stores[2] / "s.h5"), transforms=["log1p"])


def test_multidataset_output_strict(stores, tmp_path):
    """Children with different fields: the default names the field and both children;
    output_strict=False gives the fields common to all, equal to each child's own batches;
    custom-backend children mix with zbatch ones."""
    samples, native, base = stores
    other = make_samples(9, seed=4)
    for s in other:
        s.pop("charge_q")
        s["dipole"] = np.arange(3, dtype=np.float32) + s["energy"]
    opath = tmp_path / "o.zarr"
    zbatch.AtomicWriter(opath).write(other)
    odd = zbatch.open(opath)
    with pytest.raises(zbatch.ZbatchError, match=r"field 'charge_q' is in dataset 0 \(.*s.zarr"
                                                 r"\) but not in dataset 1 \(.*o.zarr\)"):
        zbatch.MultiDataset([native, odd])
    with pytest.raises(zbatch.ZbatchError, match="field 'charge_q'"):
        zbatch.MultiDataset([zbatch.Dataset(H5Reader(base / "s.h5")), odd])
    for first in (native, zbatch.Dataset(readers(base)["lmdb"])):
        md = zbatch.MultiDataset([first, odd], output_strict=False)
        assert isinstance(md, zbatch.MultiDataset) and md.sizes == [N, 9] and len(md) == N + 9
        ids = [N + 2, 5, N + 8, 0, 5]
        b = md.read_many(ids)
        common = set(native.fields) & set(odd.fields)
        assert common == set(native.fields) - {"charge_q"}
        assert set(b) == common | {"index", "dataset", "atoms_ptr", "edges_ptr", "batch_idx"}
        np.testing.assert_array_equal(b["dataset"], [1, 0, 1, 0, 0])
        np.testing.assert_array_equal(b["index"], ids)
        # each sample's values are its child's, re-based in the mixed batch
        want_ptr = [0]
        for i in ids:
            src = odd[i - N] if i >= N else native[i]
            want_ptr.append(want_ptr[-1] + len(src["positions"]))
        np.testing.assert_array_equal(b["atoms_ptr"], want_ptr)
        for k, i in enumerate(ids):
            src = odd[i - N] if i >= N else native[i]
            a0, a1 = b["atoms_ptr"][k], b["atoms_ptr"][k + 1]
            e0, e1 = b["edges_ptr"][k], b["edges_ptr"][k + 1]
            np.testing.assert_array_equal(b["positions"][a0:a1], src["positions"])
            np.testing.assert_array_equal(b["neighbor_list"][e0:e1] - a0, src["neighbor_list"])
            np.testing.assert_array_equal(b["energy"][k], src["energy"])
        loader = zbatch.DataLoader(md, sampler="random", batch_size=7, seed=2)
        seen = np.concatenate([x["index"] for x in loader])
        np.testing.assert_array_equal(np.sort(seen), np.arange(N + 9))
    same = zbatch.MultiDataset([native, native], output_strict=False)
    assert type(same) is zbatch.MultiDataset   # same fields: the C reader, as before


def test_set_epoch_and_torch_samplers_on_a_backend(stores):
    _, native, base = stores
    ds = zbatch.Dataset(H5Reader(base / "s.h5"))
    a = zbatch.DataLoader(native, batch_size=8, shuffle=True, seed=9)
    b = zbatch.DataLoader(ds, batch_size=8, shuffle=True, seed=9)
    for epoch in (3, 3, 1):
        a.sampler.set_epoch(epoch)      # PyTorch's idiom, through the loader
        b.sampler.set_epoch(epoch)
        assert len(a) == len(b) == 5
        for x, y in zip(a, b):
            assert_batches_equal(x, y)
    assert b.state_dict() == {**a.state_dict(), "num_samples": N}
    import torch
    order = torch.randperm(N, generator=torch.Generator().manual_seed(0)).tolist()
    t = zbatch.DataLoader(ds, batch_size=6, sampler=order, output="torch")
    got = list(t)
    assert [x["index"].tolist() for x in got] == [order[i:i + 6] for i in range(0, N, 6)]
    for x in got:
        w = native.read_many(x["index"].numpy(), output="torch")
        for k in w:
            assert torch.equal(w[k], x[k]), k
