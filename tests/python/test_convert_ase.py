"""zbatch.neighbor_list and zbatch.convert_ase against their oracles: ASE's own neighbour list
(ase.neighborlist.neighbor_list "ijS"), ASE's writers and readers (extended XYZ, .db, .traj),
nvalchemi-toolkit 0.2.0's AtomicDataZarrReader, Batch and neighbour filter, and numpy.

Expected values always come from the structures built here with ASE/numpy, never from zbatch.
"""
from __future__ import annotations

import json
import math
import os
import threading
import time
import tracemalloc
import warnings
import weakref
from pathlib import Path

import numpy as np
import pytest

from conftest import expect_error

warnings.filterwarnings("ignore", message=".*CUDA.*")

import ase.io  # noqa: E402
from ase import Atoms  # noqa: E402
from ase.build import bulk, fcc111, molecule  # noqa: E402
from ase.calculators.emt import EMT  # noqa: E402
from ase.calculators.singlepoint import SinglePointCalculator  # noqa: E402
from ase.neighborlist import neighbor_list as ase_neighbor_list  # noqa: E402

import zbatch  # noqa: E402


def _nvalchemi():
    try:
        import torch  # noqa: F401
        from nvalchemi.data import AtomicData, Batch
        from nvalchemi.data.datapipes.backends.zarr import AtomicDataZarrReader
    except Exception as exc:  # pragma: no cover - depends on the environment
        pytest.fail(f"nvalchemi-toolkit 0.2.0 (the oracle) is not importable: {exc!r}")
    return AtomicData, Batch, AtomicDataZarrReader


def _triples(i, j, S):
    return set(zip(np.asarray(i).tolist(), np.asarray(j).tolist(),
                   map(tuple, np.asarray(S).tolist())))


def _ase_triples(atoms, cutoff):
    return _triples(*ase_neighbor_list("ijS", atoms, cutoff))


def _random_cell(rng, scale):
    while True:
        cell = np.eye(3) * scale + rng.uniform(-0.4, 0.4, (3, 3)) * scale
        if abs(np.linalg.det(cell)) > 0.25 * scale**3:
            return cell


# ------------------------------------------------------------------------------------------------
# zbatch.neighbor_list == ase.neighborlist.neighbor_list("ijS")
# ------------------------------------------------------------------------------------------------
def _nl_cases():
    rng = np.random.default_rng(7)
    cases = []
    # bulk crystals with repeats (cubic, primitive fcc/bcc: triclinic cells, hcp)
    for sym, kw, rep in [("Cu", {"cubic": True}, (2, 2, 2)), ("Cu", {}, (3, 3, 3)),
                         ("Fe", {}, (4, 3, 2)), ("Si", {}, (2, 2, 2)), ("Mg", {}, (3, 3, 2)),
                         ("NaCl", {"crystalstructure": "rocksalt", "a": 5.64}, (2, 2, 2))]:
        a = bulk(sym, **kw).repeat(rep)
        a.rattle(0.05, seed=len(cases))
        cases.append((f"bulk {sym}{rep}", a))
    # small cells with several images of each atom: one- and two-atom cells
    cases.append(("Cu primitive, 1 atom", bulk("Cu")))
    cases.append(("Si primitive, 2 atoms", bulk("Si")))
    # random triclinic cells, atoms also outside the cell
    for k in range(4):
        cell = _random_cell(rng, rng.uniform(3, 7))
        n = int(rng.integers(2, 30))
        frac = rng.uniform(-1.2, 2.2, (n, 3))
        cases.append((f"triclinic {k}", Atoms("H" * n, positions=frac @ cell, cell=cell, pbc=True)))
    # mixed pbc: a slab with vacuum, a wire, a slab with a zero c vector
    slab = fcc111("Pt", size=(3, 3, 3), vacuum=6.0)
    slab.rattle(0.05, seed=3)
    cases.append(("slab pbc TTF", slab))
    wire = bulk("Cu", cubic=True).repeat((4, 1, 1))
    wire.pbc = (True, False, False)
    wire.rattle(0.05, seed=4)
    cases.append(("wire pbc TFF", wire))
    flat = Atoms("C2", positions=[[0, 0, 0], [1.42, 0, 0.1]],
                 cell=[[2.46, 0, 0], [-1.23, 2.13, 0], [0, 0, 0]], pbc=(True, True, False))
    cases.append(("graphene, c = 0", flat))
    mixed = Atoms("H" * 12, positions=rng.uniform(0, 6, (12, 3)),
                  cell=_random_cell(rng, 6), pbc=(False, True, True))
    cases.append(("triclinic pbc FTT", mixed))
    # molecules without a cell, single atoms
    for name in ("H2O", "C6H6", "CH3CH2OH"):
        cases.append((f"molecule {name}", molecule(name)))
    cases.append(("single atom, no cell", Atoms("Ar", positions=[[1, 2, 3]])))
    cases.append(("single atom, periodic", Atoms("Ar", positions=[[0.3, 0.2, 0.1]],
                                                 cell=[2.0, 2.5, 3.0], pbc=True)))
    return cases


