"""Reading Zarr v2 stores written by zarr-python 3.1 (zarr_format=2) with numcodecs 0.16.

The oracle is the numpy array that was written (and, as a cross-check of the fixture, zarr-python's
own read of it). FORMATS §1, §2 and §9 rows 5, 7-11.
"""
import math
import os
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import zarr
from zarr.core.dtype import VariableLengthUTF8

from conftest import (NUMERIC_DTYPES, assert_read_equal, chunk_files, info, load_json, read,
                      sample_data, string_data, write_json, write_v2, zarr_read)

# ------------------------------------------------------------------------------------------------
# Compressors
# ------------------------------------------------------------------------------------------------
COMPRESSORS = (
    [numcodecs.Blosc(cname=c, clevel=5, shuffle=s) for c in ("lz4", "zstd", "blosclz")
     for s in (0, 1, 2)]
    + [numcodecs.Blosc(cname="zlib", clevel=3, shuffle=1),
       numcodecs.Blosc(cname="lz4hc", clevel=9, shuffle=-1),
       numcodecs.Zstd(level=3),
       numcodecs.Zstd(level=1, checksum=True),  # zarr 3.1 writes "checksum": true into .zarray
       numcodecs.LZ4(),
       numcodecs.LZ4(acceleration=8),
       numcodecs.GZip(level=5),
       numcodecs.Zlib(level=1),
       None]
)


def _cid(c):
    if c is None:
        return "none"
    cfg = c.get_config()
    return "-".join(str(v) for k, v in sorted(cfg.items()) if k not in ("blocksize",))


FILL = {"float32": -1.0, "int64": -1, "uint16": 7, "bool": True, "float64": np.nan}


@pytest.mark.parametrize("dtype", ["float32", "int64", "uint16", "bool"])
@pytest.mark.parametrize("comp", COMPRESSORS, ids=_cid)
def test_compressor(tmp_path, comp, dtype):
    # FORMATS §9 row 5: a 5x6 array in 2x4 chunks, so chunks 0.1, 1.1 and 2.x are edge chunks.
    data = sample_data(dtype, (5, 6), seed=1)
    write_v2(tmp_path / "a", data, (2, 4), compressors=comp, fill_value=FILL[dtype])
    meta = load_json(tmp_path / "a" / ".zarray")
    if comp is None:
        assert meta["compressor"] is None
    else:
        assert meta["compressor"]["id"] == comp.codec_id
    assert len(chunk_files(tmp_path / "a")) == 6
    np.testing.assert_array_equal(zarr_read(tmp_path / "a"), data)  # fixture sanity
    assert_read_equal(read(tmp_path / "a"), data)


def test_spec_example_edge_chunk_padding(tmp_path):
    # FORMATS §1.5: chunk 2.1 is stored at full 2x4 size, padded with the fill value -1.
    data = np.arange(30, dtype="<f4").reshape(5, 6)
    write_v2(tmp_path / "a", data, (2, 4), compressors=None, fill_value=-1.0)
    raw = np.frombuffer((tmp_path / "a" / "2.1").read_bytes(), "<f4")
    np.testing.assert_array_equal(raw, [28, 29, -1, -1, -1, -1, -1, -1])
    assert_read_equal(read(tmp_path / "a"), data)
    # Poison the padding: the reader must never rely on it.
    (tmp_path / "a" / "2.1").write_bytes(
        np.array([28, 29, 99, 99, 99, 99, 99, 99], "<f4").tobytes())
    assert_read_equal(read(tmp_path / "a"), data)


