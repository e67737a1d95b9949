"""Hand-built `sharding_indexed` shards: layouts zarr-python never writes, and corrupt indexes.

The zarr.json and every shard byte are written here in Python (struct-packed '<QQ' entries, CRC32C
from the suite's own implementation, itself checked against the standard check value and against
numcodecs). Valid shards are cross-checked against zarr-python's read of the same bytes.
FORMATS §4 and §9 rows 30-33.
"""
import gzip
import struct

import numcodecs
import numpy as np
import pytest

from conftest import (MAX64, assert_read_equal, crc32c, expect_error, read, shard_index_bytes,
                      write_json, zarr_read)

BYTES_LE = {"name": "bytes", "configuration": {"endian": "little"}}
INDEX_CODECS = [BYTES_LE, {"name": "crc32c"}]


def write_meta(root, *, shape, shard_shape, inner_shape, dtype, fill, inner_codecs=(),
               index_location="end", index_codecs=None):
    write_json(root / "zarr.json", {
        "zarr_format": 3, "node_type": "array", "shape": list(shape), "data_type": dtype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(shard_shape)}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": fill,
        "codecs": [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": list(inner_shape),
            "codecs": [BYTES_LE, *inner_codecs],
            "index_codecs": INDEX_CODECS if index_codecs is None else index_codecs,
            "index_location": index_location}}],
        "attributes": {},
    })


def build_shard(chunks, *, location="end", order=None, gaps=None, overrides=None,
                with_crc=True, index_endian="<"):
    """Lays out encoded inner chunks (a list of bytes, or None for an empty entry) in `order`
    (storage order of entry numbers), with `gaps[k]` junk bytes before the k-th stored chunk, and
    the index at `location`. `overrides` maps entry number -> (offset, nbytes) written verbatim.
    Returns (shard bytes, entries)."""
    n = len(chunks)
    order = list(range(n)) if order is None else order
    gaps = gaps or {}
    base = 16 * n + (4 if with_crc else 0) if location == "start" else 0
    body = bytearray()
    entries = [(MAX64, MAX64)] * n
    for k, j in enumerate(order):
        body += bytes((0xA5 + i) & 0xFF for i in range(gaps.get(k, 0)))  # junk in the gap
        if chunks[j] is None:
            continue
        entries[j] = (base + len(body), len(chunks[j]))
        body += chunks[j]
    for j, e in (overrides or {}).items():
        entries[j] = e
    index = shard_index_bytes(entries, with_crc=with_crc, endian=index_endian)
    assert len(index) == 16 * n + (4 if with_crc else 0)
    shard = index + bytes(body) if location == "start" else bytes(body) + index
    return shard, entries


def write_shard(root, key, shard):
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(shard)


