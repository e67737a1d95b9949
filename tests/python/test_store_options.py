"""The file store's mapping budget is an option (zb_store_opts.mmap_bytes): the C library reads
no environment variable; zbatch.open(..., mmap_bytes=) and the command fill it, from
ZBATCH_MMAP_BYTES when it is not given. Oracle: the process's own memory map (/proc/self/maps
lists every data file a store has mapped) and the batches read with views off."""
import os
import subprocess

import numpy as np
import pytest

import zbatch
from conftest import CLI, run_cli


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    path = tmp_path_factory.mktemp("opts") / "cells.zarr"
    r = run_cli("synth", "--kind", "cells", "--n", "300", "--genes", "500", "-o", path,
                "--seed", "3")
    assert r.returncode == 0, r.stderr
    return str(path)


def mapped_files(root):
    """The files under `root` this process has memory-mapped now."""
    root = os.path.realpath(root) + os.sep
    with open("/proc/self/maps") as f:
        return {line.split(None, 5)[5].strip() for line in f
                if len(line.split(None, 5)) == 6 and line.split(None, 5)[5].startswith(root)}


def read_all(ds):
    b = ds.read_many(np.arange(len(ds)))
    x = b["X"]
    return x.indptr.copy(), x.indices.copy(), x.data.copy()


def test_default_maps_data_files_and_zero_reads_with_pread(cells, monkeypatch):
    monkeypatch.delenv("ZBATCH_MMAP_BYTES", raising=False)
    ds = zbatch.open(cells)
    mapped = read_all(ds)
    assert mapped_files(cells), "the default budget (1 GiB) maps the store's data files"
    del ds
    assert not mapped_files(cells), "closing the store unmaps its files"

    ds = zbatch.open(cells, mmap_bytes=0)
    pread = read_all(ds)
    assert not mapped_files(cells)
    for a, b in zip(mapped, pread):
        np.testing.assert_array_equal(a, b)


def test_environment_fills_the_option(cells, monkeypatch):
    monkeypatch.setenv("ZBATCH_MMAP_BYTES", "0")
    ds = zbatch.open(cells)
    read_all(ds)
    assert not mapped_files(cells)
    # the argument wins over the environment
    ds2 = zbatch.open(cells, mmap_bytes=1 << 30)
    read_all(ds2)
    assert mapped_files(cells)


@pytest.mark.parametrize("value", [-1, 1.5, "10", True])
def test_bad_argument_is_refused(cells, value):
    with pytest.raises(ValueError, match="mmap_bytes must be an integer >= 0"):
        zbatch.open(cells, mmap_bytes=value)


def test_bad_environment_is_refused(cells, monkeypatch):
    monkeypatch.setenv("ZBATCH_MMAP_BYTES", "1G")
    with pytest.raises(ValueError, match="ZBATCH_MMAP_BYTES='1G': not a number of bytes"):
        zbatch.open(cells)


def test_command_reads_the_environment(cells):
    env = dict(os.environ, ZBATCH_MMAP_BYTES="lots")
    r = subprocess.run([str(CLI), "info", cells], capture_output=True, text=True, env=env,
                       timeout=30)
    assert r.returncode == 1
    assert "ZBATCH_MMAP_BYTES='lots': not a number of bytes" in r.stderr
    env["ZBATCH_MMAP_BYTES"] = "0"
    r = subprocess.run([str(CLI), "info", cells], capture_output=True, text=True, env=env,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    assert "300" in r.stdout
