"""bench/run.py --quick (tiny data, ~1 s per loader) and bench/plot.py.

The quick run must produce one JSON record with an entry for every peer and every zbatch
setting, each with samples/s > 0 and a zbatch/peer ratio for every peer, and content checks
(each peer's batch for a fixed id list against zbatch's read of the same ids) that all hold.
Independently of the driver's own checks, and of zbatch: the zarrs peer's rows equal anndata's
X rows of the h5ad, and the LMDB's samples equal the source structures read with zarr-python.
The checker itself is shown to reject a wrong value. plot.py must write real PNG files.

The quick run takes about a minute (most of it importing torch in four fresh processes).
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
PNG = b"\x89PNG\r\n\x1a\n"

PEERS = {"scDataset", "AnnLoader", "zarrs", "nvalchemi", "LMDB", "annbatch"}


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    base = tmp_path_factory.mktemp("bench_peers")
    work, results = base / "work", base / "results"
    r = subprocess.run([PY, str(ROOT / "bench" / "run.py"), "--quick", "--work", str(work),
                        "--keep", "--results", str(results)], cwd=str(ROOT),
                       capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, f"bench/run.py --quick failed:\n{r.stdout[-4000:]}\n" \
                              f"{r.stderr[-4000:]}"
    recs = sorted(results.glob("*.json"))
    assert len(recs) == 1, recs
    return {"record": json.loads(recs[0].read_text()), "work": work, "results": results,
            "stdout": r.stdout}


def test_record_has_every_loader_with_real_figures(quick):
    rec = quick["record"]
    entries = rec["entries"]
    loaders = {e["loader"] for e in entries}
    assert PEERS | {"zbatch"} <= loaders, loaders
    for e in entries:
        assert "error" not in e, (e["id"], e.get("error"), e.get("traceback"))
        assert e["samples_per_s"] > 0, e["id"]
        assert e["batches"] > 0 and e["seconds"] > 0 and e["samples"] > 0, e["id"]
        assert abs(e["samples"] / e["seconds"] - e["samples_per_s"]) < 1e-6 * e["samples_per_s"]
        assert isinstance(e["config"], dict) and e["config"], e["id"]
        if e["loader"] == "zbatch":
            assert e["amplification"] > 0, e["id"]
            if e["group"].startswith("cells"):  # whole chunks decoded, never fewer bytes
                assert e["amplification"] >= 1.0, e["id"]
        else:
            # every peer is paired with the zbatch run reading the same bytes the same way
            m = next(x for x in entries if x["id"] == e["match"])
            assert m["loader"] == "zbatch"
            assert e["ratio_zbatch_over_peer"] == pytest.approx(
                m["samples_per_s"] / e["samples_per_s"])
    # the same batch size for every cells loader, and for every atoms loader
    bs = {e["config"]["batch_size"] for e in entries if e["group"].startswith("cells")}
    assert bs == {rec["parameters"]["batch_size"]}
    bsa = {e["config"].get("batch_size", e["config"].get("dataloader", {}).get("batch_size"))
           for e in entries if e["group"].startswith("atoms")}
    assert bsa == {rec["parameters"]["atoms_batch_size"]}
    # machine and versions
    m = rec["machine"]
    assert m["cpu_model"] and m["logical_cores"] >= 1 and m["memory_bytes"] > 0
    v = rec["versions"]
    for pkg in ("torch", "anndata", "zarr", "scDataset", "zarrs", "lmdb", "nvalchemi-toolkit",
                "numpy"):
        assert pkg in v, pkg
    assert v["torch"].startswith("2.13.0")
    assert "annbatch" in rec["notes"]
    # the printed table names every loader
    for name in PEERS:
        assert name in quick["stdout"]
    # annbatch ran in its own interpreter, at its settings, each beside zbatch's same sampling
    ab = [e for e in entries if e["loader"] == "annbatch"]
    assert {e["config"]["chunk_size"] for e in ab} >= {32, 512}
    for e in ab:
        assert e["config"]["versions"]["python"].startswith("3.12")
        m = next(x for x in entries if x["id"] == e["match"])
        assert m["config"]["block_size"] == e["config"]["chunk_size"]
        assert m["config"]["blocks_per_window"] == e["config"]["preload_nchunks"]
    assert any(t["target"] == "annbatch at its best, CSR" and t["goal"] == 5
               for t in rec["targets"])
    assert "annbatch at its best" in quick["stdout"]


def test_every_peer_delivers_zbatchs_content(quick):
    checks = quick["record"]["checks"]
    ids = {c["id"] for c in checks}
    assert {"scdataset-h5ad", "scdataset-h5ad-dense", "scdataset-zarr", "annloader",
            "annloader-dense", "zarrs", "lmdb", "nvalchemi", "zbatch-loader-cells",
            "zbatch-loader-atoms", "annbatch"} <= ids
    for c in checks:
        assert c.get("equal") is True, c
        assert c["fields"] and all(c["fields"].values()), c
        assert len(c["ids"]) >= 2, c
    # the atomic checks compare the whole graph, not one field
    nv = next(c for c in checks if c["id"] == "nvalchemi")
    assert {"positions", "atomic_numbers", "neighbor_list", "energy", "cell"} <= set(nv["fields"])


def test_zarrs_rows_and_lmdb_samples_match_independent_sources(quick):
    """In a fresh process (the zarrs pipeline setting is process-global): zarrs rows vs
    anndata's in-memory X of the h5ad; LMDB samples vs zarr-python's read of the atoms store."""
    work = quick["work"]
    script = textwrap.dedent(f"""
        import json, sys, warnings
        warnings.simplefilter("ignore")
        sys.path.insert(0, {str(ROOT)!r})
        import numpy as np, anndata as ad, zarr
        from bench.peers import zarrs_peer, lmdb_peer
        a = ad.read_h5ad({str(work / 'cells.h5ad')!r})
        ids = [a.n_obs - 1, 3, 0, 17, 3, a.n_obs // 2]
        x = zarrs_peer.read_ids({str(work / 'cells.zarr')!r}, ids)["X"]
        ref = a.X[ids]
        out = {{"zarrs_shape": list(x.shape), "zarrs_diff": int((x != ref).nnz),
               "zarrs_nnz": [int(x.nnz), int(ref.nnz)]}}
        g = zarr.open_group({str(work / 'atoms.zarr')!r}, mode="r")
        ap, ep = g["meta/atoms_ptr"][:], g["meta/edges_ptr"][:]
        n = len(ap) - 1
        sids = [0, n - 1, 7, 7, 42 % n]
        got = lmdb_peer.samples({str(work / 'atoms.lmdb')!r}, sids)
        bad = []
        for i, s in zip(sids, got):
            want = {{
                "positions": g["core/positions"][ap[i]:ap[i + 1]],
                "atomic_numbers": g["core/atomic_numbers"][ap[i]:ap[i + 1]],
                "forces": g["core/forces"][ap[i]:ap[i + 1]],
                "neighbor_list": g["core/neighbor_list"][ep[i]:ep[i + 1]] - ap[i],
                "shifts": g["core/shifts"][ep[i]:ep[i + 1]],
                "energy": g["core/energy"][i:i + 1], "cell": g["core/cell"][i:i + 1],
                "pbc": g["core/pbc"][i:i + 1]}}
            for k, w in want.items():
                if k not in s or s[k].dtype != w.dtype or not np.array_equal(s[k], w):
                    bad.append([int(i), k])
        out["lmdb_bad"] = bad
        out["lmdb_n"] = len(got)
        out["lmdb_atoms"] = int(sum(len(s["positions"]) for s in got))
        print(json.dumps(out))
    """)
    r = subprocess.run([PY, "-c", script], cwd=str(ROOT), capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["zarrs_shape"][0] == 6 and res["zarrs_diff"] == 0
    assert res["zarrs_nnz"][0] == res["zarrs_nnz"][1] > 0
    assert res["lmdb_n"] == 5 and res["lmdb_atoms"] > 0
    assert res["lmdb_bad"] == []


def test_content_checker_rejects_a_wrong_value():
    sys.path.insert(0, str(ROOT))
    from bench.run import same_content
    x = sp.random(5, 40, density=0.3, format="csr", random_state=1, dtype=np.float32)
    ok, _ = same_content({"X": x.copy()}, {"X": x})
    assert ok
    y = x.copy()
    y.data[3] += 1.0
    assert not same_content({"X": y}, {"X": x})[0]
    assert not same_content({"X": x[:4]}, {"X": x})[0]
    d = x.toarray()
    e = d.copy()
    e[0, 0] += 2.0
    assert same_content({"X": d.copy()}, {"X": d})[0]
    assert not same_content({"X": e}, {"X": d})[0]
    g = {"positions": np.ones((3, 3), np.float32), "neighbor_list": np.array([[0, 1]])}
    assert same_content({k: v.copy() for k, v in g.items()}, g)[0]
    assert not same_content({"positions": g["positions"], "neighbor_list": np.array([[1, 0]])},
                            g)[0]
    assert not same_content({}, g)[0]  # nothing compared is not a pass


def test_repeated_rounds_keep_each_runs_best():
    sys.path.insert(0, str(ROOT))
    from bench.run import best_rounds
    rounds = [{"id": "a", "samples_per_s": 10.0, "n": 1}, {"id": "b", "samples_per_s": 5.0},
              {"id": "a", "samples_per_s": 30.0, "n": 2}, {"id": "b", "samples_per_s": 0.0,
                                                           "error": "worker exited with 1"},
              {"id": "a", "samples_per_s": 20.0, "n": 3}]
    got = {e["id"]: e for e in best_rounds(rounds)}
    assert set(got) == {"a", "b"}
    assert got["a"]["n"] == 2 and got["a"]["samples_per_s"] == 30.0
    assert got["a"]["samples_per_s_rounds"] == [10.0, 30.0, 20.0]
    assert got["b"]["samples_per_s"] == 5.0 and "error" not in got["b"]
    assert got["b"]["samples_per_s_rounds"] == [5.0, 0.0]


def test_plot_writes_pngs(quick):
    out = quick["results"] / "plots"
    r = subprocess.run([PY, str(ROOT / "bench" / "plot.py"), "--results",
                        str(quick["results"])], cwd=str(ROOT), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    pngs = {p.name: p for p in out.glob("*.png")}
    assert {"peers-throughput.png", "peers-amplification.png"} <= set(pngs), pngs
    for p in pngs.values():
        data = p.read_bytes()
        assert data[:8] == PNG and len(data) > 10_000, p


# ------------------------------------------------------------------------------------------------
# annbatch's Loader as a peer (issue 19): it runs in .venv-annbatch (an error, never a skip,
# when that environment is missing: tests/python/annbatch_bridge.py)
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_cells(tmp_path_factory):
    """A tiny Tahoe-like store (zbatch's default codec: blosc lz4, sharded, v3) and a copy with
    one stored value altered in the row of one of the check ids."""
    import shutil
    sys.path.insert(0, str(ROOT))
    from bench.run import check_ids
    base = tmp_path_factory.mktemp("annbatch_peer")
    store, altered = base / "cells.zarr", base / "altered.zarr"
    r = subprocess.run([str(ROOT / "build" / "zbatch"), "synth", "--kind", "cells", "--n", "700",
                        "--genes", "3000", "-o", str(store), "--seed", "5"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    shutil.copytree(store, altered)
    ids = check_ids(700)
    script = textwrap.dedent(f"""
        import zarr
        g = zarr.open_group({str(altered)!r}, mode="r+")
        ptr = g["X/indptr"][:]
        row = {int(ids[1])}
        assert ptr[row + 1] > ptr[row]
        k = int(ptr[row]) + (int(ptr[row + 1] - ptr[row]) // 2)
        d = g["X/data"]
        d[k:k + 1] = d[k:k + 1] + 1.0
    """)
    r = subprocess.run([PY, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return {"store": store, "altered": altered, "ids": ids}


def test_annbatch_peer_runs_and_its_content_check_holds_and_can_fail(tiny_cells):
    sys.path.insert(0, str(ROOT))
    import anndata as ad
    from bench.peers import annbatch_peer, zbatch_peer
    from bench.run import same_content
    store, ids = str(tiny_cells["store"]), tiny_cells["ids"]
    # the timing loop runs in annbatch's interpreter and reports back
    r = annbatch_peer.run(store, 128, 0.5, num_workers=2, chunk_size=32, preload_nchunks=16)
    assert r["loader"] == "annbatch" and r["samples_per_s"] > 0 and r["batches"] > 0
    assert abs(r["samples"] / r["seconds"] - r["samples_per_s"]) < 1e-6 * r["samples_per_s"]
    assert r["batch_types"] == ["scipy.sparse._csr.csr_matrix"]
    assert r["config"]["versions"]["annbatch"] == "0.3.1"
    assert r["config"]["versions"]["python"].startswith("3.12")
    # the rows annbatch yields for the check ids equal zbatch's read and anndata's X rows
    got = annbatch_peer.read_ids(store, ids, chunk_size=32, preload_nchunks=16, batch_size=128)
    assert got["X"].shape == (len(ids), 3000) and got["X"].nnz > 0
    ok, detail = same_content(got, zbatch_peer.read_ids(store, ids))
    assert ok and detail == {"X": True}
    a = ad.read_zarr(store)
    assert same_content(got, {"X": a.X[ids]})[0]
    # ... and the check fails on the store with one altered value
    bad = annbatch_peer.read_ids(str(tiny_cells["altered"]), ids, chunk_size=32,
                                 preload_nchunks=16, batch_size=128)
    assert not same_content(bad, zbatch_peer.read_ids(store, ids))[0]
    diff = bad["X"] - got["X"]
    assert diff.nnz == 1 and diff.data[0] == pytest.approx(1.0)
    assert diff.nonzero()[0][0] == 1  # the row of ids[1]
    # a dense output is refused, not faked (annbatch's environment has no torch)
    with pytest.raises(ValueError):
        annbatch_peer.run(store, 128, 0.5, output="dense")
