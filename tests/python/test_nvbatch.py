"""nvalchemi users (issue 20, items 1-2 and SizeAwareSampler(max_atoms=None)): batches that are
``nvalchemi.data.Batch`` objects, a reader with nvalchemi's contract, nvalchemi's size-aware
sampler form and its dynamics calls.

The oracle is nvalchemi-toolkit 0.2.0 itself: its ``AtomicDataZarrReader`` + ``Dataset``
(``load_batches``, i.e. ``Batch.from_data_list`` over validated ``AtomicData``), its
``SizeAwareSampler`` (``build_initial_batch`` / ``request_replacement``), over stores written
by its own ``AtomicDataZarrWriter`` (with soft deletes) and by zbatch's ``AtomicWriter``.
Structures are ASE g2 molecules and fcc crystals with EMT forces (test_dataset_atomic).
"""
from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest

from conftest import zbatch_api
from test_dataset_atomic import DELETED, make_structures

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch
    from nvalchemi.data import Batch as NvBatch
    from nvalchemi.data.datapipes import AtomicDataZarrReader, AtomicDataZarrWriter
    from nvalchemi.data.datapipes import Dataset as NvDataset
    from nvalchemi.dynamics import SizeAwareSampler as NvSizeAwareSampler

IDS = {"shuffled": [16, 0, 3, 9, 6, 1, 12, 2], "duplicates": [3, 0, 3, 5, 5],
       "single_no_edges": [6], "all": None}


@pytest.fixture(scope="module")
def structures():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make_structures()


@pytest.fixture(scope="module")
def stores(structures, tmp_path_factory):
    """An nvalchemi-written store with soft deletes, and a zbatch-written one."""
    zb = zbatch_api()
    base = tmp_path_factory.mktemp("nvbatch")
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = AtomicDataZarrWriter(str(base / "nv.zarr"), config={"core": {"chunk_size": 7}})
        w.write(structures)
        w.delete(DELETED)
        out["nvalchemi"] = str(base / "nv.zarr")
    zb.AtomicWriter(base / "zb.zarr").write(_sample_dicts(structures))
    out["zbatch"] = str(base / "zb.zarr")
    return out


