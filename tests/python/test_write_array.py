"""Arrays written by zbatch, read by zarr-python 3.1 (the oracle) and by zbatch itself.

Covers FORMATS §9 rows 17-19 (v2 output within numcodecs 0.11's accepted key sets, zstd frames
with a content size, full-size fill-padded edge chunks) and row 36 (zbatch-written shards, both
index locations, empty entries, no all-empty shard), plus every dtype, strings and
write_empty_chunks. The expected values are always the numpy array that was written.
"""
import json

import numcodecs
import numpy as np
import pytest
import zarr

from conftest import (MAX64, NUMERIC_DTYPES, assert_read_equal, chunk_files, expect_error,
                      load_json, parse_shard_index, read, sample_data, string_data, zarr_read,
                      zbatch_api)

CODECS = ["none", "zstd:3", "zstd:-2", "lz4", "lz4:4", "gzip:5", "zlib:1", "blosc",
          "blosc:lz4:5:shuffle", "blosc:zstd:3:bitshuffle", "blosc:blosclz:9:noshuffle",
          "blosc:lz4hc:4:shuffle", "blosc:zlib:1:shuffle"]

# numcodecs 0.11's get_config key sets: anything more is a TypeError there (FORMATS §2.1).
V2_KEYS = {"blosc": {"id", "cname", "clevel", "shuffle", "blocksize"},
           "zstd": {"id", "level"}, "lz4": {"id", "acceleration"},
           "gzip": {"id", "level"}, "zlib": {"id", "level"}}


def write(store, path, data, **kw):
    """zbatch.write_array into a fresh store directory."""
    store.mkdir(parents=True, exist_ok=True)
    zbatch_api().write_array(str(store), path, data, **kw)
    return store / path if path else store


def zarr_equal(array_dir, data):
    """zarr-python's read of the whole array equals `data` (and so does zbatch's)."""
    assert_read_equal(zarr_read(array_dir), data)


def zbatch_equal(store, path, data):
    assert_read_equal(read(store, path), data)


# ------------------------------------------------------------------------------------------------
# Codecs, both formats
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("codec", CODECS)
def test_every_codec_reads_back_in_zarr_python(tmp_path, zarr_format, codec):
    data = sample_data("float32", (29, 6), seed=1)
    adir = write(tmp_path / "s.zarr", "a", data, chunks=8, codec=codec, zarr_format=zarr_format)
    zarr_equal(adir, data)
    zbatch_equal(tmp_path / "s.zarr", "a", data)
    # 29 rows in chunks of 8: four chunks, the last one full-size (FORMATS §1.5)
    keys = chunk_files(adir)
    assert keys == (["0.0", "1.0", "2.0", "3.0"] if zarr_format == 2 else
                    ["c/0/0", "c/1/0", "c/2/0", "c/3/0"])
    z = zarr.open_array(str(adir), mode="r")
    if codec == "none":
        raw = (adir / keys[-1]).read_bytes()
        assert len(raw) == 8 * 6 * 4
        tail = np.frombuffer(raw, dtype="<f4").reshape(8, 6)[5:]
        assert (tail == 0).all() and not np.signbit(tail).any()
    if zarr_format == 2:
        comp = load_json(adir / ".zarray")["compressor"]
        if codec == "none":
            assert comp is None
        else:
            assert set(comp) == V2_KEYS[comp["id"]], comp
            numcodecs.get_codec(comp)
    else:
        assert z.metadata.zarr_format == 3


def test_v2_zarray_document(tmp_path):
    data = sample_data("int16", (10, 3))
    adir = write(tmp_path / "s.zarr", "g/a", data, chunks=4, codec="blosc:lz4:5:shuffle",
                 zarr_format=2, attributes={"units": "m"})
    doc = load_json(adir / ".zarray")
    assert doc == {"chunks": [4, 3],
                   "compressor": {"blocksize": 0, "clevel": 5, "cname": "lz4", "id": "blosc",
                                  "shuffle": 1},
                   "dimension_separator": ".", "dtype": "<i2", "fill_value": 0,
                   "filters": None, "order": "C", "shape": [10, 3], "zarr_format": 2}
    assert load_json(adir / ".zattrs") == {"units": "m"}
    assert zarr.open_array(str(adir), mode="r").attrs.asdict() == {"units": "m"}


def test_v3_zstd_checksum_and_v2_refusal(tmp_path):
    data = sample_data("float64", (20,))
    adir = write(tmp_path / "s.zarr", "a", data, chunks=6, codec="zstd:2:checksum")
    codecs = load_json(adir / "zarr.json")["codecs"]
    assert codecs[1] == {"name": "zstd", "configuration": {"level": 2, "checksum": True}}
    zarr_equal(adir, data)
    # numcodecs 0.11 rejects a "checksum" key, so v2 cannot have it (FORMATS §2.1)
    with expect_error("ZB_E_INVALID", "checksum"):
        write(tmp_path / "t.zarr", "a", data, chunks=6, codec="zstd:2:checksum", zarr_format=2)
    assert not (tmp_path / "t.zarr" / "a" / ".zarray").exists()


