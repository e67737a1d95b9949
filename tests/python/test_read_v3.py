"""Reading Zarr v3 stores written by zarr-python 3.1 and anndata 0.12.

Oracles: the numpy array written, zarr-python's own read (zarr.open_array(...)[start:stop]) and the
AnnData object. FORMATS §3, §4, §6 and §9 rows 20-32, 38-39.
"""
import os

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import zarr
import zarr.codecs as zc
import zarr.codecs.numcodecs as znc

from conftest import (MAX64, NUMERIC_DTYPES, assert_read_equal, chunk_files, load_json,
                      parse_shard_index, read, sample_data, string_data, write_json, write_v3,
                      zarr_read)

# ------------------------------------------------------------------------------------------------
# Codec chains
# ------------------------------------------------------------------------------------------------
CODEC_CASES = {}
for _cname in ("lz4", "zstd", "blosclz", "zlib"):
    for _sh in ("noshuffle", "shuffle", "bitshuffle"):
        CODEC_CASES[f"blosc-{_cname}-{_sh}"] = (
            {"compressors": [zc.BloscCodec(cname=_cname, clevel=5, shuffle=_sh)]}, ["blosc"])
CODEC_CASES.update({
    "blosc-lz4hc-typesize-default": ({"compressors": [zc.BloscCodec(cname="lz4hc")]}, ["blosc"]),
    "zstd": ({"compressors": [zc.ZstdCodec(level=3)]}, ["zstd"]),
    "zstd-checksum": ({"compressors": [zc.ZstdCodec(level=3, checksum=True)]}, ["zstd"]),
    "zstd-negative-level": ({"compressors": [zc.ZstdCodec(level=-3)]}, ["zstd"]),
    "gzip": ({"compressors": [zc.GzipCodec(level=6)]}, ["gzip"]),
    "crc32c": ({"compressors": [zc.Crc32cCodec()]}, ["crc32c"]),
    "zstd-crc32c": ({"compressors": [zc.ZstdCodec(level=1), zc.Crc32cCodec()]},
                    ["zstd", "crc32c"]),
    "crc32c-gzip": ({"compressors": [zc.Crc32cCodec(), zc.GzipCodec(level=1)]},
                    ["crc32c", "gzip"]),
    "none": ({"compressors": None}, []),
    "bytes-big": ({"serializer": zc.BytesCodec(endian="big"), "compressors": None}, []),
    "bytes-big-zstd": ({"serializer": zc.BytesCodec(endian="big"),
                        "compressors": [zc.ZstdCodec(level=1)]}, ["zstd"]),
    "transpose": ({"filters": [zc.TransposeCodec(order=(1, 0))]}, ["zstd"]),
    "transpose-blosc": ({"filters": [zc.TransposeCodec(order=(1, 0))],
                         "compressors": [zc.BloscCodec(cname="lz4", shuffle="shuffle")]},
                        ["blosc"]),
    "transpose-identity": ({"filters": [zc.TransposeCodec(order=(0, 1))]}, ["zstd"]),
    "numcodecs.lz4": ({"compressors": [znc.LZ4()]}, ["numcodecs.lz4"]),
    "numcodecs.zlib": ({"compressors": [znc.Zlib(level=1)]}, ["numcodecs.zlib"]),
    "numcodecs.zstd": ({"compressors": [znc.Zstd(level=3)]}, ["numcodecs.zstd"]),
    "numcodecs.gzip": ({"compressors": [znc.GZip(level=5)]}, ["numcodecs.gzip"]),
    "numcodecs.blosc": ({"compressors": [znc.Blosc(cname="zstd", clevel=3, shuffle=2)]},
                        ["numcodecs.blosc"]),
    # numcodecs.blosc with only cname given: zarr writes {"cname": "lz4"} and nothing else.
    "numcodecs.blosc-minimal": ({"compressors": [znc.Blosc(cname="lz4")]}, ["numcodecs.blosc"]),
})


