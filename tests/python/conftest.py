"""Shared fixtures and helpers for the zbatch Python test suite.

Every store is generated at test time (into pytest's tmp dirs) by the oracle libraries:
zarr-python 3.1 (v2 and v3 writer), numcodecs, anndata 0.12, or by hand-built bytes. The expected
values always come from an independent source (the numpy array that was written, zarr-python's own
read, or the AnnData object), never from zbatch itself.

Nothing is skipped: a missing zbatch API, a missing CLI binary or a store that cannot be generated
makes the test fail.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

REPO = Path(__file__).resolve().parents[2]
CLI = REPO / "build" / "zbatch"

# The suite tests the checkout it runs from: its python/ first on the path of this process and
# of the processes tests start (the venv's zbatch-dev.pth names whichever checkout last ran
# scripts/dev-install.py, another worktree's perhaps).
sys.path.insert(0, str(REPO / "python"))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(REPO / "python"), os.environ.get("PYTHONPATH")) if p)

# Files that hold metadata, not chunk data (FORMATS §1.1, §1.4, §3.1).
META_NAMES = {".zarray", ".zattrs", ".zgroup", ".zmetadata", "zarr.json"}

MAX64 = 2**64 - 1


def pytest_configure(config):
    # zarr-python 3.1 and anndata 0.12 warn about unstable specs (numcodecs.* codecs in v3, the
    # string dtype, consolidated metadata) and upcoming default changes; the warnings are expected
    # for the stores these tests write on purpose and would only clutter the output.
    for line in ("ignore::zarr.errors.ZarrUserWarning",
                 "ignore::zarr.errors.UnstableSpecificationWarning",
                 "ignore:Writing zarr v2 data will no longer be the default:UserWarning",
                 "ignore:zarr v3 autosharding will be the default:UserWarning"):
        config.addinivalue_line("filterwarnings", line)


@pytest.fixture(scope="module", autouse=True)
def _module_scratch_freed(request, tmp_path_factory):
    """Frees the disk a test module wrote once its last test has run, so that the suite's
    footprint is one module's, not the sum of all (CI machines may have only a few GB free). Each
    test's own tmp_path goes when it passes (tmp_path_retention_policy = "failed" in
    pyproject.toml); this removes what the module's fixtures made with tmp_path_factory, unless a
    test of the module failed (then everything stays to be looked at). So a directory made with
    tmp_path_factory lives as long as the module that made it: fixtures that share one across
    modules would lose it here (there are none; the wheel's are module-scoped)."""
    base = tmp_path_factory.getbasetemp()
    before = set(os.listdir(base))
    failed = request.session.testsfailed
    yield
    if request.session.testsfailed == failed:
        for name in set(os.listdir(base)) - before:
            shutil.rmtree(base / name, ignore_errors=True)


# ------------------------------------------------------------------------------------------------
# The zbatch module under test
# ------------------------------------------------------------------------------------------------
def zbatch_api():
    """Imports zbatch and checks that the API under test exists; fails (never skips) otherwise."""
    try:
        mod = importlib.import_module("zbatch")
    except Exception as exc:  # pragma: no cover - depends on the build state
        pytest.fail(f"import zbatch failed: {exc!r}")
    missing = [n for n in ("read_array", "info", "ZbatchError") if not hasattr(mod, n)]
    if missing:
        pytest.fail(f"zbatch lacks {missing} (extension not landed yet?)")
    assert issubclass(mod.ZbatchError, Exception)
    return mod


def nvalchemi_zarr():
    """nvalchemi-toolkit's AtomicData and its Zarr reader and writer (the atomic layout's
    oracle); a missing oracle fails the test, as it is a pinned dependency."""
    try:
        import torch  # noqa: F401
        from nvalchemi.data import AtomicData
        from nvalchemi.data.datapipes.backends.zarr import (AtomicDataZarrReader,
                                                            AtomicDataZarrWriter)
    except Exception as exc:  # pragma: no cover - depends on the environment
        pytest.fail(f"nvalchemi-toolkit 0.2.0 (the oracle) is not importable: {exc!r}")
    return AtomicData, AtomicDataZarrReader, AtomicDataZarrWriter


@pytest.fixture
def zb():
    return zbatch_api()


def read(store, array_path="", start=0, stop=None):
    """zbatch.read_array with the test's argument conventions (paths may be Path objects)."""
    return zbatch_api().read_array(str(store), array_path, start, stop)


def info(path):
    return zbatch_api().info(str(path))


@contextlib.contextmanager
def expect_error(status, *substrings):
    """Asserts that the block raises zbatch.ZbatchError with `status`, an int code, and a message
    containing every substring."""
    zb = zbatch_api()
    with pytest.raises(zb.ZbatchError) as ei:
        yield ei
    err = ei.value
    assert err.status == status, f"expected {status}, got {err.status}: {err}"
    assert isinstance(err.code, int) and err.code < 0, f"bad code {err.code!r}"
    msg = str(err)
    for s in substrings:
        assert s in msg, f"{s!r} not in error message {msg!r}"


# ------------------------------------------------------------------------------------------------
# Writers (zarr-python 3.1)
# ------------------------------------------------------------------------------------------------
_DEFAULT = object()


def _create(path, data, chunks, zarr_format, *, dtype=None, compressors=_DEFAULT,
            filters=_DEFAULT, serializer=_DEFAULT, shards=None, fill_value=_DEFAULT,
            order=None, chunk_key_encoding=None, write_empty_chunks=True, attributes=None,
            write=True):
    kw = {}
    if compressors is not _DEFAULT:
        kw["compressors"] = compressors
    if filters is not _DEFAULT:
        kw["filters"] = filters
    if serializer is not _DEFAULT:
        kw["serializer"] = serializer
    if fill_value is not _DEFAULT:
        kw["fill_value"] = fill_value
    if chunks is None:
        chunks = data.shape
    if dtype is None:
        # A numpy 'U' array would otherwise be stored as fixed-width UCS-4 ("<U40"); the engine's
        # string type is the variable-length one (dtype=str: v2 "|O" + vlen-utf8, v3 "string").
        dtype = str if data.dtype.kind in ("U", "T", "O") else data.dtype
    z = zarr.create_array(
        store=str(path), shape=data.shape, chunks=tuple(chunks),
        dtype=dtype, zarr_format=zarr_format, shards=shards,
        order=order, chunk_key_encoding=chunk_key_encoding, attributes=attributes,
        config={"write_empty_chunks": write_empty_chunks}, overwrite=True, **kw)
    if write:
        z[...] = data
    return z


def write_v2(path, data, chunks=None, *, dimension_separator=None, **kw):
    """Writes `data` as a Zarr v2 array at directory `path` through zarr-python 3.1."""
    if dimension_separator is not None:
        kw["chunk_key_encoding"] = {"name": "v2", "separator": dimension_separator}
    return _create(path, np.asarray(data), chunks, 2, **kw)


def write_v3(path, data, chunks=None, **kw):
    """Writes `data` as a Zarr v3 array at directory `path` through zarr-python 3.1."""
    return _create(path, np.asarray(data), chunks, 3, **kw)


def zarr_read(path, start=0, stop=None):
    """zarr-python's own read of rows [start, stop) as a plain numpy array (strings as 'U')."""
    z = zarr.open_array(str(path), mode="r")
    out = np.asarray(z[()] if z.ndim == 0 else z[start:stop])
    if out.dtype.kind in ("T", "O"):
        out = np.array(out.tolist(), dtype=str).reshape(out.shape)
    return out


# ------------------------------------------------------------------------------------------------
# Comparisons
# ------------------------------------------------------------------------------------------------
def assert_read_equal(got, expected):
    """zbatch output vs the oracle: same shape, same (native) dtype, same values (NaN == NaN)."""
    expected = np.asarray(expected)
    assert isinstance(got, np.ndarray), f"zbatch returned {type(got)}"
    assert got.shape == expected.shape, f"shape {got.shape} != expected {expected.shape}"
    if expected.dtype.kind in ("U", "T", "O"):
        assert got.dtype.kind == "U", f"string array came back as dtype {got.dtype}"
        np.testing.assert_array_equal(got, expected.astype(str))
        return
    want = expected.dtype.newbyteorder("=")
    assert got.dtype == want, f"dtype {got.dtype} != expected {want}"
    if expected.dtype.kind == "f":
        np.testing.assert_array_equal(got, expected, strict=False)  # NaN-aware by default
        # assert_array_equal treats -0.0 == 0.0; compare bits too, so sign and NaN survive.
        assert np.array_equal(np.signbit(got), np.signbit(expected))
    else:
        np.testing.assert_array_equal(got, expected)


def json_equal(a, b):
    """Deep equality with exact types (1 != 1.0, True != 1) in which NaN equals NaN (json.loads
    makes a distinct NaN object each time)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    return a == b


# ------------------------------------------------------------------------------------------------
# On-disk helpers
# ------------------------------------------------------------------------------------------------
def chunk_files(array_dir):
    """Every chunk/shard file under an array directory (metadata files excluded), as relative
    '/'-joined keys."""
    array_dir = Path(array_dir)
    out = []
    for dp, _dn, fn in os.walk(array_dir):
        for f in fn:
            if f in META_NAMES:
                continue
            out.append(Path(dp, f).relative_to(array_dir).as_posix())
    return sorted(out)


def stored_bytes_on_disk(array_dir):
    array_dir = Path(array_dir)
    return sum((array_dir / k).stat().st_size for k in chunk_files(array_dir))


def write_json(path, doc):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=2))


def load_json(path):
    return json.loads(Path(path).read_text())


def run_cli(*args, timeout=30):
    assert CLI.is_file(), f"CLI binary missing at {CLI}"
    return subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


# ------------------------------------------------------------------------------------------------
# CRC32C (Castagnoli). Written here rather than imported so the shard tests have an oracle that is
# independent of both the engine and numcodecs; checked against the standard check value and
# against numcodecs' CRC32C in the test suite.
# ------------------------------------------------------------------------------------------------
def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def shard_index_bytes(entries, *, with_crc=True, endian="<"):
    """Encodes (offset, nbytes) pairs as the sharding index (FORMATS §4.1)."""
    raw = b"".join(struct.pack(endian + "QQ", o, n) for o, n in entries)
    return raw + (struct.pack("<I", crc32c(raw)) if with_crc else b"")


def parse_shard_index(shard: bytes, n: int, location="end"):
    size = 16 * n + 4
    idx = shard[-size:] if location == "end" else shard[:size]
    raw, crc = idx[:-4], struct.unpack("<I", idx[-4:])[0]
    assert crc == crc32c(raw), "zarr-python wrote an index whose CRC32C does not match"
    return [struct.unpack_from("<QQ", raw, 16 * i) for i in range(n)]


def patch_shard_index(path, n, entries, location="end", fix_crc=True):
    """Rewrites a zarr-written shard's index in place with `entries`."""
    data = bytearray(Path(path).read_bytes())
    idx = shard_index_bytes(entries)
    if not fix_crc:
        idx = idx[:-4] + bytes([idx[-4] ^ 0xFF]) + idx[-3:]
    size = 16 * n + 4
    if location == "end":
        data[-size:] = idx
    else:
        data[:size] = idx
    Path(path).write_bytes(bytes(data))


# ------------------------------------------------------------------------------------------------
# Deterministic test data
# ------------------------------------------------------------------------------------------------
NUMERIC_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                  "uint64", "float16", "float32", "float64"]