def test_golden_prefixes_of_fixtures(tmp_path):
    # FORMATS §9 row 6: confirms what zarr-python 3.1 + numcodecs 0.16 put on disk, so the other
    # tests exercise the byte formats the engine was written against.
    data = np.arange(8, dtype="<f4")
    cases = {
        "blosc": (numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1), bytes.fromhex("02013304")),
        "zstd": (numcodecs.Zstd(level=1), bytes.fromhex("28b52ffd")),
        "lz4": (numcodecs.LZ4(), bytes.fromhex("20000000")),
        "gzip": (numcodecs.GZip(level=1), bytes.fromhex("1f8b08")),
        "zlib": (numcodecs.Zlib(level=1), bytes.fromhex("7801")),
    }
    for name, (comp, prefix) in cases.items():
        write_v2(tmp_path / name, data, (8,), compressors=comp)
        raw = (tmp_path / name / "0").read_bytes()
        assert raw.startswith(prefix), (name, raw[:8].hex())
        assert_read_equal(read(tmp_path / name), data)


# ------------------------------------------------------------------------------------------------
# dtypes
# ------------------------------------------------------------------------------------------------
DTYPE_COMPRESSORS = {
    "default": "auto",  # zarr 3.1's v2 default: {"id": "zstd", "level": 0}
    "blosc-shuffle": numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1),
    "blosc-bitshuffle": numcodecs.Blosc(cname="zstd", clevel=3, shuffle=2),
}


@pytest.mark.parametrize("comp", list(DTYPE_COMPRESSORS), ids=str)
@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
def test_dtype(tmp_path, dtype, comp):
    data1 = sample_data(dtype, (37,), seed=2)
    data2 = sample_data(dtype, (9, 7), seed=3)
    write_v2(tmp_path / "one", data1, (8,), compressors=DTYPE_COMPRESSORS[comp])
    write_v2(tmp_path / "two", data2, (4, 3), compressors=DTYPE_COMPRESSORS[comp])
    assert load_json(tmp_path / "one" / ".zarray")["dtype"] == np.dtype(dtype).str
    assert_read_equal(read(tmp_path / "one"), data1)
    assert_read_equal(read(tmp_path / "two"), data2)


@pytest.mark.parametrize("comp", [None, "auto", numcodecs.Blosc(cname="lz4", shuffle=1)],
                         ids=["none", "default", "blosc"])
def test_strings_dtype_str(tmp_path, comp):
    data = string_data((23,), seed=4)
    write_v2(tmp_path / "s", data, (5,), compressors=comp)
    meta = load_json(tmp_path / "s" / ".zarray")
    assert meta["dtype"] == "|O" and meta["filters"] == [{"id": "vlen-utf8"}]
    np.testing.assert_array_equal(zarr_read(tmp_path / "s"), data)
    assert_read_equal(read(tmp_path / "s"), data)


def test_strings_explicit_vlenutf8_filter(tmp_path):
    data = string_data((11,), seed=5)
    write_v2(tmp_path / "s", data, (4,), dtype=VariableLengthUTF8(),
             filters=[numcodecs.VLenUTF8()], compressors=numcodecs.Zlib(level=1))
    assert load_json(tmp_path / "s" / ".zarray")["filters"] == [{"id": "vlen-utf8"}]
    assert_read_equal(read(tmp_path / "s"), data)


def test_strings_edge_chunk_layout(tmp_path):
    # FORMATS §1.6: 5 items in chunks of 3; chunk 1 holds "dd", "e" and an empty overhang item.
    data = np.array(["a", "bb", "ccc", "dd", "e"])
    write_v2(tmp_path / "s", data, (3,), compressors=None)
    raw = (tmp_path / "s" / "1").read_bytes()
    assert raw == bytes.fromhex("03000000 02000000 6464 01000000 65 00000000")
    assert_read_equal(read(tmp_path / "s"), data)


def test_strings_2d(tmp_path):
    data = string_data((5, 4), seed=6)
    write_v2(tmp_path / "s", data, (2, 3))
    assert_read_equal(read(tmp_path / "s"), data)


def test_strings_missing_chunk_reads_empty(tmp_path):
    data = string_data((12,), seed=7)
    data[4:8] = ""  # the v2 string fill value zarr 3.1 writes is ""
    write_v2(tmp_path / "s", data, (4,), write_empty_chunks=False)
    assert load_json(tmp_path / "s" / ".zarray")["fill_value"] == ""
    assert chunk_files(tmp_path / "s") == ["0", "2"]
    assert_read_equal(read(tmp_path / "s"), data)


