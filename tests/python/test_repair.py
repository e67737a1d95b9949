"""zbatch.repair / `zbatch repair` against the damage nvalchemi-toolkit 0.2.0's own writer does
(FORMATS.md §8.5: append without the store's atom offset, defragment without re-offsetting).

Every damaged store here is made by nvalchemi's AtomicDataZarrWriter; the oracle for the repaired
store is the same live samples written by nvalchemi in one write() (no buggy sequence), and the
source structures come from ASE (positions, EMT results, ase.neighborlist neighbour lists).
"""
from __future__ import annotations

import hashlib
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import expect_error, nvalchemi_zarr, run_cli

warnings.filterwarnings("ignore", message=".*CUDA.*")

import zarr  # noqa: E402
from ase.build import bulk, molecule  # noqa: E402
from ase.calculators.emt import EMT  # noqa: E402
from ase.neighborlist import neighbor_list  # noqa: E402

import zbatch  # noqa: E402
from zbatch._atomic import AtomicWriter  # noqa: E402

CUTOFF = 3.0
PYDIR = Path(__file__).resolve().parents[2] / "python"


_nvalchemi = nvalchemi_zarr


@pytest.fixture(scope="module")
def structures():
    out = []
    for name in ("CH4", "H2O", "NH3", "C2H6"):
        a = molecule(name)
        a.center(vacuum=3.0)
        out.append(a)
    for sym, rep in (("Cu", (2, 1, 1)), ("Al", (2, 2, 1)), ("Ni", (1, 1, 2)), ("Au", (1, 2, 1))):
        a = bulk(sym, cubic=True).repeat(rep)
        a.rattle(0.02, seed=len(out))
        out.append(a)
    for a in out:
        a.calc = EMT()
    return out


def _data(atoms_list):
    """nvalchemi AtomicData of ASE structures, neighbour lists from ASE (every atom of these
    structures has a neighbour within the cutoff, so each sample's edges reach its first and
    last atom)."""
    import torch
    AtomicData, _, _ = _nvalchemi()
    out = []
    for a in atoms_list:
        i, j, S = neighbor_list("ijS", a, CUTOFF)
        cell = a.get_cell().array
        out.append(AtomicData(
            positions=torch.tensor(a.get_positions(), dtype=torch.float32),
            atomic_numbers=torch.tensor(a.get_atomic_numbers(), dtype=torch.int64),
            forces=torch.tensor(a.get_forces(), dtype=torch.float32),
            energy=torch.tensor([[a.get_potential_energy()]], dtype=torch.float32),
            cell=torch.tensor(cell, dtype=torch.float32)[None],
            pbc=torch.tensor(np.asarray(a.get_pbc()))[None],
            neighbor_list=torch.tensor(np.stack([i, j], 1), dtype=torch.int64),
            shifts=torch.tensor(S @ cell, dtype=torch.float32)))
    return out


def _live_rows(t, level, structures, deleted):
    """The rows of a store-wide tensor that belong to the samples not deleted, from the
    structures' own atom and edge counts (ASE)."""
    sizes = {"atom": [len(a) for a in structures],
             "edge": [len(neighbor_list("i", a, CUTOFF)) for a in structures],
             "system": [1] * len(structures)}[level]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    keep = np.concatenate([np.arange(starts[k], starts[k + 1]) for k in range(len(structures))
                           if k not in deleted])
    return t[keep]


def _tree_hash(path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(path).rglob("*")) if p.is_file()}


