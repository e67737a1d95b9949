"""Crash safety (issue 3, item 5): writers killed with SIGKILL at many points leave a store that
either refuses to open with a clear status (ZB_E_INCOMPLETE for a layout write that never
committed, ZB_E_NOTFOUND for an array whose metadata was never written) or holds exactly what
was committed before the kill; and `zbatch verify` on it says incomplete or clean, never
crashes.

The expected values come from deterministic regeneration (the same seed, written again to
another path and read back through zarr-python, or the writer script's own generator), never
from the killed store. Kill points are drawn from a fixed-seed generator so a failure can be
replayed; each killed process is asserted to have still been running when it was killed.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from conftest import CLI, expect_error, info, read, run_cli, zbatch_api

MARKER = ".zbatch-incomplete"


def verify(path):
    r = run_cli("verify", path, timeout=60)
    assert r.returncode in (0, 1), f"verify crashed or failed (rc {r.returncode}): {r.stderr}"
    assert "Sanitizer" not in r.stderr, r.stderr
    return r.returncode, r.stdout


def kill_after(cmd, delay):
    """Starts `cmd`, SIGKILLs it after `delay` seconds (None: lets it finish); returns its exit
    status."""
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    if delay is None:
        p.wait(timeout=60)
    else:
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
    _, err = p.communicate(timeout=30)
    return p.returncode, err.decode(errors="replace")


def assert_refused_incomplete(path):
    """A layout write killed before its commit: every entry point refuses with
    ZB_E_INCOMPLETE and says a write was not committed; verify reports exactly that."""
    zb = zbatch_api()
    assert (path / MARKER).exists()
    with expect_error("ZB_E_INCOMPLETE", "a write was not committed", MARKER):
        info(path)
    with expect_error("ZB_E_INCOMPLETE", "a write was not committed"):
        zb.open(str(path))
    r = run_cli("info", path)
    assert r.returncode == 1 and "a write was not committed" in r.stderr
    rc, out = verify(path)
    assert rc == 1 and out.splitlines() == [
        out.splitlines()[0], "0 arrays, 0 chunks checked, 1 problem (incomplete: a write was not "
        "committed)"], out
    assert out.startswith(f"{MARKER}: incomplete: a write was not committed")


def data_chunks(store, array):
    """Chunk files of a v3 1-d array by chunk number, leaving out the file store's
    temporary names (`KEY.zbtmp.PID.N`, the debris of a put cut short)."""
    d = Path(store, array, "c")
    if not d.is_dir():
        return {}
    return {int(f.name): f for f in d.iterdir() if f.name.isdigit()}


# ------------------------------------------------------------------------------------------------
# (a) zbatch synth --kind cells (the anndata writer) killed mid-write
# ------------------------------------------------------------------------------------------------
def test_synth_cells_killed_mid_write(tmp_path):
    """200,000 cells take ~20 s to write; kills land between 0.05 s and 2 s. Each store is
    refused as incomplete, and every chunk it already holds is whole: byte-identical to the same
    chunk of a complete store of the same seed (cells are generated per (seed, cell), so the
    leading chunks of X do not depend on --n)."""
    ref = tmp_path / "ref.zarr"
    # unsharded, so that every chunk is a file of its own to compare
    r = run_cli("synth", "--kind", "cells", "--n", "10000", "--seed", "7", "--shard-nnz", "0",
                "-o", ref, timeout=60)
    assert r.returncode == 0, r.stderr
    ref_chunks = {a: data_chunks(ref, a) for a in ("X/data", "X/indices")}
    rng = random.Random(31)
    delays = [0.05, 0.25 + rng.random() * 0.2, 0.6 + rng.random() * 0.3, 1.2 + rng.random() * 0.3,
              1.8 + rng.random() * 0.2]
    compared = []
    for i, delay in enumerate(delays):
        path = tmp_path / f"killed{i}.zarr"
        rc, err = kill_after([CLI, "synth", "--kind", "cells", "--n", "200000", "--seed", "7",
                              "--shard-nnz", "0", "-o", path], delay)
        assert rc == -signal.SIGKILL, f"synth ended on its own (rc {rc}) after {delay:.2f} s: {err}"
        if not (path / MARKER).exists():
            # killed before the writer started: nothing that looks like a store
            assert not (path / "zarr.json").exists() and delay < 0.2
            # on a loaded machine the kill may come before synth made the directory at all
            with expect_error("ZB_E_NOTFOUND",
                              "no zarr.json" if path.exists() else "no such directory"):
                info(path)
            continue
        assert_refused_incomplete(path)
        n = 0
        for array, ref_files in ref_chunks.items():
            last = max(ref_files)  # the reference's last chunk is partial: not comparable
            for k, f in data_chunks(path, array).items():
                if k < last:
                    assert f.read_bytes() == ref_files[k].read_bytes(), f"{array} chunk {k} torn"
                    n += 1
        compared.append(n)
        print(f"kill after {delay:.2f} s: {n} chunks compared")
        shutil.rmtree(path)
    # the later kills had written chunks, and every one compared was whole
    assert len(compared) >= 4 and compared[-1] > 20, compared


def test_synth_cells_killed_around_the_commit(tmp_path, zb):
    """A small store is killed all through its short life: before, during and after the commit.
    Each result is either refused as incomplete or, when the kill came too late, complete and
    equal to a full regeneration with the same seed (read back through zarr-python)."""
    ref = tmp_path / "ref.zarr"
    t0 = time.monotonic()
    r = run_cli("synth", "--kind", "cells", "--n", "3000", "--seed", "11", "-o", ref, timeout=60)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    arrays = [n["path"] for n in info(ref)["nodes"] if n["type"] == "array"]
    expected = {a: np.asarray(zarr.open_array(str(ref / a), mode="r")[...]) for a in arrays
                if not a.endswith(("_index", "categories"))}
    outcomes = []
    for i, frac in enumerate([0.3, 0.6, 0.85, 0.95, 1.1, None]):
        path = tmp_path / f"k{i}.zarr"
        rc, err = kill_after([CLI, "synth", "--kind", "cells", "--n", "3000", "--seed", "11",
                              "-o", path], None if frac is None else took * frac)
        assert rc in (0, -signal.SIGKILL), err
        if (path / MARKER).exists():
            outcomes.append("incomplete")
            assert_refused_incomplete(path)
            continue
        if not (path / "zarr.json").exists():
            outcomes.append("empty")
            with expect_error("ZB_E_NOTFOUND"):
                info(path)
            continue
        outcomes.append("complete")
        assert verify(path)[0] == 0
        assert len(zb.open(str(path))) == 3000
        for a, want in expected.items():
            np.testing.assert_array_equal(read(path, a), want, err_msg=f"{path}/{a}")
        assert read(path, "obs/_index").tolist() == read(ref, "obs/_index").tolist()
    assert outcomes[-1] == "complete", outcomes  # the run left alone compares equal


# ------------------------------------------------------------------------------------------------
# (b) the atomic writer: write, then append repeatedly; killed between and during commits
# ------------------------------------------------------------------------------------------------
ATOMIC_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from zbatch._atomic import AtomicWriter

    path, seed, block = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

    def samples(k):
        rng = np.random.default_rng([seed, k])
        out = []
        for _ in range(block):
            n = int(rng.integers(2, 12))
            e = int(rng.integers(1, 3 * n))
            out.append({"positions": rng.standard_normal((n, 3)).astype(np.float32),
                        "atomic_numbers": rng.integers(1, 90, n),
                        "forces": rng.standard_normal((n, 3)).astype(np.float32),
                        "energy": np.float32(rng.standard_normal()),
                        "cell": np.eye(3, dtype=np.float32) * 8,
                        "pbc": np.array([True, True, False]),
                        "neighbor_list": rng.integers(0, n, (e, 2)),
                        "shifts": rng.standard_normal((e, 3)).astype(np.float32)})
        return out

    w = AtomicWriter(path, config={"core": {"chunk_rows": 64}, "meta": {"chunk_rows": 16}})
    w.write(samples(0))
    print("committed", block, flush=True)
    for k in range(1, 100000):
        w.append(samples(k))
        print("committed", block * (k + 1), flush=True)
""")


