"""The pipelined DataLoader: order, coverage, resumption, distributed ranks, transforms, early
exit and errors, bounded memory. Oracles: anndata / scipy for values, numpy set algebra for
coverage, an uninterrupted run for resumption, /proc for threads and memory."""
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import anndata as ad
import numpy as np
import pytest

import zbatch

ROOT = Path(__file__).resolve().parents[2]
CLI = str(ROOT / "build" / "zbatch")


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def settled_threads(want: int, timeout: float = 2.0) -> int:
    """The thread count once it reaches `want`, or after `timeout`: a thread that
    pthread_join has already returned for can stay listed in /proc/self/task for a moment,
    until the kernel reaps it. A thread that is really left running keeps the count high."""
    import time
    deadline = time.monotonic() + timeout
    n = os_threads()
    while n != want and time.monotonic() < deadline:
        time.sleep(0.01)
        n = os_threads()
    return n


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    p = tmp_path_factory.mktemp("loader") / "cells.zarr"
    subprocess.run([CLI, "synth", "--kind", "cells", "--n", "3000", "-o", str(p), "--seed", "7",
                    "--genes", "2000", "--chunk-nnz", "8192"], check=True, capture_output=True)
    return p, ad.read_zarr(p)


def ids_of(loader):
    return [b["index"].astype(np.int64).copy() for b in loader]


@pytest.mark.parametrize("sampler,kw", [("sequential", {}), ("random", {}),
                                        ("block", {"block_size": 32, "blocks_per_window": 4})])
def test_epoch_covers_every_sample_once_and_values_match(cells, sampler, kw):
    p, a = cells
    ds = zbatch.open(p, num_threads=2)
    dl = zbatch.DataLoader(ds, batch_size=256, sampler=sampler, seed=1, prefetch_factor=3, **kw)
    seen = []
    for b in dl:
        ids = b["index"].astype(np.int64)
        assert (b["X"] != a.X[ids]).nnz == 0
        np.testing.assert_array_equal(b["obs/cell_line"], a.obs["cell_line"].cat.codes.values[ids])
        seen.append(ids)
    assert len(seen) == len(dl) == 12
    allids = np.concatenate(seen)
    np.testing.assert_array_equal(np.sort(allids), np.arange(3000))
    if sampler == "sequential":
        np.testing.assert_array_equal(allids, np.arange(3000))


def test_order_depends_on_seed_and_epoch_not_threads(cells):
    p, _ = cells
    runs = {}
    for threads in (1, 2):
        ds = zbatch.open(p, num_threads=threads)
        dl = zbatch.DataLoader(ds, batch_size=300, sampler="random", seed=11, prefetch_factor=2)
        e0 = np.concatenate(ids_of(dl))
        dl.set_epoch(1)
        e1 = np.concatenate(ids_of(dl))
        runs[threads] = (e0, e1)
    np.testing.assert_array_equal(runs[1][0], runs[2][0])
    np.testing.assert_array_equal(runs[1][1], runs[2][1])
    assert not np.array_equal(runs[1][0], runs[1][1])
    ds = zbatch.open(p)
    other = np.concatenate(ids_of(zbatch.DataLoader(ds, batch_size=300, sampler="random", seed=12)))
    assert not np.array_equal(other, runs[1][0])


@pytest.mark.parametrize("sampler,kw", [("sequential", {}), ("random", {}),
                                        ("block", {"block_size": 16, "blocks_per_window": 8})])
def test_resume_equals_uninterrupted_run(cells, sampler, kw):
    p, _ = cells
    ds = zbatch.open(p, num_threads=2)

    def loader():
        return zbatch.DataLoader(ds, batch_size=128, sampler=sampler, seed=4, prefetch_factor=4,
                                 **kw)

    full = ids_of(loader())
    dl = loader()
    part = []
    for i, b in enumerate(dl):
        part.append(b["index"].astype(np.int64).copy())
        if i == 6:
            break
    state = dl.state_dict()
    dl2 = loader()
    dl2.load_state_dict(state)
    rest = ids_of(dl2)
    assert len(part) + len(rest) == len(full)
    for x, y in zip(full, part + rest):
        np.testing.assert_array_equal(x, y)


