"""The atomic layout writer (zbatch.AtomicWriter; FORMATS.md §8) against its oracles:
nvalchemi-toolkit 0.2.0's own AtomicDataZarrReader / AtomicDataZarrWriter, ASE (structures,
EMT energies and forces, ase.neighborlist neighbour lists) and numpy.

Expected values always come from the source arrays built here with ASE/numpy, never from zbatch.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import CLI, expect_error, nvalchemi_zarr, read

warnings.filterwarnings("ignore", message=".*CUDA.*")

from ase import Atoms  # noqa: E402
from ase.build import bulk, molecule  # noqa: E402
from ase.calculators.emt import EMT  # noqa: E402
from ase.collections import g2  # noqa: E402
from ase.neighborlist import neighbor_list  # noqa: E402

from zbatch._atomic import AtomicWriter, ArrayConfig, WriteConfig  # noqa: E402

_nvalchemi = nvalchemi_zarr


CUTOFF = 3.0
EMT_ELEMENTS = {"H", "C", "N", "O", "Al", "Ni", "Cu", "Pd", "Ag", "Pt", "Au"}


# ------------------------------------------------------------------------------------------------
# Sources: real structures, with EMT energies/forces and ASE neighbour lists
# ------------------------------------------------------------------------------------------------
def _structures():
    out = []
    names = [n for n in g2.names if set(g2[n].get_chemical_symbols()) <= EMT_ELEMENTS]
    for name in sorted(names)[:8]:
        a = molecule(name)
        a.center(vacuum=3.0)
        out.append(a)
    for sym, kw, rep in [("Cu", {"cubic": True}, (2, 1, 1)), ("Al", {}, (2, 2, 2)),
                         ("Ni", {"orthorhombic": True}, (1, 2, 1)), ("Pt", {}, (1, 1, 3)),
                         ("Au", {"cubic": True}, (1, 1, 1)), ("Ag", {}, (3, 1, 1))]:
        a = bulk(sym, **kw).repeat(rep)
        a.rattle(0.03, seed=len(out))
        out.append(a)
    for a in out:
        a.calc = EMT()
    return out


def _source(a: Atoms) -> dict:
    """The oracle arrays of one structure (computed with ASE, independently of zbatch)."""
    i, j, s = neighbor_list("ijS", a, CUTOFF)
    cell = a.get_cell().array
    return {"positions": a.get_positions(), "atomic_numbers": a.get_atomic_numbers(),
            "forces": a.get_forces(), "energy": a.get_potential_energy(), "cell": cell,
            "pbc": a.get_pbc(), "neighbor_list": np.stack([i, j], 1), "shifts": s @ cell}


@pytest.fixture(scope="module")
def sources():
    structs = _structures()
    return structs, [_source(a) for a in structs]


def _assert_sample(got: dict, src: dict, where: str):
    """A sample as nvalchemi's reader returns it (torch tensors) against the source."""
    f32 = np.float32
    np.testing.assert_array_equal(got["positions"].numpy(), src["positions"].astype(f32), where)
    np.testing.assert_array_equal(got["atomic_numbers"].numpy(), src["atomic_numbers"], where)
    np.testing.assert_array_equal(got["forces"].numpy(), src["forces"].astype(f32), where)
    np.testing.assert_array_equal(got["energy"].numpy(), np.full((1, 1), src["energy"], f32), where)
    np.testing.assert_array_equal(got["cell"].numpy(), src["cell"].astype(f32)[None], where)
    np.testing.assert_array_equal(got["pbc"].numpy(), np.asarray(src["pbc"])[None], where)
    # nvalchemi subtracts atoms_ptr[p]: local indices must come back exactly
    np.testing.assert_array_equal(got["neighbor_list"].numpy(), src["neighbor_list"], where)
    np.testing.assert_array_equal(got["shifts"].numpy(), src["shifts"].astype(f32), where)


def _assert_store_equals(path, expected: list[dict]):
    _, Reader, _ = _nvalchemi()
    r = Reader(str(path))
    assert len(r) == len(expected)
    for i, src in enumerate(expected):
        data, _meta = r[i]
        _assert_sample(data, src, f"{path} sample {i}")
    r.close()