@pytest.mark.parametrize("dtype", ["float32", "int16", "uint8"])
@pytest.mark.parametrize("case", list(CODEC_CASES))
def test_codec(tmp_path, case, dtype):
    kw, bb_names = CODEC_CASES[case]
    data = sample_data(dtype, (9, 7), seed=50)
    write_v3(tmp_path / "a", data, (4, 3), fill_value=np.array(3, dtype).item(), **kw)
    codecs = load_json(tmp_path / "a" / "zarr.json")["codecs"]
    names = [c["name"] for c in codecs]
    assert [n for n in names if n not in ("bytes", "transpose")] == bb_names, names
    assert len(chunk_files(tmp_path / "a")) == 9
    np.testing.assert_array_equal(zarr_read(tmp_path / "a"), data)
    assert_read_equal(read(tmp_path / "a"), data)


@pytest.mark.parametrize("order", [(2, 0, 1), (1, 2, 0), (2, 1, 0)])
def test_transpose_3d(tmp_path, order):
    data = sample_data("float64", (5, 6, 7), seed=51)
    write_v3(tmp_path / "t", data, (2, 4, 3), filters=[zc.TransposeCodec(order=order)],
             compressors=None)
    write_v3(tmp_path / "c", data, (2, 4, 3), compressors=None)
    cfg = load_json(tmp_path / "t" / "zarr.json")["codecs"][0]
    assert cfg == {"name": "transpose", "configuration": {"order": list(order)}}
    # fixture sanity: the stored chunk is the permuted block in C order
    raw = np.frombuffer((tmp_path / "t" / "c" / "0" / "0" / "0").read_bytes(), "<f8")
    np.testing.assert_array_equal(raw, data[:2, :4, :3].transpose(order).ravel())
    assert_read_equal(read(tmp_path / "t"), data)
    assert_read_equal(read(tmp_path / "t", "", 1, 4), read(tmp_path / "c", "", 1, 4))


def test_bytes_big_endian_on_disk(tmp_path):
    data = sample_data("int32", (10,), seed=52)
    write_v3(tmp_path / "a", data, (4,), serializer=zc.BytesCodec(endian="big"),
             compressors=None)
    assert (tmp_path / "a" / "c" / "0").read_bytes() == data[:4].astype(">i4").tobytes()
    assert_read_equal(read(tmp_path / "a"), data)


def test_crc32c_codec_on_disk(tmp_path):
    # FORMATS §3.4: input + u32le CRC32C of the input.
    from conftest import crc32c
    data = np.arange(6, dtype="<i4")
    write_v3(tmp_path / "a", data, (6,), compressors=[zc.Crc32cCodec()])
    raw = (tmp_path / "a" / "c" / "0").read_bytes()
    assert raw[:-4] == data.tobytes()
    assert int.from_bytes(raw[-4:], "little") == crc32c(data.tobytes())
    assert_read_equal(read(tmp_path / "a"), data)


def test_bare_string_codec_entry(tmp_path):
    # FORMATS §3.4 / §9 row 26: a codec given as a bare name string is accepted.
    data = sample_data("int32", (10,), seed=53)
    write_v3(tmp_path / "a", data, (4,), compressors=[zc.Crc32cCodec()])
    meta = load_json(tmp_path / "a" / "zarr.json")
    assert meta["codecs"][-1] == {"name": "crc32c"}
    meta["codecs"][-1] = "crc32c"
    write_json(tmp_path / "a" / "zarr.json", meta)
    assert_read_equal(read(tmp_path / "a"), data)


# ------------------------------------------------------------------------------------------------
# Chunk key encodings
# ------------------------------------------------------------------------------------------------
KEY_ENCODINGS = [
    ({"name": "default", "separator": "/"}, "c/2/1"),
    ({"name": "default", "separator": "."}, "c.2.1"),
    ({"name": "v2", "separator": "."}, "2.1"),
    ({"name": "v2", "separator": "/"}, "2/1"),
]


@pytest.mark.parametrize("enc,key", KEY_ENCODINGS, ids=[k for _, k in KEY_ENCODINGS])
def test_chunk_key_encoding(tmp_path, enc, key):
    data = sample_data("float32", (5, 6), seed=54)
    write_v3(tmp_path / "a", data, (2, 4), chunk_key_encoding=enc)
    assert (tmp_path / "a" / key).is_file(), chunk_files(tmp_path / "a")
    assert_read_equal(read(tmp_path / "a"), data)


