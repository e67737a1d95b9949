"""zbatch's anndata writer against anndata 0.12 as the oracle.

Stores written by ``write_anndata`` (v2 and v3, CSR and dense, several codecs, sharded) must open
in ``anndata.read_zarr`` with X, layers, obs (categoricals with str and numeric categories,
pandas' nullable dtypes with NA included), var and the names equal to the source objects; the
same inputs must give byte-identical stores whatever the thread count; the incomplete marker must be gone after a write and present after a write that
was not committed. ``zbatch synth --kind cells`` must be reproducible by seed and look like
Tahoe-100M (FORMATS.md §7.3).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from conftest import CLI, expect_error, info, read, run_cli, zbatch_api

from zbatch._write_anndata import write_anndata

MARKER = ".zbatch-incomplete"


# ------------------------------------------------------------------------------------------------
# Source objects
# ------------------------------------------------------------------------------------------------
def make_obs(n, seed=0):
    rng = np.random.default_rng(seed)
    ct = pd.Categorical.from_codes(rng.integers(-1, 4, n), categories=["B", "NK", "T", "mono"])
    many = pd.Categorical.from_codes(rng.integers(0, 200, n),
                                     categories=[f"drug_{i:03d}" for i in range(200)])
    return pd.DataFrame({
        "cell_type": ct,                                   # int8 codes, with -1 (missing)
        "drug": many,                                      # 200 categories: int16 codes
        "stage": pd.Categorical(rng.choice(["G1", "S", "G2M"], n),
                                categories=["G1", "S", "G2M"], ordered=True),
        "n_genes": rng.integers(0, 5000, n).astype(np.int32),
        "total": rng.integers(0, 2**40, n).astype(np.int64),
        "frac": rng.random(n),
        "frac32": rng.random(n).astype(np.float32),
        "small": rng.integers(0, 200, n).astype(np.uint8),
        "is_doublet": rng.random(n) < 0.3,
        "barcode": [f"AC{i:06d}-é" for i in range(n)],      # a str column: string-array
    }, index=[f"cell_{i}" for i in range(n)])


def make_var(n, seed=1):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "gene_type": pd.Categorical(rng.choice(["protein_coding", "lncRNA"], n)),
        "mean": rng.random(n).astype(np.float32),
        "highly_variable": rng.random(n) < 0.1,
    }, index=[f"ENSG{j:011d}" for j in range(n)])


def make_csr(n_obs, n_vars, density=0.1, dtype=np.float32, seed=2):
    rng = np.random.default_rng(seed)
    X = sp.random(n_obs, n_vars, density=density, format="csr", random_state=rng,
                  data_rvs=lambda k: rng.integers(1, 50, k)).astype(dtype)
    X.sort_indices()
    return X


def assert_frame_equal_anndata(got: pd.DataFrame, want: pd.DataFrame):
    """Columns, order, dtypes and values equal; categoricals compared by codes and categories."""
    assert list(got.columns) == list(want.columns)
    assert list(got.index) == list(want.index)
    for name in want.columns:
        g, w = got[name], want[name]
        if isinstance(w.dtype, pd.CategoricalDtype):
            assert isinstance(g.dtype, pd.CategoricalDtype), name
            assert list(g.cat.categories) == list(w.cat.categories), name
            np.testing.assert_array_equal(g.cat.codes.to_numpy(), w.cat.codes.to_numpy())
            assert g.cat.ordered == w.cat.ordered, name
        else:
            assert g.dtype == w.dtype, (name, g.dtype, w.dtype)
            np.testing.assert_array_equal(g.to_numpy(), w.to_numpy())
    pd.testing.assert_frame_equal(got, want)


# ------------------------------------------------------------------------------------------------
# write_anndata -> anndata.read_zarr
# ------------------------------------------------------------------------------------------------
CASES = [
    # (zarr_format, codec, chunk_size, shard_size)
    (3, None, None, None),
    (2, None, None, None),
    (3, "blosc:lz4:5:shuffle", 64, 256),
    (2, "blosc:zstd:3:bitshuffle", 100, None),
    (3, "gzip:1", 50, None),
    (2, "zlib:1", None, None),
    (2, "lz4", 37, None),
    (3, "none", 16, 64),
]


@pytest.mark.parametrize("fmt,codec,chunk,shard", CASES)
def test_csr_roundtrip(tmp_path, fmt, codec, chunk, shard):
    X = make_csr(300, 120)
    obs, var = make_obs(300), make_var(120)
    p = tmp_path / "a.zarr"
    write_anndata(p, X, obs=obs, var=var, zarr_format=fmt, codec=codec, chunk_size=chunk,
                  shard_size=shard, num_threads=2)
    assert not (p / MARKER).exists()
    assert (p / ("zarr.json" if fmt == 3 else ".zgroup")).is_file()
    a = ad.read_zarr(p)
    assert a.shape == (300, 120)
    assert sp.issparse(a.X) and a.X.format == "csr"
    # counts 1..49 in float32: stored narrow by default (issue 19), anndata reads them as such
    assert a.X.dtype == np.uint8
    np.testing.assert_array_equal(a.X.indptr, X.indptr)
    np.testing.assert_array_equal(a.X.indices, X.indices)
    np.testing.assert_array_equal(a.X.data, X.data)
    assert list(a.obs_names) == list(obs.index)
    assert list(a.var_names) == list(var.index)
    assert_frame_equal_anndata(a.obs, obs)
    assert_frame_equal_anndata(a.var, var)
    # the stored dtypes: narrow indices (anndata's min-dtype rule: uint8 for 120 columns), int64
    # indptr, pandas' code types
    assert read(p, "X/indices").dtype == np.uint8
    assert read(p, "X/indptr").dtype == np.int64
    assert read(p, "obs/cell_type/codes").dtype == np.int8
    assert read(p, "obs/drug/codes").dtype == np.int16
    assert info(p)["layout"] == "anndata"
    if shard:
        meta = json.loads((p / "X" / "data" / "zarr.json").read_text())
        sharding = meta["codecs"][0]
        assert sharding["name"] == "sharding_indexed"
        assert meta["chunk_grid"]["configuration"]["chunk_shape"] == [shard]
        assert sharding["configuration"]["chunk_shape"] == [chunk]


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.uint16])
def test_dense_roundtrip(tmp_path, fmt, dtype):
    rng = np.random.default_rng(5)
    X = (rng.random((211, 17)) * 1000).astype(dtype)
    obs = make_obs(211)
    p = tmp_path / "d.zarr"
    write_anndata(p, X, obs=obs, zarr_format=fmt, chunk_size=50)
    a = ad.read_zarr(p)
    assert isinstance(a.X, np.ndarray)
    assert a.X.dtype == dtype
    np.testing.assert_array_equal(a.X, X)
    assert_frame_equal_anndata(a.obs, obs)
    # var not given: anndata's default names
    assert list(a.var_names) == [str(j) for j in range(17)]
    attrs = (json.loads((p / "X" / "zarr.json").read_text())["attributes"] if fmt == 3
             else json.loads((p / "X" / ".zattrs").read_text()))
    assert attrs == {"encoding-type": "array", "encoding-version": "0.2.0"}


def test_dense_sharded_v3(tmp_path):
    X = np.arange(40 * 6, dtype=np.float32).reshape(40, 6)
    p = tmp_path / "d.zarr"
    write_anndata(p, X, chunk_size=4, shard_size=12, codec="zstd:1")
    a = ad.read_zarr(p)
    np.testing.assert_array_equal(a.X, X)
    assert list(a.obs_names) == [str(i) for i in range(40)]
    np.testing.assert_array_equal(read(p, "X", 10, 30), X[10:30])


@pytest.mark.parametrize("fmt", [2, 3])
def test_attributes_match_anndata(tmp_path, fmt):
    """Every element's attributes and the node set equal what anndata 0.12 itself writes (its
    `raw` null element aside), and the consolidated metadata lists the same nodes."""
    X = make_csr(20, 9).astype(np.float32)
    X.indptr = X.indptr.astype(np.int64)
    obs, var = make_obs(20), make_var(9)
    ours, theirs = tmp_path / "z.zarr", tmp_path / "a.zarr"
    write_anndata(ours, X, obs=obs, var=var, zarr_format=fmt, data_dtype="keep",
                  narrow_indices=False)  # anndata's defaults
    with ad.settings.override(zarr_write_format=fmt):
        ad.AnnData(X=X, obs=obs, var=var).write_zarr(theirs)

    def nodes(root):
        out = {}
        for d, _, files in os.walk(root):
            rel = os.path.relpath(d, root)
            rel = "" if rel == "." else rel
            if rel.split("/")[0] == "raw":
                continue
            if fmt == 3 and "zarr.json" in files:
                doc = json.loads(Path(d, "zarr.json").read_text())
                out[rel] = (doc["node_type"], doc.get("attributes", {}),
                            doc.get("data_type"), doc.get("shape"))
            elif fmt == 2 and (".zgroup" in files or ".zarray" in files):
                attrs = (json.loads(Path(d, ".zattrs").read_text())
                         if ".zattrs" in files else {})
                arr = json.loads(Path(d, ".zarray").read_text()) if ".zarray" in files else {}
                out[rel] = ("array" if arr else "group", attrs, arr.get("dtype"),
                            arr.get("shape"))
        return out

    want, got = nodes(theirs), nodes(ours)
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k] == want[k], k
    if fmt == 3:
        cm = json.loads((ours / "zarr.json").read_text())["consolidated_metadata"]
        assert cm["kind"] == "inline"
        assert sorted(cm["metadata"]) == sorted(k for k in want if k)
    else:
        zm = json.loads((ours / ".zmetadata").read_text())
        assert zm["zarr_consolidated_format"] == 1
        listed = {k.rsplit("/", 1)[0] if "/" in k else "" for k in zm["metadata"]}
        assert listed == set(want)


@pytest.mark.parametrize("fmt", [2, 3])
def test_default_obs_names_with_given_var(tmp_path, fmt):
    """obs names left to their default are written at commit, after var's: the consolidated
    metadata must still list siblings together (zarr-python groups adjacent keys)."""
    X = make_csr(12, 6)
    var = make_var(6)
    p = tmp_path / "a.zarr"
    write_anndata(p, X, var=var, zarr_format=fmt)
    a = ad.read_zarr(p)
    assert list(a.obs_names) == [str(i) for i in range(12)]
    assert_frame_equal_anndata(a.var, var)
    import zarr
    g = zarr.open_consolidated(str(p), zarr_format=fmt)
    assert sorted(g["obs"].array_keys()) == ["_index"]
    assert sorted(g["var"].array_keys()) == ["_index", "highly_variable", "mean"]


def test_csr_streams_other_sparse_and_int64_indices(tmp_path):
    X = make_csr(64, 33, density=0.3)
    coo = X.tocoo()
    p = tmp_path / "coo.zarr"
    write_anndata(p, coo)
    a = ad.read_zarr(p)
    assert (a.X != X).nnz == 0
    X64 = X.copy()
    X64.indices = X64.indices.astype(np.int64)
    X64.indptr = X64.indptr.astype(np.int64)
    p2 = tmp_path / "i64.zarr"
    write_anndata(p2, sp.csr_array(X64), zarr_format=2)
    b = ad.read_zarr(p2)
    np.testing.assert_array_equal(b.X.indices, X.indices)
    np.testing.assert_array_equal(b.X.toarray(), X.toarray())


def test_empty_rows_and_zero_obs(tmp_path):
    X = sp.csr_matrix((5, 4), dtype=np.float32)
    p = tmp_path / "e.zarr"
    write_anndata(p, X)
    a = ad.read_zarr(p)
    assert a.shape == (5, 4) and a.X.nnz == 0
    np.testing.assert_array_equal(a.X.indptr, np.zeros(6))
    p0 = tmp_path / "z.zarr"
    write_anndata(p0, sp.csr_matrix((0, 3), dtype=np.float32), zarr_format=2)
    b = ad.read_zarr(p0)
    assert b.shape == (0, 3)
    assert list(b.var_names) == ["0", "1", "2"]


# ------------------------------------------------------------------------------------------------
# Refusals and the incomplete marker
# ------------------------------------------------------------------------------------------------
def test_refuses_bad_inputs(tmp_path):
    X = make_csr(10, 5)
    with pytest.raises(ValueError, match="obs has 9 rows"):
        write_anndata(tmp_path / "a", X, obs=make_obs(9))
    with pytest.raises(TypeError, match="is not a str"):
        write_anndata(tmp_path / "b", X,
                      obs=pd.DataFrame({"c": pd.Categorical([1, "a"] * 5)}))
    with pytest.raises(TypeError, match="not supported"):
        write_anndata(tmp_path / "c", X,
                      obs=pd.DataFrame({"c": pd.array(np.arange(10.0), dtype="Float64")}))
    with pytest.raises(TypeError, match="missing values in a str column"):
        write_anndata(tmp_path / "c2", X, obs=pd.DataFrame({"c": ["a", None] * 5}))
    with pytest.raises(TypeError, match="only scipy.sparse"):
        write_anndata(tmp_path / "c3", X, layers={"dense": X.toarray()})
    with pytest.raises(ValueError, match=r"layers\['l'\] has shape \(10, 4\)"):
        write_anndata(tmp_path / "c4", X, layers={"l": make_csr(10, 4)})
    with expect_error("ZB_E_INVALID", "codec"):
        write_anndata(tmp_path / "d", X, codec="brotli")
    with expect_error("ZB_E_INVALID", "multiple"):
        write_anndata(tmp_path / "e", X, chunk_size=10, shard_size=25)
    with expect_error("ZB_E_INVALID", "sharding needs zarr_format 3"):
        write_anndata(tmp_path / "f", X, zarr_format=2, chunk_size=10, shard_size=20)
    write_anndata(tmp_path / "g", X)
    with expect_error("ZB_E_INVALID", "already holds"):
        write_anndata(tmp_path / "g", X)
    # the refused writes wrote no marker (they failed before it) or left it (after)
    assert ad.read_zarr(tmp_path / "g").shape == (10, 5)


def test_uncommitted_write_is_marked_incomplete(tmp_path):
    zb = zbatch_api()
    p = tmp_path / "crash.zarr"
    p.mkdir()
    w = zb._zbatch.AnndataWriter(str(p), 5, "csr", "<f4", x_chunk=2)
    X = make_csr(6, 5, density=0.5)
    w.append_csr(X.indptr.astype(np.int64), X.indices, X.data)
    assert (p / MARKER).is_file()
    marker = json.loads((p / MARKER).read_text())
    assert marker["writer"].startswith("zbatch")
    w.close()  # no commit: as if the process had died
    assert (p / MARKER).is_file()
    assert not (p / "zarr.json").exists()
    with pytest.raises(Exception):
        ad.read_zarr(p)


def test_reader_refuses_incomplete_store(tmp_path):
    """A committed store with a marker put back (a crash after the root, before the marker's
    erase is impossible; this stands for any half-written store) is refused by zbatch."""
    p = tmp_path / "a.zarr"
    write_anndata(p, make_csr(8, 4))
    (p / MARKER).write_text('{"writer": "zbatch"}')
    with expect_error("ZB_E_INCOMPLETE", "incomplete"):
        info(p)
    (p / MARKER).unlink()
    assert info(p)["layout"] == "anndata"


def test_low_level_writer_columns_in_pieces(tmp_path):
    """Streaming obs columns in pieces gives the same store as writing them whole."""
    zb = zbatch_api()
    X = make_csr(10, 4, density=0.5)
    p = tmp_path / "s.zarr"
    p.mkdir()
    w = zb._zbatch.AnndataWriter(str(p), 4, "csr", "<f4", zarr_format=2)
    for r0 in (0, 3, 7):
        r1 = {0: 3, 3: 7, 7: 10}[r0]
        ip = X.indptr[r0:r1 + 1].astype(np.int64)
        w.append_csr(ip, X.indices[ip[0]:ip[-1]], X.data[ip[0]:ip[-1]])
        w.append_names("obs", [f"c{i}" for i in range(r0, r1)])
        w.append_column("obs", "v", "<i4", np.arange(r0, r1, dtype=np.int32))
    w.define_categorical("obs", "k", ["x", "y"])
    w.append_codes("obs", "k", "|i1", np.array([0, 1, -1, 0, 1, 0, 1, 0, 1, -1], np.int8))
    assert w.rows == 10 and w.nnz == X.nnz
    w.commit()
    w.close()
    a = ad.read_zarr(p)
    np.testing.assert_array_equal(a.X.toarray(), X.toarray())
    assert list(a.obs_names) == [f"c{i}" for i in range(10)]
    np.testing.assert_array_equal(a.obs["v"].to_numpy(), np.arange(10))
    assert a.obs["k"].isna().sum() == 2
    assert list(a.obs["k"].cat.categories) == ["x", "y"]


# ------------------------------------------------------------------------------------------------
# zbatch synth --kind cells
# ------------------------------------------------------------------------------------------------
def synth(path, *args):
    r = run_cli("synth", "--kind", "cells", "--n", 2000, "-o", path, *args, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def tree_bytes(root):
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            full = Path(d, f)
            out[str(full.relative_to(root))] = full.read_bytes()
    return out


def test_synth_cells_reproducible_and_tahoe_like(tmp_path):
    a, b, c = tmp_path / "a.zarr", tmp_path / "b.zarr", tmp_path / "c.zarr"
    out = synth(a, "--seed", 1)
    assert "2000 cells" in out and "bytes" in out
    synth(b, "--seed", 1, "--threads", 3)
    ta, tb = tree_bytes(a), tree_bytes(b)
    assert sorted(ta) == sorted(tb)
    assert all(ta[k] == tb[k] for k in ta), "same seed must give byte-identical stores"
    assert MARKER not in ta

    adata = ad.read_zarr(a)
    assert adata.shape == (2000, 62710)
    X = adata.X
    # counts stored narrow by default (issue 19): uint8 values, uint16 gene ids
    assert sp.issparse(X) and X.format == "csr" and X.dtype == np.uint8
    nnz = np.diff(X.indptr)
    assert abs(nnz.mean() - 1460) < 0.2 * 1460
    assert nnz.min() >= 1 and nnz.std() > 100          # lognormal spread, not a constant
    assert X.indices.dtype == np.uint16
    for r in range(0, 2000, 97):                      # sorted unique gene ids per cell
        row = X.indices[X.indptr[r]:X.indptr[r + 1]]
        assert (np.diff(row) > 0).all() and row.min() >= 0 and row.max() < 62710
    d = X.data
    assert (d >= 1).all() and (d == np.round(d)).all()  # integer counts stored as float32
    assert {c: len(adata.obs[c].cat.categories) for c in ("cell_line", "drug", "plate")} == \
        {"cell_line": 50, "drug": 380, "plate": 14}
    assert adata.obs["cell_line"].nunique() == 50     # 2000 cells cover every cell line
    np.testing.assert_array_equal(adata.obs["n_genes"].to_numpy(), nnz)
    assert adata.obs["n_genes"].dtype == np.int32
    assert list(adata.obs_names[:3]) == ["cell_0", "cell_1", "cell_2"]
    assert adata.obs_names[-1] == "cell_1999"
    assert adata.var_names[0] == "gene_0" and adata.var_names[-1] == "gene_62709"

    synth(c, "--seed", 2)
    tc = tree_bytes(c)
    assert tc["X/indices/c/0"] != ta["X/indices/c/0"]
    other = ad.read_zarr(c)
    assert other.X.nnz != X.nnz or not np.array_equal(other.X.indices, X.indices)
    assert not np.array_equal(other.obs["drug"].cat.codes, adata.obs["drug"].cat.codes)


def test_synth_cells_v2_sharded_options(tmp_path):
    p2 = tmp_path / "v2.zarr"
    r = run_cli("synth", "--kind", "cells", "--n", 300, "-o", p2, "--format", "v2",
                "--codec", "blosc:lz4:5:shuffle", "--genes", 1000, "--seed", 3)
    assert r.returncode == 0, r.stderr
    a = ad.read_zarr(p2)
    assert a.shape == (300, 1000)
    assert json.loads((p2 / "X" / "data" / ".zarray").read_text())["compressor"]["id"] == "blosc"
    assert (np.diff(a.X.indptr) <= 1000).all()

    p3 = tmp_path / "v3.zarr"
    r = run_cli("synth", "--kind", "cells", "--n", 300, "-o", p3, "--chunk-nnz", 4096,
                "--shard-nnz", 65536, "--seed", 3, "--genes", 1000)
    assert r.returncode == 0, r.stderr
    meta = json.loads((p3 / "X" / "indices" / "zarr.json").read_text())
    assert meta["chunk_grid"]["configuration"]["chunk_shape"] == [65536]
    assert meta["codecs"][0]["configuration"]["chunk_shape"] == [4096]
    b = ad.read_zarr(p3)
    # same seed and genes, other format and chunking: the same matrix
    assert (a.X != b.X).nnz == 0
    pd.testing.assert_frame_equal(a.obs, b.obs)


def test_synth_cells_bad_usage(tmp_path):
    r = run_cli("synth", "--kind", "cells", "-o", tmp_path / "x")
    assert r.returncode == 2 and "--n" in r.stderr
    r = run_cli("synth", "--kind", "cells", "--n", "12x", "-o", tmp_path / "x")
    assert r.returncode == 2 and "not an integer" in r.stderr
    r = run_cli("synth", "--kind", "cells", "--n", 5, "-o", tmp_path / "x", "--format", "v4")
    assert r.returncode == 2
    r = run_cli("synth", "--kind", "cells", "--n", 5, "-o", tmp_path / "y", "--bogus", 1)
    assert r.returncode == 2 and "--bogus" in r.stderr
    ok = tmp_path / "ok"
    assert run_cli("synth", "--kind", "cells", "--n", 5, "-o", ok, "--genes", 10).returncode == 0
    r = run_cli("synth", "--kind", "cells", "--n", 5, "-o", ok, "--genes", 10)
    assert r.returncode == 1 and "already holds" in r.stderr
    r = run_cli("synth", "--kind", "cells", "--help")
    assert r.returncode == 0 and "--chunk-nnz" in r.stdout


def test_default_csr_chunk_is_the_library_constant(tmp_path):
    """With no chunk_size, X/data and X/indices of a CSR matrix larger than one chunk are
    chunked by ZB_ANNDATA_DEFAULT_X_CHUNK (4,096 elements, docs/PERFORMANCE.md "Codec
    defaults") — from Python and from `zbatch synth`, as zarr-python reports them."""
    import zarr
    from zbatch import _zbatch
    assert _zbatch.ANNDATA_DEFAULT_X_CHUNK == 4096
    X = sp.random(300, 200, density=0.2, format="csr", dtype=np.float32, random_state=3)
    p = tmp_path / "c.zarr"
    write_anndata(p, X)
    g = zarr.open_group(str(p), mode="r")
    assert g["X/data"].chunks == (4096,) and g["X/indices"].chunks == (4096,)
    np.testing.assert_array_equal(ad.read_zarr(p).X.toarray(), X.toarray())
    s = tmp_path / "s.zarr"
    r = run_cli("synth", "--kind", "cells", "--n", "20", "--genes", "3000", "-o", str(s))
    assert r.returncode == 0, r.stderr
    g = zarr.open_group(str(s), mode="r")
    assert g["X/data"].chunks == (4096,) and g["X/data"].shards == (4096 * 1024,)


# ------------------------------------------------------------------------------------------------
# Nullable columns, numeric categories, layers, narrow indices, determinism
# ------------------------------------------------------------------------------------------------
LAYOUTS = [(2, None), (3, None), (3, 64)]  # (zarr_format, shard_size with chunk_size 16)

NULLABLE_INTS = ["Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64"]


def with_na(values, n, dtype):
    """A pandas extension array of `dtype` with NA at the first, a middle and the last row."""
    vals = list(values)
    for i in (0, n // 2, n - 1):
        vals[i] = pd.NA
    return pd.array(vals, dtype=dtype)


def make_nullable_obs(n, seed=7):
    rng = np.random.default_rng(seed)
    cols = {}
    for dt in NULLABLE_INTS:
        info_ = np.iinfo(dt.lower())
        vals = rng.integers(max(info_.min, -1000), min(info_.max, 1000), n).tolist()
        vals[1] = int(info_.max)  # the type's extremes survive
        vals[2] = int(info_.min)
        cols[f"n_{dt}"] = with_na(vals, n, dt)
    cols["flag"] = with_na((rng.random(n) < 0.5).tolist(), n, "boolean")
    cols["label"] = with_na([f"s{i}-é" for i in range(n)], n, "string")
    cols["full"] = pd.array(rng.integers(0, 9, n), dtype="Int64")  # nullable, no NA
    return pd.DataFrame(cols, index=[f"c{i}" for i in range(n)])


def make_numeric_cat_obs(n, seed=8):
    rng = np.random.default_rng(seed)
    def cat(cats, ordered=False):
        codes = rng.integers(-1, len(cats), n)
        codes[0] = -1
        return pd.Categorical.from_codes(codes, categories=pd.Index(cats), ordered=ordered)
    return pd.DataFrame({
        "leiden": cat(np.array([0, 3, 1, 12, 7], dtype=np.int64)),   # cluster ids as ints
        "i32": cat(np.array([-5, 2**30, 9], dtype=np.int32)),
        "u8": cat(np.array([255, 0, 1], dtype=np.uint8), ordered=True),
        "f64": cat(np.array([0.5, -1e300, np.inf, 2.25])),
        "f32": cat(np.array([1.5, -0.25], dtype=np.float32)),
        "b": cat(np.array([True, False])),
    }, index=[f"c{i}" for i in range(n)])


def write_store(path, X, fmt, shard, **kw):
    chunk = 16 if shard else None
    write_anndata(path, X, zarr_format=fmt, chunk_size=chunk, shard_size=shard, **kw)


@pytest.mark.parametrize("fmt,shard", LAYOUTS)
def test_nullable_columns_roundtrip(tmp_path, fmt, shard):
    n = 61
    X = make_csr(n, 9)
    obs = make_nullable_obs(n)
    var = pd.DataFrame({"hv": with_na([True] * 9, 9, "boolean"),
                        "n": with_na(list(range(9)), 9, "Int32")},
                       index=[f"g{j}" for j in range(9)])
    p = tmp_path / "n.zarr"
    write_store(p, X, fmt, shard, obs=obs, var=var, num_threads=2)
    a = ad.read_zarr(p)
    for df, want in ((a.obs, obs), (a.var, var)):
        assert list(df.columns) == list(want.columns)
        for name in want.columns:
            assert df[name].dtype == want[name].dtype, (name, df[name].dtype)
            # NA where NA was written (first, middle, last row), the values elsewhere
            np.testing.assert_array_equal(df[name].isna().to_numpy(), want[name].isna().to_numpy())
            pd.testing.assert_series_equal(df[name], want[name], check_names=False)
    enc = "zarr.json" if fmt == 3 else ".zattrs"
    def attrs(rel):
        doc = json.loads((p / rel / enc).read_text())
        return doc["attributes"] if fmt == 3 else doc
    assert attrs("obs/n_Int16") == {"encoding-type": "nullable-integer",
                                    "encoding-version": "0.1.0"}
    assert attrs("obs/flag")["encoding-type"] == "nullable-boolean"
    assert attrs("obs/label")["encoding-type"] == "nullable-string-array"
    # a missing value is stored as anndata stores it: 0, False, ""
    assert read(p, "obs/n_UInt64/values").dtype == np.uint64
    assert read(p, "obs/n_Int8/values")[0] == 0
    assert not read(p, "obs/flag/values")[n - 1]
    assert read(p, "obs/label/values")[n // 2] == ""
    np.testing.assert_array_equal(read(p, "obs/label/mask"), obs["label"].isna().to_numpy())


@pytest.mark.parametrize("fmt,shard", LAYOUTS)
def test_numeric_categories_roundtrip(tmp_path, fmt, shard):
    n = 50
    obs = make_numeric_cat_obs(n)
    var = pd.DataFrame({"k": pd.Categorical([3, 1, 3, 2, 1, 1, 2, 3, 3])},
                       index=[f"g{j}" for j in range(9)])
    p = tmp_path / "c.zarr"
    write_store(p, make_csr(n, 9), fmt, shard, obs=obs, var=var)
    a = ad.read_zarr(p)
    for df, want in ((a.obs, obs), (a.var, var)):
        for name in want.columns:
            g, w = df[name], want[name]
            assert isinstance(g.dtype, pd.CategoricalDtype), name
            assert g.cat.categories.dtype == w.cat.categories.dtype, \
                (name, g.cat.categories.dtype)
            np.testing.assert_array_equal(g.cat.categories.to_numpy(),
                                          w.cat.categories.to_numpy())
            np.testing.assert_array_equal(g.cat.codes.to_numpy(), w.cat.codes.to_numpy())
            assert g.cat.ordered == w.cat.ordered
        pd.testing.assert_frame_equal(df, want)
    assert read(p, "obs/leiden/categories").dtype == np.int64
    assert read(p, "obs/leiden/codes").dtype == np.int8


@pytest.mark.parametrize("fmt,shard", LAYOUTS)
def test_layers_roundtrip(tmp_path, fmt, shard):
    X = make_csr(120, 40)
    counts = make_csr(120, 40, density=0.3, dtype=np.int32, seed=9)
    spliced = make_csr(120, 40, density=0.05, dtype=np.float64, seed=10).tocsc()
    p = tmp_path / "l.zarr"
    write_store(p, X, fmt, shard, layers={"counts": counts, "spliced": spliced},
                num_threads=3, data_dtype="keep")
    a = ad.read_zarr(p)
    assert sorted(a.layers) == ["counts", "spliced"]
    for name, want in (("counts", counts), ("spliced", spliced.tocsr())):
        got = a.layers[name]
        assert sp.issparse(got) and got.format == "csr" and got.dtype == want.dtype, name
        np.testing.assert_array_equal(got.indptr, want.indptr)
        np.testing.assert_array_equal(got.indices, want.indices)
        np.testing.assert_array_equal(got.data, want.data)
    np.testing.assert_array_equal(a.X.toarray(), X.toarray())
    # zbatch's reader exposes the layer too, row for row
    ds = zbatch_api().open(str(p), load_layers=True)
    ids = np.array([5, 119, 0, 5, 64])
    b = ds.read_many(ids)
    got = b["layers/counts"]
    want = counts[ids]
    assert isinstance(got, sp.csr_matrix) and got.shape == want.shape
    np.testing.assert_array_equal(got.indptr, want.indptr)
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_array_equal(got.data, want.data)
    # beside a dense X a layer is CSR too
    d = tmp_path / "d.zarr"
    write_anndata(d, X.toarray(), zarr_format=fmt, layers={"counts": counts})
    b2 = ad.read_zarr(d)
    assert isinstance(b2.X, np.ndarray) and b2.layers["counts"].format == "csr"
    assert (b2.layers["counts"] != counts).nnz == 0


def narrow_dtype_of_anndata(tmp_path, n_vars):
    """The indices dtype anndata itself picks with write_csr_csc_indices_with_min_possible_dtype."""
    import zarr
    p = tmp_path / f"anndata_{n_vars}.zarr"
    X = sp.csr_matrix((np.ones(1, np.float32), ([0], [n_vars - 1])), shape=(2, n_vars))
    with ad.settings.override(write_csr_csc_indices_with_min_possible_dtype=True):
        ad.AnnData(X=X).write_zarr(p)
    return zarr.open_group(str(p), mode="r")["X/indices"].dtype


@pytest.mark.parametrize("n_vars,want", [(9, np.uint8), (255, np.uint8), (256, np.uint16),
                                         (65535, np.uint16), (65536, np.uint32),
                                         (70000, np.uint32)])
def test_narrow_indices_dtype_as_anndata(tmp_path, n_vars, want):
    assert narrow_dtype_of_anndata(tmp_path, n_vars) == want  # the oracle agrees with the table
    rng = np.random.default_rng(n_vars)
    X = sp.random(30, n_vars, density=min(0.3, 200 / n_vars), format="csr", dtype=np.float32,
                  random_state=rng)
    X = X.tolil()
    X[3, n_vars - 1] = 5.0  # the largest column id is stored
    X = X.tocsr()
    X.sort_indices()
    p = tmp_path / "z.zarr"
    write_anndata(p, X, narrow_indices=True, layers={"c": X.copy()}, zarr_format=2)
    assert read(p, "X/indices").dtype == want
    assert read(p, "layers/c/indices").dtype == want
    a = ad.read_zarr(p)
    np.testing.assert_array_equal(a.X.indices, X.indices)
    np.testing.assert_array_equal(a.X.indptr, X.indptr)
    np.testing.assert_array_equal(a.layers["c"].toarray(), X.toarray())
    # default: narrow up to 65,535 columns (uint8/uint16, as anndata's rule), else int32
    q = tmp_path / "q.zarr"
    assert write_anndata(q, X)["X/indices"] == (want if n_vars <= 65535 else np.int32)
    assert read(q, "X/indices").dtype == (want if n_vars <= 65535 else np.int32)
    r = tmp_path / "r.zarr"
    write_anndata(r, X, narrow_indices=False)
    assert read(r, "X/indices").dtype == np.int32


@pytest.mark.parametrize("fmt,shard", LAYOUTS)
def test_narrow_indices_read_by_zbatch(tmp_path, fmt, shard):
    """zbatch's own reader reads uint16 indices exactly (batches equal scipy's rows)."""
    X = make_csr(200, 700, density=0.05)
    obs = make_obs(200)
    p = tmp_path / "n.zarr"
    write_store(p, X, fmt, shard, obs=obs, narrow_indices=True)
    assert read(p, "X/indices").dtype == np.uint16
    ds = zbatch_api().open(str(p))
    assert len(ds) == 200 and ds.n_vars == 700
    for ids in (np.arange(200), np.array([199, 3, 3, 0, 150]), np.array([], np.int64)):
        b = ds.read_many(ids)
        got = b["X"]
        want = X[ids]
        assert got.shape == want.shape
        np.testing.assert_array_equal(got.indptr, want.indptr)
        np.testing.assert_array_equal(got.indices, want.indices)
        np.testing.assert_array_equal(got.data, want.data)
        np.testing.assert_array_equal(b["obs/n_genes"], obs["n_genes"].to_numpy()[ids])


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("narrow", [False, True])
def test_new_elements_match_anndata_attributes(tmp_path, fmt, narrow):
    """Nullable columns, numeric categoricals and layers: the node set, every attribute, dtype
    and shape equal what anndata 0.12 itself writes for the same objects."""
    n = 20
    X = make_csr(n, 9)
    X.indptr = X.indptr.astype(np.int64)
    layer = make_csr(n, 9, dtype=np.int32, seed=4)
    layer.indptr = layer.indptr.astype(np.int64)
    obs = pd.concat([make_nullable_obs(n), make_numeric_cat_obs(n)], axis=1)
    # anndata turns str columns with repeated values into categoricals; keep this one unique
    obs["label"] = pd.array([f"u{i}" for i in range(n)], dtype="string")
    ours, theirs = tmp_path / "z.zarr", tmp_path / "a.zarr"
    write_anndata(ours, X, obs=obs, zarr_format=fmt, layers={"counts": layer},
                  narrow_indices=narrow, data_dtype="keep")
    with ad.settings.override(zarr_write_format=fmt, allow_write_nullable_strings=True,
                              write_csr_csc_indices_with_min_possible_dtype=narrow):
        ad.AnnData(X=X, obs=obs, layers={"counts": layer}).write_zarr(theirs)

    def nodes(root):
        out = {}
        for d, _, files in os.walk(root):
            rel = os.path.relpath(d, root)
            rel = "" if rel == "." else rel
            if rel.split("/")[0] == "raw":
                continue
            if fmt == 3 and "zarr.json" in files:
                doc = json.loads(Path(d, "zarr.json").read_text())
                out[rel] = (doc["node_type"], doc.get("attributes", {}), doc.get("data_type"),
                            doc.get("shape"))
            elif fmt == 2 and (".zgroup" in files or ".zarray" in files):
                attrs = (json.loads(Path(d, ".zattrs").read_text())
                         if ".zattrs" in files else {})
                arr = json.loads(Path(d, ".zarray").read_text()) if ".zarray" in files else {}
                out[rel] = ("array" if arr else "group", attrs, arr.get("dtype"),
                            arr.get("shape"))
        return out

    want, got = nodes(theirs), nodes(ours)
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k] == want[k], k
    a = ad.read_zarr(ours)
    pd.testing.assert_frame_equal(a.obs, ad.read_zarr(theirs).obs)


def test_deterministic_bytes(tmp_path):
    """The same inputs give byte-identical stores (every file) with 1 and 4 threads, v2 and v3,
    sharded and not, and when written again."""
    n = 900
    X = make_csr(n, 300, density=0.08)
    index = [f"cell_{i}" for i in range(n)]
    obs = pd.concat([f.set_axis(index) for f in
                     (make_obs(n), make_nullable_obs(n), make_numeric_cat_obs(n))], axis=1)
    layers = {"counts": make_csr(n, 300, density=0.05, dtype=np.int32, seed=11)}
    for fmt, shard in LAYOUTS:
        trees = []
        for run, threads in enumerate((1, 4, 4)):
            p = tmp_path / f"v{fmt}_{shard}_{run}.zarr"
            write_store(p, X, fmt, shard, obs=obs, var=make_var(300), layers=layers,
                        num_threads=threads, narrow_indices=True)
            trees.append(tree_bytes(p))
        ref = trees[0]
        assert len(ref) > 40 and MARKER not in ref
        if shard:
            assert any(k.startswith("X/data/c/") for k in ref)
        for other in trees[1:]:
            assert sorted(other) == sorted(ref), (fmt, shard)
            diff = [k for k in ref if ref[k] != other[k]]
            assert not diff, (fmt, shard, diff[:5])


def test_low_level_nullable_mask_length(tmp_path):
    """The extension passes the mask's own length: a short one is refused by the C writer."""
    zb = zbatch_api()
    p = tmp_path / "m.zarr"
    p.mkdir()
    w = zb._zbatch.AnndataWriter(str(p), 3, "csr", "<f4")
    with expect_error("ZB_E_INVALID", "mask has 2 entries for 3 values"):
        w.append_nullable_column("obs", "n", "<i8", np.arange(3, dtype=np.int64),
                                 np.zeros(2, np.uint8))
    with expect_error("ZB_E_INVALID", "mask has 1 entries for 2 values"):
        w.append_nullable_string_column("obs", "s", ["a", "b"], np.zeros(1, np.uint8))
    with expect_error("ZB_E_INVALID", "appears more than once"):
        w.define_categorical_values("obs", "k", "<f8", np.array([1.0, -0.0, 0.0]))
    w.close()


def test_zero_obs_with_new_elements(tmp_path):
    """No rows: the layer, the nullable columns and the numeric categorical still exist, with
    their dtypes."""
    obs = pd.DataFrame({"a": pd.array([], dtype="Int16"), "s": pd.array([], dtype="string"),
                        "b": pd.array([], dtype="boolean"),
                        "c": pd.Categorical(np.array([], np.int64))})
    p = tmp_path / "z.zarr"
    write_anndata(p, sp.csr_matrix((0, 3), dtype=np.float32), obs=obs, narrow_indices=True,
                  layers={"l": sp.csr_matrix((0, 3), dtype=np.int32)})
    a = ad.read_zarr(p)
    assert a.shape == (0, 3)
    assert a.layers["l"].shape == (0, 3) and a.layers["l"].dtype == np.int32
    assert a.X.indices.dtype == np.uint8
    assert a.obs.dtypes.to_dict() == obs.dtypes.to_dict()
    assert a.obs["c"].cat.categories.dtype == np.int64
