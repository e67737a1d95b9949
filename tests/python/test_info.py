"""zbatch.info and `zbatch info [--json]`: the node tree, per-array metadata, byte counts and the
layout detection (anndata, annbatch collections, nvalchemi AtomicData stores, plain).

Expected values come from walking the directory, from zarr-python's view of each array, and from
what the test wrote. FORMATS §1.4, §3.5, §6, §7, §8.
"""
import json
import math
import os
from pathlib import Path

import anndata as ad
import anndata.io
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import zarr
import zarr.codecs as zc

from conftest import (MAX64, info, json_equal, load_json, read, run_cli,
                      sample_data, stored_bytes_on_disk, string_data, write_v2, write_v3)

V3_DTYPE = {"|b1": "bool", "|i1": "int8", "<i2": "int16", "<i4": "int32", "<i8": "int64",
            "|u1": "uint8", "<u2": "uint16", "<u4": "uint32", "<u8": "uint64",
            "<f2": "float16", "<f4": "float32", "<f8": "float64", ">f8": "float64",
            ">i4": "int32", "|O": "string"}


def walk_nodes(root):
    """{relative path: "group" | "array"} from the directory tree alone."""
    root = Path(root)
    out = {}
    for dp, _dn, fn in os.walk(root):
        rel = Path(dp).relative_to(root).as_posix()
        rel = "" if rel == "." else rel
        if "zarr.json" in fn:
            out[rel] = load_json(Path(dp) / "zarr.json")["node_type"]
        elif ".zarray" in fn:
            out[rel] = "array"
        elif ".zgroup" in fn:
            out[rel] = "group"
    return out


def by_path(doc):
    paths = [n["path"] for n in doc["nodes"]]
    assert len(paths) == len(set(paths)), f"duplicate nodes: {paths}"
    return {n["path"]: n for n in doc["nodes"]}


def check_arrays_against_zarr(root, doc):
    """Every array node's shape, dtype, chunks, shards, fill and byte counts, against
    zarr-python's metadata and the files on disk."""
    nodes = by_path(doc)
    assert {p: n["type"] for p, n in nodes.items()} == walk_nodes(root)
    for path, node in nodes.items():
        if node["type"] != "array":
            assert "shape" not in node or node.get("shape") is None
            continue
        z = zarr.open_array(str(Path(root) / path), mode="r")
        assert node["shape"] == list(z.shape), path
        assert node["chunks"] == list(z.chunks), path
        assert node["shards"] == (None if z.shards is None else list(z.shards)), path
        assert isinstance(node["codecs"], str) and node["codecs"], path
        assert node["stored_bytes"] == stored_bytes_on_disk(Path(root) / path), path
        if node["dtype"] != "string":
            itemsize = np.dtype(node["dtype"]).itemsize
            assert node["logical_bytes"] == int(np.prod(z.shape, dtype=np.int64)) * itemsize, \
                path
        assert node["attributes"] == dict(z.attrs), path


# ------------------------------------------------------------------------------------------------
# anndata
# ------------------------------------------------------------------------------------------------
def _adata(seed=0, n_obs=60, n_vars=12):
    rng = np.random.default_rng(seed)
    X = sp.random(n_obs, n_vars, density=0.2, format="csr", dtype="float32",
                  random_state=seed)
    obs = pd.DataFrame({"ct": pd.Categorical(rng.choice(["a", "b", "c"], n_obs)),
                        "n": rng.integers(0, 100, n_obs)},
                       index=[f"c{seed}_{i}" for i in range(n_obs)])
    var = pd.DataFrame(index=[f"g{i}" for i in range(n_vars)])
    return ad.AnnData(X=X, obs=obs, var=var)


