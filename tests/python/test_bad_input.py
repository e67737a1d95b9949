"""Hostile input: every malformed store fails with its own status and a message naming the key,
through zbatch.read_array / zbatch.info and, for metadata errors, through `zbatch info` (exit 1,
a stderr message, no crash signal). FORMATS §1-§5, §9 rows 2-3, 10, 13-15, 22, 24-25, 33.
"""
import json
import struct

import numcodecs
import numpy as np
import pytest
import zarr
import zarr.codecs as zc

from conftest import (MAX64, assert_read_equal, expect_error, info, load_json, zbatch_api,
                      parse_shard_index, patch_shard_index, read, run_cli, sample_data,
                      write_json, write_v2, write_v3)

DATA = sample_data("float32", (9, 10), seed=100)  # chunks (4, 5): the grid is 3 x 2


def v2_store(root, compressor=numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1), **kw):
    """A group `root` holding array `arr` (v2), so keys read `arr/.zarray`, `arr/2.1`."""
    zarr.open_group(str(root), mode="w", zarr_format=2)
    write_v2(root / "arr", DATA, (4, 5), compressors=compressor, **kw)
    return root / "arr"


def v3_store(root, **kw):
    zarr.open_group(str(root), mode="w", zarr_format=3)
    write_v3(root / "arr", DATA, (4, 5), **kw)
    return root / "arr"


def assert_cli_fails(path, *substrings):
    r = run_cli("info", path)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)  # 1, not a signal (< 0)
    assert r.stderr.strip(), "no message on stderr"
    for s in substrings:
        assert s in r.stderr, f"{s!r} not in CLI stderr {r.stderr!r}"
    r = run_cli("info", path, "--json")
    assert r.returncode == 1 and r.stderr.strip(), (r.returncode, r.stderr)


# ------------------------------------------------------------------------------------------------
# Truncated and corrupt chunks
# ------------------------------------------------------------------------------------------------
# The status each decoder reports for a chunk cut to half its length, pinned after checking the
# engine. The rule: ZB_E_TRUNCATED where the format itself states a length the object falls short
# of (blosc's header cbytes, zstd's frame content size, a raw chunk's expected size);
# ZB_E_CORRUPT where the decoder cannot tell a cut stream from a bad one (deflate in gzip/zlib,
# lz4's raw block).
TRUNCATED_V2 = {
    "blosc": (numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1), "ZB_E_TRUNCATED"),
    "blosc-zstd": (numcodecs.Blosc(cname="zstd", clevel=5, shuffle=2), "ZB_E_TRUNCATED"),
    "zstd": (numcodecs.Zstd(level=1), "ZB_E_TRUNCATED"),
    "lz4": (numcodecs.LZ4(), "ZB_E_CORRUPT"),
    "gzip": (numcodecs.GZip(level=1), "ZB_E_CORRUPT"),
    "zlib": (numcodecs.Zlib(level=1), "ZB_E_CORRUPT"),
    "none": (None, "ZB_E_TRUNCATED"),
}


