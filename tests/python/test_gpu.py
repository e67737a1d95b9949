"""GPU delivery without a GPU (issue 22, docs/GPU.md).

- device="cuda" on a torch without CUDA is a clear error; pin_memory=True warns and stays on
  the host, as torch's DataLoader does.
- A C loader asked for device batches without a CUDA runtime falls back to host memory and
  says why (or fails when required to).
- With a fake CUDA runtime (tests/c/fake/fake_cudart.c, compiled here: host memory posing as
  page-locked and device memory) the device copies are bit for bit the host batches, the
  Python device path (zbatch._cuda.DeviceBatch: CSR X, pointer arrays, batch_idx, densify) builds
  the same batch as the host path and as scipy / the samples written, the consumer stream
  waits once per batch, and everything is freed when batches and loader are gone.
- pin_memory=True with the script's own non_blocking copies out of the batches: a batch's
  release fences torch's current stream at that moment, and its page-locked memory is
  reused only after the fence ran (the fake runtime holds copies back as a lagging GPU does).
The same checks on a real GPU run in scripts/gpu-check.sh.
"""
import ctypes
import gc
import shutil
import subprocess
import warnings
from pathlib import Path
from types import SimpleNamespace

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch

import zbatch
from zbatch import _zbatch
from zbatch._cuda import DeviceBatch, scatter_dense
from zbatch.dataset import Batch
from zbatch.samplers import make_sampler

N, GENES, BS = 300, 37, 40
ROOT = Path(__file__).resolve().parents[2]