def nv_batch(path, ids):
    """nvalchemi's own batch of the ids: its reader, its Dataset, Batch.from_data_list."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = NvDataset(AtomicDataZarrReader(path), device="cpu", skip_validation=True)
        return ds.load_batches([list(ids)])[0]


def assert_same_batch(got, want, where=""):
    """Field by field (values, dtypes, shapes, levels), offsets and counts included."""
    assert type(got) is type(want), where
    assert got.keys == want.keys, where
    assert set(got._storage.groups) == set(want._storage.groups), where
    for name, wg in want._storage.groups.items():
        gg = got._storage.groups[name]
        assert type(gg) is type(wg), (where, name)
        assert set(gg.keys()) == set(wg.keys()), (where, name)
        for k in wg.keys():
            assert gg[k].dtype == wg[k].dtype, (where, k)
            assert torch.equal(gg[k], wg[k]), (where, k)
        if hasattr(wg, "segment_lengths"):
            assert gg.segment_lengths.dtype == wg.segment_lengths.dtype, where
            assert torch.equal(gg.segment_lengths, wg.segment_lengths), (where, name)
    assert_same_derived(got, want, where)


def assert_same_derived(got, want, where=""):
    for attr in ("batch_idx", "batch_ptr", "num_nodes_per_graph", "num_edges_per_graph"):
        g, w = getattr(got, attr), getattr(want, attr)
        assert g.dtype == w.dtype, (where, attr)
        assert torch.equal(g, w), (where, attr)
    for attr in ("num_graphs", "num_nodes", "num_edges", "num_nodes_list", "num_edges_list",
                 "batch_size"):
        assert getattr(got, attr) == getattr(want, attr), (where, attr)
    assert torch.equal(got.edge_ptr, want.edge_ptr) if hasattr(got, "edge_ptr") else True


@pytest.mark.parametrize("store", ["nvalchemi", "zbatch"])
def test_read_many_nvalchemi_equals_nvalchemis_batch(stores, store):
    zb = zbatch_api()
    ds = zb.open(stores[store])
    for label, ids in IDS.items():
        ids = list(range(len(ds))) if ids is None else ids
        got = ds.read_many(ids, output="nvalchemi")
        assert_same_batch(got, nv_batch(stores[store], ids), f"{store}/{label}")
    # the neighbour list is re-based as nvalchemi does: global atom ids within the batch
    b = ds.read_many([3, 0], output="nvalchemi")
    n3 = b.num_nodes_list[0]
    assert int(b.neighbor_list[b.num_edges_list[0]:].min()) >= n3


def test_output_nvalchemi_refused_where_it_means_nothing(stores, tmp_path):
    zb = zbatch_api()
    import anndata
    anndata.AnnData(X=np.ones((4, 3), dtype=np.float32)).write_zarr(tmp_path / "cells.zarr")
    ds = zb.open(stores["zbatch"])
    with pytest.raises(ValueError, match="'numpy', 'scipy', 'torch' or 'nvalchemi'"):
        ds.read_many([0], output="nvalchemy")
    cells = zb.open(str(tmp_path / "cells.zarr"))
    with pytest.raises(ValueError, match="layout is 'anndata'"):
        zb.DataLoader(cells, batch_size=2, output="nvalchemi")
    with pytest.raises(ValueError, match="layout is 'anndata'"):
        cells.read_many([0], output="nvalchemi")


def test_without_nvalchemi_an_atomic_batch_with_the_same_attributes(stores, monkeypatch):
    zb = zbatch_api()
    ds = zb.open(stores["nvalchemi"])
    ids = IDS["shuffled"]
    want = nv_batch(stores["nvalchemi"], ids)
    for mod in [m for m in sys.modules if m == "nvalchemi" or m.startswith("nvalchemi.")]:
        monkeypatch.setitem(sys.modules, mod, None)   # "import nvalchemi..." now fails
    got = ds.read_many(ids, output="nvalchemi")
    assert type(got) is zb.AtomicBatch
    assert got.keys == want.keys
    for key in set().union(*want.keys.values()):
        assert getattr(got, key).dtype == getattr(want, key).dtype, key
        assert torch.equal(getattr(got, key), getattr(want, key)), key
        assert torch.equal(got[key], want[key]), key
    assert_same_derived(got, want, "AtomicBatch")
    moved = got.to("cpu")
    assert moved is not got and torch.equal(moved.positions, want.positions)
    assert moved.device == torch.device("cpu")
    got["status"] = torch.zeros(got.num_graphs, 1, dtype=torch.long)   # a system field
    assert got.status.shape == (len(ids), 1)
    with pytest.raises(ValueError, match="matches neither"):
        got["odd"] = torch.zeros(got.num_graphs + 1)
    with pytest.raises(AttributeError, match="no attribute 'stress'"):
        got.stress


class PairEnergy(torch.nn.Module):
    """A small energy model written against nvalchemi's Batch API only (positions,
    atomic_numbers, neighbor_list, shifts, batch_idx, num_graphs): a Morse-like pair term
    per element pair, summed per system, forces by autograd."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.embed = torch.nn.Parameter(torch.rand(100, 1, generator=g, dtype=torch.float64))

    def forward(self, batch):
        pos = batch.positions.to(torch.float64).requires_grad_(True)
        i, j = batch.neighbor_list[:, 0], batch.neighbor_list[:, 1]
        d = (pos[j] - pos[i] + batch.shifts.to(torch.float64)).norm(dim=1)
        eps = (self.embed[batch.atomic_numbers[i]] * self.embed[batch.atomic_numbers[j]])[:, 0]
        pair = eps * (torch.exp(-2 * (d - 1.5)) - 2 * torch.exp(-(d - 1.5)))
        atom_e = torch.zeros(pos.shape[0], dtype=torch.float64).index_add(0, i, 0.5 * pair)
        energy = torch.zeros(batch.num_graphs, dtype=torch.float64).index_add(
            0, batch.batch_idx.long(), atom_e)
        forces, = torch.autograd.grad(energy.sum(), pos)
        return energy, -forces


def test_energy_model_runs_unchanged_on_zbatch_batches(stores, monkeypatch):
    zb = zbatch_api()
    model = PairEnergy()
    ids = [16, 0, 3, 9, 6, 1, 12, 2, 13]
    e_nv, f_nv = model(nv_batch(stores["nvalchemi"], ids))
    assert f_nv.abs().max() > 0
    ds = zb.open(stores["nvalchemi"])
    e_zb, f_zb = model(ds.read_many(ids, output="nvalchemi"))
    assert torch.equal(e_zb, e_nv) and torch.equal(f_zb, f_nv)
    for mod in [m for m in sys.modules if m == "nvalchemi" or m.startswith("nvalchemi.")]:
        monkeypatch.setitem(sys.modules, mod, None)
    e_fb, f_fb = model(ds.read_many(ids, output="nvalchemi"))
    assert torch.equal(e_fb, e_nv) and torch.equal(f_fb, f_nv)