def atomic_expected(seed, block, n_samples):
    """The writer script's samples, regenerated here with the same generator."""
    ns: dict = {}
    src = ATOMIC_SCRIPT.split("w = AtomicWriter")[0].replace(
        "path, seed, block = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])", "")
    exec(src, ns)  # noqa: S102 - the script's own generator, not zbatch
    ns["seed"], ns["block"] = seed, block
    out = []
    k = 0
    while len(out) < n_samples:
        out.extend(ns["samples"](k))
        k += 1
    return out[:n_samples]


def run_and_kill_script(script, args, lines_before_kill, jitter, env=None):
    """Runs a writer script, reads `lines_before_kill` "committed ..." lines, waits `jitter`
    seconds and SIGKILLs it; returns every line it printed."""
    env = dict(os.environ if env is None else env)
    p = subprocess.Popen([sys.executable, "-c", script, *map(str, args)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    while len(lines) < lines_before_kill:
        line = p.stdout.readline()
        assert line, f"writer exited early (rc {p.wait()}): {p.stderr.read()}"
        lines.append(line.strip())
    time.sleep(jitter)
    p.send_signal(signal.SIGKILL)
    out, err = p.communicate(timeout=30)
    assert p.returncode == -signal.SIGKILL, f"writer ended on its own: {err}"
    lines += [ln.strip() for ln in out.splitlines() if ln.strip()]
    assert all(ln.startswith("committed ") for ln in lines), lines
    return lines


@pytest.mark.parametrize("run", range(4))
def test_atomic_writer_killed_during_appends(tmp_path, zb, run):
    """Killed between or during appends: the committed samples (the root num_samples is the
    commit point, include/zbatch_atomic.h) are exactly the ones written, whole, and readable;
    an interrupted append may leave arrays longer than they need (an uncommitted tail)."""
    rng = random.Random(1000 + run)
    block = 16
    path = tmp_path / "ds.zarr"
    lines = run_and_kill_script(ATOMIC_SCRIPT, [path, run, block], rng.randint(1, 6),
                                rng.random() * 0.03)
    committed = int(lines[-1].split()[1])
    n = json.loads((path / "zarr.json").read_text())["attributes"]["num_samples"]
    # killed between the samples_mask put and the root put, the mask already holds the block
    # (whole: every other array was extended first), and both readers count the mask
    n = max(n, json.loads((path / "meta" / "samples_mask" / "zarr.json").read_text())["shape"][0])
    # the kill may fall between a commit and its print: one block more, never a partial one
    assert n in (committed, committed + block), (n, committed)
    want = atomic_expected(run, block, n)
    ap = np.concatenate([[0], np.cumsum([len(s["positions"]) for s in want])])
    ep = np.concatenate([[0], np.cumsum([len(s["neighbor_list"]) for s in want])])
    nl = np.concatenate([s["neighbor_list"] + ap[p] for p, s in enumerate(want)])

    # the stored rows the committed samples own, read array by array (bounded by the pointers,
    # as nvalchemi's reader reads them): exactly what the writer was given
    np.testing.assert_array_equal(read(path, "meta/atoms_ptr", 0, n + 1), ap)
    np.testing.assert_array_equal(read(path, "meta/edges_ptr", 0, n + 1), ep)
    np.testing.assert_array_equal(read(path, "core/positions", 0, ap[-1]),
                                  np.concatenate([s["positions"] for s in want]))
    np.testing.assert_array_equal(read(path, "core/neighbor_list", 0, ep[-1]), nl)
    np.testing.assert_array_equal(read(path, "core/energy", 0, n).ravel(),
                                  [s["energy"] for s in want])
    rc, out = verify(path)
    assert rc == 0, out
    assert out.splitlines()[-1].startswith("13 arrays, ")  # 5 in meta/, 8 fields in core/

    # zbatch's own reader sees the committed samples, whatever tail the kill left
    ds = zb.open(str(path))
    assert len(ds) == n
    b = ds.read_many(list(range(n)))
    np.testing.assert_array_equal(b["atoms_ptr"], ap)
    np.testing.assert_array_equal(b["positions"], np.concatenate([s["positions"] for s in want]))
    np.testing.assert_array_equal(b["atomic_numbers"],
                                  np.concatenate([s["atomic_numbers"] for s in want]))
    np.testing.assert_array_equal(np.ravel(b["energy"]), [s["energy"] for s in want])
    # neighbour lists come back re-based to the batch: local + the sample's first atom
    np.testing.assert_array_equal(b["neighbor_list"], nl)


# ------------------------------------------------------------------------------------------------
# (c) the array writer: many arrays into one store, killed mid-stream
# ------------------------------------------------------------------------------------------------
ARRAYS_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import zbatch

    path = sys.argv[1]
    for i in range(100000):
        data = np.random.default_rng(i).integers(-10**6, 10**6, (20000 + 97 * i, 3), dtype=np.int32)
        zbatch.write_array(path, f"a{i:04d}", data, chunks=1000, codec="zstd:1")
        print("committed", i, flush=True)
""")


def array_expected(i):
    return np.random.default_rng(i).integers(-10**6, 10**6, (20000 + 97 * i, 3), dtype=np.int32)


@pytest.mark.parametrize("run", range(3))
def test_array_writer_killed_between_arrays(tmp_path, zb, run):
    rng = random.Random(2000 + run)
    path = tmp_path / "many.zarr"
    zarr.open_group(str(path), mode="w", zarr_format=3)
    lines = run_and_kill_script(ARRAYS_SCRIPT, [path], rng.randint(2, 8), rng.random() * 0.02)
    done = int(lines[-1].split()[1]) + 1  # arrays a0000 .. a{done-1} reported committed
    for i in range(done):
        np.testing.assert_array_equal(read(path, f"a{i:04d}"), array_expected(i), f"a{i:04d}")
    # the array in flight: absent (no metadata yet) or, killed after its commit, complete
    try:
        got = read(path, f"a{done:04d}")
    except zb.ZbatchError as e:
        assert e.status == "ZB_E_NOTFOUND" and "no array here" in str(e), e
        n_arrays = done
    else:
        np.testing.assert_array_equal(got, array_expected(done))
        n_arrays = done + 1
    with expect_error("ZB_E_NOTFOUND", "no array here"):
        read(path, f"a{n_arrays:04d}")
    assert not any((path / f"a{i:04d}" / "zarr.json").exists() for i in range(n_arrays, n_arrays + 50))
    assert len([n for n in info(path)["nodes"] if n["type"] == "array"]) == n_arrays
    rc, out = verify(path)
    assert rc == 0, out
    assert out.splitlines()[-1].startswith(f"{n_arrays} array")


# ------------------------------------------------------------------------------------------------
# (d) delete + defragment killed part way: after recover() the store holds the samples before
# the delete or those after it, whole (issue 21: every writer killed, the fsync policy in
# docs/RELIABILITY.md)
# ------------------------------------------------------------------------------------------------
DEFRAG_SCRIPT = textwrap.dedent("""
    import sys
    from zbatch._atomic import AtomicWriter

    w = AtomicWriter(sys.argv[1])
    w.delete(range(0, int(sys.argv[2]), 3))
    print("deleted", flush=True)
    w.defragment()
    print("defragmented", flush=True)
""")


def defrag_samples(n):
    rng = np.random.default_rng(77)
    return [{"positions": rng.standard_normal((int(k), 3)).astype(np.float32),
             "atomic_numbers": rng.integers(1, 9, int(k)),
             "energy": np.float32(i)} for i, k in enumerate(rng.integers(2, 9, n))]


def test_delete_defragment_killed(tmp_path, zb):
    n = 3000
    want = defrag_samples(n)
    kept = [s for i, s in enumerate(want) if i % 3]
    src = tmp_path / "src" / "ds.zarr"
    src.parent.mkdir()
    zb.AtomicWriter(src, config={"core": {"chunk_rows": 512}, "meta": {"chunk_rows": 512}}).write(want)
    # how long the whole job takes, unkilled, on this machine
    ref = tmp_path / "ref"
    shutil.copytree(src.parent, ref)
    t0 = time.monotonic()
    rc, err = kill_after([sys.executable, "-c", DEFRAG_SCRIPT, ref / "ds.zarr", n], None)
    took = time.monotonic() - t0
    assert rc == 0, err
    outcomes = []
    for i, frac in enumerate([0.2, 0.4, 0.55, 0.7, 0.8, 0.9, 0.97]):
        d = tmp_path / f"k{i}"
        shutil.copytree(src.parent, d)
        path = d / "ds.zarr"
        rc, err = kill_after([sys.executable, "-c", DEFRAG_SCRIPT, path, n], took * frac)
        assert rc in (0, -signal.SIGKILL), err
        mid_defragment = any(".zbatch-" in p.name for p in d.iterdir())
        zb.AtomicWriter(path).recover()
        ds = zb.open(str(path))
        got_n = len(ds)
        assert got_n in (n, len(kept)), got_n
        expect = want if got_n == n else kept
        outcomes.append(("before" if got_n == n else "after") +
                        (" (killed in defragment)" if mid_defragment else ""))
        b = ds.read_many(list(range(got_n)))
        np.testing.assert_array_equal(np.ravel(b["energy"]), [s["energy"] for s in expect])
        np.testing.assert_array_equal(b["positions"],
                                      np.concatenate([s["positions"] for s in expect]))
        assert verify(path)[0] == 0
        assert not [p for p in d.iterdir() if ".zbatch-" in p.name], list(d.iterdir())
    print("kill outcomes:", outcomes)


def test_recover_removes_an_emptied_old_tree(tmp_path, zb):
    """A kill inside the removal of the old tree (the last step of a defragment) can leave its
    directories with no file in them: recover() removes them too, whatever the nesting."""
    path = tmp_path / "ds.zarr"
    want = defrag_samples(20)
    zb.AtomicWriter(path).write(want)
    old = tmp_path / "ds.zarr.zbatch-old"
    for sub in ("core/positions/c/0", "core/atomic_numbers/c", "meta/atoms_ptr"):
        (old / sub).mkdir(parents=True)
    zb.AtomicWriter(path).recover()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.zarr"]
    b = zb.open(str(path)).read_many(list(range(20)))
    np.testing.assert_array_equal(b["positions"], np.concatenate([s["positions"] for s in want]))
