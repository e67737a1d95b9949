"""zbatch.open + Dataset.read_many on atomic stores (DESIGN §2, shared FORMATS §8) written by
nvalchemi-toolkit 0.2.0's own AtomicDataZarrWriter, with samples soft-deleted through its delete.

Structures are real: ASE g2 molecules (H, C, N, O only) and fcc crystals, rattled, with EMT forces
and energies and ASE neighbour lists ('ijS'). Two oracles, both independent of zbatch:
nvalchemi's AtomicDataZarrReader.read_many for the same logical ids (its per-sample dicts,
concatenated here), and a concatenation of the source AtomicData objects themselves, with the
neighbour lists offset by hand by the running atom count. Deleted samples are zero-filled by
nvalchemi (FORMATS §8.5.6) and must be invisible.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from conftest import expect_error, zbatch_api

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch
    from ase.build import bulk, molecule
    from ase.calculators.emt import EMT
    from ase.neighborlist import neighbor_list
    from nvalchemi.data import AtomicData
    from nvalchemi.data.datapipes.backends.zarr import AtomicDataZarrReader, AtomicDataZarrWriter

# g2 molecules made of elements EMT knows; CO2 gets a cutoff below its bond length: no edges
MOLECULES = ["CH4", "H2O", "NH3", "C2H6", "CH3OH", "HCN", "CO2", "C6H6", "N2", "H2CO",
             "CH3CH2OH", "C2H2", "HCOOH", "CH3CN"]
CRYSTALS = [("Cu", {"cubic": True}, (2, 1, 1)), ("Al", {}, (1, 1, 1)),
            ("Ni", {"cubic": True}, (1, 1, 1)), ("Au", {}, (2, 2, 1)),
            ("Ag", {"cubic": True}, (1, 1, 1)), ("Pd", {"orthorhombic": True}, (1, 1, 2)),
            ("Pt", {}, (3, 1, 1))]
DELETED = [2, 9, 15, 20]  # physical samples removed through nvalchemi's delete
ATOM_FIELDS = ["positions", "atomic_numbers", "forces", "atomic_masses", "atom_categories",
               "velocities"]
EDGE_FIELDS = ["neighbor_list", "shifts"]
SYSTEM_FIELDS = ["energy", "cell", "pbc"]


def to_atomic_data(atoms, cutoff):
    atoms.calc = EMT()
    forces, energy = atoms.get_forces(), atoms.get_potential_energy()
    i, j, S = neighbor_list("ijS", atoms, cutoff)
    return AtomicData(
        positions=torch.tensor(atoms.positions, dtype=torch.float32),
        atomic_numbers=torch.tensor(atoms.numbers, dtype=torch.long),
        forces=torch.tensor(forces, dtype=torch.float32),
        energy=torch.tensor([[energy]], dtype=torch.float32),
        neighbor_list=torch.tensor(np.stack([i, j], 1), dtype=torch.long),
        shifts=torch.tensor(S @ atoms.cell.array, dtype=torch.float32),
        cell=torch.tensor(atoms.cell.array, dtype=torch.float32).reshape(1, 3, 3),
        pbc=torch.tensor(atoms.pbc).reshape(1, 3))


def make_structures():
    out = []
    for k, name in enumerate(MOLECULES):
        a = molecule(name)
        a.center(vacuum=3.0)
        a.rattle(0.02, seed=k)
        out.append(to_atomic_data(a, 0.9 if name == "CO2" else 1.6))
    for k, (el, kw, rep) in enumerate(CRYSTALS):
        a = bulk(el, "fcc", **kw).repeat(rep)
        a.rattle(0.05, seed=50 + k)
        out.append(to_atomic_data(a, 3.0))
    return out


CONFIGS = {
    "defaults": None,                                            # zstd-0, one chunk per array
    "chunked": {"core": {"chunk_size": 7}, "meta": {"chunk_size": 5}},
    "sharded": {"core": {"chunk_size": 4, "shard_size": 16}},
}


@pytest.fixture(scope="module")
def structures():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make_structures()


@pytest.fixture(scope="module")
def stores(structures, tmp_path_factory):
    base = tmp_path_factory.mktemp("atomic")
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, cfg in CONFIGS.items():
            path = str(base / f"{name}.zarr")
            w = AtomicDataZarrWriter(path, config=cfg)
            w.write(structures)
            w.delete(DELETED)
            out[name] = path
    return out


def live(structures):
    return [s for k, s in enumerate(structures) if k not in DELETED]


def hand_batch(samples):
    """The collated batch computed here: per-atom and per-edge fields concatenated, neighbour
    lists offset by the running atom count, system fields stacked, pointers cumulative."""
    nat = [int(s.positions.shape[0]) for s in samples]
    ned = [int(s.neighbor_list.shape[0]) for s in samples]
    atoms_ptr = np.concatenate([[0], np.cumsum(nat)]).astype(np.int64)
    edges_ptr = np.concatenate([[0], np.cumsum(ned)]).astype(np.int64)
    cat = lambda key, shape: (np.concatenate([getattr(s, key).numpy() for s in samples])  # noqa
                              if samples else np.zeros(shape))
    nl = [s.neighbor_list.numpy() + atoms_ptr[k] for k, s in enumerate(samples)]
    return {
        "positions": cat("positions", (0, 3)).astype(np.float32),
        "atomic_numbers": cat("atomic_numbers", (0,)).astype(np.int64),
        "forces": cat("forces", (0, 3)).astype(np.float32),
        "shifts": cat("shifts", (0, 3)).astype(np.float32),
        "neighbor_list": (np.concatenate(nl) if nl else np.zeros((0, 2))).astype(np.int64),
        "energy": cat("energy", (0, 1)).astype(np.float32),
        "cell": cat("cell", (0, 3, 3)).astype(np.float32),
        "pbc": cat("pbc", (0, 3)).astype(bool),
        "atoms_ptr": atoms_ptr,
        "edges_ptr": edges_ptr,
        "batch_idx": np.repeat(np.arange(len(samples)), nat).astype(np.int64),
    }


def reader_batch(reader, ids):
    """nvalchemi's own read of the same logical ids, collated the same way."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dicts = [d for d, _meta in reader.read_many([int(i) for i in ids])]
    out = {}
    offset = 0
    nl = []
    for d in dicts:
        nl.append(d["neighbor_list"].numpy() + offset)  # the reader returns per-sample indices
        offset += int(d["positions"].shape[0])
    for key in ATOM_FIELDS + EDGE_FIELDS + SYSTEM_FIELDS:
        if key == "neighbor_list":
            continue
        parts = [d[key].numpy() for d in dicts]
        out[key] = np.concatenate(parts) if parts else None
    out["neighbor_list"] = np.concatenate(nl) if nl else None
    return out