def test_v3_numcodecs_ids_for_zlib_and_lz4(tmp_path):
    data = sample_data("uint32", (17,))
    for codec, entry in [("zlib:4", {"name": "numcodecs.zlib", "configuration": {"level": 4}}),
                         ("lz4:2", {"name": "numcodecs.lz4",
                                    "configuration": {"acceleration": 2}})]:
        adir = write(tmp_path / codec.replace(":", "_"), "a", data, chunks=5, codec=codec)
        assert load_json(adir / "zarr.json")["codecs"][1] == entry
        zarr_equal(adir, data)


# ------------------------------------------------------------------------------------------------
# zstd frames carry their content size (numcodecs 0.11 cannot decode them otherwise)
# ------------------------------------------------------------------------------------------------
def zstd_frame_content_size(buf):
    """Frame_Content_Size from an RFC 8878 frame header, or None when the frame has none."""
    assert buf[:4] == b"\x28\xb5\x2f\xfd", buf[:4].hex()
    fhd = buf[4]
    fcs_flag, single = fhd >> 6, (fhd >> 5) & 1
    did_flag = fhd & 3
    pos = 5 + (0 if single else 1) + [0, 1, 2, 4][did_flag]
    size = [1 if single else 0, 2, 4, 8][fcs_flag]
    if size == 0:
        return None
    v = int.from_bytes(buf[pos:pos + size], "little")
    return v + 256 if size == 2 else v