@pytest.mark.parametrize("name,atoms", _nl_cases(), ids=[c[0] for c in _nl_cases()])
@pytest.mark.parametrize("cutoff", [1.2, 3.0, 5.0, 7.5])
def test_neighbor_list_equals_ase(name, atoms, cutoff):
    i, j, S = zbatch.neighbor_list(atoms.positions, atoms.cell, atoms.pbc, cutoff)
    assert i.dtype == j.dtype == S.dtype == np.int64
    assert i.shape == j.shape and S.shape == (len(i), 3)
    assert np.all(np.diff(i) >= 0), "pairs are grouped by i"
    got = _triples(i, j, S)
    assert len(got) == len(i), "no pair listed twice"
    want = _ase_triples(atoms, cutoff)
    assert got == want, (name, cutoff, len(got), len(want), sorted(got ^ want)[:5])
    # the distances follow ASE's formula, strictly inside the cutoff
    D = atoms.positions[j] - atoms.positions[i] + S @ atoms.cell.array
    assert np.all(np.linalg.norm(D, axis=1) < cutoff)


def test_neighbor_list_images_of_a_small_cell():
    # one atom in a simple cubic cell of 1 Å with a cutoff of 2.5 cells: its 80 images with
    # |S|^2 <= 6 (6 + 12 + 8 + 6 + 24 + 24), both signs of each
    a = Atoms("X", positions=[[0.1, 0.2, 0.3]], cell=np.eye(3), pbc=True)
    i, j, S = zbatch.neighbor_list(a.positions, a.cell, a.pbc, 2.5)
    assert len(i) == 80 and set(i) == set(j) == {0}
    norms = (S**2).sum(1)
    assert sorted(np.bincount(norms, minlength=7).tolist()) == sorted([0, 6, 12, 8, 6, 24, 24])
    assert _triples(i, j, S) == _triples(i, j, -S)
    assert _triples(i, j, S) == _ase_triples(a, 2.5)