def id_lists(n):
    rng = np.random.default_rng(11)
    return {
        "sorted": np.sort(rng.choice(n, 8, replace=False)),
        "shuffled": rng.permutation(n),
        "duplicates": np.array([3, 0, 3, n - 1, 3, 5, 5]),
        "single": np.array([6]),  # CO2: no edges
        "all": np.arange(n),
        "empty": np.array([], dtype=np.int64),
    }


@pytest.mark.parametrize("name", list(CONFIGS))
def test_batches_match_nvalchemi_and_hand(stores, structures, name):
    zb = zbatch_api()
    ds = zb.open(stores[name])
    reader = AtomicDataZarrReader(stores[name])
    samples = live(structures)
    assert ds.layout == "atomic"
    assert len(ds) == len(reader) == len(structures) - len(DELETED)
    assert ds.fields["neighbor_list"]["kind"] == "index"
    assert ds.fields["neighbor_list"]["target"] == "atoms"
    assert ds.fields["positions"]["segment"] == "atoms"
    assert ds.fields["shifts"]["segment"] == "edges"
    assert ds.fields["energy"]["kind"] == "per_sample"
    for label, ids in id_lists(len(ds)).items():
        b = ds.read_many(ids)
        np.testing.assert_array_equal(b["index"], np.asarray(ids, dtype=np.uint64))
        want = hand_batch([samples[i] for i in ids])
        for key, arr in want.items():
            assert b[key].dtype == arr.dtype, (label, key)
            assert b[key].shape == arr.shape, (label, key)
            np.testing.assert_array_equal(b[key], arr, err_msg=f"{label}: {key}")
        if len(ids) == 0:
            continue
        theirs = reader_batch(reader, ids)
        for key, arr in theirs.items():
            assert b[key].shape == arr.shape, (label, key)
            np.testing.assert_array_equal(b[key], arr, err_msg=f"{label}: {key} vs nvalchemi")


def test_store_layouts_give_identical_batches(stores):
    zb = zbatch_api()
    ids = [16, 0, 3, 3, 6, 1, 12]
    batches = {name: zb.open(p).read_many(ids) for name, p in stores.items()}
    batches["threads"] = zb.open(stores["sharded"], num_threads=2).read_many(ids)
    ref = batches.pop("defaults")
    for name, b in batches.items():
        assert set(b) == set(ref)
        for k in ref:
            assert b[k].dtype == ref[k].dtype, (name, k)
            np.testing.assert_array_equal(b[k], ref[k], err_msg=f"{name}: {k}")


