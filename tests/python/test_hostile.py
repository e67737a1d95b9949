"""Hostile input (issue 21): values a damaged store delivers are refused or skipped on the read
path, integer arguments are never reduced modulo 2**64, `zbatch verify` stays bounded and agrees
with the reader, and messages say what is wrong. The oracles are anndata/scipy (the stores'
values), zarr-python (what a store holds, and whether a chunk is corrupt) and numpy.
"""
from __future__ import annotations

import json
import time
import warnings

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import zarr

from conftest import expect_error, run_cli, zbatch_api

N_OBS, N_VARS = 60, 12
CATS = ["a", "b", "c"]


def make_adata(seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(N_OBS, N_VARS, density=0.4, format="csr", dtype=np.float32, random_state=rng)
    X.data[:] = rng.integers(1, 100, X.nnz).astype(np.float32)
    obs = pd.DataFrame({"ct": pd.Categorical.from_codes(np.arange(N_OBS) % 3, CATS)},
                       index=[f"c{i}" for i in range(N_OBS)])
    return ad.AnnData(X=X, obs=obs, var=pd.DataFrame(index=[f"g{j}" for j in range(N_VARS)]))


def write_store(path, adata):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with ad.settings.override(zarr_write_format=3):
            adata.write_zarr(str(path))
    return path


@pytest.fixture
def adata():
    return make_adata()


def damage(path, array, fn):
    """Rewrites array `array` of the store with fn(values) (zarr-python, metadata kept)."""
    z = zarr.open_array(str(path / array), mode="r+")
    v = z[:]
    fn(v)
    z[:] = v
    return v


def first_row_with_values(X, k=0):
    """A row with at least one stored value, and the position of its first value."""
    rows = [r for r in range(X.shape[0]) if X.indptr[r + 1] > X.indptr[r]]
    return rows[k], int(X.indptr[rows[k]])


# ------------------------------------------------------------------------------------------------
# Validation on the read path (deliver item 2, defect 2)
# ------------------------------------------------------------------------------------------------
def test_csr_column_outside_n_vars_is_refused_naming_sample_field_chunk(tmp_path, adata):
    zb = zbatch_api()
    path = write_store(tmp_path / "a.zarr", adata)
    r, k = first_row_with_values(adata.X, 3)
    damage(path, "X/indices", lambda v: v.__setitem__(k, N_VARS))
    ds = zb.open(str(path))
    with expect_error("ZB_E_CORRUPT", f"sample {r}", "X/indices", f"{N_VARS}",
                      "chunk X/indices/c/0"):
        ds.read_many(list(range(N_OBS)))
    # the other samples read as anndata holds them
    ids = [i for i in range(N_OBS) if i != r]
    np.testing.assert_array_equal(ds.read_many(ids)["X"].toarray(), adata.X[ids].toarray())
    # a negative column id too
    damage(path, "X/indices", lambda v: v.__setitem__(k, -3))
    with expect_error("ZB_E_CORRUPT", f"sample {r}", "-3"):
        zb.open(str(path)).read_many([r])


def test_skip_leaves_bad_samples_out_and_counts_them(tmp_path, adata):
    zb = zbatch_api()
    path = write_store(tmp_path / "a.zarr", adata)
    r1, k1 = first_row_with_values(adata.X, 2)
    r2, k2 = first_row_with_values(adata.X, 9)
    damage(path, "X/indices", lambda v: (v.__setitem__(k1, N_VARS + 5), v.__setitem__(k2, -1)))
    damage(path, "obs/ct/codes", lambda v: v.__setitem__(40, 3))  # 3 categories: 0..2, -1
    bad = {r1, r2, 40}
    ds = zb.open(str(path), on_invalid="skip")
    ids = list(range(N_OBS))[::-1]
    b = ds.read_many(ids)
    good = [i for i in ids if i not in bad]
    assert b.size == len(good)
    np.testing.assert_array_equal(b["index"], good)
    np.testing.assert_array_equal(b["X"].toarray(), adata.X[good].toarray())
    np.testing.assert_array_equal(np.asarray(b["obs/ct"]), adata.obs["ct"].cat.codes.values[good])
    assert b.stats["samples_skipped"] == 3
    # a clean request counts nothing
    assert ds.read_many(good[:5]).stats["samples_skipped"] == 0
    # the loader skips them too, batch by batch, and delivers every other sample once
    seen, skipped = [], 0
    for batch in zb.DataLoader(ds, batch_size=7, prefetch_factor=3):
        seen += list(batch["index"])
        skipped += batch.stats["samples_skipped"]
    assert sorted(seen) == sorted(good)
    assert skipped == 3


def test_categorical_codes_outside_categories(tmp_path, adata):
    zb = zbatch_api()
    path = write_store(tmp_path / "a.zarr", adata)
    damage(path, "obs/ct/codes", lambda v: v.__setitem__(7, 5))
    with expect_error("ZB_E_CORRUPT", "sample 7", "obs/ct", "code 5", "[-1, 3)",
                      "obs/ct/codes/c/0"):
        zb.open(str(path)).read_many([6, 7])
    # -1 is anndata's missing value: delivered as is
    damage(path, "obs/ct/codes", lambda v: v.__setitem__(7, -1))
    got = np.asarray(zb.open(str(path)).read_many([6, 7, 8])["obs/ct"])
    np.testing.assert_array_equal(got, [0, -1, 2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert pd.isna(ad.read_zarr(str(path)).obs["ct"].iloc[7])  # the oracle agrees


def test_categories_cut_short(tmp_path, adata):
    zb = zbatch_api()
    path = write_store(tmp_path / "a.zarr", adata)
    g = zarr.open_group(str(path / "obs" / "ct"), mode="r+")
    attrs = dict(g["categories"].attrs)
    del g["categories"]
    g.create_array("categories", shape=(2,), dtype=str)[:] = np.array(["a", "b"], dtype=object)
    g["categories"].attrs.update(attrs)
    zarr.consolidate_metadata(str(path))
    with expect_error("ZB_E_CORRUPT", "sample 2", "code 2", "[-1, 2)"):
        zb.open(str(path)).read_many([0, 1, 2])


# Each way a reader task lands values checks them as they land (rows.c): a unit decoded and
# copied out or decoded straight into the batch, raw (uncompressed) rows viewed or read, inner
# chunks of a shard, narrow stored values widened as they are copied, and the listed path of a
# store that reads lists itself (HTTP). name: (dtype, compressed, chunks, shards)
LAYOUTS = {
    "zstd_chunks": ("int32", True, 16, None),
    "raw_chunks": ("int32", False, 16, None),
    "zstd_shards": ("int32", True, 16, 64),
    "raw_shards": ("int32", False, 16, 64),
    "uint16_zstd": ("uint16", True, 16, None),
    "uint16_raw_shards": ("uint16", False, 16, 64),
    "one_chunk": ("int32", True, 4096, None),
}


def rewrite(path, name, values, dtype, compressed, chunks, shards):
    """Array `name` of the store written again by zarr-python with these values and encoding."""
    g = zarr.open_group(str(path), mode="r+")
    attrs = dict(g[name].attrs)
    del g[name]
    a = g.create_array(name, shape=values.shape, dtype=dtype, chunks=(chunks,),
                       shards=(shards,) if shards else None,
                       compressors=zarr.codecs.ZstdCodec() if compressed else None)
    a[:] = values.astype(dtype)
    a.attrs.update(attrs)
    zarr.consolidate_metadata(str(path))


@pytest.mark.parametrize("remote", [False, True], ids=["file", "http"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_bad_column_id_in_every_reader_path(tmp_path, adata, layout, remote, request):
    zb = zbatch_api()
    dtype, compressed, chunks, shards = LAYOUTS[layout]
    path = write_store(tmp_path / "a.zarr", adata)
    r, k = first_row_with_values(adata.X, 5)
    indices = adata.X.indices.copy()
    indices[k] = N_VARS + 7  # past n_vars; an unsigned dtype holds it too
    rewrite(path, "X/indices", indices, dtype, compressed, chunks, shards)
    codes = adata.obs["ct"].cat.codes.values.copy()
    codes[33] = 4  # 3 categories
    rewrite(path, "obs/ct/codes", codes, "int8", compressed, chunks, shards)
    url = str(path)
    if remote:
        url = f"{request.getfixturevalue('nginx_serve')(tmp_path).url}/a.zarr"
    unit = k // (shards or chunks)  # the chunk (or shard) object holding the value
    ds = zb.open(url)
    with expect_error("ZB_E_CORRUPT", f"sample {r}:", "field X/indices", f"column id {N_VARS + 7}",
                      f"[0, {N_VARS})", f"row {k}", f"chunk X/indices/c/{unit}"):
        ds.read_many(list(range(N_OBS)))
    with expect_error("ZB_E_CORRUPT", "sample 33:", "field obs/ct", "code 4", "[-1, 3)",
                      f"chunk obs/ct/codes/c/{33 // (shards or chunks)}"):
        ds.read_many([32, 33, 34])
    # the other samples read as anndata holds them, alone and with the bad ones skipped
    good = [i for i in range(N_OBS) if i not in (r, 33)]
    b = ds.read_many(good)
    np.testing.assert_array_equal(b["X"].toarray(), adata.X[good].toarray())
    np.testing.assert_array_equal(np.asarray(b["obs/ct"]), adata.obs["ct"].cat.codes.values[good])
    b = zb.open(url, on_invalid="skip").read_many(list(range(N_OBS)))
    assert b.stats["samples_skipped"] == 2
    np.testing.assert_array_equal(b["index"], good)
    np.testing.assert_array_equal(b["X"].toarray(), adata.X[good].toarray())


def test_bad_values_in_a_collection_name_the_collection_sample(tmp_path):
    """A MultiDataset of two stores (same genes, same categories: codes delivered as stored):
    the second child's bad column id and bad code are found as its rows land, named by the
    collection's sample id; the first child's samples still read."""
    zb = zbatch_api()
    a0, a1 = make_adata(0), make_adata(1)
    p0 = write_store(tmp_path / "a0.zarr", a0)
    p1 = write_store(tmp_path / "a1.zarr", a1)
    r, k = first_row_with_values(a1.X, 2)
    damage(p1, "X/indices", lambda v: v.__setitem__(k, N_VARS))
    damage(p1, "obs/ct/codes", lambda v: v.__setitem__(9, 3))
    md = zb.MultiDataset([zb.open(str(p0)), zb.open(str(p1))])
    with expect_error("ZB_E_CORRUPT", f"sample {N_OBS + r}:", f"column id {N_VARS}",
                      f"[0, {N_VARS})"):
        md.read_many([0, N_OBS + r])
    with expect_error("ZB_E_CORRUPT", f"sample {N_OBS + 9}:", "code 3", "[-1, 3)"):
        md.read_many([9, N_OBS + 9])
    b = md.read_many([3, 9, N_OBS + 8])
    want = sp.vstack([a0.X[[3, 9]], a1.X[[8]]]).toarray()
    np.testing.assert_array_equal(b["X"].toarray(), want)


def test_csr_indices_of_two_dimensions_are_refused_at_open(tmp_path, adata):
    """CSR column ids are one value per stored element (scipy and anndata need a 1-d array); a
    2-d X/indices is refused when the dataset opens, naming the array."""
    zb = zbatch_api()
    path = write_store(tmp_path / "a.zarr", adata)
    ind = adata.X.indices
    g = zarr.open_group(str(path), mode="r+")
    del g["X/indices"]
    g.create_array("X/indices", data=np.stack([ind, ind], axis=1).astype("int32"), chunks=(16, 2))
    zarr.consolidate_metadata(str(path))
    assert zarr.open_array(str(path / "X" / "indices"), mode="r").ndim == 2
    with expect_error("ZB_E_CORRUPT", "X/indices", "CSR indices must be 1-d"):
        zb.open(str(path)).read_many([0])


def test_pointer_claiming_2_40_rows_fails_before_allocating(tmp_path, adata):
    zb = zbatch_api()
    path = write_store(tmp_path / "a.zarr", adata)
    g = zarr.open_group(str(path / "X"), mode="r+")
    indptr = g["indptr"][:].astype(np.int64)
    indptr[11] = 1 << 40  # sample 10 claims 2^40 values (sample 11 is then not monotone)
    del g["indptr"]
    g.create_array("indptr", data=indptr)
    zarr.consolidate_metadata(str(path))
    ds = zb.open(str(path))
    t = time.perf_counter()
    with expect_error("ZB_E_CORRUPT", "sample 10", "X/indptr", "past the"):
        ds.read_many([10])
    assert time.perf_counter() - t < 2
    # skipped like any invalid sample
    b = zb.open(str(path), on_invalid="skip").read_many([9, 10, 12])
    assert list(b["index"]) == [9, 12] and b.stats["samples_skipped"] == 1
    np.testing.assert_array_equal(b["X"].toarray(), adata.X[[9, 12]].toarray())


def test_per_request_memory_cap(tmp_path, adata):
    zb = zbatch_api()
    path = write_store(tmp_path / "a.zarr", adata)
    ds = zb.open(str(path), max_request_bytes=4096)
    with expect_error("ZB_E_INVALID", "4096-byte cap", "max_request_bytes"):
        ds.read_many(list(range(N_OBS)) * 20)
    np.testing.assert_array_equal(ds.read_many([1, 2])["X"].toarray(), adata.X[[1, 2]].toarray())


# ------------------------------------------------------------------------------------------------
# Integers are never reduced modulo 2**64 (defect 3)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [
    lambda zb, ds: zb.DataLoader(ds, batch_size=2**64 + 5),
    lambda zb, ds: zb.samplers.SequentialSampler(2**64 + 10, 4),
    lambda zb, ds: zb.samplers.SequentialSampler(10, 2**64 + 4),
    lambda zb, ds: zb.samplers.SequentialSampler(10, 2, rank=2**32 + 1, world_size=2**32 + 2),
    lambda zb, ds: zb.open(ds.path, cache_bytes=-1),
    lambda zb, ds: zb.open(ds.path, cache_bytes=2**64),
    lambda zb, ds: next(iter(zb.DataLoader(ds, batch_size=4, prefetch_factor=10**30))),
], ids=["loader-batch", "sampler-n", "sampler-batch", "rank", "cache-neg", "cache-big",
        "prefetch"])
def test_out_of_range_integers_are_refused(tmp_path, adata, make):
    zb = zbatch_api()
    ds = zb.open(str(write_store(tmp_path / "a.zarr", adata)))
    with pytest.raises((OverflowError, ValueError)):
        make(zb, ds)


def test_write_array_chunks_past_64_bits(tmp_path):
    zb = zbatch_api()
    with pytest.raises((OverflowError, ValueError)):
        zb.write_array(str(tmp_path / "s.zarr"), "a", np.arange(10), chunks=2**64 + 16)
    assert not (tmp_path / "s.zarr" / "a" / "zarr.json").exists()


def test_prefetch_factor_bounded_before_allocating(tmp_path, adata):
    zb = zbatch_api()
    ds = zb.open(str(write_store(tmp_path / "a.zarr", adata)))
    t = time.perf_counter()
    with pytest.raises((zb.ZbatchError, ValueError)) as ei:
        iter(zb.DataLoader(ds, batch_size=64, prefetch_factor=2**40)).__next__()
    assert "prefetch_factor" in str(ei.value)
    assert time.perf_counter() - t < 5


# ------------------------------------------------------------------------------------------------
# verify walks the chunks that exist, not the declared grid (defect 1)
# ------------------------------------------------------------------------------------------------
VERIFY_SUMMARY = "arrays, {} chunks checked, 0 problems"


def run_verify(path):
    t = time.perf_counter()
    r = run_cli("verify", path, timeout=60)
    return r, time.perf_counter() - t


@pytest.mark.parametrize("fmt", [2, 3])
def test_verify_huge_declared_shapes_cost_what_is_stored(tmp_path, fmt):
    root = zarr.open_group(str(tmp_path / "h.zarr"), mode="w", zarr_format=fmt)
    s = root.create_array("s", shape=(2**62,), chunks=(4,), dtype=str, fill_value="")
    s[8:12] = np.array(["a", "bb", "", "dddd"], dtype=object)
    u = root.create_array("u", shape=(2**40,), chunks=(1024,), dtype="uint8", fill_value=0)
    u[1 << 30:(1 << 30) + 1024] = np.arange(1024) % 251
    d = root.create_array("d", shape=(2**30, 2**30), chunks=(16, 16), dtype="int32",
                          fill_value=0)
    d[32:48, 16:32] = np.arange(256).reshape(16, 16)
    r, took = run_verify(tmp_path / "h.zarr")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stdout.splitlines()[-1].startswith("3 arrays, 3 chunks checked, 0 problems"), r.stdout
    assert took < 10
    # zbatch reads what zarr-python wrote, next to the missing chunks (fill)
    zb = zbatch_api()
    got = zb.read_array(str(tmp_path / "h.zarr"), "s", 6, 12)
    assert list(got) == ["", ""] + list(s[8:12])
    np.testing.assert_array_equal(zb.read_array(str(tmp_path / "h.zarr"), "u", 1 << 30,
                                                (1 << 30) + 1024), u[1 << 30:(1 << 30) + 1024])


def test_verify_listed_walk_still_finds_a_corrupt_chunk(tmp_path):
    root = zarr.open_group(str(tmp_path / "h.zarr"), mode="w", zarr_format=3)
    u = root.create_array("u", shape=(2**40,), chunks=(1024,), dtype="uint8", fill_value=0)
    u[5 * 1024:7 * 1024] = 7
    (tmp_path / "h.zarr" / "u" / "c" / "6").write_bytes(b"\x28\xb5\x2f\xfd garbage")
    (tmp_path / "h.zarr" / "u" / "c" / "x7").write_bytes(b"not a chunk key")
    r, took = run_verify(tmp_path / "h.zarr")
    assert r.returncode == 1 and took < 10, (r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    assert lines[-1].startswith("1 array, 2 chunks checked, 1 problem"), r.stdout
    assert lines[0].startswith("u/c/6: "), lines


# ------------------------------------------------------------------------------------------------
# verify agrees with the reader (defect 4)
# ------------------------------------------------------------------------------------------------
def verify_lines(path):
    r = run_cli("verify", path, timeout=60)
    return r.returncode, r.stdout.splitlines()


def reader_error(path):
    zb = zbatch_api()
    with pytest.raises(zb.ZbatchError) as ei:
        zb.open(str(path)).read_many([0, 1])
    return str(ei.value)


def test_verify_flags_a_categorical_without_codes(tmp_path, adata):
    import shutil
    path = write_store(tmp_path / "a.zarr", adata)
    shutil.rmtree(path / "obs" / "ct" / "codes")
    zarr.consolidate_metadata(str(path))
    msg = reader_error(path)
    assert "no array 'obs/ct/codes'" in msg and ": : " not in msg
    rc, lines = verify_lines(path)
    assert rc == 1
    assert lines[0] == f"/: the reader refuses this dataset: {path}: no array 'obs/ct/codes'"


def test_verify_flags_x_whose_encoding_type_is_array(tmp_path, adata):
    path = write_store(tmp_path / "a.zarr", adata)
    doc = json.loads((path / "X" / "zarr.json").read_text())
    doc["attributes"]["encoding-type"] = "array"
    (path / "X" / "zarr.json").write_text(json.dumps(doc))
    zarr.consolidate_metadata(str(path))
    assert "X is neither a CSR nor a dense matrix" in reader_error(path)
    rc, lines = verify_lines(path)
    assert rc == 1
    assert lines[0] == (f"/: the reader refuses this dataset: {path}: X is neither a CSR nor a "
                        "dense matrix")


def atomic_store(path):
    from test_verify import atomic_samples
    zb = zbatch_api()
    zb.AtomicWriter(path).write(atomic_samples(6, seed=1))
    return path


def test_verify_flags_missing_positions_and_positions_per_system(tmp_path):
    import shutil
    a = atomic_store(tmp_path / "a.zarr")
    shutil.rmtree(a / "core" / "positions")
    assert "core/positions is missing" in reader_error(a)
    rc, lines = verify_lines(a)
    assert rc == 1 and lines[0].startswith("/: core/positions is missing")
    b = atomic_store(tmp_path / "b.zarr")
    doc = json.loads((b / "zarr.json").read_text())
    doc["attributes"]["fields"]["core"]["positions"] = "system"
    (b / "zarr.json").write_text(json.dumps(doc))
    assert "level 'system'" in reader_error(b)
    rc, lines = verify_lines(b)
    assert rc == 1 and lines[0] == ("/: core/positions: the fields attribute gives level "
                                    "'system'; positions are per atom")


# ------------------------------------------------------------------------------------------------
# Names that are not UTF-8 or hold NUL, and cutoffs that never end (defect 6)
# ------------------------------------------------------------------------------------------------
def test_node_name_not_utf8_is_refused_with_a_zbatch_error(tmp_path):
    import os
    zb = zbatch_api()
    root = zarr.open_group(str(tmp_path / "u.zarr"), mode="w", zarr_format=3)
    root.create_array("ab", data=np.arange(4))
    os.rename(bytes(tmp_path / "u.zarr" / "ab"), bytes(tmp_path / "u.zarr") + b"/a\xffb")
    with expect_error("ZB_E_BADKEY", r'"a\xffb": node name is not valid UTF-8 (byte 1)'):
        zb.info(str(tmp_path / "u.zarr"))
    r = run_cli("info", tmp_path / "u.zarr", "--json")
    assert r.returncode == 1 and r.stdout == ""
    assert "not valid UTF-8" in r.stderr


def test_metadata_document_not_utf8_is_malformed_json(tmp_path):
    zb = zbatch_api()
    root = zarr.open_group(str(tmp_path / "u.zarr"), mode="w", zarr_format=3)
    root.create_array("a", data=np.arange(4), attributes={"note": "ab"})
    doc = (tmp_path / "u.zarr" / "a" / "zarr.json").read_bytes()
    (tmp_path / "u.zarr" / "a" / "zarr.json").write_bytes(doc.replace(b'"ab"', b'"a\xff"'))
    with pytest.raises(UnicodeDecodeError):
        doc.replace(b'"ab"', b'"a\xff"').decode()  # the oracle: not UTF-8
    with expect_error("ZB_E_JSON", "a/zarr.json"):
        zb.read_array(str(tmp_path / "u.zarr"), "a")
    r = run_cli("info", tmp_path / "u.zarr", "--json")
    assert r.returncode == 1 and r.stdout == ""


def test_add_custom_name_with_nul_is_refused(tmp_path):
    zb = zbatch_api()
    path = atomic_store(tmp_path / "a.zarr")
    w = zb.AtomicWriter(path)
    with pytest.raises(ValueError, match="NUL"):
        w.add_custom("a\x00b", np.zeros(6), "system")
    assert not (path / "custom" / "a").exists()
    doc = json.loads((path / "zarr.json").read_text())
    assert "a" not in doc["attributes"]["fields"].get("custom", {})
    w.add_custom("ab", np.arange(6.0), "system")  # a proper name still works
    np.testing.assert_array_equal(zarr.open_array(str(path / "custom" / "ab"))[:], np.arange(6.0))


def test_sample_from_atoms_huge_cutoff_refused_quickly():
    from ase.build import bulk
    from ase.neighborlist import neighbor_list
    zb = zbatch_api()
    atoms = bulk("Cu", cubic=True)
    t = time.perf_counter()
    for cutoff in (2**63, 1e6):
        with pytest.raises(ValueError, match="periodic images"):
            zb.sample_from_atoms(atoms, cutoff=cutoff)
    assert time.perf_counter() - t < 2
    d = zb.sample_from_atoms(atoms, cutoff=3.0)  # an ordinary cutoff: ASE's list
    i, j = neighbor_list("ij", atoms, 3.0)
    np.testing.assert_array_equal(d["neighbor_list"], np.stack([i, j], axis=1))


# ------------------------------------------------------------------------------------------------
# Messages (defect 7)
# ------------------------------------------------------------------------------------------------
def test_chunk_over_the_16_gib_limit_says_the_limit(tmp_path):
    zb = zbatch_api()
    zarr.create_array(str(tmp_path / "a.zarr"), shape=(2**34,), chunks=(2**33,), dtype="float32",
                      zarr_format=3)
    with expect_error("ZB_E_OVERFLOW", "over the 16 GiB limit on one decoded chunk"):
        zb.read_array(str(tmp_path / "a.zarr"), "", 0, 4)
    zarr.create_array(str(tmp_path / "b.zarr"), shape=(2**62,), chunks=(4,), dtype="float32",
                      zarr_format=3)
    with expect_error("ZB_E_OVERFLOW", "overflows 64 bits"):
        zb.read_array(str(tmp_path / "b.zarr"), "", 0, 4)


def test_zstd_frame_declaring_more_than_it_holds_is_refused(tmp_path):
    """A frame whose header declares one byte more than its blocks hold: zarr-python (the
    oracle) reports corruption, and so does zbatch (never fewer bytes in silence)."""
    import struct
    zb = zbatch_api()
    data = (np.arange(1024) % 256).astype("uint8")
    z = zarr.create_array(str(tmp_path / "a.zarr"), shape=(1024,), chunks=(1024,), dtype="uint8",
                          zarr_format=3,
                          compressors=zarr.codecs.ZstdCodec(level=1, checksum=False))
    z[:] = data
    chunk = tmp_path / "a.zarr" / "c" / "0"
    frame = bytearray(chunk.read_bytes())
    assert frame[4] >> 6 == 1  # a 2-byte content size field (value - 256) after the header byte
    struct.pack_into("<H", frame, 5, struct.unpack_from("<H", frame, 5)[0] + 1)
    chunk.write_bytes(bytes(frame))
    with pytest.raises(Exception):
        zarr.open_array(str(tmp_path / "a.zarr"), mode="r")[:]
    with expect_error("ZB_E_CORRUPT", "c/0", "1025"):
        zb.read_array(str(tmp_path / "a.zarr"), "", 0, 1024)


def test_atomic_edge_index_outside_its_structure_error_and_skip(tmp_path):
    from test_verify import atomic_samples
    zb = zbatch_api()
    samples = atomic_samples(6, seed=1)
    path = atomic_store(tmp_path / "a.zarr")
    ap = zarr.open_array(str(path / "meta" / "atoms_ptr"), mode="r")[:]
    ep = zarr.open_array(str(path / "meta" / "edges_ptr"), mode="r")[:]
    # sample 3's first edge points one atom past its structure (store-global indices)
    damage(path, "core/neighbor_list", lambda v: v.__setitem__((ep[3], 1), ap[4]))
    with expect_error("ZB_E_CORRUPT", "sample 3", "neighbor_list"):
        zb.open(str(path)).read_many([2, 3])
    b = zb.open(str(path), on_invalid="skip").read_many([5, 3, 0])
    assert list(b["index"]) == [5, 0] and b.stats["samples_skipped"] == 1
    want = np.concatenate([samples[5]["positions"], samples[0]["positions"]])
    np.testing.assert_allclose(np.asarray(b["positions"]), want)
    # the neighbour list re-based to the batch: sample 0's atoms follow sample 5's
    n5 = len(samples[5]["positions"])
    want_nl = np.concatenate([samples[5]["neighbor_list"], samples[0]["neighbor_list"] + n5])
    np.testing.assert_array_equal(np.asarray(b["neighbor_list"]), want_nl)


@pytest.mark.parametrize("group, key, value, words", [
    ("obs/ct", "encoding-type", 4611686018427387904, ["obs/ct", "encoding-type"]),
    ("obs/ct", "encoding-type", None, ["obs/ct", "encoding-type"]),   # deleted
    ("obs", "column-order", 2147483648, ["obs", "column-order"]),
    ("obs", "column-order", ["ct", 7], ["obs", "column-order entry 1"]),
])
def test_column_encoding_type_not_a_string_is_refused(tmp_path, adata, group, key, value, words):
    """Found by the damage campaign (scripts/campaign.py): an obs column whose encoding-type
    attribute is a number or is missing, or a column-order that is not a list of names, left
    the columns out of every batch without a word, and `zbatch verify` called the store clean.
    anndata refuses such stores too."""
    zb = zbatch_api()
    path = write_store(tmp_path / "a.zarr", adata)
    g = zarr.open_group(str(path / group), mode="r+")
    if value is None:
        del g.attrs[key]
    else:
        g.attrs[key] = value
    zarr.consolidate_metadata(str(path))
    with pytest.raises(Exception):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ad.read_zarr(str(path))  # the oracle refuses it
    with expect_error("ZB_E_METADATA", *words):
        zb.open(str(path))
    r = run_cli("verify", path)
    assert r.returncode == 1 and all(w in r.stdout for w in words), r.stdout


@pytest.mark.parametrize("shape", [1, "60,12", {"rows": 60}, None])
def test_csr_shape_attribute_that_is_not_a_list(tmp_path, adata, shape):
    """Found by the damage campaign (scripts/campaign.py): X's shape attribute rewritten to a
    number aborted the process in json-c (json_object_array_length's assertion, SIGABRT) at
    zbatch.open. It is ZB_E_METADATA naming X and its shape; run in a child process, so that
    an abort fails this test instead of ending the test run."""
    import subprocess
    import sys
    path = write_store(tmp_path / "a.zarr", adata)
    g = zarr.open_group(str(path / "X"), mode="r+")
    g.attrs["shape"] = shape
    zarr.consolidate_metadata(str(path))
    code = ("import sys, zbatch\n"
            "try:\n    zbatch.open(sys.argv[1])\n"
            "except zbatch.ZbatchError as e:\n    print(e.status, e)\n")
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("ZB_E_METADATA") and "X" in r.stdout and "shape" in r.stdout, \
        r.stdout


@pytest.mark.parametrize("remote", [False, True], ids=["file", "http"])
def test_categories_metadata_comes_from_the_same_snapshot(tmp_path, adata, remote, request):
    """Found by the damage campaign (scripts/campaign.py), over HTTP: the reader took every
    array's metadata from the consolidated snapshot except the categories', which it read
    from their own zarr.json, so a damaged categories document failed read_many while
    `zbatch verify` (which has only the snapshot over HTTP) called the store clean. The
    categories now come from the same tree as everything else: the store reads as its
    snapshot says, as anndata (consolidated) reads it."""
    zb = zbatch_api()
    path = write_store(tmp_path / "a.zarr", adata)
    doc_path = path / "obs" / "ct" / "categories" / "zarr.json"
    doc = json.loads(doc_path.read_text())
    doc["data_type"] = 1.5  # the node's own document only; the snapshot keeps "string"
    doc_path.write_text(json.dumps(doc))
    url = str(path)
    if remote:
        url = f"{request.getfixturevalue('nginx_serve')(tmp_path).url}/a.zarr"
    ds = zb.open(url)
    b = ds.read_many(list(range(N_OBS)))
    np.testing.assert_array_equal(np.asarray(b["obs/ct"]), adata.obs["ct"].cat.codes.values)
    assert list(ds.categories("obs/ct")) == CATS
    # the file store's verify compares the documents with the snapshot and says so
    if not remote:
        r = run_cli("verify", path)
        assert r.returncode == 1 and "obs/ct/categories" in r.stdout, r.stdout


# ------------------------------------------------------------------------------------------------
# Strings that are not UTF-8 in a string chunk (found by scripts/campaign.py)
# ------------------------------------------------------------------------------------------------
def _flip_in_chunks(group_dir, marker: bytes) -> int:
    """Replaces the first byte of `marker` by 0xff in every uncompressed chunk file under
    group_dir that holds it; returns how many files changed."""
    changed = 0
    for f in sorted(p for p in group_dir.rglob("*") if p.is_file() and p.name != "zarr.json"):
        data = f.read_bytes()
        if marker in data:
            f.write_bytes(data.replace(marker, b"\xff" + marker[1:]))
            changed += 1
    return changed


def test_strings_not_utf8_are_refused_as_zarr_python_refuses_them(tmp_path):
    zb = zbatch_api()
    path = tmp_path / "s.zarr"
    zb.write_array(str(path), "names", ["alpha", "bqqzzb", "gamma"], codec="none")
    assert _flip_in_chunks(path / "names", b"bqqzzb") == 1
    with pytest.raises(UnicodeDecodeError):  # the oracle refuses the chunk
        zarr.open_array(str(path / "names"))[:]
    with expect_error("ZB_E_CORRUPT", "names: string 1 (6 bytes) is not UTF-8"):
        zb.read_array(str(path), "names")

    # anndata's store: a categorical's categories, a string obs column and the var names
    n = 6
    obs = pd.DataFrame({"ct": pd.Categorical(["cqqzzt", "b"] * 3),
                        "label": [f"lqqzz{i}" for i in range(n)]},
                       index=[f"c{i}" for i in range(n)])
    var = pd.DataFrame(index=["g0", "vqqzzg", "g2"])
    a = ad.AnnData(sp.random(n, 3, density=0.5, format="csr", dtype=np.float32, random_state=0),
                   obs=obs, var=var)
    store = tmp_path / "a.zarr"
    a.write_zarr(str(store))
    # rewrite the three string arrays uncompressed, so one byte can be flipped
    root = zarr.open_group(str(store), mode="a")
    for key in ("obs/ct/categories", "obs/label", "var/_index"):
        values = root[key][:]
        attrs = dict(root[key].attrs)
        del root[key]
        arr = root.create_array(key, shape=values.shape, dtype=values.dtype, compressors=None,
                                chunks=values.shape, attributes=attrs)
        arr[:] = values
    zarr.consolidate_metadata(str(store))
    good = zb.open(str(store))
    assert good.categories("obs/ct") == ["b", "cqqzzt"]
    assert list(good.var_names) == ["g0", "vqqzzg", "g2"]
    for marker in (b"cqqzzt", b"lqqzz3", b"vqqzzg"):
        assert _flip_in_chunks(store, marker) == 1
    ds = zb.open(str(store))
    with expect_error("ZB_E_CORRUPT", "obs/ct", "string 1", "is not UTF-8"):
        ds.categories("obs/ct")
    with expect_error("ZB_E_CORRUPT", "var/_index", "string 1", "is not UTF-8"):
        ds.var_names
    with expect_error("ZB_E_CORRUPT", "is not UTF-8"):
        ds.obs
    for key in ("obs/ct/categories", "obs/label", "var/_index"):
        with pytest.raises(UnicodeDecodeError):  # the oracle refuses each damaged array too
            zarr.open_group(str(store), mode="r", use_consolidated=False)[key][:]


def test_write_array_refuses_strings_without_utf8(tmp_path):
    zb = zbatch_api()
    with pytest.raises(ValueError, match="not valid Unicode text"):
        zb.write_array(str(tmp_path / "s.zarr"), "names", ["ok", "a\udcffb"])
    assert not (tmp_path / "s.zarr" / "names" / "zarr.json").exists()