def _assert_same_store(got, want):
    """Every array of the oracle store equals the repaired store's (zarr-python reads both),
    and nvalchemi's reader returns equal samples."""
    g, w = zarr.open_group(str(got), mode="r"), zarr.open_group(str(want), mode="r")
    assert g.attrs["num_samples"] == w.attrs["num_samples"]
    assert g.attrs["fields"]["core"] == w.attrs["fields"]["core"]
    for group in ("meta", "core"):
        assert sorted(g[group].array_keys()) == sorted(w[group].array_keys()), group
        for name in w[group].array_keys():
            a, b = g[group][name][...], w[group][name][...]
            assert a.dtype == b.dtype, f"{group}/{name}"
            np.testing.assert_array_equal(a, b, f"{group}/{name}")
    _, Reader, _ = _nvalchemi()
    rg, rw = Reader(str(got)), Reader(str(want))
    assert len(rg) == len(rw)
    for k in range(len(rw)):
        dg, dw = rg[k][0], rw[k][0]
        assert set(dg) == set(dw)
        for f in dw:
            np.testing.assert_array_equal(dg[f].numpy(), dw[f].numpy(), f"sample {k} {f}")
    rg.close()
    rw.close()


def _refused_by_zbatch(path, sample):
    with expect_error("ZB_E_CORRUPT", f"core/neighbor_list: sample {sample}"):
        AtomicWriter(path).check()
    r = run_cli("verify", path)
    assert r.returncode != 0 and "neighbor_list" in r.stdout + r.stderr


def _zbatch_reads(path, atoms_list):
    ds = zbatch.open(str(path))
    assert len(ds) == len(atoms_list)
    b = ds.read_many(list(range(len(atoms_list))))
    np.testing.assert_array_equal(
        b["positions"], np.concatenate([a.get_positions() for a in atoms_list]).astype(np.float32))
    assert run_cli("verify", path).returncode == 0


def test_append_damage_repaired_to_what_one_write_gives(tmp_path, structures):
    _, _, Writer = _nvalchemi()
    bad, good = tmp_path / "bad.zarr", tmp_path / "good.zarr"
    w = Writer(str(bad))
    w.write(_data(structures[:3]))
    w.append(_data(structures[3:6]))  # nvalchemi offsets from 0 within the appended batch
    w.append(_data(structures[6:7])[0])  # one AtomicData: raw local indices
    stored = zarr.open_group(str(bad))["core/neighbor_list"][...]
    assert stored.min() >= 0  # the damage is indices pointing into earlier samples
    _refused_by_zbatch(bad, 3)
    w.delete([1])  # soft delete: masks cleared and rows zero-filled
    before = _tree_hash(bad)

    r = zbatch.repair(bad)
    assert r == {"output": str(tmp_path / "bad.repaired.zarr"), "samples": 6, "rebased": 4,
                 "dropped": 1}
    assert _tree_hash(bad) == before  # the damaged store is only read
    live = [structures[k] for k in (0, 2, 3, 4, 5, 6)]
    Writer(str(good)).write(_data(live))
    _assert_same_store(r["output"], good)
    _zbatch_reads(r["output"], live)


def test_defragment_damage_repaired(tmp_path, structures):
    _, _, Writer = _nvalchemi()
    bad, good = tmp_path / "bad.zarr", tmp_path / "good.zarr"
    import torch
    w = Writer(str(bad))
    w.write(_data(structures))
    atoms = sum(len(a) for a in structures)
    edges = int(zarr.open_group(str(bad))["meta/edges_ptr"][-1])
    # custom fields of each level, carried through defragment and repair
    custom = {"charge_ref": ("atom", torch.arange(atoms, dtype=torch.float32) / 7),
              "bond_order": ("edge", torch.arange(edges, dtype=torch.int64) % 5),
              "label": ("system", torch.arange(len(structures), dtype=torch.int64) * 10)}
    for key, (level, t) in custom.items():
        w.add_custom(key, t, level)
    w.delete([0, 4])
    w.defragment()  # copies stored indices: every later sample's point past it
    nl = zarr.open_group(str(bad))["core/neighbor_list"][...]
    ap = zarr.open_group(str(bad))["meta/atoms_ptr"][...]
    assert nl[-1].max() >= ap[-1]  # indices past the store's atoms
    _refused_by_zbatch(bad, 0)

    out = tmp_path / "fixed.zarr"
    r = zbatch.repair(bad, out)
    assert (r["samples"], r["rebased"], r["dropped"]) == (6, 6, 0)
    live = [s for k, s in enumerate(structures) if k not in (0, 4)]
    gw = Writer(str(good))
    gw.write(_data(live))
    for key, (level, t) in custom.items():
        gw.add_custom(key, _live_rows(t, level, structures, (0, 4)), level)
    _assert_same_store(out, good)
    g = zarr.open_group(str(out), mode="r")
    for key, (level, t) in custom.items():
        np.testing.assert_array_equal(g[f"custom/{key}"][...],
                                      _live_rows(t, level, structures, (0, 4)).numpy(), key)
    _zbatch_reads(out, live)