def test_neighbor_list_arguments_and_errors():
    # plain lists, None for the cell of a molecule, a scalar pbc
    i, j, S = zbatch.neighbor_list([[0, 0, 0], [0, 0, 1.0]], None, False, 1.5)
    assert _triples(i, j, S) == {(0, 1, (0, 0, 0)), (1, 0, (0, 0, 0))}
    i, j, S = zbatch.neighbor_list(np.zeros((0, 3)), None, False, 2.0)
    assert len(i) == len(j) == len(S) == 0
    pos = bulk("Cu", cubic=True).positions
    cell = bulk("Cu", cubic=True).cell
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with expect_error("ZB_E_INVALID", "cutoff"):
            zbatch.neighbor_list(pos, cell, True, bad)
    nan = pos.copy()
    nan[2, 1] = np.nan
    with expect_error("ZB_E_INVALID", "atom 2"):
        zbatch.neighbor_list(nan, cell, True, 3.0)
    singular = np.array([[3.6, 0, 0], [7.2, 0, 0], [0, 0, 3.6]])
    with expect_error("ZB_E_INVALID", "singular"):
        zbatch.neighbor_list(pos, singular, True, 3.0)
    with expect_error("ZB_E_INVALID", "singular"):
        zbatch.neighbor_list(pos, np.zeros((3, 3)), True, 3.0)  # periodic without a cell
    # ... but the zero cell of a molecule is fine
    assert len(zbatch.neighbor_list(pos, np.zeros((3, 3)), False, 3.0)[0]) == 12
    n = len(zbatch.neighbor_list(pos, cell, True, 3.0)[0])
    with expect_error("ZB_E_OVERFLOW", "max_pairs"):
        zbatch.neighbor_list(pos, cell, True, 3.0, max_pairs=n - 1)
    assert len(zbatch.neighbor_list(pos, cell, True, 3.0, max_pairs=n)[0]) == n
    with pytest.raises(ValueError, match="shape"):
        zbatch.neighbor_list(np.zeros((4, 2)), cell, True, 3.0)
    with pytest.raises(ValueError, match="cell"):
        zbatch.neighbor_list(pos, np.eye(2), True, 3.0)


def test_neighbor_list_releases_the_gil():
    """While one thread builds large lists in C, the other keeps running Python: most of the
    time passes in short pauses of the second thread. (Were the GIL held, it would wait out
    each whole build: a Python sort of similar length, which holds the GIL, leaves under a
    tenth of the time in short pauses.)"""
    a = bulk("Cu", cubic=True).repeat((14, 14, 14))  # 10,976 atoms, 1.5M pairs at 7 Å
    t0 = time.perf_counter()
    zbatch.neighbor_list(a.positions, a.cell, a.pbc, 7.0)
    build = time.perf_counter() - t0
    started, done = threading.Event(), threading.Event()

    def work():
        started.set()
        for _ in range(4):
            zbatch.neighbor_list(a.positions, a.cell, a.pbc, 7.0)
        done.set()

    th = threading.Thread(target=work)
    th.start()
    started.wait()
    gaps, last = [], time.perf_counter()
    begin = last
    while not done.is_set():
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    th.join()
    assert build > 0.02, f"the build took only {build:.3f} s: too short to tell"
    short = sum(g for g in gaps if g < build / 4) / (last - begin)
    assert short > 0.5, (short, max(gaps), build)


# ------------------------------------------------------------------------------------------------
# convert_ase
# ------------------------------------------------------------------------------------------------
CUTOFF = 4.0


def _emt_structures(n=12, seed=0):
    """Periodic EMT structures of a few sizes and cells, each with energy, forces and stress
    (SinglePointCalculator, so every ASE writer stores them)."""
    rng = np.random.default_rng(seed)
    recipes = [("Cu", {"cubic": True}, (2, 2, 1)), ("Al", {}, (2, 2, 2)),
               ("Ni", {"orthorhombic": True}, (1, 2, 1)), ("Pt", {}, (1, 1, 3)),
               ("Au", {"cubic": True}, (1, 1, 1)), ("Ag", {}, (3, 1, 1))]
    out = []
    for k in range(n):
        sym, kw, rep = recipes[k % len(recipes)]
        a = bulk(sym, **kw).repeat(rep)
        a.rattle(0.05, seed=int(rng.integers(1 << 30)))
        a.set_cell(a.cell.array * (1 + rng.uniform(-0.02, 0.02)), scale_atoms=True)
        a.arrays.pop("initial_magmoms", None)  # bulk("Ni") has them: every structure the same
        a.calc = EMT()
        res = dict(energy=a.get_potential_energy(), forces=a.get_forces(),
                   stress=a.get_stress())
        a.calc = SinglePointCalculator(a, **res)
        out.append(a)
    return out