@pytest.mark.parametrize("name,key", [("default", "c/2/1"), ("v2", "2.1")])
def test_chunk_key_encoding_without_separator(tmp_path, name, key):
    # FORMATS §3.3: a bare {"name": ...} takes the encoding's default separator.
    data = sample_data("int8", (5, 6), seed=55)
    sep = "/" if name == "default" else "."
    write_v3(tmp_path / "a", data, (2, 4), chunk_key_encoding={"name": name, "separator": sep})
    meta = load_json(tmp_path / "a" / "zarr.json")
    meta["chunk_key_encoding"] = {"name": name}
    write_json(tmp_path / "a" / "zarr.json", meta)
    assert (tmp_path / "a" / key).is_file()
    assert_read_equal(read(tmp_path / "a"), data)


# ------------------------------------------------------------------------------------------------
# dtypes, dimensionality, fill values
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", NUMERIC_DTYPES + ["string"])
def test_dtype(tmp_path, dtype):
    np_dtype = str if dtype == "string" else dtype
    data1 = sample_data(np_dtype, (37,), seed=56)
    data2 = sample_data(np_dtype, (9, 7), seed=57)
    write_v3(tmp_path / "one", data1, (8,))
    write_v3(tmp_path / "two", data2, (4, 3), compressors=[zc.BloscCodec(cname="lz4")]
             if dtype != "string" else "auto")
    assert load_json(tmp_path / "one" / "zarr.json")["data_type"] == dtype
    np.testing.assert_array_equal(zarr_read(tmp_path / "one"), data1)
    assert_read_equal(read(tmp_path / "one"), data1)
    assert_read_equal(read(tmp_path / "two"), data2)


def test_string_v3_equals_v2_twin(tmp_path):
    # FORMATS §9 row 28.
    data = string_data((13,), seed=58)
    write_v3(tmp_path / "v3", data, (4,))
    zarr.create_array(store=str(tmp_path / "v2"), shape=data.shape, chunks=(4,), dtype=str,
                      zarr_format=2)[:] = data
    assert_read_equal(read(tmp_path / "v3"), read(tmp_path / "v2"))
    assert_read_equal(read(tmp_path / "v3"), data)


@pytest.mark.parametrize("dtype", ["float64", "int16", "bool", "string"])
def test_zero_d(tmp_path, dtype):
    data = np.array("zero-d ✓") if dtype == "string" else sample_data(dtype, (), seed=59)
    write_v3(tmp_path / "z", data, ())
    assert chunk_files(tmp_path / "z") == ["c"]
    got = read(tmp_path / "z")
    assert got.ndim == 0
    assert_read_equal(got, data)


@pytest.mark.parametrize("shape,chunks", [((37,), (10,)), ((5, 6, 7), (2, 4, 3)),
                                          ((3, 4, 5, 2), (2, 3, 2, 2)), ((6, 5), (10, 10))])
def test_ndim_edge_chunks(tmp_path, shape, chunks):
    data = sample_data("float32", shape, seed=60)
    write_v3(tmp_path / "a", data, chunks, fill_value=-5.0)
    assert_read_equal(read(tmp_path / "a"), data)


FILL_CASES = [
    ("float64", np.nan, "NaN"),
    ("float32", -np.inf, "-Infinity"),
    ("float32", np.inf, "Infinity"),
    ("uint64", MAX64, MAX64),
    ("int64", -(2**63), -(2**63)),
    ("bool", True, True),
    ("int8", -7, -7),
    ("float16", 1.5, 1.5),
]


@pytest.mark.parametrize("dtype,fill,json_fill", FILL_CASES,
                         ids=[f"{d}-{j}" for d, _, j in FILL_CASES])
def test_fill_value_missing_chunks(tmp_path, dtype, fill, json_fill):
    data = sample_data(dtype, (10,), seed=61)
    data[4:8] = np.array(fill, dtype)  # an all-fill chunk: zarr 3.1 skips it by default
    write_v3(tmp_path / "a", data, (4,), fill_value=fill, write_empty_chunks=False)
    assert load_json(tmp_path / "a" / "zarr.json")["fill_value"] == json_fill
    assert "c/1" not in chunk_files(tmp_path / "a")
    assert_read_equal(read(tmp_path / "a"), data)