def test_ambiguous_sample_refused_naming_it(tmp_path, structures):
    """An appended sample whose edges do not reach its last atom (an isolated atom far away):
    several offsets fit, so repair refuses and writes nothing."""
    import torch
    _, _, Writer = _nvalchemi()
    bad = tmp_path / "bad.zarr"
    w = Writer(str(bad))
    w.write(_data(structures[:2]))
    lonely = _data(structures[2:3])[0]
    n = lonely.positions.shape[0]
    far = lonely.positions.clone()
    far[-1] = far[-1] + 50.0
    AtomicData, _, _ = _nvalchemi()
    nl = lonely.neighbor_list
    keep = (nl < n - 1).all(dim=1)  # drop the last atom's edges
    w.append([AtomicData(positions=far, atomic_numbers=lonely.atomic_numbers,
                         forces=lonely.forces, energy=lonely.energy, cell=lonely.cell,
                         pbc=lonely.pbc, neighbor_list=nl[keep].clone(),
                         shifts=lonely.shifts[keep].clone())])
    with pytest.raises(ValueError, match=r"sample 2: core/neighbor_list .* reaches only "
                                         rf"{n - 1} of its {n} atoms, so 2 offsets fit"):
        zbatch.repair(bad, tmp_path / "out.zarr")
    assert not (tmp_path / "out.zarr").exists()
    del torch


def test_unrecoverable_and_misused(tmp_path, structures):
    _, _, Writer = _nvalchemi()
    bad = tmp_path / "bad.zarr"
    Writer(str(bad)).write(_data(structures[:2]))
    with pytest.raises(ValueError, match="beside"):
        zbatch.repair(bad, bad / "inner.zarr")
    (tmp_path / "taken.zarr").mkdir()
    (tmp_path / "taken.zarr" / "x").write_text("x")
    with pytest.raises(FileExistsError):
        zbatch.repair(bad, tmp_path / "taken.zarr")
    # an array nvalchemi's append never extended: its appended rows do not exist anywhere
    g = zarr.open_group(str(bad), mode="r+")
    g["core/forces"].resize((g["core/forces"].shape[0] - 1, 3))
    with pytest.raises(ValueError, match=r"core/forces has \d+ rows where its atom level needs"):
        zbatch.repair(bad, tmp_path / "out.zarr")
    assert not (tmp_path / "out.zarr").exists()
    with pytest.raises(FileNotFoundError):
        zbatch.repair(tmp_path / "missing.zarr")


def test_cli_repair(tmp_path, structures, capsys):
    _, _, Writer = _nvalchemi()
    bad = tmp_path / "bad.zarr"
    w = Writer(str(bad))
    w.write(_data(structures[:2]))
    w.append(_data(structures[2:4]))
    assert "repair" in run_cli("--help").stdout
    env = {**os.environ, "ZBATCH_PYTHON": sys.executable, "PYTHONPATH": str(PYDIR)}
    import subprocess
    from conftest import CLI
    r = subprocess.run([str(CLI), "repair", str(bad), "-o", str(tmp_path / "ok.zarr")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "4 samples, 2 with re-based edge indices, 0 deleted left out" in r.stdout
    _zbatch_reads(tmp_path / "ok.zarr", structures[:4])

    from zbatch.__main__ import main
    assert main(["repair", str(bad), "-o", str(tmp_path / "ok.zarr")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("zbatch repair: ") and "ok.zarr already exists" in err