def _tree_bytes(path) -> dict[str, str]:
    out = {}
    for dp, _dn, fn in os.walk(path):
        for f in fn:
            p = Path(dp, f)
            out[p.relative_to(path).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _invariants_by_hand(path):
    """FORMATS §8.2, read with zbatch.read_array and checked here (not by zbatch)."""
    attrs = json.loads(Path(path, "zarr.json").read_text())["attributes"]
    n = attrs["num_samples"]
    ap = read(path, "meta/atoms_ptr")
    ep = read(path, "meta/edges_ptr")
    mask = read(path, "meta/samples_mask")
    assert len(ap) == len(ep) == len(mask) + 1 == n + 1
    assert ap[0] == ep[0] == 0 and np.all(np.diff(ap) >= 0) and np.all(np.diff(ep) >= 0)
    levels = {**attrs["fields"]["core"], **attrs["fields"].get("custom", {})}
    for group in ("core", "custom"):
        for name in sorted(os.listdir(Path(path, group))):
            if not Path(path, group, name, "zarr.json").exists():
                continue
            rows = len(read(path, f"{group}/{name}"))
            want = {"atom": ap[-1], "edge": ep[-1], "system": n}[levels[name]]
            assert rows == want, f"{group}/{name}: {rows} rows, {levels[name]} level needs {want}"
    nl = read(path, "core/neighbor_list")
    for p in range(n):
        local = nl[ep[p]:ep[p + 1]] - ap[p]
        assert local.min(initial=0) >= 0 and local.max(initial=-1) < ap[p + 1] - ap[p]
    return n, mask


# ------------------------------------------------------------------------------------------------
# zbatch-written stores, read by nvalchemi
# ------------------------------------------------------------------------------------------------
def test_round_trip_write_append_delete_defragment(tmp_path, sources):
    structs, srcs = sources
    path = tmp_path / "ds.zarr"
    w = AtomicWriter(path, cutoff=CUTOFF)
    # dict samples (local neighbour lists), then ase.Atoms samples twice
    w.write([dict(s) for s in srcs[:5]])
    w.append(structs[5:9])
    w.append(structs[9:])
    _assert_store_equals(path, srcs)
    # the default storage of data arrays: ~32 KiB inner chunks, 1,024 per shard (the
    # store nvalchemi just read is sharded); pointer arrays unsharded
    nlm = meta_of(path, "core/neighbor_list")
    assert nlm["codecs"][0]["name"] == "sharding_indexed"
    assert nlm["codecs"][0]["configuration"]["chunk_shape"] == [2048, 2]
    assert nlm["chunk_grid"]["configuration"]["chunk_shape"] == [2048 * 1024, 2]
    assert meta_of(path, "meta/atoms_ptr")["codecs"][0]["name"] == "bytes"
    n, _ = _invariants_by_hand(path)
    assert n == len(srcs)
    with pytest.raises(FileExistsError):
        w.write(structs[:1])
    summary = w.check()
    assert summary["num_samples"] == len(srcs) and not summary["uncommitted_tail"]
    assert summary["num_atoms"] == sum(len(s["positions"]) for s in srcs)
    assert summary["num_edges"] == sum(len(s["neighbor_list"]) for s in srcs)
    # the stored form is store-global on every append (FORMATS §8.3)
    nl = read(path, "core/neighbor_list")
    ap, ep = read(path, "meta/atoms_ptr"), read(path, "meta/edges_ptr")
    last = len(srcs) - 1
    np.testing.assert_array_equal(nl[ep[last]:], srcs[last]["neighbor_list"] + ap[last])

    live = list(range(len(srcs)))
    for batch in ([1, 6, 1], [9]):  # logical indices (the i-th live sample); duplicates collapse
        w.delete(batch)
        doomed = {live[i] for i in batch}
        live = [x for x in live if x not in doomed]
    assert len(live) == len(srcs) - 3
    _assert_store_equals(path, [srcs[i] for i in live])
    _, mask = _invariants_by_hand(path)
    assert mask.tolist() == [i in live for i in range(len(srcs))]
    # soft delete keeps the data (nvalchemi zero-fills it)
    pos = read(path, "core/positions")
    assert 1 not in live
    np.testing.assert_array_equal(pos[ap[1]:ap[2]], srcs[1]["positions"].astype(np.float32))

    w.defragment()
    _assert_store_equals(path, [srcs[i] for i in live])
    n, mask = _invariants_by_hand(path)
    assert n == len(live) and mask.all()
    assert not any(p.name.startswith("ds.zarr.zbatch-") for p in tmp_path.iterdir())
    # and it keeps taking appends with the right offsets
    w.append(structs[:2])
    _assert_store_equals(path, [srcs[i] for i in live] + srcs[:2])


def test_config_codecs_chunks_shards(tmp_path, sources):
    _, srcs = sources
    cfg = WriteConfig(core=ArrayConfig(codec="blosc:lz4:5:shuffle", chunk_rows=16, shard_rows=64),
                      meta=ArrayConfig(codec="zstd:1", chunk_rows=8),
                      field_overrides={"positions": ArrayConfig(codec="zstd:5", shard_rows=0),
                                       "core/energy": ArrayConfig(chunk_rows=4, shard_rows=8)})
    path = tmp_path / "cfg.zarr"
    AtomicWriter(path, cfg).write(srcs)
    _assert_store_equals(path, srcs)

    def meta(name):
        return json.loads(Path(path, name, "zarr.json").read_text())

    forces = meta("core/forces")
    assert forces["chunk_grid"]["configuration"]["chunk_shape"] == [64, 3]
    shard = forces["codecs"][0]
    assert shard["name"] == "sharding_indexed"
    assert shard["configuration"]["chunk_shape"] == [16, 3]
    assert shard["configuration"]["codecs"][1]["name"] == "blosc"
    pos = meta("core/positions")  # the override's codec and no shards, the group's chunk rows
    assert [c["name"] for c in pos["codecs"]] == ["bytes", "zstd"]
    assert pos["codecs"][1]["configuration"]["level"] == 5
    assert pos["chunk_grid"]["configuration"]["chunk_shape"] == [16, 3]
    energy = meta("core/energy")
    assert energy["chunk_grid"]["configuration"]["chunk_shape"] == [8, 1]
    assert energy["codecs"][0]["configuration"]["chunk_shape"] == [4, 1]
    assert meta("meta/atoms_ptr")["chunk_grid"]["configuration"]["chunk_shape"] == [8]
    # nvalchemi's field names work as a plain dict too
    path2 = tmp_path / "cfg2.zarr"
    AtomicWriter(path2, {"core": {"codec": "none", "chunk_size": 32}}).write(srcs[:3])
    assert meta_of(path2, "core/forces")["chunk_grid"]["configuration"]["chunk_shape"] == [32, 3]
    _assert_store_equals(path2, srcs[:3])


def meta_of(path, name):
    return json.loads(Path(path, name, "zarr.json").read_text())


def test_append_missing_or_unknown_field_writes_nothing(tmp_path, sources):
    _, srcs = sources
    path = tmp_path / "ds.zarr"
    w = AtomicWriter(path)
    w.write(srcs[:3])
    before = _tree_bytes(path)
    missing = [{k: v for k, v in s.items() if k != "forces"} for s in srcs[3:5]]
    with expect_error("ZB_E_INVALID", "core/forces is missing"):
        w.append(missing)
    extra = [dict(s, charges_ref=np.zeros(len(s["positions"]))) for s in srcs[3:5]]
    with expect_error("ZB_E_INVALID", "custom/charges_ref is not in the store"):
        w.append(extra)
    bad = [dict(s) for s in srcs[3:5]]
    bad[1]["neighbor_list"] = bad[1]["neighbor_list"] + 1000  # not local indices
    with expect_error("ZB_E_INVALID", "neighbor_list"):
        w.append(bad)
    assert _tree_bytes(path) == before
    _assert_store_equals(path, srcs[:3])


def test_add_custom_then_append_must_extend_it(tmp_path, sources):
    structs, srcs = sources
    path = tmp_path / "ds.zarr"
    w = AtomicWriter(path)
    w.write(srcs[:4])
    n_atoms = sum(len(s["positions"]) for s in srcs[:4])
    charges = np.arange(n_atoms, dtype=np.float32) * 0.25
    with expect_error("ZB_E_INVALID", f"needs {n_atoms}"):
        w.add_custom("charges_ref", charges[:-1], "atom")
    w.add_custom("charges_ref", charges, "atom")
    w.add_custom("tag", np.arange(4, dtype=np.int32) + 7, "system")
    with expect_error("ZB_E_INVALID", "custom/charges_ref is missing"):
        w.append(srcs[4:5])
    more = dict(srcs[4], charges_ref=np.full(len(srcs[4]["positions"]), -1.0), tag=np.int32(99))
    w.append([more])
    _, Reader, _ = _nvalchemi()
    r = Reader(str(path))
    assert r.field_levels["charges_ref"] == "atom" and r.field_levels["tag"] == "system"
    off = 0
    for i in range(4):
        d, _ = r[i]
        n = len(srcs[i]["positions"])
        np.testing.assert_array_equal(d["charges_ref"].numpy(), charges[off:off + n])
        assert d["tag"].numpy().tolist() == [7 + i]
        off += n
    d, _ = r[4]
    np.testing.assert_array_equal(d["charges_ref"].numpy(), -np.ones(len(srcs[4]["positions"])))
    assert d["tag"].numpy().tolist() == [99]
    _assert_sample(d, srcs[4], "appended")
    _invariants_by_hand(path)


def test_interrupted_append_nvalchemi_reads_committed_samples(tmp_path, sources):
    """A crash inside an append, replayed: the chunks of an append keep their old rows, so
    restoring the metadata documents of before the append is what a crash between two puts
    leaves. nvalchemi counts samples by the length of samples_mask, zbatch by num_samples."""
    _, srcs = sources
    path = tmp_path / "ds.zarr"
    w = AtomicWriter(path)
    w.write(srcs[:4])
    docs = {p: p.read_bytes() for p in path.rglob("zarr.json")}
    w.append(srcs[4:7])
    # crash before samples_mask's metadata put: every document but the data arrays' is old
    for p, text in docs.items():
        if "core" not in p.parts:
            p.write_bytes(text)
    _assert_store_equals(path, srcs[:4])
    assert w.check()["uncommitted_tail"]
    w.append(srcs[7:9])  # recovery cuts the tails back first
    _assert_store_equals(path, srcs[:4] + srcs[7:9])
    assert not w.check()["uncommitted_tail"]

    # crash between the samples_mask put and the root put: nvalchemi already sees the new
    # samples (complete); zbatch's recovery rolls num_samples forward to match
    root = Path(path, "zarr.json")
    old_root = root.read_bytes()
    w.append(srcs[9:11])
    root.write_bytes(old_root)
    _assert_store_equals(path, srcs[:4] + srcs[7:11])
    assert w.check()["num_samples"] == 6
    w.recover()
    assert w.check()["num_samples"] == 8
    _invariants_by_hand(path)


# ------------------------------------------------------------------------------------------------
# nvalchemi-written stores, checked and extended by zbatch
# ------------------------------------------------------------------------------------------------
def _nv_data(srcs):
    import torch
    AtomicData, _, _ = _nvalchemi()
    out = []
    for s in srcs:
        out.append(AtomicData(
            positions=torch.tensor(s["positions"], dtype=torch.float32),
            atomic_numbers=torch.tensor(s["atomic_numbers"], dtype=torch.int64),
            forces=torch.tensor(s["forces"], dtype=torch.float32),
            energy=torch.tensor([[s["energy"]]], dtype=torch.float32),
            cell=torch.tensor(s["cell"], dtype=torch.float32)[None],
            pbc=torch.tensor(np.asarray(s["pbc"]))[None],
            neighbor_list=torch.tensor(s["neighbor_list"], dtype=torch.int64),
            shifts=torch.tensor(s["shifts"], dtype=torch.float32)))
    return out


def test_nvalchemi_store_passes_checks_and_takes_zbatch_appends(tmp_path, sources):
    _, srcs = sources
    _, Reader, Writer = _nvalchemi()
    path = tmp_path / "nv.zarr"
    Writer(str(path)).write(_nv_data(srcs[:5]))
    n, _ = _invariants_by_hand(path)
    w = AtomicWriter(path)
    summary = w.check()
    assert summary["num_samples"] == n == 5
    assert summary["num_atoms"] == sum(len(s["positions"]) for s in srcs[:5])
    assert summary["num_fields"] == 11  # nvalchemi also writes atomic_masses, velocities, ...
    # zbatch reads nvalchemi's arrays (zstd level 0 default) as zarr-python does
    import zarr
    z = zarr.open_group(str(path), mode="r")
    for name in ("core/positions", "core/neighbor_list", "core/cell", "meta/edges_ptr"):
        np.testing.assert_array_equal(read(path, name), z[name][...])

    # zbatch appends to it: every array (nvalchemi's extras included) extended, indices offset
    nv_store = Reader(str(path))
    extras = {k: v for k, v in nv_store[0][0].items()
              if k in ("atomic_masses", "atom_categories", "velocities")}
    nv_store.close()
    appended = []
    for s in srcs[5:8]:
        m = len(s["positions"])
        appended.append(dict(s, atomic_masses=np.ones(m, np.float32),
                             atom_categories=np.zeros(m, np.int64),
                             velocities=np.zeros((m, 3), np.float32)))
    assert set(extras) == {"atomic_masses", "atom_categories", "velocities"}
    w.append(appended)
    _assert_store_equals(path, srcs[:8])
    _invariants_by_hand(path)
    w.delete([0])
    w.defragment()
    _assert_store_equals(path, srcs[1:8])


def test_nvalchemi_append_hazard_is_reported(tmp_path, sources):
    _, srcs = sources
    _, Reader, Writer = _nvalchemi()
    path = tmp_path / "nv.zarr"
    nw = Writer(str(path))
    nw.write(_nv_data(srcs[:3]))
    nw.append(_nv_data(srcs[3:5]))  # nvalchemi forgets the store's atom offset (FORMATS §8.5)
    with expect_error("ZB_E_CORRUPT", "core/neighbor_list: sample 3"):
        AtomicWriter(path).check()
    with expect_error("ZB_E_CORRUPT", "neighbor_list"):
        AtomicWriter(path).defragment()
    # the failed defragment removed its half-written new store and left the old one as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nv.zarr"]
    r = Reader(str(path))
    assert len(r) == 5
    for i in range(3):  # the samples nvalchemi wrote before its faulty append
        _assert_sample(r[i][0], srcs[i], f"nvalchemi sample {i}")
    r.close()


# ------------------------------------------------------------------------------------------------
# zbatch synth --kind atoms
# ------------------------------------------------------------------------------------------------
def test_synth_atoms_reproducible_and_readable(tmp_path):
    assert CLI.exists(), f"{CLI} is not built"
    a, b = tmp_path / "a.zarr", tmp_path / "b.zarr"
    for p in (a, b):
        out = subprocess.run([str(CLI), "synth", "--kind", "atoms", "--n", "500", "-o", str(p),
                              "--seed", "1"], capture_output=True, text=True, check=True)
        assert "500 structures" in out.stdout and out.stdout.count("\n") == 1
    assert _tree_bytes(a) == _tree_bytes(b)
    c = tmp_path / "c.zarr"
    subprocess.run([str(CLI), "synth", "--kind", "atoms", "--n", "500", "-o", str(c), "--seed",
                    "2"], capture_output=True, check=True)
    assert _tree_bytes(a) != _tree_bytes(c)
    n, _ = _invariants_by_hand(a)
    assert n == 500
    _, Reader, _ = _nvalchemi()
    r = Reader(str(a))
    assert len(r) == 500
    natoms = np.diff(read(a, "meta/atoms_ptr"))
    assert natoms.min() >= 10 and natoms.max() <= 200
    for i in (0, 137, 499):
        d, _ = r[i]
        pos = d["positions"].numpy().astype(np.float64)
        cell = d["cell"].numpy()[0].astype(np.float64)
        vol = abs(np.linalg.det(cell))
        assert 0.04 < len(pos) / vol < 0.11  # a realistic number density (atoms/Å^3)
        assert np.all(d["pbc"].numpy())
        assert d["forces"].shape == (len(pos), 3) and d["energy"].shape == (1, 1)
        # the neighbour list is ASE's for that cutoff, with Cartesian shifts S @ cell
        atoms = Atoms(numbers=d["atomic_numbers"].numpy(), positions=pos, cell=cell, pbc=True)
        ii, jj, ss = neighbor_list("ijS", atoms, 5.0)
        nl = d["neighbor_list"].numpy()
        sh = d["shifts"].numpy().astype(np.float64)
        s_int = np.rint(np.linalg.solve(cell.T, sh.T).T).astype(int)
        np.testing.assert_allclose(s_int @ cell, sh, atol=1e-3)
        got = sorted(zip(nl[:, 0], nl[:, 1], map(tuple, s_int)))
        want = sorted(zip(ii, jj, map(tuple, ss)))
        # float32 positions can move a pair across the cutoff; allow a hair of disagreement
        assert len(set(got) ^ set(want)) <= max(2, len(want) // 5000), (i, len(got), len(want))
    r.close()


def test_reads_through_a_mask_of_many_blocks(tmp_path):
    """Soft deletes over 3,000 samples, across many of the mask's rank blocks (one rank entry
    per 256 samples): blocks with every sample kept, a block wholly deleted, blocks with one or
    a few deletions, the last (short) block. Every logical id reads the physical sample that
    numpy's flatnonzero(mask) names, neighbour lists re-based to the batch."""
    import zbatch
    n = 3000
    rng = np.random.default_rng(11)
    srcs = []
    for k in range(n):
        m = 1 + k % 3
        srcs.append({"positions": np.full((m, 3), k, np.float64),
                     "atomic_numbers": np.full(m, 1 + k % 80),
                     "forces": np.zeros((m, 3)), "energy": float(k),
                     "cell": np.eye(3), "pbc": np.array([True, True, True]),
                     "neighbor_list": np.array([[j, (j + 1) % m] for j in range(m)]),
                     "shifts": np.zeros((m, 3))})
    path = tmp_path / "many.zarr"
    w = AtomicWriter(path, cutoff=CUTOFF)
    w.write(srcs)
    doomed = set(range(512, 768))                      # the third block, whole
    doomed |= {1000, 1300, 1301, 1302, 2999}           # one; a run of three; the very last
    doomed |= set(rng.choice(np.arange(1800, 2300), 40, replace=False).tolist())
    alive = [k for k in range(n) if k not in doomed]
    w.delete(sorted(doomed))  # logical ids of the store as it is: every sample still live
    mask = read(path, "meta/samples_mask")
    assert np.flatnonzero(mask).tolist() == alive
    ds = zbatch.open(str(path))
    assert len(ds) == len(alive)
    ids = np.concatenate([np.arange(len(alive)), rng.permutation(len(alive))[:500]])
    b = ds.read_many(ids.tolist())
    phys = np.flatnonzero(mask)[ids]
    np.testing.assert_array_equal(b["energy"].reshape(-1), phys.astype(np.float32))
    counts = 1 + phys % 3
    np.testing.assert_array_equal(b["positions"][:, 0], np.repeat(phys, counts).astype(np.float32))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    want_nl = np.concatenate([np.stack([np.arange(c), (np.arange(c) + 1) % c], 1) + s
                              for c, s in zip(counts, starts)])
    np.testing.assert_array_equal(b["neighbor_list"], want_nl)