def test_resume_onto_a_different_world_size(cells):
    """4 ranks run k steps, then 3 ranks continue: together every sample exactly once."""
    p, _ = cells
    ds = zbatch.open(p)
    n = 3000
    k = 2
    first, states = [], []
    for r in range(4):
        dl = zbatch.DataLoader(ds, batch_size=100, sampler="random", seed=9, rank=r,
                               world_size=4, drop_last=False)
        it = iter(dl)
        for _ in range(k):
            first.append(next(it)["index"].astype(np.int64).copy())
        states.append(dl.state_dict())
        dl.close()
    assert len({s["position"] for s in states}) == 1
    rest = []
    for r in range(3):
        dl = zbatch.DataLoader(ds, batch_size=100, sampler="random", seed=9, rank=r,
                               world_size=3, drop_last=False)
        dl.load_state_dict(states[0])
        rest += ids_of(dl)
    allids = np.concatenate(first + rest)
    # padding may repeat a few samples at the very end; nothing is dropped
    assert set(allids.tolist()) == set(range(n))
    assert len(allids) - n < 3 * 100


def test_transforms_in_c_and_python(cells):
    p, a = cells
    ds = zbatch.open(p)
    cols = [5, 17, 1999, 0]
    dl = zbatch.DataLoader(ds, batch_size=200, sampler="sequential",
                           transforms=[("normalize_total", 1e4), "log1p", ("densify", cols)],
                           batch_transforms=[lambda b: (b, b["index"].sum())[0]])
    b = next(iter(dl))
    ids = b["index"].astype(np.int64)
    x = a.X[ids].toarray().astype(np.float64)
    x = np.log1p(x / x.sum(axis=1, keepdims=True) * 1e4)
    np.testing.assert_allclose(b["X_dense"], x[:, cols], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b["X"].toarray(), x, rtol=1e-5, atol=1e-5)
    dl = zbatch.DataLoader(ds, batch_size=50, transforms=[("cast", "obs/n_genes", "float32")])
    b = next(iter(dl))
    assert b["obs/n_genes"].dtype == np.float32
    np.testing.assert_array_equal(b["obs/n_genes"], a.obs["n_genes"].values[:50].astype(np.float32))
    with pytest.raises(ValueError):
        zbatch.DataLoader(ds, transforms=["no_such_transform"])


# batch 100: 0.8 MB, written in place; batch 1100 (8.8 MB, full columns) is streamed out of a
# scratch row (transforms.c STREAM_MIN_BATCH_BYTES, 8 MiB), and its short last batch is not
@pytest.mark.parametrize("batch_size", [100, 1100])
@pytest.mark.parametrize("cols", [None, [3, 1999, 0, 700]])
def test_densify_every_pooled_batch_is_exact(cells, cols, batch_size):
    """Dense batches come from the batch memory pool, whose blocks recur across batches: each
    must be zeroed before it is filled (a stale value from an earlier batch, or from the
    previous row's scratch, would show here)."""
    p, a = cells
    ds = zbatch.open(p, num_threads=2)
    dl = zbatch.DataLoader(ds, batch_size=batch_size, sampler="random", seed=4,
                           prefetch_factor=2, drop_last=False,
                           transforms=[("densify", cols)] if cols else ["densify"])
    nb = 0
    for b in dl:
        ids = b["index"].astype(np.int64)
        want = a.X[ids].toarray()
        if cols:
            want = want[:, cols]
        got = b["X_dense"]
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        nb += 1
        del b, got
    assert nb == -(-3000 // batch_size)


@pytest.mark.parametrize("batch_size", [100, 1100])
def test_densify_index_outside_n_vars_is_an_error(cells, tmp_path, batch_size):
    """A column index >= n_vars in X/indices is corruption: the read path names the sample, the
    value and the chunk before densify could write outside the row (in place and streamed
    alike; docs/ERRORS.md "Invalid data")."""
    import zarr
    p, _ = cells
    q = tmp_path / "bad.zarr"
    shutil.copytree(p, q)
    ix = zarr.open_array(str(q / "X" / "indices"), mode="r+")
    ix[1500] = 2000 + 7  # n_vars is 2000; entry 1500 lies in the first rows
    ds = zbatch.open(q, num_threads=2)
    dl = zbatch.DataLoader(ds, batch_size=batch_size, sampler="sequential",
                           prefetch_factor=1, transforms=["densify"])
    with pytest.raises(zbatch.ZbatchError) as e:
        for _ in dl:
            pass
    assert e.value.status == "ZB_E_CORRUPT"
    assert ("sample 0: field X/indices: column id 2007 is outside [0, 2000) (row 1500, chunk "
            "X/indices/c/0)") in str(e.value)


# (genes, batch, prefetch): few batches in flight; and ~190 pooled blocks in flight at once
# (3 windows of 64 dense batches), which a pool keeping a fixed number of blocks (48 before)
# kept unmapping and mapping again (136 faults per batch of 312 pages)
@pytest.mark.parametrize("genes,batch,prefetch,epochs", [(2000, 1000, 2, 100),
                                                         (20000, 16, 64, 20)])
def test_densify_does_not_fault_in_fresh_pages_per_batch(cells, tmp_path, genes, batch,
                                                         prefetch, epochs):
    """Page faults per batch (zbatch bench, /proc accounting) with densify stay far below the
    pages of one dense batch (batch x genes float32), each faulted in anew when a batch's
    output is a fresh allocation."""
    import json
    p = cells[0]
    if genes != 2000:
        p = tmp_path / "wide.zarr"
        subprocess.run([CLI, "synth", "--kind", "cells", "--n", "6000", "--genes", str(genes),
                        "-o", str(p), "--seed", "3"], check=True, capture_output=True)
    pages = batch * genes * 4 / 4096
    # enough batches that the pool's growth to its working set (the first few windows: ~20k
    # faults for 3,000 cells of 8 MB batches) does not decide the figure; the loader reads on
    # across epochs, so a run of only a few batches would mostly measure that growth
    r = subprocess.run([CLI, "bench", str(p), "--sampler", "random", "--batch", str(batch),
                        "--prefetch", str(prefetch), "--threads", "2", "--epochs", str(epochs),
                        "--transform", "densify", "--no-decode-only", "--json", "--results",
                        str(tmp_path)], check=True, capture_output=True, text=True,
                       # malloc maps and unmaps every block past 1 MiB itself (no adaptive
                       # threshold): a batch's pages stay mapped only if the pool keeps them
                       env=dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(1 << 20)))
    f = json.loads(r.stdout)["figures"]
    assert f["page_faults_per_batch"] < pages / 8, (f["page_faults_per_batch"], pages)