# ------------------------------------------------------------------------------------------------
# Dimensionality
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float64", "int32", "bool", "uint64", "float16"])
def test_zero_d(tmp_path, dtype):
    data = sample_data(dtype, (), seed=8)
    write_v2(tmp_path / "z", data, ())
    assert chunk_files(tmp_path / "z") == ["0"]
    got = read(tmp_path / "z")
    assert got.ndim == 0
    assert_read_equal(got, data)
    assert_read_equal(read(tmp_path / "z", "", 0, None), data)


def test_zero_d_missing_chunk_reads_fill(tmp_path):
    write_v2(tmp_path / "z", np.array(2.5), (), fill_value=2.5, write_empty_chunks=False)
    assert chunk_files(tmp_path / "z") == []
    assert_read_equal(read(tmp_path / "z"), np.array(2.5))


def test_zero_d_string(tmp_path):
    data = np.array("héllo wörld")
    write_v2(tmp_path / "z", data, ())
    assert_read_equal(read(tmp_path / "z"), data)


@pytest.mark.parametrize("shape,chunks", [
    ((37,), (10,)),
    ((9, 7), (4, 3)),
    ((5, 6, 7), (2, 4, 3)),
    ((3, 4, 5, 2), (2, 3, 2, 2)),
    ((6, 5), (6, 5)),  # one chunk
    ((6, 5), (10, 10)),  # chunk bigger than the array
    ((7, 1), (1, 1)),  # one element per chunk
])
def test_ndim_edge_chunks(tmp_path, shape, chunks):
    data = sample_data("float32", shape, seed=9)
    write_v2(tmp_path / "a", data, chunks, fill_value=-5.0)
    assert_read_equal(read(tmp_path / "a"), data)


def test_empty_dimension(tmp_path):
    data = np.zeros((0, 4), dtype="int16")
    write_v2(tmp_path / "a", data, (3, 2))
    assert_read_equal(read(tmp_path / "a"), data)


# ------------------------------------------------------------------------------------------------
# dimension_separator, order, byte order
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("comp", [None, numcodecs.Blosc(cname="lz4", shuffle=1)],
                         ids=["none", "blosc"])
def test_dimension_separator_slash(tmp_path, comp):
    data = sample_data("int32", (5, 6, 7), seed=10)
    write_v2(tmp_path / "a", data, (2, 4, 3), dimension_separator="/", compressors=comp)
    assert load_json(tmp_path / "a" / ".zarray")["dimension_separator"] == "/"
    assert (tmp_path / "a" / "2" / "1" / "2").is_file()
    assert_read_equal(read(tmp_path / "a"), data)


def test_dimension_separator_absent_means_dot(tmp_path):
    data = sample_data("int32", (5, 6), seed=11)
    write_v2(tmp_path / "a", data, (2, 4))
    meta = load_json(tmp_path / "a" / ".zarray")
    del meta["dimension_separator"]
    write_json(tmp_path / "a" / ".zarray", meta)
    assert_read_equal(read(tmp_path / "a"), data)


@pytest.mark.parametrize("shape,chunks", [((5, 6), (2, 4)), ((5, 6, 7), (2, 4, 3)),
                                          ((9,), (4,))])
@pytest.mark.parametrize("comp", [None, numcodecs.Zstd(level=1),
                                  numcodecs.Blosc(cname="lz4", shuffle=1)],
                         ids=["none", "zstd", "blosc"])
def test_order_f(tmp_path, shape, chunks, comp):
    data = sample_data("float64", shape, seed=12)
    write_v2(tmp_path / "f", data, chunks, order="F", compressors=comp, fill_value=-1.0)
    write_v2(tmp_path / "c", data, chunks, order="C", compressors=comp, fill_value=-1.0)
    assert load_json(tmp_path / "f" / ".zarray")["order"] == "F"
    if comp is None and len(shape) > 1:
        # fixture sanity: zarr 3.1 really writes the chunk column-major
        raw = np.frombuffer((tmp_path / "f" / ".".join("0" * len(shape))).read_bytes(), "<f8")
        block = data[tuple(slice(0, c) for c in chunks)]
        np.testing.assert_array_equal(raw, block.ravel(order="F"))
    assert_read_equal(read(tmp_path / "f"), data)
    assert_read_equal(read(tmp_path / "f"), read(tmp_path / "c"))