def test_dataloader_output_nvalchemi_with_nvalchemis_sampler_form(stores):
    zb = zbatch_api()
    ds = zb.open(stores["nvalchemi"])
    args = (ds, 60, 400, 5)
    ids = [b.tolist() for b in zb.samplers.SizeAwareSampler(*args, seed=3)]
    loader = zb.DataLoader(ds, sampler=zb.samplers.SizeAwareSampler(*args, seed=3),
                           prefetch_factor=4, output="nvalchemi")
    batches = list(loader)
    assert len(batches) == len(ids)
    assert sorted(i for b in ids for i in b) == list(range(len(ds)))
    for k, (got, want) in enumerate(zip(batches, ids)):
        assert got.num_nodes <= 60 and got.num_edges <= 400 and got.num_graphs <= 5
        assert_same_batch(got, nv_batch(stores["nvalchemi"], want), f"batch {k}")
    # batch transforms get the nvalchemi Batch and must give one back
    shifted = zb.DataLoader(ds, sampler=zb.samplers.SizeAwareSampler(*args, seed=3),
                            output="nvalchemi", batch_transforms=[lambda b: b.to("cpu")])
    first = next(iter(shifted))
    assert torch.equal(first.positions, batches[0].positions)
    broken = zb.DataLoader(ds, sampler=zb.samplers.SizeAwareSampler(*args, seed=3),
                           output="nvalchemi", batch_transforms=[lambda b: None])
    with pytest.raises(TypeError, match="must return the batch"):
        next(iter(broken))


# -- the reader ----------------------------------------------------------------------------

@pytest.mark.parametrize("store", ["nvalchemi", "zbatch"])
def test_reader_contract_equals_nvalchemis_reader(stores, store):
    zb = zbatch_api()
    theirs = AtomicDataZarrReader(stores[store])
    ours = zb.AtomicReader(stores[store])
    assert len(ours) == len(theirs)
    assert ours.field_levels == theirs.field_levels
    n = len(theirs)
    for i in [0, 5, n - 1, -1, -n]:
        assert ours.get_metadata(i) == theirs.get_metadata(i), i
    requests = [[3, -1, 3, 0], [n - 1, -n], list(range(n))]
    for ids in requests:
        for (d1, m1), (d2, m2) in zip(ours.read_many(ids), theirs.read_many(ids), strict=True):
            assert m1 == m2, ids
            assert d1.keys() == d2.keys()
            for k in d2:
                assert d1[k].dtype == d2[k].dtype and torch.equal(d1[k], d2[k]), (ids, k)
    for (d1, m1), (d2, m2) in [(ours[-2], theirs[-2]), (ours.read(4), theirs.read(4))]:
        assert m1 == m2 and all(torch.equal(d1[k], d2[k]) for k in d2)
    for bad in (n, -n - 1):
        with pytest.raises(IndexError, match=f"Index {bad} out of range for reader with {n}"):
            ours.read_many([0, bad])
        with pytest.raises(IndexError):
            theirs.read_many([0, bad])
    ours.close()
    with pytest.raises(RuntimeError, match="closed"):
        ours[0]
    with pytest.raises(RuntimeError, match="closed"):
        ours.refresh()


def test_nvalchemis_dataset_runs_on_the_zbatch_reader(stores):
    """nvalchemi's Dataset takes any object with read_many / len / close."""
    zb = zbatch_api()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = NvDataset(zb.AtomicReader(stores["nvalchemi"]), device="cpu",
                       skip_validation=True)
        got = ds.load_batches([IDS["shuffled"]])[0]
    assert_same_batch(got, nv_batch(stores["nvalchemi"], IDS["shuffled"]))


def _sample_dicts(structures):
    keys = ("positions", "atomic_numbers", "forces", "energy", "neighbor_list", "shifts",
            "cell", "pbc")
    out = [{k: getattr(s, k).numpy() for k in keys} for s in structures]
    for d in out:
        d["energy"], d["cell"], d["pbc"] = d["energy"][0], d["cell"][0], d["pbc"][0]
    return out


def test_refresh_sees_deletes_and_appends(structures, tmp_path):
    zb = zbatch_api()
    path = str(tmp_path / "live.zarr")
    samples = _sample_dicts(structures)
    w = zb.AtomicWriter(path)
    w.write(samples[:10])
    ds = zb.open(path)
    reader = zb.AtomicReader(path)
    before = ds.read_many([4])["positions"].copy()
    w.delete([3])
    # opened before: the handle still serves the deleted sample (what refresh is for)
    np.testing.assert_array_equal(ds.read_many([3])["positions"], samples[3]["positions"])
    assert len(ds) == 10
    w.append(samples[10:12])
    ds.refresh()
    reader.refresh()
    theirs = AtomicDataZarrReader(path)
    assert len(ds) == len(reader) == len(theirs) == 11
    np.testing.assert_array_equal(ds.read_many([3])["positions"], before)   # sample 4 now
    for i in (3, 9, 10):
        (d, m), (dn, mn) = reader[i], theirs[i]
        assert m == mn and all(torch.equal(d[k], dn[k]) for k in dn), i
        np.testing.assert_array_equal(ds.read_many([i])["positions"], dn["positions"].numpy())