@pytest.mark.parametrize("fmt", [2, 3])
def test_anndata_store(tmp_path, fmt):
    a = _adata()
    with ad.settings.override(zarr_write_format=fmt):
        a.write_zarr(tmp_path / "a.zarr")
    p = tmp_path / "a.zarr"
    doc = info(p)
    # "path" is the root node's path within the opened store (the engine's choice; "" here)
    assert doc["path"] == doc["nodes"][0]["path"] == ""
    assert doc["zarr_format"] == fmt
    assert doc["layout"] == "anndata"
    assert doc["consolidated"] is True  # anndata 0.12 consolidates both formats
    nodes = by_path(doc)
    assert nodes[""]["type"] == "group"
    assert nodes[""]["attributes"]["encoding-type"] == "anndata"
    assert nodes["X"]["attributes"] == {"encoding-type": "csr_matrix", "encoding-version": "0.1.0",
                                        "shape": [60, 12]}
    data = nodes["X/data"]
    assert data["type"] == "array" and data["shape"] == [a.X.nnz] and data["dtype"] == "float32"
    z = zarr.open_array(str(p / "X" / "data"), mode="r")
    assert data["chunks"] == list(z.chunks) and data["shards"] is None
    assert data["fill_value"] == 0.0
    if fmt == 2:  # anndata 0.12's v2 default: blosc lz4 clevel 5 shuffle 1
        assert "blosc" in data["codecs"] and "lz4" in data["codecs"]
    else:  # zarr 3.1's v3 default: zstd level 0
        assert "zstd" in data["codecs"]
    assert nodes["X/indptr"]["shape"] == [61]
    assert nodes["obs/_index"]["dtype"] == "string"
    assert nodes["obs/ct/codes"]["dtype"] == "int8"
    assert nodes["obs/ct/categories"]["dtype"] == "string"
    assert nodes["raw"]["type"] == "array" and nodes["raw"]["shape"] == []
    assert nodes["raw"]["dtype"] == "bool" and nodes["raw"]["stored_bytes"] == 0
    check_arrays_against_zarr(p, doc)


# ------------------------------------------------------------------------------------------------
# Sharded arrays, plain groups, byte counts
# ------------------------------------------------------------------------------------------------
def test_v3_sharded_array(tmp_path):
    data = sample_data("float32", (100, 6), seed=1)
    data[32:64] = 0.0  # the second shard is all fill: not written
    write_v3(tmp_path / "s", data, (8, 3), shards=(32, 6), compressors=[zc.BloscCodec()],
             write_empty_chunks=False)
    doc = info(tmp_path / "s")
    assert doc["zarr_format"] == 3 and doc["layout"] == "plain" and doc["consolidated"] is False
    (node,) = doc["nodes"]
    assert node["path"] == "" and node["type"] == "array"
    assert node["shape"] == [100, 6]
    assert node["chunks"] == [8, 3]
    assert node["shards"] == [32, 6]
    assert node["dtype"] == "float32"
    assert "blosc" in node["codecs"]
    assert node["stored_bytes"] == stored_bytes_on_disk(tmp_path / "s")
    assert node["logical_bytes"] == 100 * 6 * 4
    assert not (tmp_path / "s" / "c" / "1" / "0").exists()
    check_arrays_against_zarr(tmp_path / "s", doc)


def _plain_group(root, fmt):
    g = zarr.open_group(str(root), mode="w", zarr_format=fmt)
    g.attrs.update({"title": "plain", "n": 3, "nested": {"k": [1, 2.5, None, True]}})
    sub = g.create_group("sub")
    sub.attrs["units"] = "m"
    sub.create_group("empty")
    write = write_v2 if fmt == 2 else write_v3
    write(root / "ints", sample_data("int16", (17, 3), seed=2), (5, 2), fill_value=-3,
          attributes={"a": 1})
    write(root / "sub" / "floats", sample_data("float64", (40,), seed=3), (16,))
    write(root / "sub" / "names", string_data((9,), seed=4), (4,))
    write(root / "sub" / "flags", np.zeros(10, bool), (3,), write_empty_chunks=False)
    write(root / "sub" / "u64", np.arange(7, dtype="u8"), (7,), fill_value=MAX64)
    write(root / "scalar", np.array(2.5), ())
    if fmt == 2:
        write_v2(root / "sub" / "slash", sample_data("uint8", (20, 4), seed=5), (6, 3),
                 dimension_separator="/")
        write_v2(root / "big", sample_data(np.dtype("f8"), (5,), seed=6).astype(">f8"), (2,))
    else:
        write_v3(root / "sub" / "sharded", sample_data("uint8", (20, 4), seed=5), (5, 2),
                 shards=(10, 4))
    return g