def test_order_f_strings(tmp_path):
    data = string_data((5, 4), seed=13)
    write_v2(tmp_path / "f", data, (2, 3), order="F")
    assert_read_equal(read(tmp_path / "f"), data)


@pytest.mark.parametrize("dtype", [">f8", ">i4", ">u2", ">i8", ">f4", ">f2", ">u8"])
@pytest.mark.parametrize("comp", [None, numcodecs.Blosc(cname="lz4", shuffle=1)],
                         ids=["none", "blosc"])
def test_big_endian(tmp_path, dtype, comp):
    data = sample_data(np.dtype(dtype).newbyteorder("="), (13, 3), seed=14).astype(dtype)
    write_v2(tmp_path / "a", data, (5, 2), compressors=comp)
    assert load_json(tmp_path / "a" / ".zarray")["dtype"] == dtype
    if comp is None:
        raw = (tmp_path / "a" / "0.0").read_bytes()
        assert raw == np.ascontiguousarray(data[:5, :2]).astype(dtype).tobytes()
    got = read(tmp_path / "a")
    assert got.dtype.byteorder in ("=", "<", "|")
    assert_read_equal(got, data)


# ------------------------------------------------------------------------------------------------
# Missing chunks and fill values
# ------------------------------------------------------------------------------------------------
def test_write_empty_chunks_false(tmp_path):
    data = np.arange(20, dtype="int32")
    data[4:8] = 3
    data[12:16] = 3
    write_v2(tmp_path / "a", data, (4,), fill_value=3, write_empty_chunks=False)
    assert chunk_files(tmp_path / "a") == ["0", "2", "4"]
    assert_read_equal(read(tmp_path / "a"), data)


def test_write_empty_chunks_false_2d(tmp_path):
    data = sample_data("float32", (9, 10), seed=15)
    data[4:8, 0:5] = -2.0
    data[8:, 5:] = -2.0  # an all-fill edge chunk
    write_v2(tmp_path / "a", data, (4, 5), fill_value=-2.0, write_empty_chunks=False)
    assert "1.0" not in chunk_files(tmp_path / "a") and "2.1" not in chunk_files(tmp_path / "a")
    assert_read_equal(read(tmp_path / "a"), data)


@pytest.mark.parametrize("comp", [None, numcodecs.Blosc(cname="zstd", shuffle=1)],
                         ids=["none", "blosc"])
def test_deleted_chunk_reads_fill(tmp_path, comp):
    data = sample_data("int16", (9, 10), seed=16)
    write_v2(tmp_path / "a", data, (4, 5), fill_value=-9, compressors=comp)
    os.remove(tmp_path / "a" / "1.0")
    os.remove(tmp_path / "a" / "2.1")
    expected = data.copy()
    expected[4:8, 0:5] = -9
    expected[8:, 5:] = -9
    np.testing.assert_array_equal(zarr_read(tmp_path / "a"), expected)
    assert_read_equal(read(tmp_path / "a"), expected)


def test_all_chunks_missing(tmp_path):
    write_v2(tmp_path / "a", np.zeros((7, 3), "f4"), (2, 2), fill_value=1.5, write=False)
    assert chunk_files(tmp_path / "a") == []
    assert_read_equal(read(tmp_path / "a"), np.full((7, 3), 1.5, "f4"))