@pytest.mark.parametrize("hexfill,dtype,value", [
    ("0x7fc00000", "float32", np.float32(np.nan)),
    ("0x3fc00000", "float32", np.float32(1.5)),
    ("0xbff0000000000000", "float64", np.float64(-1.0)),
    ("0x3e00", "float16", np.float16(1.5)),
])
def test_fill_value_hex_form(tmp_path, hexfill, dtype, value):
    # FORMATS §3.2: "0x..." is the exact IEEE bit pattern.
    write_v3(tmp_path / "a", np.zeros(6, dtype), (3,), write=False)
    meta = load_json(tmp_path / "a" / "zarr.json")
    meta["fill_value"] = hexfill
    write_json(tmp_path / "a" / "zarr.json", meta)
    expected = np.full(6, value, dtype)
    np.testing.assert_array_equal(zarr_read(tmp_path / "a"), expected)
    got = read(tmp_path / "a")
    assert_read_equal(got, expected)
    assert got.view(f"u{np.dtype(dtype).itemsize}")[0] == int(hexfill, 16)


def test_missing_chunk_deleted_by_hand(tmp_path):
    data = sample_data("uint16", (9, 10), seed=62)
    write_v3(tmp_path / "a", data, (4, 5), fill_value=77)
    os.remove(tmp_path / "a" / "c" / "1" / "1")
    expected = data.copy()
    expected[4:8, 5:10] = 77
    assert_read_equal(read(tmp_path / "a"), expected)


def test_unknown_must_understand_false_key_ignored(tmp_path):
    # FORMATS §3.4: an extra top-level object with "must_understand": false is ignored.
    data = sample_data("int32", (7,), seed=63)
    write_v3(tmp_path / "a", data, (3,))
    meta = load_json(tmp_path / "a" / "zarr.json")
    meta["my_extension"] = {"must_understand": False, "x": 1}
    write_json(tmp_path / "a" / "zarr.json", meta)
    assert_read_equal(read(tmp_path / "a"), data)


def test_dimension_names_ignored(tmp_path):
    data = sample_data("float32", (4, 3), seed=64)
    write_v3(tmp_path / "a", data, (2, 2))
    meta = load_json(tmp_path / "a" / "zarr.json")
    meta["dimension_names"] = ["obs", None]
    write_json(tmp_path / "a" / "zarr.json", meta)
    assert_read_equal(read(tmp_path / "a"), data)


# ------------------------------------------------------------------------------------------------
# Sharding (zarr-python-written)
# ------------------------------------------------------------------------------------------------
SHARD_LAYOUTS = [
    ((100,), (8,), (32,)),  # last shard mostly outside the array
    ((37, 21), (4, 5), (8, 10)),
    ((64, 64), (32, 32), (64, 64)),  # the FORMATS §4.1 example geometry
    ((9, 6, 5), (3, 2, 5), (3, 4, 5)),
]


