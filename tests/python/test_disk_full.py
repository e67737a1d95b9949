"""Writes on a full file system (issue 21, durability): each writer fails with ZB_E_IO naming
the object it could not write and "No space left on device", and leaves what was already on the
file system as it was: an AtomicWriter append keeps the committed samples, a new store
(write_anndata, convert, write_array) is refused as incomplete or absent, and stores beside it
read exactly as before.

The file system is a small tmpfs mounted by the test (it needs root, as CI has; otherwise the
tests skip saying so). Expected values are what the test wrote, read back through zarr-python
or regenerated from the same seed, never the damaged store."""
from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import anndata as ad
import numpy as np
import pytest
import scipy.sparse as sp

from conftest import expect_error, read, zbatch_api


@pytest.fixture
def small_fs(tmp_path):
    """A 16 MiB tmpfs at tmp_path/fs, unmounted afterwards."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", f"zbfull-{uuid.uuid4().hex[:8]}",
                        str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(mnt: Path, leave: int = 0) -> None:
    """Fills the file system up to `leave` free bytes with a filler file."""
    st = os.statvfs(mnt)
    free = st.f_bavail * st.f_frsize
    with open(mnt / "filler", "wb") as f:
        f.write(b"\xff" * max(0, free - leave))
    # tmpfs counts whole pages; a last small write takes what is left
    try:
        with open(mnt / "filler2", "wb") as f:
            f.write(b"\xff" * 65536)
    except OSError:
        pass


def samples(seed, n):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.integers(2, 6))
        out.append({"positions": rng.standard_normal((k, 3)).astype(np.float32),
                    "atomic_numbers": rng.integers(1, 9, k),
                    "energy": np.float32(rng.standard_normal())})
    return out


def check_atomic(path, want):
    zb = zbatch_api()
    ds = zb.open(str(path))
    assert len(ds) == len(want)
    b = ds.read_many(list(range(len(want))))
    np.testing.assert_array_equal(b["positions"], np.concatenate([s["positions"] for s in want]))
    np.testing.assert_array_equal(np.ravel(b["energy"]), [s["energy"] for s in want])


def test_atomic_append_on_full_fs(small_fs):
    zb = zbatch_api()
    path = small_fs / "atoms.zarr"
    base = samples(0, 20)
    w = zb.AtomicWriter(path, config={"core": {"codec": "zstd:1"}, "meta": {"codec": "zstd:1"}})
    w.write(base)
    check_atomic(path, base)
    fill(small_fs)
    with expect_error("ZB_E_IO", "No space left on device", str(path)):
        w.append(samples(1, 4000))  # ~170 KiB of random positions: cannot fit
    check_atomic(path, base)  # the last commit, whole, while the disk is still full
    (small_fs / "filler").unlink()
    check_atomic(path, base)  # and after space comes back
    w.append(samples(1, 10))  # the store still takes appends
    check_atomic(path, base + samples(1, 10))


def test_write_anndata_on_full_fs(small_fs, tmp_path):
    zb = zbatch_api()
    X = sp.random(3000, 400, density=0.2, format="csr", dtype=np.float32, random_state=0)
    beside = small_fs / "small.zarr"
    zb.write_anndata(beside, X[:50], codec="none")
    before = read(beside, "X/data")
    fill(small_fs, leave=100 << 10)
    path = small_fs / "big.zarr"
    with expect_error("ZB_E_IO", "No space left on device"):
        zb.write_anndata(path, X, codec="none")  # ~2 MiB of data + indices
    # the failed store: refused as incomplete (its marker was written first) or never started
    if path.exists():
        with expect_error("ZB_E_INCOMPLETE", "a write was not committed"):
            zb.open(str(path))
    np.testing.assert_array_equal(read(beside, "X/data"), before)
    np.testing.assert_array_equal(before, X[:50].data)


def test_convert_on_full_fs(small_fs, tmp_path):
    zb = zbatch_api()
    X = sp.random(3000, 400, density=0.2, format="csr", dtype=np.float32, random_state=1)
    h5 = tmp_path / "in.h5ad"
    ad.AnnData(X=X).write_h5ad(h5)
    beside = small_fs / "beside.zarr"
    zb.write_anndata(beside, X[:20], codec="none")
    fill(small_fs, leave=100 << 10)
    out = small_fs / "out.zarr"
    with expect_error("ZB_E_IO", "No space left on device"):
        zb.convert(h5, out, codec="none", shuffle=False, memory="64M")
    if out.exists():
        with pytest.raises(zb.ZbatchError) as ei:
            zb.open(str(out))
        assert ei.value.status in ("ZB_E_INCOMPLETE", "ZB_E_NOTFOUND"), ei.value
    np.testing.assert_array_equal(read(beside, "X/data"), X[:20].data)


def test_write_array_on_full_fs(small_fs):
    zb = zbatch_api()
    path = small_fs / "arrays.zarr"
    first = np.arange(1000, dtype=np.int64).reshape(250, 4)
    zb.write_array(path, "first", first, chunks=50, codec="none")
    fill(small_fs, leave=64 << 10)
    big = np.random.default_rng(2).integers(0, 2**62, (100000, 4), dtype=np.int64)  # 3.2 MB
    with expect_error("ZB_E_IO", "No space left on device"):
        zb.write_array(path, "second", big, chunks=5000, codec="none")
    np.testing.assert_array_equal(read(path, "first"), first)
    # the array that failed has no metadata (it is written last): it does not exist
    with expect_error("ZB_E_NOTFOUND"):
        read(path, "second")