def inner_blocks(data, shard_origin, shard_shape, inner_shape):
    """The inner chunks of one shard, in C order of their coordinates, as C-order numpy blocks
    padded to the full inner shape (padding = 0; the reader must ignore it)."""
    cps = [s // c for s, c in zip(shard_shape, inner_shape)]
    out = []
    for local in np.ndindex(*cps):
        sl = tuple(slice(o + l * c, o + (l + 1) * c)
                   for o, l, c in zip(shard_origin, local, inner_shape))
        block = np.zeros(inner_shape, data.dtype)
        part = data[sl]
        block[tuple(slice(0, s) for s in part.shape)] = part
        out.append(block)
    return out


def test_crc32c_oracle():
    assert crc32c(b"123456789") == 0xE3069283
    for msg in (b"", b"a", bytes(range(256)) * 3):
        enc = bytes(numcodecs.CRC32C().encode(msg))
        assert enc[:-4] == msg and struct.unpack("<I", enc[-4:])[0] == crc32c(msg)


# ------------------------------------------------------------------------------------------------
# Valid hand-built shards
# ------------------------------------------------------------------------------------------------
def test_spec_example_shard(tmp_path):
    # FORMATS §4.1 / §9 row 30: a [64,64] shard of [32,32] inner chunks, n = 4, 68-byte index.
    data = np.arange(64 * 64, dtype="<u2").reshape(64, 64)
    write_meta(tmp_path, shape=(64, 64), shard_shape=(64, 64), inner_shape=(32, 32),
               dtype="uint16", fill=0)
    blocks = inner_blocks(data, (0, 0), (64, 64), (32, 32))
    shard, entries = build_shard([b.tobytes() for b in blocks])
    assert len(shard) == 4 * 32 * 32 * 2 + 68
    assert entries == [(0, 2048), (2048, 2048), (4096, 2048), (6144, 2048)]
    write_shard(tmp_path, "c/0/0", shard)
    np.testing.assert_array_equal(zarr_read(tmp_path), data)
    assert_read_equal(read(tmp_path), data)
    assert_read_equal(read(tmp_path, "", 31, 33), data[31:33])


@pytest.mark.parametrize("location", ["end", "start"])
def test_reversed_order_and_empty_entry(tmp_path, location):
    # §9 row 31: inner chunks stored in reverse, entry 1 = (MAX64, MAX64) reads as fill -7.
    data = np.arange(64 * 64, dtype="<i4").reshape(64, 64) - 2000
    write_meta(tmp_path, shape=(64, 64), shard_shape=(64, 64), inner_shape=(32, 32),
               dtype="int32", fill=-7, index_location=location)
    chunks = [b.tobytes() for b in inner_blocks(data, (0, 0), (64, 64), (32, 32))]
    chunks[1] = None
    shard, entries = build_shard(chunks, location=location, order=[3, 2, 1, 0])
    assert entries[1] == (MAX64, MAX64)
    assert entries[3][0] == (0 if location == "end" else 68)  # stored first
    write_shard(tmp_path, "c/0/0", shard)
    expected = data.copy()
    expected[0:32, 32:64] = -7
    np.testing.assert_array_equal(zarr_read(tmp_path), expected)
    assert_read_equal(read(tmp_path), expected)


def test_index_at_start_offsets_shifted(tmp_path):
    # §9 row 32: offsets are absolute, so with the index first they start at 16n+4.
    data = np.linspace(-1, 1, 48, dtype="<f8").reshape(12, 4)
    write_meta(tmp_path, shape=(12, 4), shard_shape=(12, 4), inner_shape=(3, 4), dtype="float64",
               fill=0.0, index_location="start")
    shard, entries = build_shard(
        [b.tobytes() for b in inner_blocks(data, (0, 0), (12, 4), (3, 4))], location="start")
    assert entries[0] == (16 * 4 + 4, 96)
    write_shard(tmp_path, "c/0/0", shard)
    np.testing.assert_array_equal(zarr_read(tmp_path), data)
    assert_read_equal(read(tmp_path), data)


@pytest.mark.parametrize("location", ["end", "start"])
def test_gaps_between_chunks(tmp_path, location):
    data = np.arange(40, dtype="<i8") * 3 - 50
    write_meta(tmp_path, shape=(40,), shard_shape=(40,), inner_shape=(8,), dtype="int64",
               fill=0, index_location=location)
    chunks = [b.tobytes() for b in inner_blocks(data, (0,), (40,), (8,))]
    shard, _ = build_shard(chunks, location=location, order=[2, 0, 4, 1, 3],
                           gaps={0: 13, 1: 1, 3: 100, 4: 7})
    write_shard(tmp_path, "c/0", shard)
    np.testing.assert_array_equal(zarr_read(tmp_path), data)
    assert_read_equal(read(tmp_path), data)
    assert_read_equal(read(tmp_path, "", 7, 25), data[7:25])


def _gzip(b):
    return gzip.compress(b, compresslevel=6, mtime=0)


INNER = {
    "gzip": ([{"name": "gzip", "configuration": {"level": 6}}], _gzip),
    "zstd": ([{"name": "zstd", "configuration": {"level": 3, "checksum": False}}],
             lambda b: bytes(numcodecs.Zstd(level=3).encode(b))),
    "blosc": ([{"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5,
                                                   "shuffle": "shuffle", "typesize": 4,
                                                   "blocksize": 0}}],
              lambda b: bytes(numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1).encode(
                  np.frombuffer(b, "<f4")))),
    "crc32c": ([{"name": "crc32c"}], lambda b: b + struct.pack("<I", crc32c(b))),
}


@pytest.mark.parametrize("inner", list(INNER))
def test_compressed_inner_chunks(tmp_path, inner):
    codecs, enc = INNER[inner]
    data = (np.arange(30 * 8, dtype="<f4").reshape(30, 8) / 7).astype("<f4")
    write_meta(tmp_path, shape=(30, 8), shard_shape=(16, 8), inner_shape=(4, 4), dtype="float32",
               fill=0.5, inner_codecs=codecs)
    for s, origin in enumerate([(0, 0), (16, 0)]):
        chunks = [enc(b.tobytes()) for b in inner_blocks(data, origin, (16, 8), (4, 4))]
        if s == 1:
            chunks[-2:] = [None, None]  # rows 28..31 of which 30, 31 lie outside: empty entries
            expected_tail = 0.5
        shard, _ = build_shard(chunks, order=list(reversed(range(len(chunks)))))
        write_shard(tmp_path, f"c/{s}/0", shard)
    expected = data.copy()
    expected[28:30, :] = expected_tail
    np.testing.assert_array_equal(zarr_read(tmp_path), expected)
    assert_read_equal(read(tmp_path), expected)


