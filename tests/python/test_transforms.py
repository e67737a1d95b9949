"""Issue 20 item 4: transforms with nvalchemi 0.2.0's composition rules, checked against
nvalchemi's own Compose, Dataset and DataLoader (same callables, same outcomes)."""
import itertools
import warnings

import numpy as np
import pytest

import torch
from nvalchemi.data import AtomicData
from nvalchemi.data import Batch as NvBatch
from nvalchemi.data.datapipes import DataLoader as NvLoader
from nvalchemi.data.datapipes import Dataset as NvDataset
from nvalchemi.data.datapipes.backends.zarr import AtomicDataZarrReader
from nvalchemi.data.transforms import Compose as NvCompose

import zbatch
from zbatch.transforms import Compose


def s_typed(data: AtomicData, metadata):
    return data, metadata


def b_typed(batch: NvBatch):
    return batch


def untyped(x, m=None):
    return (x, m) if m is not None else x


def int_typed(x: int, m=None):
    return x, m


class CallableSample:
    def __call__(self, data: AtomicData, metadata):
        return data, metadata


class CallableBatch:
    def __call__(self, batch: NvBatch):
        return batch


CANDIDATES = {"s_typed": s_typed, "b_typed": b_typed, "untyped": untyped,
              "int_typed": int_typed, "callable_sample": CallableSample(),
              "callable_batch": CallableBatch(), "not_callable": 42}


def outcome(cls, fns):
    try:
        c = cls(fns)
    except TypeError as e:
        return ("TypeError", str(e).split(";")[0].split(" (")[0])
    return ("ok", c.is_batch)


@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_kinds_and_errors_match_nvalchemi(n):
    """Every list of up to three of these callables: the same kind, or the same TypeError
    (mixed kinds, an annotation that is neither, something not callable)."""
    names = list(CANDIDATES)
    for combo in itertools.product(names, repeat=n):
        fns = [CANDIDATES[k] for k in combo]
        assert outcome(Compose, fns) == outcome(NvCompose, fns), combo


def test_zbatch_types_classify():
    def on_dict(sample: dict, metadata):
        return sample, metadata

    def on_batch(batch: zbatch.Batch):
        return batch

    assert Compose([on_dict, untyped]).kind == "sample"
    assert Compose([untyped, on_batch]).is_batch
    with pytest.raises(TypeError, match="index 0 is 'sample' but transform at index 2 is "
                                        "'batch'"):
        Compose([on_dict, untyped, on_batch])


def log(tag):
    def fn(data, metadata):
        metadata = {**metadata, "log": metadata.get("log", ()) + (tag,)}
        return data, metadata
    return fn


def fails(data, metadata):
    raise ValueError("bad sample")


def returns_none(data, metadata):
    return None


@pytest.fixture(scope="module")
def atomic():
    rng = np.random.default_rng(0)
    a = 4
    return AtomicData(positions=torch.tensor(rng.normal(size=(a, 3)), dtype=torch.float32),
                      atomic_numbers=torch.tensor([1, 6, 8, 1]),
                      neighbor_list=torch.tensor([[0, 1], [2, 3]]),
                      shifts=torch.zeros(2, 3), cell=torch.eye(3).unsqueeze(0),
                      pbc=torch.tensor([[True, True, True]]),
                      energy=torch.tensor([[1.5]]))


def test_order_errors_and_none_match_nvalchemi(atomic):
    fns = [log("a"), log("b"), log("c")]
    _, want = NvCompose(fns)(atomic, {})
    _, got = Compose(fns)({"positions": np.zeros((1, 3))}, {})
    assert got == want == {"log": ("a", "b", "c")}
    for bad in (fails, returns_none):
        with pytest.raises(RuntimeError) as nv:
            NvCompose([log("a"), bad])(atomic, {})
        with pytest.raises(RuntimeError) as zb:
            Compose([log("a"), bad])({"positions": np.zeros((1, 3))}, {})
        assert str(zb.value).split(" (")[0] == str(nv.value).split(" (")[0] == \
            "Compose: transform[1]"
        assert str(zb.value).split(") ")[-1] == str(nv.value).split(") ")[-1]
        assert type(zb.value.__cause__) is type(nv.value.__cause__)
    # an empty composition is the identity in both
    nv_data_out, nv_meta = NvCompose([])(atomic, {"m": 1})
    sample = {"positions": np.zeros((1, 3))}
    zb_data_out, zb_meta = Compose([])(sample, {"m": 1})
    assert nv_data_out is atomic and zb_data_out is sample and zb_meta == nv_meta == {"m": 1}