def _n_inner(chunks, shards):
    return int(np.prod([s // c for s, c in zip(shards, chunks)]))


@pytest.mark.parametrize("location", ["end", "start"])
@pytest.mark.parametrize("shape,chunks,shards", SHARD_LAYOUTS,
                         ids=["x".join(map(str, s)) for s, _, _ in SHARD_LAYOUTS])
def test_sharded(tmp_path, shape, chunks, shards, location):
    data = sample_data("float32", shape, seed=65)
    write_v3(tmp_path / "a", data, chunks, shards={"shape": shards, "index_location": location},
             compressors=[zc.ZstdCodec(level=1)])
    cfg = load_json(tmp_path / "a" / "zarr.json")["codecs"][0]
    assert cfg["name"] == "sharding_indexed"
    assert cfg["configuration"]["index_location"] == location
    n = _n_inner(chunks, shards)
    first = sorted(chunk_files(tmp_path / "a"))[0]
    entries = parse_shard_index((tmp_path / "a" / first).read_bytes(), n, location)
    assert len(entries) == n
    np.testing.assert_array_equal(zarr_read(tmp_path / "a"), data)
    assert_read_equal(read(tmp_path / "a"), data)


SHARD_INNER = {
    "bytes-only": [],
    "blosc": [zc.BloscCodec(cname="lz4", clevel=3, shuffle="shuffle")],
    "gzip": [zc.GzipCodec(level=1)],
    "zstd-crc32c": [zc.ZstdCodec(level=1), zc.Crc32cCodec()],
}


@pytest.mark.parametrize("inner", list(SHARD_INNER))
def test_sharding_codec_as_serializer(tmp_path, inner):
    data = sample_data("int64", (40, 6), seed=66)
    codec = zc.ShardingCodec(chunk_shape=(5, 3),
                             codecs=[zc.BytesCodec(endian="little"), *SHARD_INNER[inner]],
                             index_codecs=[zc.BytesCodec(endian="little"), zc.Crc32cCodec()],
                             index_location="start")
    write_v3(tmp_path / "a", data, (20, 6), serializer=codec, compressors=None)
    assert chunk_files(tmp_path / "a") == ["c/0/0", "c/1/0"]
    assert_read_equal(read(tmp_path / "a"), data)
    assert_read_equal(read(tmp_path / "a", "", 17, 23), data[17:23])


def test_sharding_index_without_crc32c(tmp_path):
    # FORMATS §4.1 R: index chains of bytes(little) with an optional crc32c.
    data = sample_data("uint32", (24,), seed=67)
    codec = zc.ShardingCodec(chunk_shape=(4,), codecs=[zc.BytesCodec(endian="little")],
                             index_codecs=[zc.BytesCodec(endian="little")])
    write_v3(tmp_path / "a", data, (12,), serializer=codec, compressors=None)
    shard = (tmp_path / "a" / "c" / "0").read_bytes()
    assert len(shard) == 3 * 16 + 12 * 4
    assert_read_equal(read(tmp_path / "a"), data)


def test_sharding_followed_by_whole_shard_compressor(tmp_path):
    # zarr 3.1 quirk: ShardingCodec passed as `serializer` keeps the default compressor, which
    # then compresses the whole shard (sharding_indexed, then zstd). Valid v3.
    data = sample_data("int32", (64, 8), seed=68)
    codec = zc.ShardingCodec(chunk_shape=(8, 8))
    write_v3(tmp_path / "a", data, (32, 8), serializer=codec)
    names = [c["name"] for c in load_json(tmp_path / "a" / "zarr.json")["codecs"]]
    assert names == ["sharding_indexed", "zstd"]
    np.testing.assert_array_equal(zarr_read(tmp_path / "a"), data)
    assert_read_equal(read(tmp_path / "a"), data)


@pytest.mark.parametrize("location", ["end", "start"])
def test_sharded_partly_empty_and_missing_shards(tmp_path, location):
    fill = -7
    data = sample_data("int16", (64, 10), seed=69)
    data[8:16, :5] = fill      # one empty inner chunk in shard 0
    data[16:32, :] = fill      # shard 1 wholly fill: not written
    data[32:40, :] = fill      # shard 2: first two inner chunks empty
    data[56:64, 5:] = fill     # shard 3: last inner chunk empty
    write_v3(tmp_path / "a", data, (8, 5), shards={"shape": (16, 10), "index_location": location},
             fill_value=fill, write_empty_chunks=False)
    files = chunk_files(tmp_path / "a")
    assert files == ["c/0/0", "c/2/0", "c/3/0"], files
    idx0 = parse_shard_index((tmp_path / "a" / "c/0/0").read_bytes(), 4, location)
    assert idx0[2] == (MAX64, MAX64) and all(e != (MAX64, MAX64) for i, e in enumerate(idx0)
                                             if i != 2)
    idx2 = parse_shard_index((tmp_path / "a" / "c/2/0").read_bytes(), 4, location)
    assert idx2[0] == idx2[1] == (MAX64, MAX64)
    np.testing.assert_array_equal(zarr_read(tmp_path / "a"), data)
    assert_read_equal(read(tmp_path / "a"), data)
    for start, stop in [(0, 16), (10, 40), (16, 32), (31, 33), (60, 64)]:
        assert_read_equal(read(tmp_path / "a", "", start, stop), data[start:stop])


def test_sharded_all_missing(tmp_path):
    write_v3(tmp_path / "a", np.zeros((50, 3), "f8"), (5, 3), shards=(10, 3), fill_value=2.25,
             write=False)
    assert chunk_files(tmp_path / "a") == []
    assert_read_equal(read(tmp_path / "a"), np.full((50, 3), 2.25))


@pytest.mark.parametrize("dtype", ["string", "bool", "uint64", "float16"])
def test_sharded_dtypes(tmp_path, dtype):
    np_dtype = str if dtype == "string" else dtype
    data = sample_data(np_dtype, (45,), seed=70)
    write_v3(tmp_path / "a", data, (4,), shards=(16,))
    assert load_json(tmp_path / "a" / "zarr.json")["codecs"][0]["name"] == "sharding_indexed"
    np.testing.assert_array_equal(zarr_read(tmp_path / "a"), data)
    assert_read_equal(read(tmp_path / "a"), data)
    assert_read_equal(read(tmp_path / "a", "", 14, 35), data[14:35])


@pytest.fixture(scope="module")
def sharded_range_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded_ranges") / "a"
    data = sample_data("float64", (100, 3), seed=71)
    write_v3(root, data, (4, 3), shards=(32, 3), compressors=[zc.BloscCodec(cname="zstd")])
    return root, data


@pytest.mark.parametrize("start,stop", [(0, None), (0, 1), (15, 17), (31, 64), (63, 97),
                                        (99, 100), (50, 50), (100, None), (7, 93)])
def test_sharded_row_ranges(sharded_range_store, start, stop):
    root, data = sharded_range_store
    np.testing.assert_array_equal(zarr_read(root, start, stop), data[start:stop])
    assert_read_equal(read(root, "", start, stop), data[start:stop])


# ------------------------------------------------------------------------------------------------
# Row ranges on plain v3 arrays
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("start,stop", [(0, None), (3, 9), (4, 8), (5, 6), (22, None), (7, 7),
                                        (23, 23), (0, 0), (1, 22)])
@pytest.mark.parametrize("kind", ["int32", "string", "transposed"])
def test_row_ranges(tmp_path, kind, start, stop):
    if kind == "string":
        data = string_data((23,), seed=72)
        write_v3(tmp_path / "a", data, (4,))
    elif kind == "transposed":
        data = sample_data("float32", (23, 5), seed=73)
        write_v3(tmp_path / "a", data, (4, 3), filters=[zc.TransposeCodec(order=(1, 0))])
    else:
        data = sample_data("int32", (23, 5, 2), seed=74)
        write_v3(tmp_path / "a", data, (4, 3, 2), chunk_key_encoding={"name": "v2",
                                                                      "separator": "."})
    assert_read_equal(read(tmp_path / "a", "", start, stop), data[start:stop])


# ------------------------------------------------------------------------------------------------
# anndata 0.12
# ------------------------------------------------------------------------------------------------
def _make_adata():
    rng = np.random.default_rng(80)
    n_obs, n_vars = 120, 30
    X = sp.random(n_obs, n_vars, density=0.15, format="csr", dtype="float32", random_state=81)
    obs = pd.DataFrame({
        "ct": pd.Categorical(rng.choice(["B cell", "T cell", "NK", "mono"], n_obs)),
        "batch": pd.Categorical(rng.choice(["b1", "b2"], n_obs), categories=["b2", "b1"]),
        "n_genes": rng.integers(0, 5000, n_obs).astype("int64"),
        "score": rng.standard_normal(n_obs).astype("float64"),
        "small": rng.integers(-100, 100, n_obs).astype("int16"),
    }, index=[f"cell_{i:04d}" for i in range(n_obs)])
    var = pd.DataFrame({"means": rng.random(n_vars).astype("float32")},
                       index=[f"gene-{i}" for i in range(n_vars)])
    a = ad.AnnData(X=X, obs=obs, var=var)
    a.obsm["emb"] = rng.standard_normal((n_obs, 5)).astype("float32")
    a.layers["counts"] = rng.integers(0, 9, (n_obs, n_vars)).astype("int32")
    return a


ANNDATA_VARIANTS = {
    "v2-default": {},
    "v3": {"zarr_write_format": 3},
    "v3-sharded-min-dtype": {"zarr_write_format": 3, "auto_shard_zarr_v3": True,
                             "write_csr_csc_indices_with_min_possible_dtype": True},
}


@pytest.fixture(scope="module")
def anndata_stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("anndata")
    adata = _make_adata()
    paths = {}
    for name, settings in ANNDATA_VARIANTS.items():
        paths[name] = root / f"{name}.zarr"
        with ad.settings.override(**settings):
            adata.write_zarr(paths[name])
    return adata, paths


@pytest.mark.parametrize("variant", list(ANNDATA_VARIANTS))
def test_anndata_format_on_disk(anndata_stores, variant):
    _, paths = anndata_stores
    p = paths[variant]
    if variant == "v2-default":
        assert (p / ".zgroup").is_file() and (p / ".zmetadata").is_file()
        assert load_json(p / "X" / "data" / ".zarray")["compressor"]["id"] == "blosc"
    else:
        assert load_json(p / "zarr.json")["consolidated_metadata"]["kind"] == "inline"
        codecs = load_json(p / "X" / "data" / "zarr.json")["codecs"]
        assert (codecs[0]["name"] == "sharding_indexed") == (variant == "v3-sharded-min-dtype")


@pytest.mark.parametrize("variant", list(ANNDATA_VARIANTS))
def test_anndata_csr(anndata_stores, variant):
    adata, paths = anndata_stores
    p = paths[variant]
    X = adata.X
    data = read(p, "X/data")
    indices = read(p, "X/indices")
    indptr = read(p, "X/indptr")
    assert_read_equal(data, X.data)
    np.testing.assert_array_equal(indices, X.indices)
    np.testing.assert_array_equal(indptr, X.indptr)
    for name, got in [("indices", indices), ("indptr", indptr)]:
        assert got.dtype == zarr_read(p / "X" / name).dtype
    if variant == "v3-sharded-min-dtype":
        assert indices.dtype == np.uint8  # 30 vars: anndata 0.12 picks the smallest unsigned
    rebuilt = sp.csr_matrix((data, indices, indptr), shape=X.shape)
    np.testing.assert_array_equal(rebuilt.toarray(), X.toarray())
    # a row range of indptr and the matching element range of data
    r0, r1 = 17, 64
    ip = read(p, "X/indptr", r0, r1 + 1)
    np.testing.assert_array_equal(ip, X.indptr[r0:r1 + 1])
    assert_read_equal(read(p, "X/data", int(ip[0]), int(ip[-1])), X.data[ip[0]:ip[-1]])


@pytest.mark.parametrize("variant", list(ANNDATA_VARIANTS))
def test_anndata_obs_var(anndata_stores, variant):
    adata, paths = anndata_stores
    p = paths[variant]
    back = ad.read_zarr(p)
    assert_read_equal(read(p, "obs/_index"), np.asarray(adata.obs_names, dtype=str))
    assert_read_equal(read(p, "var/_index"), np.asarray(adata.var_names, dtype=str))
    for col in ("ct", "batch"):
        codes = read(p, f"obs/{col}/codes")
        np.testing.assert_array_equal(codes, adata.obs[col].cat.codes.to_numpy())
        assert codes.dtype.kind == "i"
        cats = read(p, f"obs/{col}/categories")
        assert_read_equal(cats, np.asarray(adata.obs[col].cat.categories, dtype=str))
        assert_read_equal(cats, np.asarray(back.obs[col].cat.categories, dtype=str))
        labels = cats[codes]
        np.testing.assert_array_equal(labels, adata.obs[col].astype(str).to_numpy())
    for col in ("n_genes", "score", "small"):
        assert_read_equal(read(p, f"obs/{col}"), adata.obs[col].to_numpy())
    assert_read_equal(read(p, "var/means"), adata.var["means"].to_numpy())
    assert_read_equal(read(p, "obs/score", 100, 120), adata.obs["score"].to_numpy()[100:120])


@pytest.mark.parametrize("variant", list(ANNDATA_VARIANTS))
def test_anndata_dense(anndata_stores, variant):
    adata, paths = anndata_stores
    p = paths[variant]
    assert_read_equal(read(p, "obsm/emb"), adata.obsm["emb"])
    assert_read_equal(read(p, "layers/counts"), adata.layers["counts"])
    assert_read_equal(read(p, "layers/counts", 5, 9), adata.layers["counts"][5:9])


@pytest.mark.parametrize("variant", list(ANNDATA_VARIANTS))
def test_anndata_raw_null_scalar(anndata_stores, variant):
    # anndata 0.12 writes `raw` (None) as a 0-d bool array with encoding-type "null" and no chunk
    # (the single chunk equals the fill value false, so zarr 3.1 skips it).
    _, paths = anndata_stores
    p = paths[variant]
    assert chunk_files(p / "raw") == []
    got = read(p, "raw")
    assert got.shape == () and got.dtype == np.bool_ and not bool(got)