def sample_data(dtype, shape, seed=0):
    """Values that exercise the whole range of `dtype` (ints to their limits, floats with NaN,
    ±inf and -0.0), deterministic for a seed."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    n = int(np.prod(shape)) if shape else 1
    if dt.kind == "b":
        flat = rng.integers(0, 2, n).astype(bool)
    elif dt.kind in "iu":
        info_ = np.iinfo(dt)
        flat = rng.integers(info_.min, info_.max, n, dtype=dt, endpoint=True)
        specials = np.array([info_.min, info_.max, 0, 1], dtype=dt)
        flat[: min(n, 4)] = specials[: min(n, 4)]
    elif dt.kind == "f":
        flat = (rng.standard_normal(n) * 1000).astype(dt)
        specials = np.array([np.nan, np.inf, -np.inf, -0.0, np.finfo(dt).max, np.finfo(dt).tiny],
                            dtype=dt)
        k = min(n, len(specials))
        pos = rng.choice(n, k, replace=False) if n > k else np.arange(k)
        flat[pos] = specials[:k]
    elif dt.kind in ("U", "T", "O"):
        words = ["", "a", "zbatch", "héllo", "日本語", "emoji 🎉", "x" * 40, "tab\tnl\n", "0"]
        flat = np.array([words[i % len(words)] + (str(i) if i % 3 else "")
                         for i in rng.permutation(n)], dtype=str)
    else:
        raise AssertionError(f"no sample data for {dt}")
    return flat.reshape(shape)


def string_data(shape, seed=0):
    return sample_data(np.dtype(str), shape, seed)


# ------------------------------------------------------------------------------------------------
# Loopback servers for remote stores (tests/python/remote_servers.py): nginx, moto, a fault proxy
# ------------------------------------------------------------------------------------------------
@pytest.fixture
def nginx_serve():
    """A factory: ``nginx_serve(root, latency_ms=0)`` starts nginx serving directory `root` on
    loopback and returns the running ``NginxServer`` (``.url``); all are stopped at teardown.
    Skips, with the reason, only where nginx or its echo module is not installed."""
    import remote_servers as rs
    reason = rs.nginx_missing_reason()
    if reason:
        pytest.skip(reason)
    servers = []

    def start(root, **kw):
        server = rs.NginxServer(root, **kw)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def moto_s3():
    """moto's S3 server on loopback, checking SigV4 (``.endpoint_url``, ``.access_key``,
    ``.secret_key``, ``.client()``, ``.storage_options()``); shared by the session, so each test
    uses buckets of its own."""
    import remote_servers as rs
    with rs.MotoServer() as server:
        yield server


@pytest.fixture
def fault_proxy():
    """A factory: ``fault_proxy(upstream_url, seed=0, rates={...}, ...)`` starts a
    ``FaultProxy`` (``.url``, ``.stats()``, ``.configure()``); all are stopped at teardown."""
    import remote_servers as rs
    proxies = []

    def start(upstream, **kw):
        proxy = rs.FaultProxy(upstream, **kw)
        proxies.append(proxy)
        return proxy.start()

    yield start
    for proxy in proxies:
        proxy.stop()


@pytest.fixture(params=["mmap", "pread"])
def io(request, monkeypatch):
    """The file store's read path, each test that takes it run with both: mapped views
    (default) or pread (ZBATCH_MMAP_BYTES=0; the budget is read when a store opens)."""
    if request.param == "pread":
        monkeypatch.setenv("ZBATCH_MMAP_BYTES", "0")
    else:
        monkeypatch.delenv("ZBATCH_MMAP_BYTES", raising=False)
    return request.param