def _expected(a: Atoms, cutoff: float) -> dict:
    i, j, S = ase_neighbor_list("ijS", a, cutoff)
    xx, yy, zz, yz, xz, xy = a.calc.results["stress"]
    return {"positions": a.positions, "atomic_numbers": a.numbers, "cell": a.cell.array,
            "pbc": a.pbc, "energy": a.calc.results["energy"], "forces": a.calc.results["forces"],
            "stress": np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]]),
            "edges": _triples(i, j, S)}


def _check_sample(got: dict, want: dict, where: str, local_nl, cutoff=CUTOFF):
    """One sample (numpy arrays) against the ASE source: values as float32, as nvalchemi
    stores them; the neighbour list as a set of (i, j, S) with local indices."""
    f32 = np.float32
    np.testing.assert_array_equal(got["positions"], want["positions"].astype(f32), where)
    np.testing.assert_array_equal(got["atomic_numbers"], want["atomic_numbers"], where)
    np.testing.assert_array_equal(got["cell"].reshape(3, 3), want["cell"].astype(f32), where)
    np.testing.assert_array_equal(got["pbc"].reshape(3), want["pbc"], where)
    assert got["energy"].reshape(()) == f32(want["energy"]), where
    np.testing.assert_array_equal(got["forces"], want["forces"].astype(f32), where)
    np.testing.assert_array_equal(got["stress"].reshape(3, 3), want["stress"].astype(f32), where)
    S = got["neighbor_list_shifts"]
    assert S.dtype == np.int64
    assert _triples(local_nl[:, 0], local_nl[:, 1], S) == want["edges"], where
    # shifts: Cartesian, S @ cell (nvalchemi's convention)
    np.testing.assert_allclose(got["shifts"], S @ want["cell"], atol=1e-5, err_msg=where)
    assert got["shifts"].dtype == np.float32


def _check_store(path, structures, cutoff=CUTOFF):
    """The store at `path` against `structures` (as ASE reads them back from the source file:
    extended XYZ keeps 8 decimals)."""
    want = [_expected(a, cutoff) for a in structures]
    # zbatch's own reader: batch-based neighbour lists, in any order
    ds = zbatch.open(str(path))
    assert len(ds) == len(structures)
    ids = list(range(len(structures)))[::-1]
    b = ds.read_many(ids)
    ap, ep = b["atoms_ptr"], b["edges_ptr"]
    for k, sid in enumerate(ids):
        a0, a1, e0, e1 = ap[k], ap[k + 1], ep[k], ep[k + 1]
        got = {"positions": b["positions"][a0:a1], "atomic_numbers": b["atomic_numbers"][a0:a1],
               "cell": b["cell"][k], "pbc": b["pbc"][k], "energy": b["energy"][k],
               "forces": b["forces"][a0:a1], "stress": b["stress"][k],
               "neighbor_list_shifts": b["neighbor_list_shifts"][e0:e1],
               "shifts": b["shifts"][e0:e1]}
        _check_sample(got, want[sid], f"zbatch sample {sid}", b["neighbor_list"][e0:e1] - a0,
                      cutoff)
    # nvalchemi's reader: local indices after its own atoms_ptr subtraction
    _, _, Reader = _nvalchemi()
    r = Reader(str(path))
    assert len(r) == len(structures)
    for sid in range(len(structures)):
        d = {k: v.numpy() for k, v in r[sid][0].items()}
        _check_sample(d, want[sid], f"nvalchemi sample {sid}", d["neighbor_list"], cutoff)
    r.close()


@pytest.fixture(scope="module")
def emt():
    return _emt_structures()


@pytest.mark.parametrize("ext", ["extxyz", "db", "traj"])
def test_convert_formats(tmp_path, emt, ext):
    src = tmp_path / f"in.{ext}"
    ase.io.write(str(src), emt)
    seen = []
    n = zbatch.convert_ase([src], tmp_path / "out.zarr", cutoff=CUTOFF, batch_size=5,
                           progress=seen.append)
    assert n == len(emt)
    assert seen == [5, 10, 12]
    _check_store(tmp_path / "out.zarr", list(ase.io.iread(str(src))))
    attrs = json.loads(Path(tmp_path, "out.zarr", "zarr.json").read_text())["attributes"]
    assert attrs["fields"]["core"]["neighbor_list_shifts"] == "edge"
    assert attrs["fields"]["core"]["stress"] == "system"


