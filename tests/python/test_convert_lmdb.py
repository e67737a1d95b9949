"""zbatch.convert_lmdb / `zbatch convert --from lmdb` on LMDBs written here in fairchem's layout
(ascii integer keys, a pickled `length` key, values pickled dicts or PyG Data), with the `lmdb`
package and torch_geometric 2.8.1 (the real PyG Data; the PyG 1 layout, attributes in the object,
is pickled through a stand-in class registered under PyG's name).

Expected values come from the source arrays (ASE structures, EMT results, ASE neighbour lists);
the converted store is read back with nvalchemi-toolkit 0.2.0's AtomicDataZarrReader (oracle).
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import CLI

warnings.filterwarnings("ignore", message=".*CUDA.*")

import lmdb  # noqa: E402
import torch  # noqa: E402
from ase.build import bulk, molecule  # noqa: E402
from ase.calculators.emt import EMT  # noqa: E402
from ase.neighborlist import neighbor_list  # noqa: E402
from torch_geometric.data import Data  # noqa: E402

import zbatch  # noqa: E402

CUTOFF = 3.0
PYDIR = Path(__file__).resolve().parents[2] / "python"


@pytest.fixture(scope="module")
def entries():
    """fairchem-style fields of real structures, as OCP's AtomsToGraphs builds them:
    edge_index = (neighbour, centre), cell_offsets the neighbour's image, float atomic numbers."""
    atoms = []
    for name in ("CH4", "H2O"):
        a = molecule(name)
        a.center(vacuum=3.0)
        atoms.append(a)
    for sym, rep in (("Cu", (2, 1, 1)), ("Al", (1, 2, 1)), ("Ni", (1, 1, 1))):
        a = bulk(sym, cubic=True).repeat(rep)
        a.rattle(0.02, seed=len(atoms))
        atoms.append(a)
    out = []
    for k, a in enumerate(atoms):
        a.calc = EMT()
        i, j, S = neighbor_list("ijS", a, CUTOFF)
        n = len(a)
        cell = a.get_cell().array
        out.append({
            "pos": a.get_positions().astype(np.float32),
            "atomic_numbers": a.get_atomic_numbers().astype(np.float32),
            "natoms": n,
            "cell": cell.astype(np.float32)[None],
            "edge_index": np.stack([j, i]).astype(np.int64),
            "cell_offsets": S.astype(np.float32),
            "distances": np.linalg.norm(a.positions[j] - a.positions[i] + S @ cell, axis=1
                                        ).astype(np.float32),
            "y": float(a.get_potential_energy()),
            "force": a.get_forces().astype(np.float32),
            "tags": np.arange(n, dtype=np.int64) % 3,
            "fixed": (np.arange(n) % 2).astype(np.float32),
            "sid": 1000 + k,
            "ref_energy": None,
            "note": "fairchem",
            "_atoms": a,
        })
    return out


def _as_torch(e):
    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
            for k, v in e.items() if not k.startswith("_")}


def _write_lmdb(path, values, length=True, subdir=False):
    env = lmdb.open(str(path), subdir=subdir, map_size=1 << 26, lock=False)
    with env.begin(write=True) as txn:
        for k, v in enumerate(values):
            txn.put(str(k).encode("ascii"), v if isinstance(v, bytes) else pickle.dumps(v))
        if length is not None:
            txn.put(b"length", pickle.dumps(len(values) if length is True else length))
    env.close()