@pytest.mark.parametrize("fmt", [2, 3])
def test_plain_group(tmp_path, fmt):
    _plain_group(tmp_path / "g", fmt)
    doc = info(tmp_path / "g")
    assert doc["zarr_format"] == fmt and doc["layout"] == "plain"
    assert doc["consolidated"] is False
    nodes = by_path(doc)
    expected_paths = {"", "sub", "sub/empty", "ints", "sub/floats", "sub/names", "sub/flags",
                      "sub/u64", "scalar"} | ({"sub/slash", "big"} if fmt == 2 else
                                              {"sub/sharded"})
    assert set(nodes) == expected_paths
    assert nodes[""]["attributes"] == {"title": "plain", "n": 3,
                                       "nested": {"k": [1, 2.5, None, True]}}
    assert nodes["sub"]["attributes"] == {"units": "m"}
    assert nodes["sub/empty"]["attributes"] == {}
    assert nodes["ints"]["dtype"] == "int16" and nodes["ints"]["fill_value"] == -3
    assert nodes["ints"]["attributes"] == {"a": 1}
    assert nodes["sub/names"]["dtype"] == "string"
    assert nodes["sub/flags"]["dtype"] == "bool" and nodes["sub/flags"]["stored_bytes"] == 0
    u64 = nodes["sub/u64"]
    assert u64["fill_value"] == MAX64 and type(u64["fill_value"]) is int
    assert nodes["scalar"]["shape"] == [] and nodes["scalar"]["logical_bytes"] == 8
    if fmt == 2:
        assert nodes["big"]["dtype"] == "float64"
        assert nodes["sub/slash"]["stored_bytes"] == stored_bytes_on_disk(
            tmp_path / "g" / "sub" / "slash") > 0
    else:
        assert nodes["sub/sharded"]["shards"] == [10, 4]
        assert nodes["sub/sharded"]["chunks"] == [5, 2]
    check_arrays_against_zarr(tmp_path / "g", doc)


@pytest.mark.parametrize("fmt", [2, 3])
def test_plain_group_consolidated(tmp_path, fmt):
    _plain_group(tmp_path / "g", fmt)
    zarr.consolidate_metadata(str(tmp_path / "g"))
    doc = info(tmp_path / "g")
    assert doc["consolidated"] is True and doc["layout"] == "plain"
    check_arrays_against_zarr(tmp_path / "g", doc)


@pytest.mark.parametrize("typestr", sorted(V3_DTYPE))
def test_v2_dtype_names(tmp_path, typestr):
    dt = str if typestr == "|O" else np.dtype(typestr)
    data = string_data((5,)) if typestr == "|O" else sample_data(
        np.dtype(typestr).newbyteorder("="), (5,), seed=7).astype(typestr)
    write_v2(tmp_path / "a", data, (2,), dtype=dt)
    assert load_json(tmp_path / "a" / ".zarray")["dtype"] == typestr
    (node,) = info(tmp_path / "a")["nodes"]
    assert node["dtype"] == V3_DTYPE[typestr]
    if typestr != "|O":
        assert node["logical_bytes"] == 5 * np.dtype(typestr).itemsize


@pytest.mark.parametrize("fill,expected", [
    (float("nan"), "NaN"),  # non-finite: the Zarr JSON string form (FORMATS §1.3)
    (float("-inf"), "-Infinity"),
    (float("inf"), "Infinity"),
    (-0.5, -0.5),
])
@pytest.mark.parametrize("fmt", [2, 3])
def test_float_fill_values(tmp_path, fmt, fill, expected):
    (write_v2 if fmt == 2 else write_v3)(tmp_path / "a", np.zeros(4, "f4"), (2,),
                                         fill_value=fill)
    (node,) = info(tmp_path / "a")["nodes"]
    assert json_equal(node["fill_value"], expected), node["fill_value"]