# -- the sampler ---------------------------------------------------------------------------

def test_size_aware_sampler_takes_the_dataset_first(stores):
    zb = zbatch_api()
    ds = zb.open(stores["nvalchemi"])
    sizes = ds.segment_lengths("atoms"), ds.segment_lengths("edges")
    by_dataset = zb.samplers.SizeAwareSampler(ds, 60, 400, 5, seed=1)
    by_reader = zb.samplers.SizeAwareSampler(zb.AtomicReader(stores["nvalchemi"]), 60, 400, 5,
                                             seed=1)
    by_keywords = zb.samplers.SizeAwareSampler(5, num_atoms=sizes[0], num_edges=sizes[1],
                                               max_atoms=60, max_edges=400, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nvds = NvDataset(AtomicDataZarrReader(stores["nvalchemi"]), device="cpu")
    by_metadata = zb.samplers.SizeAwareSampler(nvds, max_atoms=60, max_edges=400,
                                               max_batch_size=5, seed=1)
    want = [b.tolist() for b in by_keywords]
    for s in (by_dataset, by_reader, by_metadata):
        assert [b.tolist() for b in s] == want
    # max_batch_size=None (nvalchemi's default): only the atom limit binds
    free = zb.samplers.SizeAwareSampler(ds, max_atoms=200)
    batches = [b for b in free]
    assert max(len(b) for b in batches) > 5
    assert all(sizes[0][b].sum() <= 200 for b in batches)
    with pytest.raises(TypeError, match="get_metadata"):
        zb.samplers.SizeAwareSampler([1, 2, 3], max_atoms=10)


@pytest.mark.parametrize("limits", [dict(max_atoms=60, max_edges=400, max_batch_size=5),
                                    dict(max_atoms=200, max_edges=None, max_batch_size=None),
                                    dict(max_atoms=None, max_edges=None, max_batch_size=7)])
def test_dynamics_equals_nvalchemis_sampler(stores, limits):
    zb = zbatch_api()
    path = stores["nvalchemi"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nvds = NvDataset(AtomicDataZarrReader(path), device="cpu", skip_validation=True)
        theirs = NvSizeAwareSampler(nvds, **limits)
        want = theirs.build_initial_batch()
    ours = zb.samplers.SizeAwareSampler(zb.open(path), **limits)
    got = ours.build_initial_batch()
    assert_same_batch(got, want, "initial batch")
    assert torch.equal(got.system_id, want.system_id) and torch.equal(got.status, want.status)
    for room in [(10, 40), (3, 2), (50, 1000), (0, 0), (12, 90), (100, 10**6)] * 3:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            w = theirs.request_replacement(*room)
        g = ours.request_replacement(*room)
        assert (g is None) == (w is None), room
        if w is not None:
            assert type(g) is type(w)
            for k in w.model_dump(exclude_none=True):
                wv, gv = getattr(w, k), getattr(g, k)
                if isinstance(wv, torch.Tensor):
                    assert torch.equal(gv, wv), (room, k)
    assert ours.exhausted == theirs.exhausted


def test_max_atoms_none_estimates_from_free_gpu_memory(stores, monkeypatch):
    zb = zbatch_api()
    ds = zb.open(stores["nvalchemi"])
    with pytest.raises(ValueError, match="free GPU memory.*device='cuda'"):
        zb.samplers.SizeAwareSampler(ds)
    with pytest.raises(ValueError, match="batches go to 'cpu'"):
        zb.samplers.SizeAwareSampler(ds, device="cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="is_available"):
            zb.samplers.SizeAwareSampler(ds, device="cuda")
    # the estimate: int(free * fraction) // bytes_per_atom, from a mocked free-memory figure
    assert zb.estimate_max_atoms(free_bytes=3_000_000) == 8_000
    assert zb.estimate_max_atoms(free_bytes=3_000_000, fraction=0.5, bytes_per_atom=100) == 15_000
    assert zb.estimate_max_atoms(free_bytes=10) == 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (30_000, 80_000))
    assert zb.estimate_max_atoms("cuda:0") == 80
    s = zb.samplers.SizeAwareSampler(ds, device="cuda:0")
    assert s.max_atoms == 80
    nat = ds.segment_lengths("atoms")
    assert all(nat[b].sum() <= 80 for b in s)
    with pytest.raises(ValueError, match="fraction"):
        zb.estimate_max_atoms(free_bytes=1, fraction=0)
