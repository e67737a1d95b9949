"""Integrity of nvalchemi AtomicData stores (issue 20, item 5), with nvalchemi-toolkit 0.2.0 as
the oracle: what zbatch refuses at open (metadata only) and reports in ``zbatch verify``, how it
counts samples, what AtomicWriter refuses, and the arrays it fills when appending to a store
nvalchemi wrote."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import expect_error, nvalchemi_zarr, run_cli

torch = pytest.importorskip("torch")
zarr = pytest.importorskip("zarr")

from zbatch._atomic import AtomicWriter  # noqa: E402


_nv = nvalchemi_zarr


def _sample(k: int, with_edges: bool = True) -> dict:
    """Structure k: 2 + k % 4 atoms, a ring of edges, energy and forces."""
    rng = np.random.default_rng(k)
    n = 2 + k % 4
    s = {"positions": rng.random((n, 3)).astype(np.float32),
         "atomic_numbers": rng.integers(1, 30, n).astype(np.int64),
         "forces": rng.standard_normal((n, 3)).astype(np.float32),
         "energy": np.float32(-k - 0.5)}
    if with_edges:
        s["neighbor_list"] = np.stack([np.arange(n), (np.arange(n) + 1) % n], 1).astype(np.int64)
        s["shifts"] = np.zeros((n, 3), np.float32)
    return s


def _atomic_data(s: dict):
    AtomicData, _, _ = _nv()
    kw = {"positions": torch.tensor(s["positions"]),
          "atomic_numbers": torch.tensor(s["atomic_numbers"]),
          "forces": torch.tensor(s["forces"]),
          "energy": torch.tensor([[float(s["energy"])]], dtype=torch.float32)}
    if "neighbor_list" in s:
        kw["neighbor_list"] = torch.tensor(s["neighbor_list"])
        kw["shifts"] = torch.tensor(s["shifts"])
    return AtomicData(**kw)


def _nv_store(path: Path, n: int, with_edges: bool = True) -> list[dict]:
    _, _, Writer = _nv()
    samples = [_sample(k, with_edges) for k in range(n)]
    Writer(str(path)).write([_atomic_data(s) for s in samples])
    return samples


@pytest.fixture(scope="module")
def nv_store(tmp_path_factory):
    """A healthy store of 12 samples written by nvalchemi; tests copy it before breaking it."""
    path = tmp_path_factory.mktemp("integrity") / "nv.zarr"
    return path, _nv_store(path, 12)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _root_attrs(path: Path) -> dict:
    return json.loads((path / "zarr.json").read_text())["attributes"]


def _set_root_attrs(path: Path, **attrs) -> None:
    doc = json.loads((path / "zarr.json").read_text())
    doc["attributes"].update(attrs)
    (path / "zarr.json").write_text(json.dumps(doc))


def _verify(path: Path):
    """`zbatch verify --notes`: (exit code, problem lines, note lines)."""
    r = run_cli("verify", "--notes", path, timeout=60)
    assert "Traceback" not in r.stderr and "Sanitizer" not in r.stderr, r.stderr
    lines = r.stdout.splitlines()
    return (r.returncode, [ln for ln in lines if not ln.startswith("note: ")][:-1],
            [ln for ln in lines if ln.startswith("note: ")])


def _zb():
    import zbatch
    return zbatch


# ------------------------------------------------------------------------------------------------
# Required arrays and their shapes: refused at open (metadata only) and by verify
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("damage,field,what", [
    ("drop", "positions", "core/positions is missing"),
    ("drop", "atomic_numbers", "core/atomic_numbers is missing"),
    ("v2", "positions", "core/positions is float32 of shape [42, 2]; it must be [atoms, 3] floats"),
])
def test_required_arrays_refused_at_open_and_by_verify(nv_store, tmp_path, damage, field, what):
    src, _ = nv_store
    path = _copy(src, tmp_path / "bad.zarr")
    if damage == "drop":
        shutil.rmtree(path / "core" / field)
    else:
        old = zarr.open_array(str(path / "core" / field), mode="r")[:]
        assert old.shape == (42, 3)
        zarr.create_array(str(path / "core" / field), data=old[:, :2], overwrite=True)
    # the oracle: nvalchemi cannot build its AtomicData from such a sample
    AtomicData, Reader, _ = _nv()
    data, _ = Reader(str(path))[0]
    with pytest.raises(Exception):
        AtomicData(**data)
    with expect_error("ZB_E_CORRUPT", str(path), what):
        _zb().open(str(path))
    rc, problems, _ = _verify(path)
    assert rc != 0
    assert any(what in ln for ln in problems), problems


def test_open_reads_no_chunk_data(nv_store, tmp_path):
    """The open-time checks use metadata (and the pointer arrays the reader loads anyway): with
    every data chunk of core/ removed, a store opens, and only a read fails."""
    src, samples = nv_store
    path = _copy(src, tmp_path / "meta-only.zarr")
    for chunk in (path / "core").rglob("c/*"):
        if chunk.is_file():
            chunk.unlink()
    ds = _zb().open(str(path))
    assert len(ds) == len(samples)


# ------------------------------------------------------------------------------------------------
# samples_mask and num_samples: nvalchemi's reading
# ------------------------------------------------------------------------------------------------
def test_missing_samples_mask_is_refused_as_nvalchemi_does(nv_store, tmp_path):
    src, _ = nv_store
    path = _copy(src, tmp_path / "nomask.zarr")
    shutil.rmtree(path / "meta" / "samples_mask")
    _, Reader, _ = _nv()
    with pytest.raises(KeyError, match="samples_mask"):
        Reader(str(path))
    with expect_error("ZB_E_CORRUPT", str(path), "meta/samples_mask is missing"):
        _zb().open(str(path))
    rc, problems, _ = _verify(path)
    assert rc != 0 and any("meta/samples_mask: missing" in ln for ln in problems), problems


def test_num_samples_behind_the_mask_reads_as_nvalchemi(tmp_path):
    """num_samples 7 with 120 samples in the pointers and mask: nvalchemi never reads
    num_samples and serves 120; so does zbatch, and verify notes the disagreement."""
    path = tmp_path / "lag.zarr"
    samples = _nv_store(path, 120)
    _set_root_attrs(path, num_samples=7)
    _, Reader, _ = _nv()
    nv = Reader(str(path))
    assert len(nv) == 120
    ds = _zb().open(str(path))
    assert len(ds) == 120
    ids = [0, 6, 7, 64, 119]
    b = ds.read_many(ids)
    np.testing.assert_array_equal(b["positions"],
                                  np.concatenate([nv[i][0]["positions"].numpy() for i in ids]))
    np.testing.assert_array_equal(np.ravel(b["energy"]), [samples[i]["energy"] for i in ids])
    rc, problems, notes = _verify(path)
    assert rc == 0, problems
    assert any("meta/samples_mask: 120 samples, num_samples says 7: nvalchemi and zbatch read "
               "the 120" in ln for ln in notes), notes


def test_num_samples_behind_a_mask_the_arrays_do_not_cover_is_an_error(nv_store, tmp_path):
    """A mask longer than num_samples whose samples an array does not hold: nvalchemi would read
    rows that are not there; zbatch refuses the store naming the array and both counts."""
    src, _ = nv_store
    path = _copy(src, tmp_path / "short.zarr")
    _set_root_attrs(path, num_samples=7)
    forces = zarr.open_array(str(path / "core" / "forces"), mode="r+")
    forces.resize((30, 3))  # the 12 samples have 42 atoms
    with expect_error("ZB_E_CORRUPT", "core/forces: 30 rows", "needs 42",
                      "the 12 samples of meta/samples_mask (num_samples says 7)"):
        _zb().open(str(path))


def test_num_samples_past_the_mask_is_an_error(nv_store, tmp_path):
    src, _ = nv_store
    path = _copy(src, tmp_path / "ahead.zarr")
    _set_root_attrs(path, num_samples=20)
    _, Reader, _ = _nv()
    assert len(Reader(str(path))) == 12  # nvalchemi counts the mask
    with expect_error("ZB_E_CORRUPT", str(path), "num_samples is 20, meta/samples_mask holds 12"):
        _zb().open(str(path))


# ------------------------------------------------------------------------------------------------
# The root `fields` attribute against the arrays
# ------------------------------------------------------------------------------------------------
def test_nvalchemi_delete_passes_checks(nv_store, tmp_path):
    """nvalchemi's delete zero-fills the deleted samples' rows (neighbour indices 0, outside a
    later sample's atoms): the store is healthy, so check() and verify pass, and zbatch reads
    the live samples as nvalchemi does."""
    _, Reader, Writer = _nv()
    path, samples = nv_store
    p = _copy(path, tmp_path / "deleted.zarr")
    Writer(str(p)).delete([3, 7])
    nl = zarr.open_group(str(p), mode="r")["core/neighbor_list"][...]
    ptr = zarr.open_group(str(p), mode="r")["meta/edges_ptr"][...]
    assert not nl[ptr[3]:ptr[4]].any()       # the damage-like rows the checks must skip
    summary = AtomicWriter(p).check()
    assert summary["num_samples"] == 12 and summary["num_live"] == 10
    code, problems, _ = _verify(p)
    assert code == 0 and problems == []
    zb = _zb()
    r, ds = Reader(str(p)), zb.open(str(p))
    assert len(r) == len(ds) == 10
    b = ds.read_many(list(range(10)))
    ptr = b["atoms_ptr"]
    for i in range(10):
        want = r[i][0]
        np.testing.assert_array_equal(b["positions"][ptr[i]:ptr[i + 1]],
                                      want["positions"].numpy())


def test_fields_attribute_checked_at_open(nv_store, tmp_path):
    src, _ = nv_store
    path = _copy(src, tmp_path / "fields.zarr")
    fields = _root_attrs(path)["fields"]
    bad = json.loads(json.dumps(fields))
    bad["core"]["forces"] = "graph"
    _set_root_attrs(path, fields=bad)
    with expect_error("ZB_E_METADATA", str(path), 'fields.core.forces is "graph", not "atom"'):
        _zb().open(str(path))
    rc, problems, _ = _verify(path)
    assert rc != 0 and any("fields.core.forces" in ln for ln in problems), problems

    _set_root_attrs(path, fields=["core"])
    with expect_error("ZB_E_METADATA", "the root attribute 'fields' is not an object"):
        _zb().open(str(path))

    # a level contradicting what the array must be
    bad = json.loads(json.dumps(fields))
    bad["core"]["positions"] = "system"
    _set_root_attrs(path, fields=bad)
    with expect_error("ZB_E_CORRUPT", "core/positions"):
        _zb().open(str(path))

    # an entry without an array (an interrupted add_custom): read as nvalchemi does, noted
    extra = json.loads(json.dumps(fields))
    extra["custom"] = {"charges_ref": "atom"}
    _set_root_attrs(path, fields=extra)
    _, Reader, _ = _nv()
    assert len(_zb().open(str(path))) == len(Reader(str(path))) == 12
    rc, problems, notes = _verify(path)
    assert rc == 0, problems
    assert any("custom/charges_ref: the fields attribute names it" in ln for ln in notes), notes


# ------------------------------------------------------------------------------------------------
# Corruption errors name the sample id and the field
# ------------------------------------------------------------------------------------------------
def test_index_corruption_names_sample_id_and_field(nv_store, tmp_path):
    src, _ = nv_store
    path = _copy(src, tmp_path / "badidx.zarr")
    ap = zarr.open_array(str(path / "meta" / "atoms_ptr"), mode="r")[:]
    ep = zarr.open_array(str(path / "meta" / "edges_ptr"), mode="r")[:]
    nl = zarr.open_array(str(path / "core" / "neighbor_list"), mode="r+")
    row = int(ep[9])
    nl[row] = [int(ap[9]) - 1, int(ap[9])]  # one atom before sample 9's first
    ds = _zb().open(str(path))
    with expect_error("ZB_E_CORRUPT", "sample 9 (row 2 of the request): field neighbor_list: "
                      "value -1 is outside its"):
        ds.read_many([3, 0, 9, 4])


# ------------------------------------------------------------------------------------------------
# AtomicWriter: validation of every field, nothing partial left behind
# ------------------------------------------------------------------------------------------------
def _three_atoms() -> dict:
    return {"positions": np.zeros((3, 3), np.float32), "atomic_numbers": np.array([1, 6, 8]),
            "forces": np.zeros((3, 3), np.float32), "energy": np.float32(-1),
            "neighbor_list": np.array([[0, 1], [1, 2]]), "shifts": np.zeros((2, 3), np.float32),
            "pbc": np.array([True, False, True])}


def _docs(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("zarr.json"))}


@pytest.mark.parametrize("key,value,what", [
    ("atomic_numbers", [1.7, np.nan, 8.0], "value 1.7 at [0] is not an integer"),
    ("atomic_numbers", [1.0, np.nan, 8.0], "value nan at [1] is not finite"),
    ("positions", [[0, 0, 0], [np.inf, 0, 0], [1, 1, 1]], "value inf at [1, 0] is not finite"),
    ("positions", [[0, 0], [1, 0], [1, 1]], "shape (3, 2); positions are [atoms, 3]"),
    ("forces", [[0, 0, 0], [0, np.nan, 0], [1, 1, 1]], "value nan at [1, 1] is not finite"),
    ("energy", np.nan, "value nan at [0] is not finite"),
    ("neighbor_list", [[0, 1.5], [1, 0]], "value 1.5 at [0, 1] is not an integer"),
    ("pbc", [1, 0, 2], "value 2 at [2] is not a bool (0 or 1)"),
])
def test_writer_refuses_bad_values_naming_sample_and_field(tmp_path, key, value, what):
    good = [dict(_sample(k), pbc=np.array([True, False, True])) for k in (3, 4, 7)]
    bad = good[:2] + [dict(_three_atoms(), **{key: np.asarray(value)})]

    # a new store: refused before anything is written, and nothing is left behind
    new = tmp_path / "new.zarr"
    with pytest.raises(ValueError, match=rf"sample 2 of this write: field {key}: {_re(what)}"):
        AtomicWriter(new).write(bad)
    assert not new.exists()

    # an append in blocks of 2: the first block is handed to the writer, the second is refused;
    # the store reads as it was (the same metadata documents, the same samples)
    old = tmp_path / "old.zarr"
    AtomicWriter(old).write(good)
    docs = _docs(old)
    _, Reader, _ = _nv()
    want = [Reader(str(old))[i][0] for i in range(3)]
    with pytest.raises(ValueError, match=rf"sample 2 of this append: field {key}: {_re(what)}"):
        AtomicWriter(old, block_size=2).append(bad)
    assert _docs(old) == docs
    assert len(_zb().open(str(old))) == 3
    assert _same_reads(old, want)
    rc, problems, _ = _verify(old)
    assert rc == 0, problems


def test_writer_refuses_values_outside_the_stored_integer_type(tmp_path):
    p = tmp_path / "tags.zarr"
    s = _sample(3)
    s["tags"] = np.arange(len(s["positions"]), dtype=np.int32)
    AtomicWriter(p, levels={"tags": "atom"}).write([s])
    t = _sample(4)
    t["tags"] = np.array([1, 2**40])
    with pytest.raises(ValueError, match=r"sample 0 of this append: field tags: value "
                                         r"1099511627776 at \[1\] does not fit int32"):
        AtomicWriter(p).append([t])
    assert len(_zb().open(str(p))) == 1


def test_add_custom_refuses_non_finite_values(tmp_path):
    p = tmp_path / "c.zarr"
    AtomicWriter(p).write([_sample(3), _sample(4)])  # 5 + 2 atoms
    q = np.arange(7, dtype=np.float32)
    q[5] = np.inf
    with pytest.raises(ValueError, match=r"field charges: value inf at \[5\] is not finite"):
        AtomicWriter(p).add_custom("charges", q, "atom")
    assert not (p / "custom" / "charges").exists()
    assert "charges" not in _root_attrs(p)["fields"].get("custom", {})


def _re(text: str) -> str:
    import re
    return re.escape(text)


def _same_reads(path: Path, want: list[dict]) -> bool:
    _, Reader, _ = _nv()
    r = Reader(str(path))
    return len(r) == len(want) and all(
        all(torch.equal(r[i][0][k], want[i][k]) for k in want[i]) for i in range(len(want)))


def test_writer_stores_integral_floats_exactly(tmp_path):
    """Integral float values are taken (1.0 -> 1): only fractions and non-finite values fail."""
    s = _sample(5)
    s["atomic_numbers"] = s["atomic_numbers"].astype(np.float64)
    p = tmp_path / "ok.zarr"
    AtomicWriter(p).write([s])
    _, Reader, _ = _nv()
    got = Reader(str(p))[0][0]["atomic_numbers"].numpy()
    np.testing.assert_array_equal(got, _sample(5)["atomic_numbers"])
    assert got.dtype == np.int64


# ------------------------------------------------------------------------------------------------
# Appending to an nvalchemi store: its derived arrays filled as nvalchemi's writer fills them
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pos_dtype", [np.float32, np.float64])
def test_append_fills_nvalchemi_derived_arrays(tmp_path, pos_dtype):
    base = tmp_path / "base.zarr"
    _nv_store(base, 3, with_edges=False)
    more = []
    for k in range(3, 7):
        s = _sample(k, with_edges=False)
        s["atomic_numbers"] = np.array([1, 8, 26, 92, 118, 6])[: len(s["positions"])]
        s["positions"] = s["positions"].astype(pos_dtype)
        more.append(s)
    # the oracle: nvalchemi's own append of the same samples
    _, _, Writer = _nv()
    nv = _copy(base, tmp_path / "nv.zarr")
    Writer(str(nv)).append([_atomic_data(dict(s, positions=s["positions"].astype(np.float32)))
                            if pos_dtype == np.float32 else _atomic_data_dtype(s) for s in more])
    zb = _copy(base, tmp_path / "zb.zarr")
    AtomicWriter(zb).append(more)  # no atomic_masses, atom_categories, velocities given
    for name in ("atomic_masses", "atom_categories", "velocities", "positions",
                 "atomic_numbers", "forces", "energy"):
        a = zarr.open_array(str(nv / "core" / name), mode="r")[:]
        b = zarr.open_array(str(zb / "core" / name), mode="r")[:]
        assert a.dtype == b.dtype, name
        np.testing.assert_array_equal(b, a, err_msg=name)
    for name in ("atoms_ptr", "samples_mask"):
        np.testing.assert_array_equal(zarr.open_array(str(zb / "meta" / name), mode="r")[:],
                                      zarr.open_array(str(nv / "meta" / name), mode="r")[:])


def _atomic_data_dtype(s: dict):
    """AtomicData with float64 positions (nvalchemi casts the other floats to them)."""
    AtomicData, _, _ = _nv()
    return AtomicData(positions=torch.tensor(s["positions"]),
                      atomic_numbers=torch.tensor(s["atomic_numbers"]),
                      forces=torch.tensor(s["forces"], dtype=torch.float64),
                      energy=torch.tensor([[float(s["energy"])]], dtype=torch.float64))


def test_append_derived_masses_need_valid_atomic_numbers(tmp_path):
    base = tmp_path / "base.zarr"
    _nv_store(base, 2, with_edges=False)
    s = _sample(9, with_edges=False)
    s["atomic_numbers"] = np.array([1, 119, 8, 6])[: len(s["positions"])]
    with pytest.raises(ValueError, match="sample 0 of this append: field atomic_numbers: 119 "
                                         "has no atomic mass"):
        AtomicWriter(base).append([s])
    s["atomic_numbers"] = np.array([1.0, np.nan, 8.0, 6.0])[: len(s["positions"])]
    with pytest.raises(ValueError, match=r"sample 0 of this append: field atomic_numbers: "
                                         r"value nan at \[1\] is not finite"):
        AtomicWriter(base).append([s])
    assert len(_zb().open(str(base))) == 2


def test_row_shapes_must_agree_across_samples(tmp_path):
    a, b = _sample(3), _sample(4)
    b["forces"] = np.zeros((len(b["positions"]), 2), np.float32)
    with pytest.raises(ValueError, match=r"sample 1 of this write: field forces: rows of shape "
                                         r"\(2,\), sample 0 has \(3,\)"):
        AtomicWriter(tmp_path / "r.zarr").write([a, b])
    a["cell"], b["cell"] = np.eye(3), np.eye(2)
    b["forces"] = a["forces"][: len(b["positions"])] * 0
    with pytest.raises(ValueError, match=r"sample 1 of this write: field cell: a value of shape "
                                         r"\(2, 2\), sample 0 has \(3, 3\)"):
        AtomicWriter(tmp_path / "r.zarr").write([a, b])
    assert not (tmp_path / "r.zarr").exists()