FILL_CASES = [
    ("float64", np.nan, '"NaN"'),
    ("float32", np.inf, '"Infinity"'),
    ("float32", -np.inf, '"-Infinity"'),
    ("float16", np.nan, '"NaN"'),
    ("uint64", 2**64 - 1, "18446744073709551615"),
    ("int64", -(2**63), "-9223372036854775808"),
    ("int64", 2**63 - 1, "9223372036854775807"),
    ("uint32", 2**32 - 1, "4294967295"),
    ("int8", -128, "-128"),
    ("bool", True, "true"),
    ("float64", -0.0, "-0.0"),
    ("float64", 1e300, "1e+300"),
]


@pytest.mark.parametrize("dtype,fill,token", FILL_CASES,
                         ids=[f"{d}-{t}" for d, _, t in FILL_CASES])
def test_fill_value_with_missing_chunk(tmp_path, dtype, fill, token):
    data = sample_data(dtype, (10,), seed=17)
    write_v2(tmp_path / "a", data, (4,), fill_value=fill)
    text = (tmp_path / "a" / ".zarray").read_text()
    assert f'"fill_value": {token}' in text, text
    os.remove(tmp_path / "a" / "1")
    expected = data.copy()
    expected[4:8] = np.array(fill, dtype=dtype)
    np.testing.assert_array_equal(zarr_read(tmp_path / "a"), expected)
    assert_read_equal(read(tmp_path / "a"), expected)


def test_fill_value_null_reads_zeros(tmp_path):
    # FORMATS §1.3: null means "no fill value"; read it as zero bytes.
    data = np.arange(1, 11, dtype="int32")
    write_v2(tmp_path / "a", data, (4,))
    meta = load_json(tmp_path / "a" / ".zarray")
    meta["fill_value"] = None
    write_json(tmp_path / "a" / ".zarray", meta)
    os.remove(tmp_path / "a" / "1")
    expected = data.copy()
    expected[4:8] = 0
    assert_read_equal(read(tmp_path / "a"), expected)


def test_fill_value_bare_nan_token(tmp_path):
    # FORMATS §1.3 R: accept a bare NaN token as fill_value, not only the string form.
    data = np.arange(10, dtype="float64")
    write_v2(tmp_path / "a", data, (4,))
    text = (tmp_path / "a" / ".zarray").read_text()
    assert '"fill_value": 0.0' in text
    (tmp_path / "a" / ".zarray").write_text(text.replace('"fill_value": 0.0',
                                                         '"fill_value": NaN'))
    os.remove(tmp_path / "a" / "2")
    expected = data.copy()
    expected[8:] = np.nan
    assert_read_equal(read(tmp_path / "a"), expected)


def test_unknown_zarray_key_ignored(tmp_path):
    # FORMATS §1.1: unknown .zarray keys and unknown codec keys are ignored (§9 row 11).
    data = sample_data("float32", (9,), seed=18)
    write_v2(tmp_path / "a", data, (4,), compressors=numcodecs.Zlib(level=1))
    meta = load_json(tmp_path / "a" / ".zarray")
    meta["frobnicate"] = {"x": 1}
    meta["compressor"]["unknown_param"] = 42
    write_json(tmp_path / "a" / ".zarray", meta)
    assert_read_equal(read(tmp_path / "a"), data)


# ------------------------------------------------------------------------------------------------
# Attributes with NaN / Infinity, consolidated metadata
# ------------------------------------------------------------------------------------------------
def _node(doc, path):
    nodes = [n for n in doc["nodes"] if n["path"] == path]
    assert len(nodes) == 1, f"node {path!r} appears {len(nodes)} times in {doc['nodes']}"
    return nodes[0]


def test_nan_infinity_attributes(tmp_path):
    g = zarr.open_group(str(tmp_path / "g"), mode="w", zarr_format=2)
    g.attrs.update({"m": float("nan"), "p": float("inf"), "n": float("-inf"), "s": "x"})
    a = g.create_array("arr", shape=(4,), chunks=(2,), dtype="f4")
    a[:] = np.arange(4, dtype="f4")
    a.attrs["scale"] = float("nan")
    text = (tmp_path / "g" / ".zattrs").read_text()
    assert "NaN" in text and "-Infinity" in text and '"NaN"' not in text  # bare tokens
    doc = info(tmp_path / "g")
    attrs = _node(doc, "")["attributes"]
    assert math.isnan(attrs["m"]) and attrs["p"] == math.inf and attrs["n"] == -math.inf
    assert attrs["s"] == "x"
    assert math.isnan(_node(doc, "arr")["attributes"]["scale"])
    assert_read_equal(read(tmp_path / "g", "arr"), np.arange(4, dtype="f4"))