class Counters(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "host_allocs", "host_frees", "device_allocs", "device_frees", "copies", "bytes",
        "pageable_copies", "bad_copies", "streams_created", "streams_destroyed",
        "events_created", "events_destroyed", "records", "copy_stream_waits", "consumer_waits",
        "syncs", "live_device", "live_pinned")]


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    """The fake runtime, built from the C tests' source: (path, ctypes handle)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the fake CUDA runtime")
    out = tmp_path_factory.mktemp("fakecuda") / "libfake_cudart.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-pthread", "-o", str(out),
                    str(ROOT / "tests/c/fake/fake_cudart.c")], check=True)
    lib = ctypes.CDLL(str(out))
    lib.fake_cuda_reset(1)
    return str(out), lib


def counters(lib) -> Counters:
    c = Counters()
    lib.fake_cuda_counters(ctypes.byref(c))
    return c


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    rng = np.random.default_rng(7)
    x = sp.random(N, GENES, density=0.25, format="csr", random_state=8, dtype=np.float32)
    obs = pd.DataFrame({"depth": rng.integers(0, 100, N).astype(np.int64),
                        "kind": pd.Categorical(rng.choice(["a", "b"], N))},
                       index=[f"c{i}" for i in range(N)])
    a = ad.AnnData(X=x, obs=obs, var=pd.DataFrame(index=[f"g{j}" for j in range(GENES)]))
    p = tmp_path_factory.mktemp("gpu") / "cells.zarr"
    a.write_zarr(str(p))
    return p, a


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    rng = np.random.default_rng(9)
    samples = []
    for i in range(60):
        n, e = 2 + i % 5, 1 + (3 * i) % 7
        samples.append({"positions": rng.normal(size=(n, 3)).astype(np.float32),
                        "atomic_numbers": rng.integers(1, 9, n).astype(np.int64),
                        "forces": rng.normal(size=(n, 3)).astype(np.float32),
                        "energy": np.array([rng.normal()], dtype=np.float32),
                        "cell": np.eye(3, dtype=np.float32), "pbc": np.zeros(3, bool),
                        "neighbor_list": rng.integers(0, n, (e, 2)).astype(np.int64),
                        "shifts": np.zeros((e, 3), np.float32)})
    p = tmp_path_factory.mktemp("gpu") / "graphs.zarr"
    zbatch.AtomicWriter(str(p)).write(samples)
    return p, samples


class HostMapped(DeviceBatch):
    """DeviceBatch with its "device" pointers read as host memory (the fake runtime's device
    memory is host memory): the Python device path, run on the CPU."""

    def _tensor(self, ptr, typestr, shape):
        dt = np.dtype(typestr)
        n = int(np.prod(shape)) * dt.itemsize
        raw = ctypes.string_at(ptr, n) if n else b""
        return torch.from_numpy(np.frombuffer(raw, dtype=dt).reshape(shape).copy())


def c_loader(ds, batch_size, **kw):
    s = make_sampler("sequential", n=len(ds), batch_size=batch_size)
    return _zbatch._Loader(ds._c, s._c, 3, 2, [], **kw), s


def device_batches(loader):
    out = []
    while (db := loader.next_device()) is not None:
        out.append(db)
    return out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_device_cuda_without_cuda_is_a_clear_error(cells):
    ds = zbatch.open(cells[0])
    with pytest.raises(ValueError, match=r"device='cuda'.*torch.cuda.is_available\(\) is False"
                                         r".*device='cpu'"):
        zbatch.DataLoader(ds, device="cuda", output="torch")
    if torch.version.cuda is None:
        with pytest.raises(ValueError, match="CPU-only build"):
            zbatch.DataLoader(ds, device="cuda:0", output="torch")
    with pytest.warns(UserWarning, match="pin_memory=True but no accelerator"):
        dl = zbatch.DataLoader(ds, batch_size=BS, pin_memory=True, output="torch")
    assert dl.placement == "host"
    got = [b["obs/depth"] for b in dl]
    want = np.asarray(cells[1].obs["depth"])
    np.testing.assert_array_equal(torch.cat(got).numpy(), want)


def test_densify_arguments(cells):
    ds = zbatch.open(cells[0])
    with pytest.raises(ValueError, match="densify must be"):
        zbatch.DataLoader(ds, densify="gpu", output="torch")
    with pytest.raises(ValueError, match="densify='device'.*device='cuda'"):
        zbatch.DataLoader(ds, densify="device", output="torch")
    with pytest.raises(ValueError, match="num_streams"):
        zbatch.DataLoader(ds, num_streams=0, output="torch")
    b = next(iter(zbatch.DataLoader(ds, batch_size=BS, densify="host", output="torch")))
    np.testing.assert_array_equal(b["X_dense"].numpy(), cells[1].X[:BS].toarray())


def test_scatter_dense_matches_scipy():
    m = sp.random(9, 13, density=0.3, format="csr", random_state=2, dtype=np.float32)
    m.indices = m.indices.astype(np.int32)
    d = scatter_dense(torch.from_numpy(m.indptr.astype(np.int64)),
                      torch.from_numpy(m.indices.astype(np.int64)), torch.from_numpy(m.data),
                      9, 13, m.nnz)
    assert d.dtype == torch.float32
    np.testing.assert_array_equal(d.numpy(), m.toarray())


def test_fallback_without_runtime_is_reported(cells):
    ds = zbatch.open(cells[0])
    lib = "/nonexistent/libcudart.so.12"
    with pytest.raises(zbatch.ZbatchError, match=lib):
        c_loader(ds, BS, placement="device", cuda_library=lib, require_placement=True)
    with pytest.raises(ValueError, match="placement must be"):
        c_loader(ds, BS, placement="gpu")
    loader, _ = c_loader(ds, BS, placement="device", cuda_library=lib)
    where, why = loader.placement()
    assert where == "host" and lib in why and "no CUDA runtime" in why
    dbs = device_batches(loader)
    assert len(dbs) == -(-N // BS)
    assert not any(db.on_device for db in dbs) and dbs[0].pointers() is None
    x = Batch(dbs[1].host(), "anndata", GENES, "scipy")["X"]
    assert (x != cells[1].X[BS:2 * BS]).nnz == 0
    assert zbatch._zbatch.cuda_probe(lib).startswith("no CUDA runtime")
    loader.close()


def check_device_copy(db):
    """The device copy's bytes (readable: fake device memory) equal the host copy's."""
    host, ptrs = db.host(), db.pointers()
    assert db.on_device and ptrs["event"]
    for name, (buf, typestr, shape, _k, _s) in host["fields"].items():
        if isinstance(buf, list):
            assert ptrs["fields"][name] is None
            continue
        want = bytes(memoryview(buf))
        assert ctypes.string_at(ptrs["fields"][name], len(want)) == want, name
    for name, buf in host["segments"].items():
        want = bytes(memoryview(buf))
        assert ctypes.string_at(ptrs["segments"][name], len(want)) == want, name
    want = bytes(memoryview(host["index"]))
    assert ctypes.string_at(ptrs["index"], len(want)) == want


def test_device_batches_anndata(cells, fake):
    path, lib = fake
    lib.fake_cuda_reset(1)
    p, a = cells
    ds = zbatch.open(p)
    loader, _ = c_loader(ds, BS, placement="device", cuda_library=path, num_streams=2)
    assert loader.placement() == ("device", None)
    with pytest.raises(zbatch.ZbatchError, match="next_device"):
        loader.next()
    dbs = device_batches(loader)
    assert len(dbs) == -(-N // BS)
    for k, db in enumerate(dbs):
        check_device_copy(db)
        b = HostMapped(db, "anndata", GENES, "cpu", densify=True, stream=0)
        ids = np.arange(k * BS, min(N, (k + 1) * BS))
        np.testing.assert_array_equal(b["index"].numpy(), ids)
        x = b["X"]
        assert x.layout == torch.sparse_csr and x.shape == (len(ids), GENES)
        want = a.X[ids]
        np.testing.assert_array_equal(x.crow_indices().numpy(), want.indptr)
        np.testing.assert_array_equal(x.col_indices().numpy(), want.indices)
        np.testing.assert_array_equal(x.values().numpy(), want.data)
        np.testing.assert_array_equal(b["X_dense"].numpy(), want.toarray())
        np.testing.assert_array_equal(b["obs/depth"].numpy(), a.obs["depth"].to_numpy()[ids])
        host = Batch(db.host(), "anndata", GENES, "torch")
        assert set(host) | {"X_dense"} == set(b)
    stats = loader.device_stats()
    assert stats["batches_copied"] == len(dbs)
    assert 0 < stats["device_blocks"] <= 3 * 2 + 3   # windows in flight, not batches
    c = counters(lib)
    assert c.consumer_waits == len(dbs) and c.syncs == 0 and c.bad_copies == 0
    assert c.pageable_copies == 0                     # windows sit in page-locked memory
    del dbs, db, b, host
    loader.close()
    gc.collect()
    c = counters(lib)
    assert c.live_device == 0 and c.live_pinned == 0
    assert c.events_created == c.events_destroyed


def test_device_batches_graphs(graphs, fake):
    path, lib = fake
    lib.fake_cuda_reset(1)
    p, samples = graphs
    ds = zbatch.open(p)
    loader, _ = c_loader(ds, 8, placement="device", cuda_library=path)
    for k, db in enumerate(device_batches(loader)):
        check_device_copy(db)
        b = HostMapped(db, "atomic", 0, "cpu", stream=0)
        part = samples[k * 8:(k + 1) * 8]
        nat = [len(s["positions"]) for s in part]
        ned = [len(s["neighbor_list"]) for s in part]
        atoms_ptr = np.concatenate([[0], np.cumsum(nat)])
        np.testing.assert_array_equal(b["atoms_ptr"].numpy(), atoms_ptr)
        np.testing.assert_array_equal(b["edges_ptr"].numpy(), np.concatenate([[0], np.cumsum(ned)]))
        np.testing.assert_array_equal(b["batch_idx"].numpy(), np.repeat(np.arange(len(part)), nat))
        np.testing.assert_array_equal(b["positions"].numpy(),
                                      np.concatenate([s["positions"] for s in part]))
        np.testing.assert_array_equal(
            b["neighbor_list"].numpy(),
            np.concatenate([s["neighbor_list"] + atoms_ptr[i] for i, s in enumerate(part)]))
        np.testing.assert_array_equal(b["energy"].numpy().ravel(),
                                      np.concatenate([s["energy"] for s in part]))
    del db, b   # the last batch holds the device stage (and so every block) alive
    loader.close()
    gc.collect()
    c = counters(lib)
    assert c.live_device == 0 and c.live_pinned == 0


def test_pinned_placement_gives_pinned_host_batches(cells, fake):
    path, lib = fake
    lib.fake_cuda_reset(1)
    ds = zbatch.open(cells[0])
    loader, _ = c_loader(ds, BS, placement="pinned", cuda_library=path)
    assert loader.placement() == ("pinned", None)
    raw = loader.next()
    buf = raw["fields"]["X/data"][0]
    arr = np.frombuffer(buf, dtype=np.uint8)
    assert lib.fake_cuda_is_pinned(ctypes.c_void_p(arr.ctypes.data), ctypes.c_size_t(arr.size))
    assert not lib.fake_cuda_is_pinned(ctypes.c_void_p(np.zeros(4).ctypes.data),
                                       ctypes.c_size_t(4))
    x = Batch(raw, "anndata", GENES, "scipy")["X"]
    assert (x != cells[1].X[:BS]).nnz == 0
    del raw, x, buf, arr
    loader.close()
    gc.collect()
    c = counters(lib)
    assert c.copies == 0 and c.host_allocs > 0 and c.live_pinned == 0


def test_dataloader_pin_memory_reads_into_page_locked_memory(cells, fake, monkeypatch):
    """pin_memory=True with CUDA: X comes straight out of the loader's page-locked windows
    (no pin_memory() copy); torch's CUDA is stood in for by the fake runtime."""
    path, lib = fake
    lib.fake_cuda_reset(1)
    fake_torch_cuda(monkeypatch, path, {"stream": 0})
    ds = zbatch.open(cells[0])
    dl = zbatch.DataLoader(ds, batch_size=BS, pin_memory=True, output="torch")
    n = 0
    for k, b in enumerate(dl):
        v = b["X"].values()
        assert lib.fake_cuda_is_pinned(ctypes.c_void_p(v.data_ptr()),
                                       ctypes.c_size_t(v.numel() * v.element_size()))
        np.testing.assert_array_equal(v.numpy(), cells[1].X[k * BS:(k + 1) * BS].data)
        n += 1
    assert n == -(-N // BS) and dl.placement == "pinned" and dl.placement_reason is None
    del b, v
    dl.close()


def fake_torch_cuda(monkeypatch, path, current):
    """torch's CUDA stood in for by the fake runtime at `path`; torch's current stream is
    ``current["stream"]`` (a fake cudaStream_t: the fake runtime never dereferences one)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: SimpleNamespace(cuda_stream=current["stream"]))
    monkeypatch.setattr("zbatch._cuda.loaded_cudart", lambda: path)


def test_pinned_batches_fence_the_current_stream_at_release(cells, fake, monkeypatch):
    """The standard idiom ``x = b["X"].to("cuda", non_blocking=True)`` then dropping ``b``,
    with a GPU that lags (the fake runtime holds every copy back until flushed): each batch's
    release records one fence on torch's current stream at the moment its last tensor goes,
    the loader takes other page-locked blocks meanwhile (waiting on the host for nothing), and
    every copy queued before a release reads its own batch's bytes once the GPU runs it."""
    path, lib = fake
    lib.fake_cuda_reset(1)
    lib.fake_cuda_last_record_stream.restype = ctypes.c_void_p
    lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                    ctypes.c_int, ctypes.c_void_p]
    lib.cudaFree.argtypes = [ctypes.c_void_p]
    current = {"stream": 0}
    fake_torch_cuda(monkeypatch, path, current)
    ds = zbatch.open(cells[0])
    dl = zbatch.DataLoader(ds, batch_size=BS, pin_memory=True, output="torch", prefetch_factor=2)
    lib.fake_cuda_hold(1)
    copies, k, it = [], 0, iter(dl)
    while (b := next(it, None)) is not None:
        current["stream"] = 0x1000 + k      # the stream the script copies on
        v = b["X"].values()
        n = v.numel() * v.element_size()
        d = ctypes.c_void_p()
        assert lib.cudaMalloc(ctypes.byref(d), n) == 0
        assert lib.cudaMemcpyAsync(d, v.data_ptr(), n, 1, current["stream"]) == 0
        copies.append((d, n))
        records = counters(lib).records
        current["stream"] = 0x2000 + k      # the stream current when the batch goes
        del b, v
        assert counters(lib).records == records + 1
        assert lib.fake_cuda_last_record_stream() == 0x2000 + k
        k += 1
    c = counters(lib)
    assert k == -(-N // BS) and c.copies == k and c.syncs == 0
    assert dl._live.device_stats()["retired_pending"] == k
    lib.fake_cuda_flush()                   # the GPU catches up: each copy, then its fence
    lib.fake_cuda_hold(0)
    for i, (d, n) in enumerate(copies):
        want = cells[1].X[i * BS:(i + 1) * BS].data
        got = np.frombuffer(ctypes.string_at(d.value, n), dtype=want.dtype)
        np.testing.assert_array_equal(got, want, err_msg=f"batch {i}")
        lib.cudaFree(d)
    # the next epoch, batches dropped at once: the fenced blocks came back and are reused
    blocks = dl._live.device_stats()["host_blocks"]
    assert sum(len(b["index"]) for b in dl) == N
    assert dl._live.device_stats()["host_blocks"] == blocks
    dl.close()
    gc.collect()
    c = counters(lib)
    assert c.live_pinned == 0 and c.live_device == 0
    assert c.events_created == c.events_destroyed


def test_pinned_release_when_the_stream_cannot_be_read(cells, fake, monkeypatch):
    """A stream callable that fails at release (torch torn down at exit) is reported as an
    unraisable error naming it, and the batch is fenced on its consumer stream instead (the one
    given to wait(), here 0x77); an exception being raised meanwhile is left as it was."""
    path, lib = fake
    lib.fake_cuda_reset(1)
    lib.fake_cuda_last_record_stream.restype = ctypes.c_void_p
    ds = zbatch.open(cells[0])
    loader, _ = c_loader(ds, BS, placement="pinned", cuda_library=path)
    db = loader.next_device()
    assert not db.on_device and db.pointers() is None
    with pytest.raises(TypeError, match="callable"):
        db.release_on(5)

    def broken():
        raise RuntimeError("torch is gone")
    db.wait(0x77)
    db.release_on(broken)
    seen = []
    monkeypatch.setattr("sys.unraisablehook", seen.append)
    records = counters(lib).records
    try:
        raise KeyError("pending")
    except KeyError as e:
        del db
        assert e.args == ("pending",)
    assert len(seen) == 1 and seen[0].object is broken
    assert isinstance(seen[0].exc_value, RuntimeError)
    assert counters(lib).records == records + 1
    assert lib.fake_cuda_last_record_stream() == 0x77
    loader.close()
    gc.collect()
    c = counters(lib)
    assert c.live_pinned == 0 and c.events_created == c.events_destroyed


def test_dataloader_falls_back_when_no_runtime_loads(cells, monkeypatch):
    """torch has CUDA but zbatch loads no runtime: a warning with the reason, and the loader
    says it is on the host (torch then copies each batch)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr("zbatch._cuda.loaded_cudart", lambda: "/nonexistent/libcudart.so.12")
    ds = zbatch.open(cells[0])
    dl = zbatch.DataLoader(ds, batch_size=BS, device="cuda", output="torch")
    assert dl.placement == "device"      # asked for; nothing opened yet
    with pytest.warns(UserWarning, match="pageable host memory.*no CUDA runtime"):
        it = iter(dl)
        if torch.version.cuda is None:   # a CPU-only torch: its per-batch copy fails
            with pytest.raises((RuntimeError, AssertionError), match="(?i)cuda"):
                next(it)
        else:                            # torch copied the batch
            assert next(it)["obs/depth"].is_cuda
    assert dl.placement == "host" and "/nonexistent/libcudart.so.12" in dl.placement_reason
    dl.close()