@pytest.mark.parametrize("outside", ["empty", "stored-with-junk"])
def test_edge_shard_and_missing_shard(tmp_path, outside):
    # shape (50, 6), shard (16, 6), inner (4, 3): shards c/0..c/3; c/1 is missing (fill), and the
    # last shard covers rows 48..63, of which only 48, 49 exist.
    rng = np.random.default_rng(90)
    data = rng.integers(-1000, 1000, (50, 6)).astype("<i2")
    write_meta(tmp_path, shape=(50, 6), shard_shape=(16, 6), inner_shape=(4, 3), dtype="int16",
               fill=-7)
    for s in (0, 2, 3):
        padded = np.full((64, 6), 999, "<i2")  # junk beyond row 50
        padded[:50] = data
        chunks = [b.tobytes() for b in inner_blocks(padded, (16 * s, 0), (16, 6), (4, 3))]
        if s == 3 and outside == "empty":
            chunks[2:] = [None] * 6  # inner rows 52..63 lie wholly outside the array
        shard, _ = build_shard(chunks, order=list(range(7, -1, -1)))
        write_shard(tmp_path, f"c/{s}/0", shard)
    expected = data.copy()
    expected[16:32] = -7
    np.testing.assert_array_equal(zarr_read(tmp_path), expected)
    assert_read_equal(read(tmp_path), expected)
    assert_read_equal(read(tmp_path, "", 14, 34), expected[14:34])


def test_index_without_crc32c(tmp_path):
    data = np.arange(24, dtype="<u4")
    write_meta(tmp_path, shape=(24,), shard_shape=(24,), inner_shape=(6,), dtype="uint32",
               fill=0, index_codecs=[BYTES_LE])
    shard, _ = build_shard([b.tobytes() for b in inner_blocks(data, (0,), (24,), (6,))],
                           with_crc=False, order=[1, 3, 0, 2])
    assert len(shard) == 24 * 4 + 16 * 4
    write_shard(tmp_path, "c/0", shard)
    np.testing.assert_array_equal(zarr_read(tmp_path), data)
    assert_read_equal(read(tmp_path), data)


def test_index_big_endian(tmp_path):
    # FORMATS §4.1 R: index chains of bytes(little|big) with an optional crc32c.
    data = np.arange(24, dtype="<u4") * 11
    write_meta(tmp_path, shape=(24,), shard_shape=(24,), inner_shape=(6,), dtype="uint32",
               fill=0, index_codecs=[{"name": "bytes", "configuration": {"endian": "big"}},
                                     {"name": "crc32c"}])
    shard, _ = build_shard([b.tobytes() for b in inner_blocks(data, (0,), (24,), (6,))],
                           index_endian=">", order=[3, 1, 2, 0])
    write_shard(tmp_path, "c/0", shard)
    np.testing.assert_array_equal(zarr_read(tmp_path), data)
    assert_read_equal(read(tmp_path), data)


def test_two_entries_share_one_range(tmp_path):
    # Nothing in the sharding spec forbids two entries pointing at the same bytes (a writer
    # deduplicating identical chunks); zarr-python reads it.
    data = np.tile(np.arange(8, dtype="<i4"), 4)
    write_meta(tmp_path, shape=(32,), shard_shape=(32,), inner_shape=(8,), dtype="int32", fill=0)
    chunk = np.arange(8, dtype="<i4").tobytes()
    shard, _ = build_shard([chunk, None, None, None],
                           overrides={1: (0, 32), 2: (0, 32), 3: (0, 32)})
    write_shard(tmp_path, "c/0", shard)
    np.testing.assert_array_equal(zarr_read(tmp_path), data)
    assert_read_equal(read(tmp_path), data)


# ------------------------------------------------------------------------------------------------
# Corrupt shards (§4.4, §9 row 33): a precise status, a message naming the shard key, no crash
# ------------------------------------------------------------------------------------------------
N = 4  # inner chunks per shard in the corrupt fixtures: shape (32,), shard (32,), inner (8,)
CHUNK = 8 * 4


def _corrupt_store(root, location="end", **shard_kw):
    write_meta(root, shape=(32,), shard_shape=(32,), inner_shape=(8,), dtype="int32", fill=0,
               index_location=location)
    data = np.arange(32, dtype="<i4")
    chunks = [b.tobytes() for b in inner_blocks(data, (0,), (32,), (8,))]
    shard, entries = build_shard(chunks, location=location, **shard_kw)
    write_shard(root, "c/0", shard)
    return shard, entries


def test_corrupt_fixture_baseline_reads(tmp_path):
    # the uncorrupted twin of every fixture below reads fine, so each failure is the corruption's
    _corrupt_store(tmp_path)
    assert_read_equal(read(tmp_path), np.arange(32, dtype="<i4"))