@pytest.mark.parametrize("rows", [5, 100, 70000])
def test_v2_zstd_frames_declare_content_size(tmp_path, rows):
    data = np.arange(rows * 3, dtype="<f4").reshape(rows, 3)
    adir = write(tmp_path / "s.zarr", "a", data, chunks=max(1, rows // 2), codec="zstd:3",
                 zarr_format=2)
    chunk_bytes = max(1, rows // 2) * 3 * 4
    for key in chunk_files(adir):
        assert zstd_frame_content_size((adir / key).read_bytes()) == chunk_bytes
    zarr_equal(adir, data)


# ------------------------------------------------------------------------------------------------
# dtypes and fill values
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
def test_every_dtype(tmp_path, zarr_format, dtype):
    data = sample_data(dtype, (23, 2), seed=3)
    adir = write(tmp_path / "s.zarr", "a", data, chunks=5, codec="zstd:1",
                 zarr_format=zarr_format)
    zarr_equal(adir, data)
    zbatch_equal(tmp_path / "s.zarr", "a", data)


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("dtype,fill", [("float32", np.nan), ("float64", -np.inf),
                                        ("float32", -0.0), ("float64", 0.1),
                                        ("float16", 1.5), ("uint64", 2**64 - 1),
                                        ("int64", -2**63), ("bool", True), ("int8", -7)])
def test_fill_values_pad_edge_chunks(tmp_path, zarr_format, dtype, fill):
    data = sample_data(dtype, (7,), seed=4)
    adir = write(tmp_path / "s.zarr", "a", data, chunks=5, codec="none",
                 zarr_format=zarr_format, fill_value=fill)
    z = zarr.open_array(str(adir), mode="r")
    want = np.array(fill, dtype=dtype)
    got = np.asarray(z.fill_value, dtype=dtype)
    assert got.tobytes() == want.tobytes(), (z.fill_value, fill)
    zarr_equal(adir, data)
    # the stored edge chunk holds the fill past row 7
    edge = adir / ("1" if zarr_format == 2 else "c/1")
    pad = np.frombuffer(edge.read_bytes(), dtype=np.dtype(dtype).newbyteorder("<"))[2:]
    assert pad.tobytes() == np.full(3, want).astype(np.dtype(dtype).newbyteorder("<")).tobytes()
    doc_key = ".zarray" if zarr_format == 2 else "zarr.json"
    doc = load_json(adir / doc_key)
    if dtype.startswith("float") and not np.isfinite(fill):
        assert doc["fill_value"] == ("NaN" if np.isnan(fill) else
                                     "Infinity" if fill > 0 else "-Infinity")


# ------------------------------------------------------------------------------------------------
# Strings
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("codec", ["none", "zstd:1", "blosc:lz4:5:shuffle", "gzip:1"])
def test_strings(tmp_path, zarr_format, codec):
    data = string_data((41,), seed=5)
    adir = write(tmp_path / "s.zarr", "obs/_index", data, chunks=6, codec=codec,
                 zarr_format=zarr_format)
    zarr_equal(adir, data)
    zbatch_equal(tmp_path / "s.zarr", "obs/_index", data)
    if zarr_format == 2:
        doc = load_json(adir / ".zarray")
        assert doc["dtype"] == "|O" and doc["filters"] == [{"id": "vlen-utf8"}]
    else:
        doc = load_json(adir / "zarr.json")
        assert doc["data_type"] == "string" and doc["codecs"][0]["name"] == "vlen-utf8"


def test_string_edge_chunk_layout(tmp_path):
    # FORMATS §1.6: 5 items in chunks of 3; chunk 1 is n_items 3 with "" in the overhang
    data = np.array(["a", "bb", "c", "dd", "e"])
    adir = write(tmp_path / "s.zarr", "a", data, chunks=3, codec="none", zarr_format=2)
    assert (adir / "1").read_bytes() == bytes.fromhex("03000000 02000000 6464 01000000 65 "
                                                      "00000000")
    zarr_equal(adir, data)


# ------------------------------------------------------------------------------------------------
# Sharding
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("location", ["end", "start"])
@pytest.mark.parametrize("codec", ["zstd:1", "blosc:lz4:3:shuffle", "none", "gzip:1"])
def test_sharded(tmp_path, location, codec):
    data = sample_data("float32", (53, 4), seed=6)
    adir = write(tmp_path / "s.zarr", "X", data, chunks=5, shards=20, codec=codec,
                 shard_index_location=location)
    zarr_equal(adir, data)
    zbatch_equal(tmp_path / "s.zarr", "X", data)
    doc = load_json(adir / "zarr.json")
    assert doc["chunk_grid"]["configuration"]["chunk_shape"] == [20, 4]
    cfg = doc["codecs"][0]["configuration"]
    assert doc["codecs"][0]["name"] == "sharding_indexed"
    assert cfg["chunk_shape"] == [5, 4] and cfg["index_location"] == location
    assert cfg["index_codecs"] == [{"name": "bytes", "configuration": {"endian": "little"}},
                                   {"name": "crc32c"}]
    assert chunk_files(adir) == ["c/0/0", "c/1/0", "c/2/0"]
    n = 4
    for key in chunk_files(adir):
        shard = (adir / key).read_bytes()
        entries = parse_shard_index(shard, n, location)
        lo = 16 * n + 4 if location == "start" else 0
        hi = len(shard) - (16 * n + 4 if location == "end" else 0)
        for off, nb in entries:
            if (off, nb) != (MAX64, MAX64):
                assert lo <= off and off + nb <= hi
    # the last shard holds rows 40..52: inner chunks 0-2; chunk 3 lies past the array
    last = parse_shard_index((adir / "c/2/0").read_bytes(), n, location)
    assert last[3] == (MAX64, MAX64) and all(e != (MAX64, MAX64) for e in last[:3])


def test_sharded_write_empty_chunks_false(tmp_path):
    data = np.zeros((60, 2), dtype="<f4")
    data[25:27] = 3.5
    adir = write(tmp_path / "s.zarr", "X", data, chunks=5, shards=20, codec="zstd:1",
                 write_empty_chunks=False)
    # shards 0 and 2 are all fill and are not written; shard 1 has one inner chunk
    assert chunk_files(adir) == ["c/1/0"]
    entries = parse_shard_index((adir / "c/1/0").read_bytes(), 4, "end")
    assert [e == (MAX64, MAX64) for e in entries] == [True, False, True, True]
    zarr_equal(adir, data)
    zbatch_equal(tmp_path / "s.zarr", "X", data)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_write_empty_chunks_false(tmp_path, zarr_format):
    data = np.full((30,), -1, dtype="<i4")
    data[12] = 5
    adir = write(tmp_path / "s.zarr", "a", data, chunks=5, codec="lz4", fill_value=-1,
                 write_empty_chunks=False, zarr_format=zarr_format)
    assert chunk_files(adir) == (["2"] if zarr_format == 2 else ["c/2"])
    zarr_equal(adir, data)


# ------------------------------------------------------------------------------------------------
# Attributes and threads
# ------------------------------------------------------------------------------------------------
def test_attributes_and_threads(tmp_path):
    data = sample_data("float32", (1000, 8), seed=7)
    attrs = {"encoding-type": "array", "encoding-version": "0.2.0", "n": [1, 2, 3]}
    outs = []
    for threads in (1, 4):
        adir = write(tmp_path / f"t{threads}.zarr", "a", data, chunks=37, codec="blosc",
                     num_threads=threads, attributes=attrs)
        outs.append({k: (adir / k).read_bytes() for k in chunk_files(adir)})
        z = zarr.open_array(str(adir), mode="r")
        assert z.attrs.asdict() == attrs
        zarr_equal(adir, data)
    assert outs[0] == outs[1]
    assert json.loads((tmp_path / "t1.zarr/a/zarr.json").read_text())["attributes"] == attrs


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_readme_example_in_a_fresh_directory(tmp_path, zarr_format):
    """write_array into a store that does not exist yet: the directory, the root group and the
    groups above the array are made, so zarr-python opens the store and finds the array."""
    import zarr
    store = tmp_path / "new" / "out.zarr"
    x = np.arange(10.0)
    zbatch_api().write_array(str(store), "x", x, chunks=4, codec="zstd:3",
                             zarr_format=zarr_format)
    zbatch_api().write_array(str(store), "g/h/y", x * 2, chunks=4, zarr_format=zarr_format)
    root = zarr.open_group(str(store), mode="r")
    np.testing.assert_array_equal(root["x"][:], x)
    np.testing.assert_array_equal(root["g"]["h"]["y"][:], x * 2)
    assert sorted(k for k, _ in root.members(max_depth=None)) == ["g", "g/h", "g/h/y", "x"]