def test_convert_several_files_index_format_codec(tmp_path, emt):
    a, b = tmp_path / "a.traj", tmp_path / "b.data"
    ase.io.write(str(a), emt[:7])
    ase.io.write(str(b), emt[7:], format="extxyz")
    with pytest.raises(ValueError, match="b.data: ASE cannot read"):  # the wrong format
        zbatch.convert_ase(b, tmp_path / "x.zarr", cutoff=CUTOFF, format="vasp")
    unknown = tmp_path / "c.unknownext"
    unknown.write_text("hello")
    with pytest.raises(ValueError, match="c.unknownext: ASE cannot tell its format"):
        zbatch.convert_ase([a, unknown], tmp_path / "x.zarr", cutoff=CUTOFF)
    assert not (tmp_path / "x.zarr").exists()
    # ASE takes .data for its "runnerdata" format and finds nothing in it: a warning says so
    with pytest.warns(UserWarning, match="b.data: ASE read no structures .*runnerdata"):
        assert zbatch.convert_ase([a, b], tmp_path / "a_only.zarr", cutoff=CUTOFF) == 7
    c = tmp_path / "c.xyz"
    ase.io.write(str(c), emt[7:], format="extxyz")
    both = tmp_path / "both.zarr"  # several files of several formats, in order
    assert zbatch.convert_ase([a, c], both, cutoff=CUTOFF) == len(emt)
    _check_store(both, list(ase.io.iread(str(a))) + list(ase.io.iread(str(c))))
    out = tmp_path / "ab.zarr"
    assert zbatch.convert_ase([a], out, cutoff=CUTOFF, index="::2", codec="zstd:3") == 4
    _check_store(out, list(ase.io.iread(str(a), index="::2")))
    meta = json.loads(Path(out, "core", "positions", "zarr.json").read_text())
    assert "zstd" in json.dumps(meta["codecs"])
    out2 = tmp_path / "b.zarr"
    assert zbatch.convert_ase(str(b), out2, cutoff=CUTOFF, format="extxyz",
                              num_threads=2) == len(emt) - 7
    _check_store(out2, list(ase.io.iread(str(b), format="extxyz")))


