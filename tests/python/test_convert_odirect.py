"""The conversion writes its output with direct I/O (O_DIRECT, zb_store_opts.direct_io) and
reads it back the same way at the end: the same bytes as a buffered conversion
(ZBATCH_CONVERT_BUFFERED=1), on a disk file system and on tmpfs, anndata reads every cell back
equal to its source, and the output's shards are not left in the page cache (mincore, against
the buffered conversion that leaves them there: the oracle that the switch does something).
The library reads no environment variable: the command and the Python package read this one
and pass zb_convert_opts.buffered_output, the Dask path to every task.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from conftest import CLI, zbatch_api
from test_convert_collection import check_cells, make_adata, tree_bytes

GENES = [f"gene_{i:04d}" for i in range(600)]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Two .h5ad files large enough that X's shards pass the 64 KiB below which objects are
    written buffered (shards of 200-500 KB)."""
    d = tmp_path_factory.mktemp("odirect")
    out = []
    rng = np.random.default_rng(15)
    for k, n in enumerate([1500, 1100]):
        genes = GENES if k == 0 else list(rng.permutation(GENES[100:]))
        a = make_adata(k, n, genes, ["B", "T", "NK"], seed=150 + k)
        p = d / f"in{k}.h5ad"
        a.write_h5ad(p)
        out.append((str(p), a))
    return out


def convert(paths, out, *, buffered):
    env = dict(os.environ)
    env.pop("ZBATCH_CONVERT_BUFFERED", None)
    if buffered:
        env["ZBATCH_CONVERT_BUFFERED"] = "1"
    r = subprocess.run([str(CLI), "convert", *paths, "-o", str(out), "--quiet", "--dataset-size",
                        "1400", "--threads", "2", "--seed", "3"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def cached_fraction(path):
    """The fraction of the file's pages in the page cache (mincore over a shared mapping, which
    maps without reading)."""
    size = path.stat().st_size
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr is not None and addr != ctypes.c_void_p(-1).value, os.strerror(ctypes.get_errno())
        try:
            assert _libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(v & 1 for v in vec) / pages


def fs_type(path):
    """The type of the file system holding `path` (the longest mount point above it)."""
    path, best = os.path.realpath(path), ("", "")
    with open("/proc/self/mounts") as f:
        for line in f:
            _, mnt, kind = line.split()[:3]
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best[0]):
                best = (mnt, kind)
    return best[1]


def big_objects(root):
    return [p for p in Path(root).rglob("*") if p.is_file() and p.stat().st_size >= 128 << 10]


def test_direct_output_matches_buffered_and_skips_the_page_cache(inputs, tmp_path):
    paths = [p for p, _ in inputs]
    direct, buffered = tmp_path / "direct.zarr", tmp_path / "buffered.zarr"
    convert(paths, buffered, buffered=True)
    convert(paths, direct, buffered=False)
    # the conversion wrote (and verified) shards of 200-500 KB: after a buffered conversion
    # they sit in the page cache, after a direct one (write and read-back) they do not
    shards = big_objects(buffered)
    assert shards, "no object large enough to be written directly"
    if fs_type(tmp_path) not in ("tmpfs", "ramfs"):  # there everything is in the page cache
        assert min(cached_fraction(p) for p in shards) > 0.9
        # (the direct output's shards are checked before anything here reads them)
        assert max(cached_fraction(direct / p.relative_to(buffered)) for p in shards) < 0.05
    a, b = tree_bytes(direct), tree_bytes(buffered)
    assert sorted(a) == sorted(b)
    assert a == b
    # the oracle for what the output holds: anndata reads every cell equal to its source
    check_cells(direct, inputs, GENES)


def test_tmpfs_output_is_the_same(inputs, tmp_path):
    """On tmpfs (no O_DIRECT before Linux 6.6, a pretend one since) the bytes are the same."""
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm")
    paths = [p for p, _ in inputs]
    disk = tmp_path / "disk.zarr"
    convert(paths, disk, buffered=False)
    shm = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="zbatch_odirect_"))
    try:
        convert(paths, shm / "out.zarr", buffered=False)
        assert tree_bytes(shm / "out.zarr") == tree_bytes(disk)
    finally:
        shutil.rmtree(shm)


def on_disk(path):
    if fs_type(path) in ("tmpfs", "ramfs"):
        pytest.skip("everything is in the page cache on tmpfs")


@pytest.mark.parametrize("value,buffered", [("1", True), ("0", False), ("", False)])
def test_the_package_reads_the_variable(inputs, tmp_path, monkeypatch, value, buffered):
    """zbatch.convert in this process: ZBATCH_CONVERT_BUFFERED as the command reads it ("" and
    "0" off, anything else on), the same bytes as the command's conversion."""
    on_disk(tmp_path)
    zb = zbatch_api()
    paths = [p for p, _ in inputs]
    ref, out = tmp_path / "ref.zarr", tmp_path / "py.zarr"
    convert(paths, ref, buffered=False)
    monkeypatch.setenv("ZBATCH_CONVERT_BUFFERED", value)
    zb.convert(paths, out, dataset_size=1400, num_threads=2, seed=3, progress=False)
    shards = big_objects(out)
    assert shards
    if buffered:
        assert min(cached_fraction(p) for p in shards) > 0.9
    else:
        assert max(cached_fraction(p) for p in shards) < 0.05
    assert tree_bytes(out) == tree_bytes(ref)


def test_tasks_run_by_a_worker_take_the_option(inputs, tmp_path, monkeypatch):
    """What a Dask worker runs (zbatch._convert._run_task: a handle of its own from the plan in
    the output) writes buffered when the client's environment asks for it: the arguments the
    client submits carry the option, and the tasks' shards are in the page cache before the
    finishing step reads anything back; the same bytes as the command's conversion."""
    on_disk(tmp_path)
    zb = zbatch_api()
    from dask import distributed
    from zbatch import _convert, _zbatch
    paths = [p for p, _ in inputs]
    ref, out = tmp_path / "ref.zarr", tmp_path / "dask.zarr"
    convert(paths, ref, buffered=False)
    monkeypatch.setenv("ZBATCH_CONVERT_BUFFERED", "1")

    class Done:
        def __init__(self, value):
            self.value = value

        def result(self):
            return self.value

    class Client:
        """Runs each task at once, in this process, after recording its arguments."""
        submitted = []

        def submit(self, fn, *args, **kwargs):
            self.submitted.append(args)
            return Done(fn(*args))

    finish = _zbatch.convert_finish
    cached = []

    def check_then_finish(*args):
        cached.append(min(cached_fraction(p) for p in big_objects(out)))
        finish(*args)

    monkeypatch.setattr(distributed, "as_completed", iter)
    monkeypatch.setattr(_zbatch, "convert_finish", check_then_finish)
    zb.convert(paths, out, dataset_size=1400, num_threads=2, seed=3, progress=False,
               client=Client())
    assert Client.submitted and all(args[-1] is True for args in Client.submitted)
    assert cached and cached[0] > 0.9
    assert tree_bytes(out) == tree_bytes(ref)