def shift_atomic(data: AtomicData, metadata):
    """A transform written for nvalchemi: it gets an AtomicData in zbatch too."""
    data.positions = data.positions * 2.0 + 1.0
    metadata["scaled"] = True
    return data, metadata


def add_energy(data, metadata):
    data_e = data["energy"] if isinstance(data, dict) else data.energy
    if isinstance(data, dict):
        data["energy"] = data_e + 10
    else:
        data.energy = data_e + 10
    return data, metadata


def center_batch(batch):
    pos = batch["positions"] if isinstance(batch, dict) or hasattr(batch, "keys") else \
        batch.positions
    out = pos - pos.mean(0)
    if isinstance(batch, NvBatch):
        batch.positions = out
        return batch
    batch = dict(batch)
    batch["positions"] = out
    return batch


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from test_backends import make_samples
    p = tmp_path_factory.mktemp("tr") / "s.zarr"
    samples = make_samples(24, seed=3)
    for s in samples:
        s.pop("charge_q")
    zbatch.AtomicWriter(p).write(samples)
    return p


def test_dataset_and_loader_transforms_equal_nvalchemi(store):
    """The same transforms through nvalchemi's Dataset / DataLoader and zbatch's over the
    same store: the same transformed values, sample by sample and batch by batch."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nv = NvDataset(AtomicDataZarrReader(str(store)), device="cpu",
                       transforms=[shift_atomic, add_energy])
        nv_loader = NvLoader(nv, batch_size=5, batch_transforms=[center_batch],
                             prefetch_factor=0)
        want_batches = list(nv_loader)
        want_samples = [nv[i] for i in range(len(nv))]
    ds = zbatch.Dataset(zbatch.open(store), transforms=[shift_atomic, add_energy])
    got = ds.read_many(list(range(len(ds))))
    ptr = got["atoms_ptr"]
    for i, (data, meta) in enumerate(want_samples):
        np.testing.assert_allclose(got["positions"][ptr[i]:ptr[i + 1]], data.positions.numpy(),
                                   rtol=0, atol=0)
        np.testing.assert_array_equal(got["energy"][i], data.energy.numpy()[0])
        assert meta["scaled"] is True
    loader = zbatch.DataLoader(ds, batch_size=5, batch_transforms=[center_batch])
    got_batches = list(loader)
    assert len(got_batches) == len(want_batches)
    for w, g in zip(want_batches, got_batches):
        np.testing.assert_allclose(g["positions"], w.positions.numpy(), rtol=0, atol=1e-6)
        np.testing.assert_array_equal(g["energy"], w.energy.numpy())


def test_loader_and_dataset_refuse_wrong_kinds(store):
    ds = zbatch.open(store)
    with pytest.raises(TypeError, match="Sequence of callables"):
        zbatch.Dataset(ds, transforms=shift_atomic)
    with pytest.raises(TypeError, match="Sequence of callables"):
        zbatch.DataLoader(ds, batch_transforms=center_batch)
    with pytest.raises(TypeError, match="per-sample"):
        zbatch.Dataset(ds, transforms=[b_typed])
    with pytest.raises(TypeError, match="per-batch"):
        zbatch.DataLoader(ds, batch_transforms=[s_typed])
    with pytest.raises(TypeError, match="cannot mix sample and batch"):
        zbatch.DataLoader(ds, batch_transforms=[b_typed, s_typed])

    def boom(batch):
        raise KeyError("nope")

    with pytest.raises(RuntimeError, match=r"transform\[1\].*raised KeyError") as e:
        next(iter(zbatch.DataLoader(ds, batch_size=4, batch_transforms=[untyped, boom])))
    assert isinstance(e.value.__cause__, KeyError)