def _build_group(root):
    g = zarr.open_group(str(root), mode="w", zarr_format=2)
    g.attrs["title"] = "consolidated"
    sub = g.create_group("sub")
    sub.attrs["units"] = "m"
    deep = sub.create_group("deep")
    arrays = {
        "top": sample_data("float32", (10, 3), seed=19),
        "sub/ints": sample_data("int64", (17,), seed=20),
        "sub/deep/names": string_data((6,), seed=21),
    }
    for path, data in arrays.items():
        parent = {"top": g, "sub/ints": sub, "sub/deep/names": deep}[path]
        z = parent.create_array(path.rsplit("/", 1)[-1], shape=data.shape,
                                chunks=tuple(max(1, s // 2) for s in data.shape),
                                dtype=str if data.dtype.kind == "U" else data.dtype)
        z[...] = data
    return arrays


def test_consolidated_metadata(tmp_path):
    arrays = _build_group(tmp_path / "g")
    zarr.consolidate_metadata(str(tmp_path / "g"))
    zmeta = load_json(tmp_path / "g" / ".zmetadata")
    assert "sub/ints/.zarray" in zmeta["metadata"]
    doc = info(tmp_path / "g")
    assert doc["zarr_format"] == 2 and doc["consolidated"] is True
    paths = {n["path"]: n["type"] for n in doc["nodes"]}
    assert paths == {"": "group", "sub": "group", "sub/deep": "group", "top": "array",
                     "sub/ints": "array", "sub/deep/names": "array"}
    assert _node(doc, "sub")["attributes"] == {"units": "m"}
    assert _node(doc, "sub/ints")["shape"] == [17]
    for path, data in arrays.items():
        assert_read_equal(read(tmp_path / "g", path), data)


def test_consolidated_metadata_is_a_snapshot(tmp_path):
    # FORMATS §1.4 R: .zmetadata is used when present; later writes do not update it.
    _build_group(tmp_path / "g")
    zarr.consolidate_metadata(str(tmp_path / "g"))
    write_json(tmp_path / "g" / "sub" / ".zattrs", {"units": "changed-after-consolidation"})
    doc = info(tmp_path / "g")
    assert _node(doc, "sub")["attributes"] == {"units": "m"}


def test_not_consolidated(tmp_path):
    arrays = _build_group(tmp_path / "g")
    assert not (tmp_path / "g" / ".zmetadata").exists()
    doc = info(tmp_path / "g")
    assert doc["consolidated"] is False
    assert {n["path"] for n in doc["nodes"]} == {"", "sub", "sub/deep", *arrays}


def test_consolidated_nan_attributes(tmp_path):
    g = zarr.open_group(str(tmp_path / "g"), mode="w", zarr_format=2)
    a = g.create_array("arr", shape=(3,), dtype="i2")
    a[:] = [1, 2, 3]
    a.attrs["bad"] = float("nan")
    g.attrs["inf"] = float("inf")
    zarr.consolidate_metadata(str(tmp_path / "g"))
    assert "NaN" in (tmp_path / "g" / ".zmetadata").read_text()
    doc = info(tmp_path / "g")
    assert doc["consolidated"] is True
    assert math.isnan(_node(doc, "arr")["attributes"]["bad"])
    assert _node(doc, "")["attributes"]["inf"] == math.inf
    assert_read_equal(read(tmp_path / "g", "arr"), np.array([1, 2, 3], "i2"))


def test_uint64_max_fill_in_info(tmp_path):
    write_v2(tmp_path / "a", np.arange(6, dtype="u8"), (4,), fill_value=2**64 - 1)
    node = _node(info(tmp_path / "a"), "")
    assert node["fill_value"] == 2**64 - 1 and isinstance(node["fill_value"], int)
    os.remove(tmp_path / "a" / "1")
    assert_read_equal(read(tmp_path / "a"),
                      np.array([0, 1, 2, 3, 2**64 - 1, 2**64 - 1], "u8"))


# ------------------------------------------------------------------------------------------------
# Row ranges
# ------------------------------------------------------------------------------------------------
RANGES = [(0, None), (0, 23), (3, 9), (4, 8), (1, 22), (5, 6), (0, 1), (22, 23), (22, None),
          (7, 7), (0, 0), (23, 23), (23, None), (8, 20)]


@pytest.fixture(scope="module")
def range_stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("v2ranges")
    stores = {
        "int32-2d": (sample_data("int32", (23, 5), seed=30), (4, 3),
                     {"compressors": numcodecs.Blosc(cname="lz4", shuffle=1)}),
        "float64-3d-F": (sample_data("float64", (23, 3, 4), seed=31), (3, 2, 3),
                         {"order": "F", "compressors": numcodecs.GZip(level=1)}),
        "string-1d": (string_data((23,), seed=32), (4,), {}),
        "uint8-1d-slash": (sample_data("uint8", (23,), seed=33), (5,),
                           {"dimension_separator": "/", "compressors": numcodecs.LZ4()}),
        "bool-2d-missing": (np.zeros((23, 2), bool), (6, 2), {"write_empty_chunks": False}),
    }
    stores["bool-2d-missing"][0][13:15, 1] = True
    for name, (data, chunks, kw) in stores.items():
        write_v2(root / name, data, chunks, **kw)
    return root, {k: v[0] for k, v in stores.items()}


@pytest.mark.parametrize("start,stop", RANGES, ids=[f"{a}-{b}" for a, b in RANGES])
@pytest.mark.parametrize("name", ["int32-2d", "float64-3d-F", "string-1d", "uint8-1d-slash",
                                  "bool-2d-missing"])
def test_row_range(range_stores, name, start, stop):
    root, arrays = range_stores
    data = arrays[name]
    expected = data[start:stop]
    assert_read_equal(read(root / name, "", start, stop), expected)
    np.testing.assert_array_equal(zarr_read(root / name, start, stop), expected)


def test_row_range_keywords(range_stores, zb):
    root, arrays = range_stores
    got = zb.read_array(str(root / "int32-2d"), "", start=6, stop=11)
    assert_read_equal(got, arrays["int32-2d"][6:11])
    got = zb.read_array(str(root / "int32-2d"), "", stop=2)
    assert_read_equal(got, arrays["int32-2d"][:2])
    got = zb.read_array(str(root / "int32-2d"), "", start=19)
    assert_read_equal(got, arrays["int32-2d"][19:])


def test_every_single_row(range_stores):
    root, arrays = range_stores
    data = arrays["float64-3d-F"]
    for r in range(23):
        assert_read_equal(read(root / "float64-3d-F", "", r, r + 1), data[r:r + 1])


# ------------------------------------------------------------------------------------------------
# Array paths
# ------------------------------------------------------------------------------------------------
def test_array_path_forms(tmp_path):
    data = sample_data("int16", (6, 2), seed=40)
    g = zarr.open_group(str(tmp_path / "g"), mode="w", zarr_format=2)
    z = g.create_group("a").create_group("b").create_array("c", shape=data.shape, dtype="i2",
                                                           chunks=(4, 2))
    z[:] = data
    for p in ["a/b/c", "/a/b/c", "a/b/c/", "a//b/c"]:
        assert_read_equal(read(tmp_path / "g", p), data)
    # the same array opened as the store root
    assert_read_equal(read(tmp_path / "g" / "a" / "b" / "c", ""), data)
    assert_read_equal(read(tmp_path / "g" / "a" / "b" / "c", "/"), data)
    assert_read_equal(read(Path(tmp_path / "g" / "a") , "b/c"), data)
