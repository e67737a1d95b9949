"""Defect 5 of issue 21 and the store-root rules: a chunk key that is a device (a link to
/dev/zero or /dev/urandom), a FIFO or a link out of the store root is an error naming the key
through every reader (read_array, `zbatch verify`, a dataset read), never a hang and never the
fill value. The oracle is the array as zarr-python wrote it before the damage."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

from conftest import expect_error, read, run_cli, write_v2

DATA = np.arange(40, dtype=np.int32).reshape(8, 5)


def make_array(tmp_path):
    store = tmp_path / "s.zarr"
    write_v2(store, DATA, chunks=(4, 5), fill_value=-1)
    np.testing.assert_array_equal(read(store), DATA)  # intact before the damage
    return store, store / "1.0"


def damage(chunk, kind, tmp_path):
    chunk.unlink()
    if kind == "fifo":
        os.mkfifo(chunk)
    elif kind == "outside":
        secret = tmp_path / "secret"
        secret.write_bytes(DATA[4:].tobytes())  # a valid chunk, but not the store's
        chunk.symlink_to(secret)
    else:
        chunk.symlink_to(kind)


CASES = [("/dev/zero", "ZB_E_BADKEY", "outside the store root"),
         ("/dev/urandom", "ZB_E_BADKEY", "outside the store root"),
         ("fifo", "ZB_E_CORRUPT", "not a regular file (a FIFO)"),
         ("outside", "ZB_E_BADKEY", "outside the store root")]


@pytest.mark.parametrize("kind,status,why", CASES)
def test_read_array_refuses(tmp_path, kind, status, why):
    store, chunk = make_array(tmp_path)
    damage(chunk, kind, tmp_path)
    with expect_error(status, str(chunk.relative_to(store)), why):
        read(store)
    np.testing.assert_array_equal(read(store, "", 0, 4), DATA[:4])  # the other chunk still reads


@pytest.mark.parametrize("kind,status,why", CASES)
def test_verify_reports(tmp_path, kind, status, why):
    store, chunk = make_array(tmp_path)
    damage(chunk, kind, tmp_path)
    r = run_cli("verify", store, timeout=30)
    assert r.returncode != 0, r.stdout
    problems = [ln for ln in r.stdout.splitlines() if "1.0" in ln]
    assert problems and why in problems[0], r.stdout
    assert re.search(r"\b1 problems?\b", r.stdout.splitlines()[-1]), r.stdout


def test_device_inside_root_is_not_data(tmp_path):
    """A character device node inside the root itself (no link involved) is refused as not a
    regular file."""
    store, chunk = make_array(tmp_path)
    chunk.unlink()
    try:
        os.mknod(chunk, 0o666 | 0o020000, os.makedev(1, 5))  # /dev/zero's numbers
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD (not root here)")
    with expect_error("ZB_E_CORRUPT", "1.0", "not a regular file (a character device)"):
        read(store)