@pytest.mark.parametrize("output", ["scipy", "torch"])
def test_x_is_built_when_read(cells, output):
    """A batch's CSR X is made on first access (a dense consumer never pays for it): keys,
    membership and order are those of a built batch, and X equals anndata's rows."""
    if output == "torch":
        pytest.importorskip("torch")
    p, a = cells
    ds = zbatch.open(p)
    dl = zbatch.DataLoader(ds, batch_size=128, sampler="random", seed=4, output=output,
                           transforms=[("densify", None)])
    b = next(iter(dl))
    keys = list(b)
    assert keys[:2] == ["index", "X"] and "X" in b and "X_dense" in keys and len(b) == len(keys)
    ids = np.asarray(b["index"]).astype(np.int64)
    want = a.X[ids].toarray()
    np.testing.assert_array_equal(np.asarray(b["X_dense"]), want)
    assert b._items["X"] is zbatch.dataset._LAZY  # not built by reading X_dense
    x = b["X"]
    assert b["X"] is x  # built once
    got = x.to_dense().numpy() if output == "torch" else x.toarray()
    np.testing.assert_array_equal(got, want)
    assert list(b) == keys
    assert "X: " in repr(next(iter(dl))) and "2000" in repr(b)
    with pytest.raises(KeyError):
        b["no_such_field"]


def test_torch_output(cells):
    torch = pytest.importorskip("torch")
    p, a = cells
    ds = zbatch.open(p)
    b = next(iter(zbatch.DataLoader(ds, batch_size=64, output="torch")))
    assert b["X"].layout == torch.sparse_csr
    np.testing.assert_array_equal(b["X"].to_dense().numpy(), a.X[:64].toarray())
    assert isinstance(b["obs/plate"], torch.Tensor)


def test_early_break_and_close_leave_no_thread(cells):
    p, _ = cells
    ds = zbatch.open(p, num_threads=2)
    base = os_threads()
    for _ in range(5):
        dl = zbatch.DataLoader(ds, batch_size=100, sampler="random", prefetch_factor=2, depth=3)
        for i, b in enumerate(dl):
            if i == 2:
                break
        del b
        dl.close()
    assert settled_threads(base) == base
    dl = zbatch.DataLoader(ds, batch_size=100)
    it = iter(dl)
    next(it)
    dl.close()  # close during iteration
    assert settled_threads(base) == base
    with zbatch.DataLoader(ds, batch_size=100) as dl:
        next(iter(dl))
    assert settled_threads(base) == base