def test_v3_nan_attribute_in_consolidated_root(tmp_path):
    # FORMATS §5: zarr-python 3 writes a bare NaN token into the consolidated root zarr.json
    zarr.open_group(str(tmp_path / "g"), mode="w", zarr_format=3)
    write_v3(tmp_path / "g" / "a", np.arange(3, dtype="i4"), (3,),
             attributes={"m": float("nan"), "p": float("inf")})
    zarr.consolidate_metadata(str(tmp_path / "g"))
    assert "NaN" in (tmp_path / "g" / "zarr.json").read_text()
    doc = info(tmp_path / "g")
    assert doc["consolidated"] is True
    attrs = by_path(doc)["a"]["attributes"]
    assert math.isnan(attrs["m"]) and attrs["p"] == math.inf


# ------------------------------------------------------------------------------------------------
# Layout detection
# ------------------------------------------------------------------------------------------------
def _atomic_store(root):
    """An nvalchemi AtomicDataZarrWriter-like store (FORMATS §8.1): 3 samples with 2, 3, 1 atoms
    and 1, 2, 0 edges."""
    atoms = np.array([0, 2, 5, 6], "int64")
    edges = np.array([0, 1, 3, 3], "int64")
    g = zarr.open_group(str(root), mode="w", zarr_format=3)
    g.attrs.update({"num_samples": 3, "fields": {
        "core": {"positions": "atom", "atomic_numbers": "atom", "neighbor_list": "edge",
                 "energy": "system"}, "custom": {}}})
    g.create_group("meta")
    g.create_group("core")
    g.create_group("custom")
    rng = np.random.default_rng(8)
    arrays = {
        "meta/atoms_ptr": atoms, "meta/edges_ptr": edges,
        "meta/samples_mask": np.ones(3, bool), "meta/atoms_mask": np.ones(6, bool),
        "meta/edges_mask": np.ones(3, bool),
        "core/positions": rng.standard_normal((6, 3)).astype("float32"),
        "core/atomic_numbers": np.array([1, 8, 6, 1, 1, 29], "int64"),
        "core/neighbor_list": np.array([[0, 1], [2, 3], [3, 4]], "int64"),
        "core/energy": rng.standard_normal((3, 1)).astype("float32"),
    }
    for path, data in arrays.items():
        write_v3(root / path, data, data.shape)
    return arrays


def test_atomic_layout(tmp_path):
    arrays = _atomic_store(tmp_path / "atoms.zarr")
    doc = info(tmp_path / "atoms.zarr")
    assert doc["layout"] == "atomic" and doc["zarr_format"] == 3
    assert doc["consolidated"] is False  # nvalchemi stores carry no consolidated metadata
    nodes = by_path(doc)
    assert nodes[""]["attributes"]["num_samples"] == 3
    assert nodes["meta/atoms_ptr"]["shape"] == [4] and nodes["meta/atoms_ptr"]["dtype"] == "int64"
    assert nodes["core/positions"]["shape"] == [6, 3]
    check_arrays_against_zarr(tmp_path / "atoms.zarr", doc)
    for path, data in arrays.items():
        np.testing.assert_array_equal(read(tmp_path / "atoms.zarr", path), data)


def _annbatch_collection(root, n=2):
    g = zarr.open_group(str(root), mode="w", zarr_format=3)
    g.attrs.update({"encoding-type": "annbatch-preshuffled", "encoding-version": "0.1.0"})
    adatas = []
    with ad.settings.override(zarr_write_format=3):
        for i in range(n):
            a = _adata(seed=10 + i, n_obs=40 + 7 * i)
            anndata.io.write_elem(g, f"dataset_{i}", a)
            adatas.append(a)
    zarr.consolidate_metadata(str(root))
    return adatas