def _assert_converted(store, srcs):
    """Every field of the store, read by nvalchemi, against the source entries."""
    from nvalchemi.data.datapipes.backends.zarr import AtomicDataZarrReader
    r = AtomicDataZarrReader(str(store))
    assert len(r) == len(srcs)
    f32 = np.float32
    for k, e in enumerate(srcs):
        d = {f: v.numpy() for f, v in r[k][0].items()}
        n = e["natoms"]
        cell = e["cell"][0].astype(f32)
        np.testing.assert_array_equal(d["positions"], e["pos"])
        np.testing.assert_array_equal(d["atomic_numbers"], e["atomic_numbers"].astype(np.int64))
        np.testing.assert_array_equal(d["cell"], cell[None])
        # no 'pbc' in fairchem's entries: periodic where the cell has a volume (the documented
        # rule; these molecules sit in boxes)
        np.testing.assert_array_equal(d["pbc"], np.full((1, 3), abs(np.linalg.det(cell)) > 0))
        np.testing.assert_array_equal(d["forces"], e["force"])
        np.testing.assert_array_equal(d["energy"], np.full((1, 1), e["y"], f32))
        np.testing.assert_array_equal(d["neighbor_list"], e["edge_index"][::-1].T)
        np.testing.assert_array_equal(d["neighbor_list_shifts"], e["cell_offsets"])
        np.testing.assert_allclose(d["shifts"], e["cell_offsets"] @ cell, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(d["tags"], e["tags"])
        np.testing.assert_array_equal(d["fixed"], e["fixed"])
        np.testing.assert_array_equal(d["distances"], e["distances"])
        assert d["sid"].reshape(-1).tolist() == [e["sid"]]
        assert not {"natoms", "y", "force", "edge_index", "cell_offsets", "note",
                    "ref_energy"} & set(d)
        # each edge keeps its vector: OCP's pos[row] - pos[col] + offsets @ cell (fairchem's
        # get_pbc_distances) is nvalchemi's positions[j] - positions[i] + S @ cell
        row, col = e["edge_index"]
        ocp = e["pos"][row] - e["pos"][col] + e["cell_offsets"] @ cell
        nl, S = d["neighbor_list"], d["neighbor_list_shifts"]
        nv = d["positions"][nl[:, 1]] - d["positions"][nl[:, 0]] + S @ d["cell"][0]
        np.testing.assert_allclose(nv, ocp, rtol=1e-5, atol=1e-5)
        assert n == len(d["positions"])
    r.close()


def test_pyg_data_file_with_length_key(tmp_path, entries):
    _write_lmdb(tmp_path / "data.lmdb", [Data(**_as_torch(e)) for e in entries])
    with pytest.warns(UserWarning, match="'note' is not numeric"):
        n = zbatch.convert_lmdb(tmp_path / "data.lmdb", tmp_path / "out.zarr")
    assert n == len(entries)
    _assert_converted(tmp_path / "out.zarr", entries)
    ds = zbatch.open(str(tmp_path / "out.zarr"))
    b = ds.read_many([4])
    np.testing.assert_array_equal(b["positions"], entries[4]["pos"])


def test_directory_of_dict_lmdbs_without_length(tmp_path, entries):
    d = tmp_path / "train"
    d.mkdir()
    # numpy values in one file, torch tensors in the other; sorted by name as fairchem reads
    _write_lmdb(d / "b.lmdb", [_as_torch(e) for e in entries[3:]], length=None)
    _write_lmdb(d / "a.lmdb", [{k: v for k, v in e.items() if not k.startswith("_")}
                               for e in entries[:3]], length=None)
    (d / "notes.txt").write_text("not an lmdb")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        n = zbatch.convert_lmdb([d], tmp_path / "out.zarr", num_threads=1, codec="zstd:3",
                                chunk_rows=64, shard_rows=0)
    assert n == len(entries)
    _assert_converted(tmp_path / "out.zarr", entries)


def test_pyg1_layout(tmp_path, entries, monkeypatch):
    """PyG 1.x pickled Data with its attributes in the object itself (what fairchem's
    pyg2_data_transform converts): a stand-in class pickled under PyG's module and name."""
    import torch_geometric.data.data as pyg_data

    class OldData:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    OldData.__module__, OldData.__qualname__, OldData.__name__ = pyg_data.__name__, "Data", "Data"
    monkeypatch.setattr(pyg_data, "Data", OldData)
    values = [pickle.dumps(OldData(**_as_torch(e), edge_attr=None)) for e in entries[:2]]
    monkeypatch.undo()
    _write_lmdb(tmp_path / "old.lmdb", values)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zbatch.convert_lmdb(tmp_path / "old.lmdb", tmp_path / "out.zarr")
    _assert_converted(tmp_path / "out.zarr", entries[:2])


def test_cutoff_for_entries_without_edges(tmp_path, entries):
    values = [{k: v for k, v in e.items() if k not in ("edge_index", "cell_offsets",
                                                       "distances", "note") and k[0] != "_"}
              for e in entries]
    _write_lmdb(tmp_path / "noedges.lmdb", values)
    with pytest.raises(ValueError, match=r"noedges.lmdb: key '0' has no 'edge_index': pass a "
                                         r"cutoff"):
        zbatch.convert_lmdb(tmp_path / "noedges.lmdb", tmp_path / "out.zarr")
    assert not (tmp_path / "out.zarr").exists()
    zbatch.convert_lmdb(tmp_path / "noedges.lmdb", tmp_path / "out.zarr", cutoff=CUTOFF)
    from nvalchemi.data.datapipes.backends.zarr import AtomicDataZarrReader
    r = AtomicDataZarrReader(str(tmp_path / "out.zarr"))
    for k, e in enumerate(entries):
        d = r[k][0]
        a = e["_atoms"].copy()
        a.pbc = True  # the documented rule for entries without 'pbc' and a cell with volume
        i, j, S = neighbor_list("ijS", a, CUTOFF)
        want = sorted(zip(i.tolist(), j.tolist(), map(tuple, S.tolist())))
        nl, s = d["neighbor_list"].numpy(), d["neighbor_list_shifts"].numpy()
        assert sorted(zip(nl[:, 0].tolist(), nl[:, 1].tolist(), map(tuple, s.tolist()))) == want
    r.close()


@pytest.mark.parametrize("case, match", [
    ("missing_key", r"bad.lmdb: key '2' is missing \(its 'length' key says 3 entries"),
    ("unpicklable", r"bad.lmdb: key '1': the value cannot be unpickled"),
    ("not_a_dict", r"bad.lmdb: key '1': the value is a builtins.list, not a dict or a PyG Data"),
    ("no_pos", r"bad.lmdb: key '1' has no 'pos'"),
    ("forces_shape", r"bad.lmdb: key '1': 'force' has shape \(\d+, 3\), not one row per atom"),
    ("edges_shape", r"bad.lmdb: key '1': 'cell_offsets' has shape \(\d+, 3\), not \[\d+, 3\]"),
    ("natoms", r"bad.lmdb: key '1': 'natoms' is 99 but 'pos' has \d+ atoms"),
    ("row_shape", r"bad.lmdb: key '1': 'tags' has row shape \(2,\), the first entry's is \(\)"),
    ("missing_field", r"bad.lmdb: key '1' has no 'forces', which the first structure has"),
])
def test_bad_input_names_file_and_key(tmp_path, entries, case, match):
    vals = [{k: v for k, v in e.items() if not k.startswith("_") and k != "note"}
            for e in entries[:3]]
    v = vals[1]
    if case == "missing_key":
        vals = [pickle.dumps(x) for x in vals[:2]]
        _write_lmdb(tmp_path / "bad.lmdb", vals, length=3)
    else:
        if case == "unpicklable":
            vals[1] = b"\x80\x04not a pickle"
        elif case == "not_a_dict":
            vals[1] = [1, 2, 3]
        elif case == "no_pos":
            del v["pos"]
        elif case == "forces_shape":
            v["force"] = v["force"][:-1]
        elif case == "edges_shape":
            v["cell_offsets"] = v["cell_offsets"][:-1]
        elif case == "natoms":
            v["natoms"] = 99
        elif case == "row_shape":
            v["tags"] = np.stack([v["tags"], v["tags"]], 1)
        elif case == "missing_field":
            del v["force"]
        _write_lmdb(tmp_path / "bad.lmdb", vals)
    with pytest.raises(ValueError, match=match):
        zbatch.convert_lmdb(tmp_path / "bad.lmdb", tmp_path / "out.zarr")
    assert not (tmp_path / "out.zarr").exists()


def test_cli_convert_from_lmdb(tmp_path, entries):
    _write_lmdb(tmp_path / "data.lmdb", [Data(**_as_torch(e)) for e in entries[:2]])
    env = {**os.environ, "ZBATCH_PYTHON": sys.executable, "PYTHONPATH": str(PYDIR)}
    r = subprocess.run([str(CLI), "convert", "--from", "lmdb", str(tmp_path / "data.lmdb"),
                        "-o", str(tmp_path / "out.zarr"), "--codec", "zstd:3"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "converted 2 entries" in r.stdout
    _assert_converted(tmp_path / "out.zarr", entries[:2])

def test_cli_error_is_one_line(tmp_path, capsys):
    from zbatch.__main__ import main
    rc = main(["convert", "--from", "lmdb", str(tmp_path / "missing.lmdb"), "-o",
               str(tmp_path / "o2.zarr")])
    assert rc == 1
    err = capsys.readouterr().err
    assert err.startswith("zbatch convert: ") and "missing.lmdb: no such file" in err


def test_not_an_lmdb_and_empty(tmp_path):
    (tmp_path / "x.lmdb").write_bytes(b"not an lmdb at all" * 100)
    with pytest.raises(ValueError, match=r"x.lmdb: not an LMDB"):
        zbatch.convert_lmdb(tmp_path / "x.lmdb", tmp_path / "out.zarr")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"empty: a directory without .lmdb files"):
        zbatch.convert_lmdb(tmp_path / "empty", tmp_path / "out.zarr")
    _write_lmdb(tmp_path / "none.lmdb", [])
    with pytest.raises(ValueError, match=r"no entries in"):
        zbatch.convert_lmdb(tmp_path / "none.lmdb", tmp_path / "out.zarr")
    assert not (tmp_path / "out.zarr").exists()


def _synthetic(path, count, n=16, e=160):
    rng = np.random.default_rng(0)
    env = lmdb.open(str(path), subdir=False, map_size=1 << 30, lock=False)
    with env.begin(write=True) as txn:
        for k in range(count):
            txn.put(str(k).encode("ascii"), pickle.dumps({
                "pos": rng.random((n, 3), dtype=np.float32) * 8,
                "atomic_numbers": np.full(n, 29.0, np.float32),
                "cell": (np.eye(3, dtype=np.float32) * 8)[None],
                "edge_index": rng.integers(0, n, (2, e)),
                "cell_offsets": rng.integers(-1, 2, (e, 3)).astype(np.float32),
                "force": rng.random((n, 3), dtype=np.float32), "y": float(k)}))
        txn.put(b"length", pickle.dumps(count))
    env.close()
    return count * (n * 3 * 4 * 2 + n * 8 + e * (16 + 24 + 24))


def test_streamed_memory_bounded(tmp_path):
    """Peak Python-traced memory stays near one batch's worth, not the input's size."""
    import tracemalloc
    peaks = []
    for count in (300, 3000):
        data_bytes = _synthetic(tmp_path / f"{count}.lmdb", count)
        tracemalloc.start()
        zbatch.convert_lmdb(tmp_path / f"{count}.lmdb", tmp_path / f"{count}.zarr",
                            batch_size=128)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    print(f"peak traced memory {peaks[0] / 2**20:.1f} MiB for 300 entries, "
          f"{peaks[1] / 2**20:.1f} MiB for 3,000 ({data_bytes / 2**20:.0f} MiB of data)")
    assert peaks[1] < 1.5 * peaks[0] + (1 << 20), peaks
    assert peaks[1] < data_bytes / 5, (peaks, data_bytes)
    y = zbatch.open(str(tmp_path / "3000.zarr")).read_many([0, 2999])["energy"].reshape(-1)
    np.testing.assert_array_equal(y, [0.0, 2999.0])