def test_read_error_reaches_python(cells, tmp_path):
    p, _ = cells
    q = tmp_path / "broken.zarr"
    shutil.copytree(p, q)
    objs = sorted((q / "X" / "data" / "c").iterdir())  # shards (or chunks) of X/data
    chunk = objs[min(3, len(objs) - 1)]
    chunk.write_bytes(chunk.read_bytes()[:20])
    ds = zbatch.open(q)
    base = os_threads()
    dl = zbatch.DataLoader(ds, batch_size=500, sampler="sequential", prefetch_factor=1)
    with pytest.raises(zbatch.ZbatchError) as e:
        for _ in dl:
            pass
    assert e.value.status in ("ZB_E_TRUNCATED", "ZB_E_CORRUPT")
    assert "X/data/c/" in str(e.value)
    dl.close()
    assert settled_threads(base) == base


def test_batches_held_after_the_loader_is_gone(cells):
    p, a = cells
    ds = zbatch.open(p)
    dl = zbatch.DataLoader(ds, batch_size=100, prefetch_factor=2)
    held = list(dl)  # every batch kept: the loader must not stall or reuse their memory
    del dl
    for b in held[::7]:
        ids = b["index"].astype(np.int64)
        assert (b["X"] != a.X[ids]).nnz == 0


def test_peak_memory_is_bounded_by_the_options(tmp_path):
    """A store ~10x larger (decoded) than the loader's window bound: peak RSS stays within the
    bound plus a constant."""
    p = tmp_path / "big.zarr"
    subprocess.run([CLI, "synth", "--kind", "cells", "--n", "40000", "-o", str(p), "--seed", "1"],
                   check=True, capture_output=True)
    code = textwrap.dedent(f"""
        import resource, zbatch
        ds = zbatch.open({str(p)!r}, num_threads=2)
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        dl = zbatch.DataLoader(ds, batch_size=500, sampler="random", prefetch_factor=4, depth=2)
        n = 0
        for b in dl:
            n += b["X"].nnz
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(base, peak, n)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    base_kb, peak_kb, nnz = map(int, r.stdout.split())
    decoded_mb = nnz * 8 / 1e6                       # float32 data + int32 indices
    window_mb = 4 * 500 * 1460 * 8 / 1e6             # one window of prefetch_factor batches
    bound_mb = (2 + 2) * window_mb                   # depth windows + the one being consumed
    assert decoded_mb > 10 * window_mb
    assert (peak_kb - base_kb) / 1e3 < bound_mb + 64, (peak_kb - base_kb) / 1e3


DIST_WORKER = """
import os, sys, numpy as np, torch, torch.distributed as dist, zbatch
dist.init_process_group("gloo", rank=int(sys.argv[2]), world_size=2,
                        init_method="tcp://127.0.0.1:" + sys.argv[3])
ds = zbatch.open(sys.argv[1])
dl = zbatch.DataLoader(ds, batch_size=128, sampler="random", seed=3)   # rank/world from torch
assert (dl.rank, dl.world_size) == (int(sys.argv[2]), 2)
batches = [b["index"].astype(np.int64).tolist() for b in dl]
out = [None, None]
dist.all_gather_object(out, batches)
if dist.get_rank() == 0:
    print(" ".join(str(len(o)) + ":" + ",".join(str(i) for bt in o for i in bt) for o in out))
dist.destroy_process_group()
"""


def test_two_processes_with_torch_distributed(cells, tmp_path):
    pytest.importorskip("torch")
    import socket
    p, _ = cells
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    script = tmp_path / "worker.py"
    script.write_text(DIST_WORKER)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    procs = [subprocess.Popen([sys.executable, str(script), str(p), str(r), port], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    outs = [pr.communicate(timeout=120) for pr in procs]
    for pr, (o, e) in zip(procs, outs):
        assert pr.returncode == 0, e
    (n0, r0), (n1, r1) = (x.split(":") for x in outs[0][0].split())
    assert n0 == n1 == "12"                       # equal batch counts per rank
    r0, r1 = (set(map(int, r.split(","))) for r in (r0, r1))
    assert not r0 & r1                            # disjoint
    assert r0 | r1 == set(range(3000))            # complete


def test_each_iteration_is_a_full_pass(cells):
    """Without set_epoch every pass is the next epoch (torch's shuffle=True reshuffles each
    pass); a break does not shorten the next pass; once set_epoch is called the epoch set
    decides, and iterating twice gives that epoch twice. (This test used to assert that passes
    without set_epoch repeat one order, the behaviour issue 18 calls a bug.)"""
    p, _ = cells
    ds = zbatch.open(p)
    dl = zbatch.DataLoader(ds, batch_size=500, sampler="random", seed=2)
    want = sampler_epochs([0, 1, 2, 3], name="random", batch_size=500, seed=2)
    a = np.concatenate(ids_of(dl))
    np.testing.assert_array_equal(a, want[0])
    for i, _ in enumerate(dl):
        if i == 1:
            break
    b = np.concatenate(ids_of(dl))
    np.testing.assert_array_equal(b, want[2])
    assert not np.array_equal(a, b)
    dl.set_epoch(3)
    c = np.concatenate(ids_of(dl))
    np.testing.assert_array_equal(c, want[3])
    np.testing.assert_array_equal(np.concatenate(ids_of(dl)), c)


def sampler_epochs(epochs, **kw):
    """The ids of each epoch straight from a fresh sampler (the oracle of the loader's order)."""
    from zbatch.samplers import make_sampler
    sm = make_sampler(n=3000, **kw)
    out = []
    for e in epochs:
        sm.set_epoch(e)
        out.append(np.concatenate([np.asarray(x, dtype=np.int64).copy() for x in sm]))
    return out


@pytest.mark.parametrize("sampler,kw,prefetch", [
    ("random", {}, 3),           # 6 batches per epoch: windows of 3, the epoch ends on one
    ("random", {}, 4),           # windows of 4 and 2
    ("block", {"block_size": 64, "blocks_per_window": 2}, 1),
    ("sequential", {}, 16)])     # one window holds the whole epoch
def test_reading_on_across_epochs_keeps_every_epochs_order(cells, sampler, kw, prefetch):
    """After a whole pass the C loader reads on into the next epoch (the next pass without
    set_epoch, or set_epoch(e + 1); passes without set_epoch used to repeat one epoch, which
    issue 18 calls a bug); every pass still yields exactly the
    sampler's order of its epoch, a guess that misses (set_epoch(7)) starts afresh, and the
    sampler's own set_epoch is the loader's."""
    p, a = cells
    ds = zbatch.open(p, num_threads=2)
    dl = zbatch.DataLoader(ds, batch_size=500, sampler=sampler, seed=3,
                           prefetch_factor=prefetch, **kw)
    want = dict(zip([0, 1, 2, 7, 8], sampler_epochs([0, 1, 2, 7, 8], name=sampler,
                                                    batch_size=500, seed=3, **kw)))
    got0 = np.concatenate(ids_of(dl))
    np.testing.assert_array_equal(got0, want[0])
    live = dl._live
    assert live is not None  # parked: reading epoch 1, the next pass's
    np.testing.assert_array_equal(np.concatenate(ids_of(dl)), want[1])
    assert dl._live is live
    for e in (1, 2):
        dl.set_epoch(e)
        bs = list(dl)
        np.testing.assert_array_equal(np.concatenate([b["index"] for b in bs]), want[e])
        for b in bs[:2]:
            ids = b["index"].astype(np.int64)
            assert (b["X"] != a.X[ids]).nnz == 0
        assert dl.state_dict() == {"kind": dl.sampler.kind, "seed": 3, "epoch": e,
                                   "position": len(dl), "num_samples": 3000}
    dl.sampler.set_epoch(7)  # not the epoch read ahead: a fresh start
    np.testing.assert_array_equal(np.concatenate(ids_of(dl)), want[7])
    dl.sampler.set_epoch(8)  # the epoch read ahead, through the sampler
    assert dl._live is not None
    np.testing.assert_array_equal(np.concatenate(ids_of(dl)), want[8])
    assert dl.sampler.state_dict() == dl.state_dict()
    dl.close()
    assert dl.sampler.state_dict()["epoch"] == 8


def test_state_and_resume_after_a_pass_that_read_on(cells):
    """A checkpoint taken after a whole pass (while the loader reads the next epoch) is the
    end of that pass: restored into a new loader, set_epoch(e + 1) continues as uninterrupted;
    a state loaded into the same loader replaces what it read ahead."""
    p, _ = cells
    ds = zbatch.open(p, num_threads=2)

    def loader():
        return zbatch.DataLoader(ds, batch_size=400, sampler="random", seed=5,
                                 prefetch_factor=2)

    want = sampler_epochs([0, 1], name="random", batch_size=400, seed=5)
    dl = loader()
    np.testing.assert_array_equal(np.concatenate(ids_of(dl)), want[0])
    state = dl.state_dict()
    assert state["epoch"] == 0 and state["position"] == len(dl)
    dl2 = loader()
    dl2.load_state_dict(state)
    # the epoch is over: the next pass is the one that followed it uninterrupted (epoch 1;
    # this used to be an empty pass)
    np.testing.assert_array_equal(np.concatenate(ids_of(dl2)), want[1])
    dl3 = loader()
    dl3.load_state_dict(state)
    dl3.set_epoch(1)
    np.testing.assert_array_equal(np.concatenate(ids_of(dl3)), want[1])
    # mid-epoch state of epoch 1 loaded into the loader that read epoch 1 ahead
    dl.set_epoch(1)
    it = iter(dl)
    first = [next(it)["index"].astype(np.int64).copy() for _ in range(3)]
    mid = dl.state_dict()
    dl.close()
    dl.load_state_dict(mid)
    rest = ids_of(dl)
    np.testing.assert_array_equal(np.concatenate(first + rest), want[1])
    dl.sampler.load_state_dict({**mid, "position": 0})  # the sampler's is the loader's
    np.testing.assert_array_equal(np.concatenate(ids_of(dl)), want[1])


def test_size_aware_batches_respect_every_limit(tmp_path):
    p = tmp_path / "atoms.zarr"
    subprocess.run([CLI, "synth", "--kind", "atoms", "--n", "400", "-o", str(p), "--seed", "2"],
                   check=True, capture_output=True)
    ds = zbatch.open(p)
    atoms = ds.segment_lengths("atoms")
    assert atoms.min() >= 10 and atoms.max() <= 200
    dl = zbatch.DataLoader(ds, sampler="size_aware", batch_size=32, max_atoms=1500,
                           max_edges=60000, seed=4)
    seen = []
    for b in dl:
        assert b["atoms_ptr"][-1] <= 1500 and b["edges_ptr"][-1] <= 60000
        assert len(b["index"]) <= 32
        np.testing.assert_array_equal(np.diff(b["atoms_ptr"]), atoms[b["index"].astype(np.int64)])
        # neighbour lists stay inside their own sample's atoms, in batch numbering
        nl, ep, ap = b["neighbor_list"], b["edges_ptr"], b["atoms_ptr"]
        owner = np.repeat(np.arange(len(ep) - 1), np.diff(ep))
        assert np.all(nl[:, 0] >= ap[owner]) and np.all(nl[:, 0] < ap[owner + 1])
        seen.append(b["index"].astype(np.int64))
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(400))
    with pytest.raises(zbatch.ZbatchError) as e:
        zbatch.DataLoader(ds, sampler="size_aware", batch_size=32, max_atoms=100)
    assert str(int(np.argmax(atoms > 100))) in str(e.value) or "sample" in str(e.value)


def test_weighted_class_balanced_from_a_categorical_field(cells):
    p, a = cells
    ds = zbatch.open(p)
    dl = zbatch.DataLoader(ds, sampler="weighted", batch_size=500, class_field="obs/plate",
                           num_samples=14000, seed=8)
    codes = np.concatenate([b["obs/plate"] for b in dl]).astype(np.int64)
    counts = np.bincount(codes, minlength=14)
    assert len(codes) == 14000
    # balanced: ~1000 per class although the store's plates are uniform only by chance
    assert np.all(np.abs(counts - 1000) < 5 * np.sqrt(1000))


def _small(tmp_path, name, n, seed):
    p = tmp_path / name
    subprocess.run([CLI, "synth", "--kind", "cells", "--n", str(n), "-o", str(p), "--seed",
                    str(seed), "--genes", "800"], check=True, capture_output=True)
    return p


def test_multi_dataset_ratios_and_child_ids(tmp_path):
    pa, pb = _small(tmp_path, "a.zarr", 600, 1), _small(tmp_path, "b.zarr", 200, 2)
    A, B = ad.read_zarr(pa), ad.read_zarr(pb)
    md = zbatch.MultiDataset([zbatch.open(pa), zbatch.open(pb)])
    assert len(md) == 800 and md.sizes == [600, 200]
    b = md.read_many([599, 600, 0, 799])
    np.testing.assert_array_equal(b["dataset"], [0, 1, 0, 1])
    np.testing.assert_array_equal(b["X"].toarray(),
                                  np.vstack([A.X[[599]].toarray(), B.X[[0]].toarray(),
                                             A.X[[0]].toarray(), B.X[[199]].toarray()]))
    dl = zbatch.DataLoader(md, batch_size=100, sampler="multi", sizes=md.sizes,
                           samples_per_dataset=[0.5, 0.5], seed=3)
    kids = np.concatenate([x["dataset"] for x in dl])
    np.testing.assert_array_equal(np.bincount(kids), [400, 400])  # balanced halves per batch
    # the child lengths come from the MultiDataset when not given: the same batches
    implied = zbatch.DataLoader(md, batch_size=100, sampler="multi",
                                samples_per_dataset=[0.5, 0.5], seed=3)
    given = zbatch.DataLoader(md, batch_size=100, sampler="multi", sizes=md.sizes,
                              samples_per_dataset=[0.5, 0.5], seed=3)
    for x, y in zip(given, implied, strict=True):
        np.testing.assert_array_equal(x["index"], y["index"])
    other = zbatch.open(_small(tmp_path, "c.zarr", 50, 3))
    with pytest.raises(zbatch.ZbatchError):
        zbatch.MultiDataset([zbatch.open(pa), zbatch.open(_atoms(tmp_path))])


def _atoms(tmp_path):
    p = tmp_path / "atoms_md.zarr"
    subprocess.run([CLI, "synth", "--kind", "atoms", "--n", "20", "-o", str(p), "--seed", "1"],
                   check=True, capture_output=True)
    return p


def test_in_memory_dataset_serves_the_same_batches(cells):
    p, a = cells
    disk = zbatch.open(p)
    mem = zbatch.InMemoryDataset(disk)
    assert len(mem) == len(disk) and mem.fields.keys() == disk.fields.keys()
    assert mem.categories("obs/drug") == disk.categories("obs/drug")
    ids = np.random.default_rng(5).integers(0, 3000, 400)
    x, y = disk.read_many(ids), mem.read_many(ids)
    assert (x["X"] != y["X"]).nnz == 0
    for k in ("obs/cell_line", "obs/drug", "obs/plate", "obs/n_genes"):
        np.testing.assert_array_equal(x[k], y[k])
    dl = zbatch.DataLoader(mem, batch_size=500, sampler="block", block_size=20, seed=1)
    got = np.concatenate([b["index"] for b in dl]).astype(np.int64)
    np.testing.assert_array_equal(np.sort(got), np.arange(3000))


def test_block_sampler_window_is_read_whole_by_default(cells):
    """Without prefetch_factor the loader's window holds the block sampler's window (block_size
    * blocks_per_window rows), so each X chunk of an epoch is decoded once, not once per read
    that touches it: fewer chunks decoded than with the old fixed default of 4 batches, the
    same batches in the same order, and an explicit prefetch_factor is kept as given."""
    p, a = cells
    ds = zbatch.open(p, num_threads=2)
    kw = dict(batch_size=64, sampler="block", block_size=128, blocks_per_window=8, seed=1)
    auto = zbatch.DataLoader(ds, **kw)
    fixed = zbatch.DataLoader(ds, prefetch_factor=4, **kw)
    assert (auto.prefetch_factor, fixed.prefetch_factor) == (16, 4)
    assert zbatch.DataLoader(ds, batch_size=4096, sampler="block").prefetch_factor == 4
    decoded = {}
    for name, dl in (("auto", auto), ("fixed", fixed)):
        dl.set_epoch(0)
        got, n = [], 0
        for b in dl:
            got.append(b["index"].astype(np.int64).copy())
            n += b.stats["chunks_decoded"]
            assert (b["X"] != a.X[b["index"].astype(np.int64)]).nnz == 0
        decoded[name] = (n, got)
    assert all((x == y).all() for x, y in zip(decoded["auto"][1], decoded["fixed"][1]))
    assert decoded["auto"][0] * 1.5 < decoded["fixed"][0], decoded