def test_convert_extxyz_extras_molecules_and_small_cells(tmp_path):
    """info and arrays of extxyz become custom fields; strings are skipped with a warning;
    molecules without a cell have zero shifts; a 1-atom cell with a long cutoff lists images."""
    rng = np.random.default_rng(3)
    structs = []
    for k in range(6):
        if k % 2:
            a = molecule(["H2O", "CH4", "NH3"][k // 2])
        else:
            a = bulk("Cu")  # one atom: a cutoff of 6 Å reaches many images
            a.rattle(0.01, seed=k)
        n = len(a)
        a.calc = SinglePointCalculator(a, energy=float(rng.normal()),
                                       forces=rng.normal(size=(n, 3)), stress=rng.normal(size=6))
        a.info.update(temperature=300.0 + k, step=k, label=f"frame {k}", ok=bool(k % 2))
        a.arrays["weights"] = rng.uniform(size=n)
        a.set_initial_charges(rng.normal(size=n))
        structs.append(a)
    src = tmp_path / "mixed.extxyz"
    ase.io.write(str(src), structs)
    back = list(ase.io.iread(str(src)))  # what ASE itself reads back
    with pytest.warns(UserWarning, match="'label' is not numeric"):
        n = zbatch.convert_ase(src, tmp_path / "m.zarr", cutoff=6.0)
    assert n == 6
    _check_store(tmp_path / "m.zarr", back, cutoff=6.0)
    attrs = json.loads(Path(tmp_path, "m.zarr", "zarr.json").read_text())["attributes"]
    assert attrs["fields"]["custom"] == {"temperature": "system", "step": "system", "ok": "system",
                                         "weights": "atom", "initial_charges": "atom"}
    ds = zbatch.open(str(tmp_path / "m.zarr"))
    b = ds.read_many(list(range(6)))
    np.testing.assert_array_equal(b["temperature"].reshape(-1), [300.0 + k for k in range(6)])
    np.testing.assert_array_equal(b["step"].reshape(-1), np.arange(6))
    np.testing.assert_array_equal(b["ok"].reshape(-1), [bool(k % 2) for k in range(6)])
    np.testing.assert_array_equal(b["weights"], np.concatenate([a.arrays["weights"] for a in back]))
    np.testing.assert_array_equal(b["initial_charges"],
                                  np.concatenate([a.get_initial_charges() for a in back]))
    ep = b["edges_ptr"]
    for k in range(1, 6, 2):  # molecules: no cell, no shifts
        assert not b["pbc"][k].any() and not b["cell"][k].any()
        assert not b["shifts"][ep[k]:ep[k + 1]].any()
    assert ep[1] - ep[0] > 50  # the 1-atom cell: its own images


def test_nvalchemi_models_read_the_shifts(tmp_path, emt):
    """nvalchemi's own code takes the stored edges the way ASE means them: its Batch collates
    them, and its neighbour filter (positions[j] - positions[i] + neighbor_list_shifts @ cell,
    nvalchemi/models/_ops/neighbor_filter.py) cut to a smaller cutoff keeps exactly ASE's
    pairs for that cutoff."""
    import torch
    from nvalchemi.models._ops.neighbor_filter import filter_neighbor_list
    AtomicData, Batch, Reader = _nvalchemi()
    src = tmp_path / "in.traj"
    ase.io.write(str(src), emt[:6])
    zbatch.convert_ase(src, tmp_path / "s.zarr", cutoff=CUTOFF)
    r = Reader(str(tmp_path / "s.zarr"))
    data = [AtomicData(**r[k][0]) for k in range(6)]
    r.close()
    batch = Batch.from_data_list(data)
    nl = batch.neighbor_list
    counts = torch.bincount(nl[:, 0], minlength=batch.num_nodes)
    ptr = torch.zeros(batch.num_nodes + 1, dtype=torch.int64)
    ptr[1:] = counts.cumsum(0)
    pos = batch.positions.to(torch.float64)
    cell = batch.cell.to(torch.float64)
    small = 3.0
    kept, _, kept_shifts = filter_neighbor_list(pos, small, nl, ptr, cell,
                                                batch.neighbor_list_shifts, batch.batch_idx)
    offsets = batch.batch_ptr[:-1]
    for k, a in enumerate(emt[:6]):
        mine = (batch.batch_idx[kept[:, 0]] == k).numpy()
        local = kept[mine].numpy() - int(offsets[k])
        got = _triples(local[:, 0], local[:, 1], kept_shifts[mine].numpy())
        # float32 positions may move a pair across 3.0 Å: the store's own precision
        a32 = a.copy()
        a32.positions = a.positions.astype(np.float32).astype(np.float64)
        a32.cell = a.cell.array.astype(np.float32).astype(np.float64)
        assert got == _ase_triples(a32, small), k


def test_convert_errors(tmp_path, emt):
    good = tmp_path / "good.extxyz"
    ase.io.write(str(good), emt[:3])
    out = tmp_path / "out.zarr"
    for bad in (0, -1.0, float("nan"), float("inf"), "5", None):
        with pytest.raises(ValueError, match="cutoff"):
            zbatch.convert_ase(good, out, cutoff=bad)
    assert not out.exists()
    with pytest.raises(FileNotFoundError, match="missing.xyz"):
        zbatch.convert_ase([good, tmp_path / "missing.xyz"], out, cutoff=CUTOFF)
    garbage = tmp_path / "garbage.xyz"
    garbage.write_text("hello world\nthis is not xyz\n")
    with pytest.raises(ValueError, match=r"garbage.xyz: ASE cannot read structure 0"):
        zbatch.convert_ase(garbage, out, cutoff=CUTOFF)
    notdb = tmp_path / "broken.db"
    notdb.write_text("not a database")
    with pytest.raises(ValueError, match="broken.db: ASE cannot read"):
        zbatch.convert_ase(notdb, out, cutoff=CUTOFF)
    # a bad file after good ones: nothing is left behind
    with pytest.raises(ValueError, match="garbage.xyz"):
        zbatch.convert_ase([good, garbage], out, cutoff=CUTOFF, batch_size=2)
    assert not out.exists()
    # a structure without atoms (positions)
    empty = tmp_path / "empty.extxyz"
    ase.io.write(str(empty), [emt[0], Atoms(cell=np.eye(3) * 5, pbc=True)])
    with pytest.raises(ValueError, match="empty.extxyz: structure 1 has no atoms"):
        zbatch.convert_ase(empty, out, cutoff=CUTOFF)
    assert not out.exists()
    # a position that is not finite: the C library names the atom
    nan = emt[1].copy()
    nan.calc = emt[1].calc
    nan.positions[3, 0] = np.nan
    nanfile = tmp_path / "nan.traj"
    ase.io.write(str(nanfile), [emt[0], nan])
    with pytest.raises(ValueError, match=r"nan.traj: structure 1: .*atom 3"):
        zbatch.convert_ase(nanfile, out, cutoff=CUTOFF)
    # a periodic structure without a cell
    nocell = tmp_path / "nocell.traj"
    ase.io.write(str(nocell), [Atoms("Cu2", positions=[[0, 0, 0], [1, 1, 1]], pbc=True)])
    with pytest.raises(ValueError, match="singular"):
        zbatch.convert_ase(nocell, out, cutoff=CUTOFF)
    # a later structure without a field the first has
    plain = emt[4].copy()  # no calculator: no energy, forces, stress
    mixed = tmp_path / "mixed.traj"
    ase.io.write(str(mixed), [emt[0], emt[1], plain])
    with pytest.raises(ValueError, match="structure 2 has no 'energy'"):
        zbatch.convert_ase(mixed, out, cutoff=CUTOFF)
    assert not out.exists()
    with pytest.raises(ValueError, match="no structures"), \
            pytest.warns(UserWarning, match="ASE read no structures"):
        zbatch.convert_ase(good, out, cutoff=CUTOFF, index="5:")
    with pytest.raises(ValueError, match="zarr_format"):
        zbatch.convert_ase(good, out, cutoff=CUTOFF, zarr_format=2)
    zbatch.convert_ase(good, out, cutoff=CUTOFF)
    with pytest.raises(FileExistsError):
        zbatch.convert_ase(good, out, cutoff=CUTOFF)
    _check_store(out, list(ase.io.iread(str(good))))  # untouched by the refused second one


@pytest.mark.parametrize("num_threads", [1, 2])
def test_convert_failures_leave_nothing(tmp_path, emt, num_threads):
    """A failure while reading (a broken file after good ones) and a failure inside the writer
    (a custom field whose row shape changes, refused by libzbatch), with the store written on
    the calling thread and on a second thread: the error reaches the caller, nothing stays."""
    good = tmp_path / "good.traj"
    ase.io.write(str(good), emt[:6])
    garbage = tmp_path / "garbage.xyz"
    garbage.write_text("3\nnot a header\nnot an atom line\n")
    out = tmp_path / "out.zarr"
    with pytest.raises(ValueError, match="garbage.xyz: ASE cannot read structure 0"):
        zbatch.convert_ase([good, garbage], out, cutoff=CUTOFF, batch_size=2,
                           num_threads=num_threads)
    assert not out.exists()
    frames = []
    for k, a in enumerate(emt[:6]):
        a = a.copy()
        a.calc = emt[k].calc
        a.info["vec"] = np.arange(3.0 if k < 4 else 4.0)  # structure 4: 4 values, not 3
        frames.append(a)
    shape = tmp_path / "shape.traj"
    ase.io.write(str(shape), frames)
    with expect_error("ZB_E_INVALID", "vec"):
        zbatch.convert_ase(shape, out, cutoff=CUTOFF, batch_size=2, num_threads=num_threads)
    assert not out.exists()
    out.mkdir()  # an empty directory given as the output is emptied again, not removed
    with expect_error("ZB_E_INVALID", "vec"):
        zbatch.convert_ase(shape, out, cutoff=CUTOFF, batch_size=2, num_threads=num_threads)
    assert out.is_dir() and not any(out.iterdir())
    assert zbatch.convert_ase(good, out, cutoff=CUTOFF, num_threads=num_threads) == 6
    _check_store(out, list(ase.io.iread(str(good))))


def test_convert_memory_is_bounded(tmp_path, monkeypatch):
    """3,000 structures in batches of 50: at most two ase.Atoms live at once (counted with
    weakrefs on what ase.io.iread yields) and the peak of Python/numpy memory (tracemalloc)
    stays near that of 300 structures, far below the store's data."""
    rng = np.random.default_rng(0)
    base = bulk("Cu", cubic=True).repeat((2, 1, 1))
    big = tmp_path / "many.extxyz"
    frames = []
    for k in range(3000):
        a = base.copy()
        a.positions += rng.normal(scale=0.05, size=a.positions.shape)
        a.calc = SinglePointCalculator(a, energy=float(k), forces=rng.normal(size=(len(a), 3)))
        frames.append(a)
    ase.io.write(str(big), frames)
    small = tmp_path / "few.extxyz"
    ase.io.write(str(small), frames[:300])
    del frames

    live, peak_live = 0, 0
    real_iread = ase.io.iread

    def counted(*args, **kwargs):
        nonlocal live, peak_live

        def gone():
            nonlocal live
            live -= 1

        for a in real_iread(*args, **kwargs):
            live += 1
            peak_live = max(peak_live, live)
            weakref.finalize(a, gone)
            yield a
            del a

    monkeypatch.setattr(ase.io, "iread", counted)

    def peak_of(path, out):
        tracemalloc.start()
        n = zbatch.convert_ase(path, out, cutoff=4.0, batch_size=50)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return n, peak

    n_small, peak_small = peak_of(small, tmp_path / "few.zarr")
    n_big, peak_big = peak_of(big, tmp_path / "many.zarr")
    assert (n_small, n_big) == (300, 3000)
    assert peak_live <= 2, peak_live
    # what the 3,000 samples hold before the float32 cast: edges (i, j, S, shifts) and atoms
    edges = int(np.diff(zbatch.read_array(str(tmp_path / "many.zarr"), "meta/edges_ptr")).sum())
    data_bytes = edges * (16 + 24 + 24) + 3000 * 8 * (24 + 8 + 24)
    print(f"peak traced memory: {peak_small / 2**20:.1f} MiB for 300 structures, "
          f"{peak_big / 2**20:.1f} MiB for 3,000 (their data: {data_bytes / 2**20:.0f} MiB)")
    assert peak_big < 1.5 * peak_small + (1 << 20), (peak_small, peak_big)
    assert peak_big < data_bytes / 10, (peak_big, data_bytes)
    e = zbatch.open(str(tmp_path / "many.zarr")).read_many([0, 2999])["energy"].reshape(-1)
    np.testing.assert_array_equal(e, [0.0, 2999.0])


def test_convert_through_the_cli_signature(tmp_path, emt):
    """The call the CLI makes: positional inputs and output, everything else by keyword."""
    src = tmp_path / "in.xyz"
    ase.io.write(str(src), emt[:2], format="extxyz")
    n = zbatch.convert_ase([str(src)], str(tmp_path / "cli.zarr"), cutoff=CUTOFF, index=":",
                           format=None, batch_size=256, zarr_format=3, codec=None,
                           num_threads=1, progress=None)
    assert n == 2
    assert math.isclose(zbatch.open(str(tmp_path / "cli.zarr")).read_many([1])["energy"].item(),
                        emt[1].calc.results["energy"], rel_tol=1e-6)
    assert os.path.isdir(tmp_path / "cli.zarr" / "meta")