@pytest.mark.parametrize("location", ["end", "start"])
def test_wrong_index_crc(tmp_path, location):
    shard, _ = _corrupt_store(tmp_path, location)
    b = bytearray(shard)
    crc_pos = len(b) - 1 if location == "end" else 16 * N + 3
    b[crc_pos] ^= 0x01
    write_shard(tmp_path, "c/0", bytes(b))
    with expect_error("ZB_E_CHECKSUM", "c/0"):
        read(tmp_path)


def test_index_bit_flip_detected_by_crc(tmp_path):
    shard, _ = _corrupt_store(tmp_path)
    b = bytearray(shard)
    b[-(16 * N + 4) + 3] ^= 0x10  # a byte of entry 0's offset, CRC left stale
    write_shard(tmp_path, "c/0", bytes(b))
    with expect_error("ZB_E_CHECKSUM", "c/0"):
        read(tmp_path)


@pytest.mark.parametrize("location", ["end", "start"])
def test_entry_past_end_of_shard(tmp_path, location):
    base = 16 * N + 4 if location == "start" else 0
    _corrupt_store(tmp_path, location, overrides={2: (base + 3 * CHUNK, CHUNK * 100)})
    with expect_error("ZB_E_SHARD_RANGE", "c/0"):
        read(tmp_path)


def test_entry_offset_past_end_of_shard(tmp_path):
    _corrupt_store(tmp_path, overrides={1: (10**6, CHUNK)})
    with expect_error("ZB_E_SHARD_RANGE", "c/0"):
        read(tmp_path)


def test_entry_overlapping_index_at_end(tmp_path):
    # the range ends inside the trailing index: within the file, but not within the data area
    _corrupt_store(tmp_path, overrides={3: (3 * CHUNK + 8, CHUNK)})
    with expect_error("ZB_E_SHARD_RANGE", "c/0"):
        read(tmp_path)


def test_entry_overlapping_index_at_start(tmp_path):
    # offset < 16n+4 with the index at the start
    _corrupt_store(tmp_path, "start", overrides={0: (16, CHUNK)})
    with expect_error("ZB_E_SHARD_RANGE", "c/0"):
        read(tmp_path)


@pytest.mark.parametrize("entry", [(MAX64, CHUNK), (0, MAX64)], ids=["offset-max", "nbytes-max"])
def test_half_empty_entry(tmp_path, entry):
    # FORMATS §4.4: exactly one of offset/nbytes equal to MAX64 is corruption. The brief asks for
    # the exact status ZB_E_SHARD_RANGE (not ZB_E_CORRUPT).
    _corrupt_store(tmp_path, overrides={1: entry})
    with expect_error("ZB_E_SHARD_RANGE", "c/0"):
        read(tmp_path)


def test_offset_plus_nbytes_overflows(tmp_path):
    _corrupt_store(tmp_path, overrides={2: (2**63 + 5, 2**63)})
    with expect_error("ZB_E_SHARD_RANGE", "c/0"):
        read(tmp_path)


def test_offset_plus_nbytes_overflows_to_small(tmp_path):
    # wraps around to a small in-bounds value (16) if added without an overflow check
    _corrupt_store(tmp_path, overrides={2: (MAX64 - 15, 32)})
    with expect_error("ZB_E_SHARD_RANGE", "c/0"):
        read(tmp_path)


@pytest.mark.parametrize("size", [0, 10, 16 * N + 3])
def test_shard_shorter_than_index(tmp_path, size):
    shard, _ = _corrupt_store(tmp_path)
    write_shard(tmp_path, "c/0", shard[-size:] if size else b"")
    with expect_error("ZB_E_TRUNCATED", "c/0"):
        read(tmp_path)


def test_entry_with_short_nbytes_is_truncated(tmp_path):
    # in range, but the raw bytes codec gets 28 bytes for a 32-byte chunk (as for an unsharded raw
    # chunk cut short: ZB_E_TRUNCATED)
    _corrupt_store(tmp_path, overrides={0: (0, CHUNK - 4)})
    with expect_error("ZB_E_TRUNCATED", "c/0"):
        read(tmp_path)


def test_corrupt_shard_other_rows_still_read(tmp_path):
    # a corrupt shard fails only reads that touch it
    write_meta(tmp_path, shape=(64,), shard_shape=(32,), inner_shape=(8,), dtype="int32", fill=0)
    data = np.arange(64, dtype="<i4")
    for s in (0, 1):
        chunks = [b.tobytes() for b in inner_blocks(data, (32 * s,), (32,), (8,))]
        shard, _ = build_shard(chunks)
        if s == 1:
            shard = shard[:-1] + bytes([shard[-1] ^ 0xFF])
        write_shard(tmp_path, f"c/{s}", shard)
    assert_read_equal(read(tmp_path, "", 0, 32), data[:32])
    with expect_error("ZB_E_CHECKSUM", "c/1"):
        read(tmp_path, "", 30, 40)