def test_cache_repeat_decodes_nothing(stores, structures):
    zb = zbatch_api()
    ds = zb.open(stores["sharded"], cache_bytes=8 << 20)
    ids = [5, 1, 12, 12, 0]
    first, again = ds.read_many(ids), ds.read_many(ids)
    assert first.stats["chunks_decoded"] > 0
    assert again.stats["chunks_decoded"] == 0
    assert again.stats["chunks_cached"] == first.stats["chunks_decoded"]
    want = hand_batch([live(structures)[i] for i in ids])
    for k, v in want.items():
        np.testing.assert_array_equal(again[k], v)


def test_torch_output(stores, structures):
    zb = zbatch_api()
    ids = [4, 2, 2]
    t = zb.open(stores["chunked"]).read_many(ids, output="torch")
    want = hand_batch([live(structures)[i] for i in ids])
    for k in ("positions", "neighbor_list", "atoms_ptr", "batch_idx", "cell"):
        assert isinstance(t[k], torch.Tensor)
        np.testing.assert_array_equal(t[k].numpy(), want[k])
    np.testing.assert_array_equal(t["index"].numpy(), ids)


def test_out_of_range(stores):
    zb = zbatch_api()
    ds = zb.open(stores["chunked"])
    n = len(MOLECULES) + len(CRYSTALS) - len(DELETED)
    assert len(ds) == n
    with expect_error("ZB_E_RANGE", str(n)):
        ds.read_many([0, n])


def test_append_without_offsets_is_corrupt(structures, tmp_path):
    """FORMATS §8.5.1: nvalchemi's append does not offset neighbour lists by the store's atoms, so
    appended samples must be reported corrupt, never returned as wrong edges."""
    zb = zbatch_api()
    path = str(tmp_path / "appended.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = AtomicDataZarrWriter(path)
        w.write(structures[:10])
        w.append(structures[10:])
    ds = zb.open(path)
    assert len(ds) == len(structures)
    want = hand_batch([structures[i] for i in (0, 9, 3)])
    b = ds.read_many([0, 9, 3])  # written by write(): fine
    np.testing.assert_array_equal(b["neighbor_list"], want["neighbor_list"])
    with expect_error("ZB_E_CORRUPT", "neighbor_list"):
        ds.read_many([1, 11])


def _tiny(n, seed):
    rng = np.random.default_rng(seed)
    return {"positions": rng.random((n, 3)).astype(np.float32), "atomic_numbers": np.arange(n) + 1,
            "energy": float(seed), "neighbor_list": np.array([[0, 1], [1, 0]]),
            "shifts": np.zeros((2, 3), dtype=np.float32)}


@pytest.mark.parametrize("restore", ["root", "root+meta"])
def test_interrupted_append_reads_committed_samples(tmp_path, restore):
    import zbatch
    """An append killed before it extended samples_mask leaves longer arrays and possibly
    longer pointer arrays; zbatch reads exactly the committed samples."""
    import pathlib
    from zbatch._atomic import AtomicWriter
    p = tmp_path / "a.zarr"
    first = [_tiny(3, 1), _tiny(4, 2)]
    w = AtomicWriter(str(p))
    w.write(first)
    docs = {q: q.read_bytes() for q in pathlib.Path(p).rglob("zarr.json")}
    w.append([_tiny(2, 3)])
    for q, text in docs.items():
        if q == p / "zarr.json" or (restore == "root+meta" and q.parent.parent.name == "meta"):
            q.write_bytes(text)
    ds = zbatch.open(str(p))
    if restore == "root":
        # killed after samples_mask was extended, before num_samples: every array holds the
        # third sample, and zbatch reads it as nvalchemi's reader does (it counts the mask)
        from nvalchemi.data.datapipes.backends.zarr import AtomicDataZarrReader
        assert len(ds) == len(AtomicDataZarrReader(str(p))) == 3
        np.testing.assert_array_equal(ds.read_many([2])["positions"], _tiny(2, 3)["positions"])
        return
    assert len(ds) == 2
    b = ds.read_many([0, 1])
    np.testing.assert_array_equal(b["positions"], np.concatenate([s["positions"] for s in first]))
    np.testing.assert_array_equal(b["atoms_ptr"], [0, 3, 7])
    np.testing.assert_array_equal(b["neighbor_list"], [[0, 1], [1, 0], [3, 4], [4, 3]])
    with pytest.raises(zbatch.ZbatchError) as e:
        ds.read_many([2])
    assert e.value.status == "ZB_E_RANGE"