@pytest.mark.parametrize("codec", list(TRUNCATED_V2))
def test_truncated_chunk_v2(tmp_path, codec):
    comp, status = TRUNCATED_V2[codec]
    arr = v2_store(tmp_path, comp)
    chunk = arr / "2.1"
    raw = chunk.read_bytes()
    chunk.write_bytes(raw[: len(raw) // 2])
    with expect_error(status, "2.1"):
        read(tmp_path, "arr")
    # rows in other chunks still read: the failure is the cut chunk's
    assert_read_equal(read(tmp_path, "arr", 0, 8), DATA[:8])


TRUNCATED_V3 = {
    "zstd": ([zc.ZstdCodec(level=1)], "ZB_E_TRUNCATED"),
    "blosc": ([zc.BloscCodec(cname="lz4", shuffle="shuffle")], "ZB_E_TRUNCATED"),
    "gzip": ([zc.GzipCodec(level=1)], "ZB_E_CORRUPT"),
    "none": (None, "ZB_E_TRUNCATED"),
}


@pytest.mark.parametrize("codec", list(TRUNCATED_V3))
def test_truncated_chunk_v3(tmp_path, codec):
    comp, status = TRUNCATED_V3[codec]
    arr = v3_store(tmp_path, compressors=comp)
    chunk = arr / "c" / "2" / "1"
    raw = chunk.read_bytes()
    chunk.write_bytes(raw[: len(raw) // 2])
    with expect_error(status, "c/2/1"):
        read(tmp_path, "arr")


def test_empty_chunk_file_is_not_fill(tmp_path):
    # a present but empty object is not "missing": it is shorter than blosc's 16-byte header
    arr = v2_store(tmp_path, numcodecs.Blosc(cname="lz4", shuffle=1))
    (arr / "1.0").write_bytes(b"")
    with expect_error("ZB_E_TRUNCATED", "1.0"):
        read(tmp_path, "arr")


def _patch(path, offset, new):
    b = bytearray(path.read_bytes())
    b[offset:offset + len(new)] = new
    path.write_bytes(bytes(b))


@pytest.mark.parametrize("field,status", [("nbytes", "ZB_E_CORRUPT"),
                                          ("version", "ZB_E_CORRUPT"),
                                          ("cbytes", "ZB_E_TRUNCATED")])
def test_corrupt_blosc_header(tmp_path, field, status):
    arr = v2_store(tmp_path, numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1))
    chunk = arr / "2.1"
    raw = chunk.read_bytes()
    assert raw[0] == 2 and struct.unpack_from("<I", raw, 12)[0] == len(raw)  # fixture sanity
    if field == "nbytes":  # decoded size != the chunk's 4*5*4 = 80 bytes
        _patch(chunk, 4, struct.pack("<I", 80 - 4))
    elif field == "cbytes":  # header claims more bytes than the object has: truncation
        _patch(chunk, 12, struct.pack("<I", len(raw) + 100))
    else:
        _patch(chunk, 0, b"\xff")
    with expect_error(status, "2.1"):
        read(tmp_path, "arr")


def test_blosc_typesize_8_on_4_byte_dtype_decodes(tmp_path):
    # §9 row 14: a header typesize that differs from the dtype's item size still decodes
    arr = v2_store(tmp_path, numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1))
    block = np.ascontiguousarray(DATA[0:4, 0:5])
    enc = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1, typesize=8).encode(block.tobytes())
    assert bytes(enc)[3] == 8
    (arr / "0.0").write_bytes(bytes(enc))
    assert_read_equal(read(tmp_path, "arr"), DATA)


def test_lz4_prefix_mismatch(tmp_path):
    arr = v2_store(tmp_path, numcodecs.LZ4())
    _patch(arr / "2.1", 0, struct.pack("<I", 81))
    with expect_error("ZB_E_CORRUPT", "2.1"):
        read(tmp_path, "arr")


def test_lz4_frame_instead_of_block(tmp_path):
    arr = v2_store(tmp_path, numcodecs.LZ4())
    # an LZ4 frame header where numcodecs' u32le size prefix belongs (FORMATS §2.4)
    (arr / "0.0").write_bytes(bytes.fromhex("04224d18") + bytes(40))
    with expect_error("ZB_E_CORRUPT", "0.0"):
        read(tmp_path, "arr")


def test_gzip_bad_crc32(tmp_path):
    arr = v2_store(tmp_path, numcodecs.GZip(level=1))
    raw = (arr / "2.1").read_bytes()
    _patch(arr / "2.1", len(raw) - 8, bytes([raw[-8] ^ 0xFF]))  # the CRC-32 trailer
    # every checksum a format carries (crc32c, gzip's CRC-32, zstd's XXH64) is ZB_E_CHECKSUM
    with expect_error("ZB_E_CHECKSUM", "2.1"):
        read(tmp_path, "arr")


def test_gzip_bytes_under_zlib_id(tmp_path):
    arr = v2_store(tmp_path, numcodecs.Zlib(level=1))
    block = np.ascontiguousarray(DATA[8:9, 5:10])
    padded = np.zeros((4, 5), "<f4")
    padded[:1] = block
    (arr / "2.1").write_bytes(bytes(numcodecs.GZip(level=1).encode(padded.tobytes())))
    with expect_error("ZB_E_CORRUPT", "2.1"):
        read(tmp_path, "arr")


def test_v3_crc32c_mismatch(tmp_path):
    arr = v3_store(tmp_path, compressors=[zc.Crc32cCodec()])
    chunk = arr / "c" / "1" / "1"
    raw = chunk.read_bytes()
    _patch(chunk, 5, bytes([raw[5] ^ 0x01]))
    with expect_error("ZB_E_CHECKSUM", "c/1/1"):
        read(tmp_path, "arr")


def test_v3_zstd_content_checksum_mismatch(tmp_path):
    arr = v3_store(tmp_path, compressors=[zc.ZstdCodec(level=1, checksum=True)])
    chunk = arr / "c" / "1" / "1"
    raw = chunk.read_bytes()
    _patch(chunk, len(raw) - 1, bytes([raw[-1] ^ 0xFF]))  # the frame's XXH64 checksum
    with expect_error("ZB_E_CHECKSUM", "c/1/1"):
        read(tmp_path, "arr")


def test_vlen_utf8_length_past_end(tmp_path):
    zarr.open_group(str(tmp_path), mode="w", zarr_format=2)
    write_v2(tmp_path / "arr", np.array(["ab", "c", "def"]), (3,), compressors=None)
    # n_items 3; item lengths 2, 1, then 1000 with only 3 bytes left
    (tmp_path / "arr" / "0").write_bytes(struct.pack("<II", 3, 2) + b"ab" + struct.pack("<I", 1)
                                         + b"c" + struct.pack("<I", 1000) + b"def")
    with expect_error("ZB_E_TRUNCATED", "arr/0"):  # shorter than its length field says
        read(tmp_path, "arr")


def test_vlen_utf8_wrong_item_count(tmp_path):
    zarr.open_group(str(tmp_path), mode="w", zarr_format=2)
    write_v2(tmp_path / "arr", np.array(["ab", "c", "def"]), (3,), compressors=None)
    (tmp_path / "arr" / "0").write_bytes(struct.pack("<II", 2, 2) + b"ab" + struct.pack("<I", 1)
                                         + b"c")
    with expect_error("ZB_E_CORRUPT", "arr/0"):
        read(tmp_path, "arr")


# ------------------------------------------------------------------------------------------------
# Shards written by zarr-python, then damaged
# ------------------------------------------------------------------------------------------------
def _sharded(root):
    arr = v3_store(root, shards=(8, 10), compressors=[zc.ZstdCodec(level=1)])
    shard = arr / "c" / "0" / "0"
    entries = parse_shard_index(shard.read_bytes(), 4)
    return shard, entries


def test_wrong_shard_crc(tmp_path):
    shard, entries = _sharded(tmp_path)
    patch_shard_index(shard, 4, entries, fix_crc=False)
    with expect_error("ZB_E_CHECKSUM", "c/0/0"):
        read(tmp_path, "arr")


def test_shard_entry_past_end(tmp_path):
    shard, entries = _sharded(tmp_path)
    size = shard.stat().st_size
    entries[3] = (entries[3][0], size)  # offset + nbytes > size
    patch_shard_index(shard, 4, entries)
    with expect_error("ZB_E_SHARD_RANGE", "c/0/0"):
        read(tmp_path, "arr")
    # the other shard is untouched
    assert_read_equal(read(tmp_path, "arr", 8, 9), DATA[8:9])


# ------------------------------------------------------------------------------------------------
# Metadata: JSON errors, invalid metadata, unsupported features
# ------------------------------------------------------------------------------------------------
MALFORMED = {
    "truncated": lambda text: text[: len(text) // 2],
    "not-json": lambda text: "this is not json",
    "trailing-garbage": lambda text: text + "\n}",
    "trailing-document": lambda text: text + ' {"zarr_format": 2}',
    "empty": lambda text: "",
}


@pytest.mark.parametrize("how", list(MALFORMED))
@pytest.mark.parametrize("fmt", [2, 3])
def test_malformed_array_json(tmp_path, fmt, how):
    arr = v2_store(tmp_path) if fmt == 2 else v3_store(tmp_path)
    key = ".zarray" if fmt == 2 else "zarr.json"
    meta = arr / key
    meta.write_text(MALFORMED[how](meta.read_text()))
    with expect_error("ZB_E_JSON", f"arr/{key}"):
        read(tmp_path, "arr")
    with expect_error("ZB_E_JSON", f"arr/{key}"):
        info(tmp_path)
    assert_cli_fails(tmp_path, f"arr/{key}")


@pytest.mark.parametrize("key", [".zgroup", ".zattrs", ".zmetadata"])
def test_malformed_v2_group_documents(tmp_path, key):
    v2_store(tmp_path)
    if key == ".zmetadata":
        zarr.consolidate_metadata(str(tmp_path))
    (tmp_path / key).write_text('{"zarr_format": 2, ')
    with expect_error("ZB_E_JSON", key):
        info(tmp_path)
    assert_cli_fails(tmp_path, key)


def test_malformed_root_zarr_json(tmp_path):
    v3_store(tmp_path)
    (tmp_path / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group"} garbage')
    with expect_error("ZB_E_JSON", "zarr.json"):
        info(tmp_path)
    assert_cli_fails(tmp_path, "zarr.json")


@pytest.mark.parametrize("fmt", [2, 3])
def test_shape_2_pow_64_is_json_error(tmp_path, fmt):
    arr = v2_store(tmp_path) if fmt == 2 else v3_store(tmp_path)
    key = ".zarray" if fmt == 2 else "zarr.json"
    text = (arr / key).read_text()
    doc = json.loads(text)
    doc["shape"] = [12345678901, 10]
    text = json.dumps(doc).replace("12345678901", "18446744073709551616")
    (arr / key).write_text(text)
    with expect_error("ZB_E_JSON", f"arr/{key}"):
        read(tmp_path, "arr")
    assert_cli_fails(tmp_path, f"arr/{key}")


def test_uint64_fill_2_pow_64_is_json_error(tmp_path):
    zarr.open_group(str(tmp_path), mode="w", zarr_format=2)
    write_v2(tmp_path / "arr", np.arange(4, dtype="u8"), (2,), fill_value=MAX64)
    text = (tmp_path / "arr" / ".zarray").read_text()
    assert "18446744073709551615" in text
    (tmp_path / "arr" / ".zarray").write_text(text.replace("18446744073709551615",
                                                           "18446744073709551616"))
    with expect_error("ZB_E_JSON", "arr/.zarray"):
        read(tmp_path, "arr")


@pytest.mark.parametrize("fmt", [2, 3])
def test_shape_element_count_overflows(tmp_path, fmt):
    arr = v2_store(tmp_path) if fmt == 2 else v3_store(tmp_path)
    key = ".zarray" if fmt == 2 else "zarr.json"
    doc = load_json(arr / key)
    doc["shape"] = [2**40, 2**40]
    write_json(arr / key, doc)
    with expect_error("ZB_E_OVERFLOW", "arr"):
        read(tmp_path, "arr")
    with expect_error("ZB_E_OVERFLOW", "arr"):
        info(tmp_path)
    assert_cli_fails(tmp_path, "arr")


INVALID_META = {
    "float-shape": lambda d: d.update(shape=[9.0, 10]),
    "negative-shape": lambda d: d.update(shape=[-9, 10]),
    "shape-rank-mismatch": lambda d: d.update(shape=[9, 10, 2]),
    "string-shape": lambda d: d.update(shape="9,10"),
}


@pytest.mark.parametrize("how", list(INVALID_META))
@pytest.mark.parametrize("fmt", [2, 3])
def test_invalid_metadata(tmp_path, fmt, how):
    arr = v2_store(tmp_path) if fmt == 2 else v3_store(tmp_path)
    key = ".zarray" if fmt == 2 else "zarr.json"
    doc = load_json(arr / key)
    INVALID_META[how](doc)
    write_json(arr / key, doc)
    with expect_error("ZB_E_METADATA", f"arr/{key}"):
        read(tmp_path, "arr")
    assert_cli_fails(tmp_path, f"arr/{key}")


@pytest.mark.parametrize("fmt", [2, 3])
def test_zero_chunk_is_metadata_error(tmp_path, fmt):
    arr = v2_store(tmp_path) if fmt == 2 else v3_store(tmp_path)
    key = ".zarray" if fmt == 2 else "zarr.json"
    doc = load_json(arr / key)
    if fmt == 2:
        doc["chunks"] = [0, 5]
    else:
        doc["chunk_grid"]["configuration"]["chunk_shape"] = [0, 5]
    write_json(arr / key, doc)
    with expect_error("ZB_E_METADATA", f"arr/{key}"):
        read(tmp_path, "arr")


def test_v2_zarr_format_wrong(tmp_path):
    arr = v2_store(tmp_path)
    doc = load_json(arr / ".zarray")
    doc["zarr_format"] = 7
    write_json(arr / ".zarray", doc)
    with expect_error("ZB_E_METADATA", "arr/.zarray"):
        read(tmp_path, "arr")


def test_v3_bytes_without_endian_on_multibyte_type(tmp_path):
    # §9 row 21
    arr = v3_store(tmp_path)
    doc = load_json(arr / "zarr.json")
    assert doc["codecs"][0]["name"] == "bytes"
    doc["codecs"][0] = {"name": "bytes"}
    write_json(arr / "zarr.json", doc)
    with expect_error("ZB_E_METADATA", "arr/zarr.json"):
        read(tmp_path, "arr")


UNSUPPORTED_V3 = {
    "unknown-codec": lambda d: d["codecs"].append({"name": "frobnicate", "configuration": {}}),
    "unknown-codec-bare-string": lambda d: d["codecs"].append("frobnicate"),
    "unknown-data-type": lambda d: d.update(data_type="float128"),
    "rectilinear-grid": lambda d: d.update(chunk_grid={
        "name": "rectilinear", "configuration": {"chunk_shapes": [[4, 4, 1], [5, 5]]}}),
    "unknown-key-encoding": lambda d: d.update(chunk_key_encoding={"name": "morton"}),
    "storage-transformers": lambda d: d.update(storage_transformers=[{"name": "x"}]),
    "unknown-top-level-key": lambda d: d.update(frobnicate={"x": 1}),
}


@pytest.mark.parametrize("how", list(UNSUPPORTED_V3))
def test_unsupported_v3(tmp_path, how):
    arr = v3_store(tmp_path)
    doc = load_json(arr / "zarr.json")
    UNSUPPORTED_V3[how](doc)
    write_json(arr / "zarr.json", doc)
    with expect_error("ZB_E_UNSUPPORTED", "arr"):
        read(tmp_path, "arr")


UNSUPPORTED_V2 = {
    "unknown-compressor": lambda d: d.update(compressor={"id": "frobnicate", "level": 1}),
    "unknown-filter": lambda d: d.update(filters=[{"id": "frobnicate"}]),
    "structured-dtype": lambda d: d.update(dtype=[["a", "<f4"], ["b", "<i4"]], fill_value=None),
}


@pytest.mark.parametrize("how", list(UNSUPPORTED_V2))
def test_unsupported_v2(tmp_path, how):
    arr = v2_store(tmp_path)
    doc = load_json(arr / ".zarray")
    UNSUPPORTED_V2[how](doc)
    write_json(arr / ".zarray", doc)
    with expect_error("ZB_E_UNSUPPORTED", "arr"):
        read(tmp_path, "arr")


def test_unsupported_message_names_the_codec(tmp_path):
    arr = v3_store(tmp_path)
    doc = load_json(arr / "zarr.json")
    doc["codecs"].append({"name": "frobnicate", "configuration": {}})
    write_json(arr / "zarr.json", doc)
    with expect_error("ZB_E_UNSUPPORTED", "frobnicate"):
        read(tmp_path, "arr")


# ------------------------------------------------------------------------------------------------
# Keys and ranges
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["../arr", "arr/..", "sub/../arr", "..", "./arr", "a/./b",
                                  "..\\arr"])
def test_bad_array_path(tmp_path, path):
    v2_store(tmp_path / "store")
    # a real array just outside the store root, which an unchecked join would happily open
    write_v2(tmp_path / "arr", DATA, (4, 5))
    with expect_error("ZB_E_BADKEY"):
        read(tmp_path / "store", path)


def test_missing_array_is_notfound(tmp_path):
    v2_store(tmp_path)
    with expect_error("ZB_E_NOTFOUND", "nope"):
        read(tmp_path, "nope")


def test_missing_store_is_notfound(tmp_path):
    with expect_error("ZB_E_NOTFOUND", "does-not-exist"):
        read(tmp_path / "does-not-exist", "")
    with expect_error("ZB_E_NOTFOUND", "does-not-exist"):
        info(tmp_path / "does-not-exist")
    r = run_cli("info", tmp_path / "does-not-exist")
    assert r.returncode == 1 and r.stderr.strip()


RANGE_CASES = [(0, 10), (3, 2), (10, None), (10, 12), (9, 10), (-1, 5), (0, -3), (0, 2**62)]


@pytest.mark.parametrize("start,stop", RANGE_CASES, ids=[f"{a}-{b}" for a, b in RANGE_CASES])
@pytest.mark.parametrize("fmt", [2, 3])
def test_out_of_range_rows(tmp_path, fmt, start, stop):
    (v2_store if fmt == 2 else v3_store)(tmp_path)  # shape[0] == 9
    with expect_error("ZB_E_RANGE", "arr"):
        read(tmp_path, "arr", start, stop)
    assert_read_equal(read(tmp_path, "arr", 8, 9), DATA[8:9])  # the last row is in range


@pytest.mark.parametrize("dtype,values,status,needle", [
    # a uint64 pointer above INT64_MAX: corruption, named with its value and row
    ("uint64", [0, 2, 2**63 + 5], "ZB_E_CORRUPT", "pointer 9223372036854775813 at row 2"),
    # a bool array is not a pointer array
    ("bool", [False, True, True], "ZB_E_TYPE", "must be integer, not bool"),
])
def test_bad_pointer_array_dtype_or_value(tmp_path, dtype, values, status, needle):
    """Segment pointers (generic layout, FORMATS-zbatch.md §1) of a wrong dtype or out of
    int64 range fail with the array's path, never read as pointers."""
    import zbatch as zb
    root = zarr.open_group(str(tmp_path / "g.zarr"), mode="w", zarr_format=3)
    root.create_array("ptr", data=np.array(values, dtype=dtype), chunks=(4,))
    root.create_array("x", data=np.arange(4, dtype=np.float32), chunks=(4,))
    root.attrs["zbatch"] = {"segments": {"s": "ptr"},
                            "fields": {"x": {"array": "x", "kind": "ragged", "segment": "s"}}}
    with pytest.raises(zb.ZbatchError) as e:
        zb.open(str(tmp_path / "g.zarr")).read_many(np.array([0, 1]))
    assert e.value.status == status
    assert "ptr" in str(e.value) and needle in str(e.value)


@pytest.mark.parametrize("rows, status, words", [
    (2**61, "ZB_E_OVERFLOW", ["9223372036854775808 bytes"]),  # 2^63 bytes: past ssize_t
    (2**40, "ZB_E_NOMEM", ["4398046511104 bytes"]),     # 4 TiB: no machine has it
])
def test_read_array_of_a_huge_declared_shape(tmp_path, rows, status, words):
    """Found by the damage campaign (scripts/campaign.py): a shape rewritten to 2^61 or 2^40
    rows made read_array raise a bare SystemError or MemoryError (no status, no message). It
    is a ZbatchError naming the rows and the byte size."""
    a = zarr.create_array(str(tmp_path / "a.zarr"), shape=(100,), chunks=(10,), dtype="float32")
    a[:] = np.arange(100, dtype=np.float32)
    doc = load_json(tmp_path / "a.zarr" / "zarr.json")
    doc["shape"] = [rows]
    (tmp_path / "a.zarr" / "zarr.json").write_text(json.dumps(doc))
    zb = zbatch_api()
    with expect_error(status, "rows [0, %d)" % rows, *words):
        zb.read_array(str(tmp_path / "a.zarr"))
    # the rows that are there still read, as zarr-python reads them
    np.testing.assert_array_equal(zb.read_array(str(tmp_path / "a.zarr"), "", 0, 100),
                                  np.arange(100, dtype=np.float32))