def test_annbatch_collection_layout(tmp_path):
    adatas = _annbatch_collection(tmp_path / "coll.zarr")
    p = tmp_path / "coll.zarr"
    assert load_json(p / "dataset_1" / "zarr.json")["attributes"]["encoding-type"] == "anndata"
    doc = info(p)
    assert doc["layout"] == "annbatch-collection"
    assert doc["zarr_format"] == 3 and doc["consolidated"] is True
    nodes = by_path(doc)
    for i, a in enumerate(adatas):
        assert nodes[f"dataset_{i}"]["attributes"]["encoding-type"] == "anndata"
        assert nodes[f"dataset_{i}/X/data"]["shape"] == [a.X.nnz]
        assert nodes[f"dataset_{i}/X/indptr"]["shape"] == [a.n_obs + 1]
        np.testing.assert_array_equal(read(p, f"dataset_{i}/X/indices"), a.X.indices)
    check_arrays_against_zarr(p, doc)


# ------------------------------------------------------------------------------------------------
# The CLI
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cli_stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    stores = {}
    with ad.settings.override(zarr_write_format=3):
        _adata(seed=20).write_zarr(root / "anndata3.zarr")
    stores["anndata3"] = (root / "anndata3.zarr", "anndata")
    _adata(seed=21).write_zarr(root / "anndata2.zarr")
    stores["anndata2"] = (root / "anndata2.zarr", "anndata")
    _plain_group(root / "plain2", 2)
    stores["plain2"] = (root / "plain2", "plain")
    _plain_group(root / "plain3", 3)
    stores["plain3"] = (root / "plain3", "plain")
    _atomic_store(root / "atoms.zarr")
    stores["atomic"] = (root / "atoms.zarr", "atomic")
    _annbatch_collection(root / "coll.zarr")
    stores["annbatch"] = (root / "coll.zarr", "annbatch-collection")
    write_v3(root / "sharded", sample_data("int32", (50, 2), seed=22), (5, 2), shards=(25, 2))
    stores["sharded"] = (root / "sharded", "plain")
    return stores


CLI_STORES = ["anndata3", "anndata2", "plain2", "plain3", "atomic", "annbatch", "sharded"]


@pytest.mark.parametrize("name", CLI_STORES)
def test_cli_json_equals_python_info(cli_stores, name):
    path, layout = cli_stores[name]
    r = run_cli("info", path, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["layout"] == layout
    py = info(path)
    assert json_equal(doc, py), (doc, py)


def tree_paths(out):
    """Full node paths recovered from the human tree output: a "/" root line, then one line per
    node indented two spaces per level, groups ending in "/", arrays starting with their name."""
    paths, stack = {}, []
    for line in out.splitlines()[1:]:
        if not line.strip() or line.strip() == "/":
            continue
        indent = len(line) - len(line.lstrip(" "))
        token = line.split()[0]
        if token == "error:":
            continue
        depth = indent // 2 - 1
        del stack[depth:]
        name = token.rstrip("/")
        stack.append(name)
        paths["/".join(stack)] = "group" if token.endswith("/") else "array"
    return paths


@pytest.mark.parametrize("name", CLI_STORES)
def test_cli_human_output(cli_stores, name):
    path, layout = cli_stores[name]
    r = run_cli("info", path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert str(path) in out.splitlines()[0] and f"layout {layout}" in out.splitlines()[0]
    arrays = [p for p, t in walk_nodes(path).items() if t == "array" and p]
    assert arrays or name == "sharded"
    listed = tree_paths(out)
    for p in arrays:
        assert p in out or listed.get(p) == "array", f"array {p!r} missing from:\n{out}"
    for p, t in walk_nodes(path).items():
        if p:
            assert listed.get(p) == t, f"{t} {p!r} not listed as such in:\n{out}"
    if name == "sharded":
        assert "shards [25, 2]" in out and "chunks [5, 2]" in out


def test_cli_usage_errors():
    r = run_cli()
    assert r.returncode != 0 and r.returncode > 0 and r.stderr.strip()
    r = run_cli("info")
    assert r.returncode > 0 and r.stderr.strip()
