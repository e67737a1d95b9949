"""`zbatch bench`: the loader benchmark's JSON record and its write mode.

Oracles: the store's own arrays read by zarr-python / anndata (pointer arrays and chunk shapes
for the bytes a window decodes and delivers, category codes for the entropy of known batches),
numpy for entropies and gaps, and the file system (os.walk) for file counts and sizes."""
import json
import math
import os
import subprocess
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import zarr

ROOT = Path(__file__).resolve().parents[2]
CLI = str(ROOT / "build" / "zbatch")
N = 3000
B = 256
P = 4  # the loader's default prefetch factor: the warm-up window is the first P batches


def bench(*args, check=True):
    r = subprocess.run([CLI, "bench", *map(str, args)], capture_output=True, text=True,
                       timeout=120)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def run_json(store, results, *args):
    """Runs bench with --json; checks that stdout is the one record written to `results`."""
    before = set(results.glob("*.json")) if results.exists() else set()
    r = bench(store, "--results", results, "--json", *args)
    rec = json.loads(r.stdout)
    new = set(results.glob("*.json")) - before
    assert len(new) == 1
    path = new.pop()
    assert path.name.startswith("bench-") and path.name.endswith(".json")
    assert json.loads(path.read_text()) == rec
    return rec, path


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    p = tmp_path_factory.mktemp("bench") / "cells.zarr"
    # the float32/int32 store: its figures (amplification >= 1: decoded bytes are delivered
    # bytes) are the ones below; a narrow store decodes fewer bytes than it delivers
    # (test_narrow_storage.py)
    subprocess.run([CLI, "synth", "--kind", "cells", "--n", str(N), "--genes", "2000", "-o",
                    str(p), "--seed", "1", "--data-dtype", "float32", "--index-dtype", "int32"],
                   check=True, capture_output=True)
    return p


@pytest.fixture(scope="module")
def sorted_cells(tmp_path_factory):
    """An AnnData store written by anndata whose categorical obs/group is sorted: 30 groups of
    100 consecutive cells."""
    rng = np.random.default_rng(3)
    X = sp.random(N, 500, density=0.05, format="csr", dtype=np.float32, random_state=rng)
    groups = np.repeat(np.arange(30), N // 30)
    obs = pd.DataFrame({"group": pd.Categorical([f"g{g:02d}" for g in groups])},
                       index=[f"c{i}" for i in range(N)])
    p = tmp_path_factory.mktemp("bench") / "sorted.zarr"
    ad.AnnData(X=X, obs=obs).write_zarr(str(p))
    return p, groups


def entropy(codes):
    _, counts = np.unique(codes, return_counts=True)
    q = counts / counts.sum()
    return float(-(q * np.log2(q)).sum())


def sequential_timed_batches(n, batch, prefetch):
    """The batches of one sequential epoch after the warm-up window."""
    starts = range(batch * prefetch, n, batch)
    return [np.arange(s, min(s + batch, n)) for s in starts]


# ------------------------------------------------------------------------------------------------
def test_block_run_reports_every_figure(cells, tmp_path):
    res = tmp_path / "R"
    rec, path = run_json(cells, res, "--sampler", "block", "--batch", B, "--seconds", 1,
                         "--threads", 2, "--block-size", 64, "--blocks-per-window", 8)
    assert path.name.endswith("-block.json")
    assert rec["schema"] == "zbatch-bench/1" and rec["mode"] == "read"
    p = rec["parameters"]
    assert (p["sampler"], p["batch_size"], p["threads"], p["seconds"], p["epochs"]) == \
        ("block", B, 2, 1.0, None)
    assert (p["block_size"], p["blocks_per_window"], p["prefetch_factor"], p["depth"]) == \
        (64, 8, 4, 2)
    assert p["obs_column"] == "obs/cell_line" and p["transforms"] == []
    f = rec["figures"]
    assert f["samples_per_s"] > 0
    assert f["timed_seconds"] >= 1.0
    assert f["samples_per_s"] == pytest.approx(f["timed_samples"] / f["timed_seconds"])
    assert f["amplification"] >= 1
    assert f["amplification"] == pytest.approx(f["bytes_decoded"] / f["bytes_delivered"])
    assert f["decoded_gb_s"] == pytest.approx(f["bytes_decoded"] / f["timed_seconds"] / 1e9)
    d = f["decode_only"]
    assert d["gb_s"] > 0 and d["ratio"] > 0 and math.isfinite(d["ratio"])
    assert d["ratio"] == pytest.approx(f["samples_per_s"] / d["samples_per_s"])
    # decode + write: the same windows' units, then their delivered bytes written once (the
    # delivered share of each unit: amplification 1.02 or so here)
    w = f["decode_write"]
    assert w["bytes_decoded"] == d["bytes_decoded"] and w["seconds"] > 0
    assert w["bytes_decoded"] / f["amplification"] == pytest.approx(w["bytes_written"], rel=0.05)
    assert w["gb_s"] == pytest.approx(w["bytes_decoded"] / w["seconds"] / 1e9)
    assert w["samples_per_s"] == pytest.approx(d["samples"] / w["seconds"])
    assert w["ratio"] == pytest.approx(f["samples_per_s"] / w["samples_per_s"])
    assert f["peak_rss_bytes"] > 1 << 20
    # the bench's own record of the timed batches (8 bytes per sample id and a little per
    # batch) is not the loader's memory: counted apart, left out of the anonymous figure
    assert f["timed_samples"] * 8 <= f["bench_records_bytes"] < f["timed_samples"] * 8 + (1 << 20)
    assert 0 < f["peak_anon_rss_bytes"] < f["peak_rss_bytes"]
    assert f["page_faults_per_batch"] >= 0 and f["cpu_percent_of_one_core"] > 0
    assert f["cpu_utilisation"] == pytest.approx(f["cpu_percent_of_one_core"] / 100 / 2)
    assert 0 < f["time_to_first_batch_s"] < 10
    assert 0 <= f["batch_latency_p50_s"] <= f["batch_latency_p99_s"]
    m = rec["machine"]
    assert m["nproc"] == os.cpu_count() and m["mem_total_bytes"] > 0 and m["kernel"]
    assert set(rec["libraries"]) == {"blosc", "zstd", "lz4", "libdeflate", "json-c"}
    assert rec["zbatch_version"] == "0.1.0"


def test_dtype_options_reach_the_dataset(tmp_path):
    """--x-dtype / --index-dtype are zbatch.open's x_dtype / index_dtype: on a narrow store
    (synth's default: uint8 counts, uint16 gene ids) "stored" / "int32" delivers uint8 values and
    int32 ids (what annbatch yields), 3 bytes fewer per value than the float32 default, from the
    same stored bytes; a dtype that is no option is refused naming it."""
    store = tmp_path / "narrow.zarr"
    subprocess.run([CLI, "synth", "--kind", "cells", "--n", "600", "--genes", "2000", "-o",
                    str(store), "--seed", "2"], check=True, capture_output=True)
    z = zarr.open_group(str(store), mode="r")
    assert (z["X/data"].dtype, z["X/indices"].dtype) == (np.uint8, np.uint16)
    common = ("--sampler", "sequential", "--batch", 100, "--epochs", 1, "--threads", 1,
              "--no-decode-only")
    recs = {}
    for name, opt in (("default", ()), ("annbatch", ("--x-dtype", "stored", "--index-dtype",
                                                     "int32"))):
        rec, _ = run_json(store, tmp_path / name, *common, *opt)
        recs[name] = rec
    for r in recs.values():  # "dtype": as stored
        stored = {f["name"]: f["dtype"] for f in r["store"]["fields"]}
        assert (stored["X/data"], stored["X/indices"]) == ("uint8", "uint16")
    dtypes = {k: {f["name"]: f["delivered_dtype"] for f in r["store"]["fields"]}
              for k, r in recs.items()}
    assert (dtypes["default"]["X/data"], dtypes["default"]["X/indices"]) == ("float32", "int32")
    assert (dtypes["annbatch"]["X/data"], dtypes["annbatch"]["X/indices"]) == ("uint8", "int32")
    p = recs["annbatch"]["parameters"]
    assert (p["x_dtype"], p["index_dtype"]) == ("stored", "int32")
    assert (recs["default"]["parameters"]["x_dtype"],
            recs["default"]["parameters"]["index_dtype"]) == (None, None)
    # one sequential epoch after the warm-up window: the same cells in both runs
    f0, f1 = recs["default"]["figures"], recs["annbatch"]["figures"]
    nnz = np.diff(z["X/indptr"][:])[sequential_timed_batches(600, 100, P)[0][0]:].sum()
    assert f0["bytes_decoded"] == f1["bytes_decoded"]
    assert f0["bytes_delivered"] - f1["bytes_delivered"] == 3 * nnz
    r = bench(store, "--x-dtype", "uint4", "--results", tmp_path / "R", check=False)
    assert r.returncode == 1 and 'x_dtype "uint4"' in r.stderr
    assert not (tmp_path / "R").exists()


def test_table_is_printed_without_json(cells, tmp_path):
    r = bench(cells, "--sampler", "random", "--batch", B, "--seconds", 0.2, "--results",
              tmp_path, "--no-decode-only")
    assert "samples/s" in r.stdout and "read amplification" in r.stdout
    assert "decode-only" not in r.stdout
    rec = json.loads(next(tmp_path.glob("bench-*-random.json")).read_text())
    assert rec["figures"]["decode_only"] is None and rec["figures"]["decode_write"] is None
    assert rec["parameters"]["decode_only"] is False


def test_rounds_repeat_the_same_windows_and_report_medians(cells, tmp_path):
    """--rounds 3: three records (one file each, in the --json array in order), each timing the
    same epoch from the sampler's start; the table ends with the medians of the rounds."""
    r = bench(cells, "--sampler", "sequential", "--batch", B, "--epochs", 1, "--rounds", 3,
              "--results", tmp_path / "J", "--json")
    recs = json.loads(r.stdout)
    assert [x["round"] for x in recs] == [1, 2, 3]
    assert len(list((tmp_path / "J").glob("bench-*.json"))) == 3
    batches = sequential_timed_batches(N, B, P)
    for x in recs:
        assert x["parameters"]["rounds"] == 3
        f = x["figures"]
        assert f["timed_batches"] == len(batches)  # the sampler started over every round
        assert f["bytes_decoded"] == recs[0]["figures"]["bytes_decoded"]
        assert f["decode_only"]["ratio"] > 0
    r = bench(cells, "--sampler", "random", "--batch", B, "--seconds", 0.2, "--rounds", 3,
              "--results", tmp_path / "T")
    assert r.stdout.count("round ") >= 3 and "3 rounds, ratio to decode-only per round:" in r.stdout
    # the medians line: "... ratio R1; decode + write ... ratio R2"
    med = r.stdout.split("median")[-1].splitlines()[0].split("ratio")
    for k, head in ((1, "decode-only per round:"), (2, "decode + write per round:")):
        per_round = [float(v) for v in r.stdout.split(head)[1].splitlines()[0].split()]
        assert len(per_round) == 3
        assert float(med[k].strip(" ;").split(";")[0]) == pytest.approx(sorted(per_round)[1],
                                                                        abs=0.006)


def sequential_window_bytes(cells, batches):
    """The bytes each loader window of these sequential batches decodes (every chunk its rows
    touch, once) and delivers (its rows), from the store's pointers and chunk shapes."""
    g = zarr.open_group(str(cells), mode="r")
    indptr = g["X/indptr"][:]
    cx = g["X/data"].chunks[0]
    obs = [g[k] for k in ("obs/cell_line/codes", "obs/drug/codes", "obs/plate/codes",
                          "obs/n_genes")]
    decoded, delivered = [], []
    for w in range(0, len(batches), P):
        lo, hi = batches[w][0], batches[min(w + P, len(batches)) - 1][-1] + 1
        e0, e1 = indptr[lo], indptr[hi]
        units = (e1 - 1) // cx - e0 // cx + 1
        dec = units * cx * (4 + 4)  # float32 data + int32 indices
        dlv = (e1 - e0) * 8
        for a in obs:
            c = a.chunks[0]
            dec += ((hi - 1) // c - lo // c + 1) * c * a.dtype.itemsize
            dlv += (hi - lo) * a.dtype.itemsize
        decoded.append(int(dec))
        delivered.append(int(dlv))
    return decoded, delivered


def test_sequential_epoch_bytes_and_shuffle_match_the_store(cells, tmp_path):
    rec, _ = run_json(cells, tmp_path, "--sampler", "sequential", "--batch", B, "--epochs", 1)
    f = rec["figures"]
    batches = sequential_timed_batches(N, B, P)
    assert f["timed_batches"] == len(batches)
    assert f["timed_samples"] == sum(len(b) for b in batches)
    assert rec["parameters"]["epochs"] == 1 and rec["parameters"]["seconds"] is None

    # bytes: each window decodes every chunk its rows touch once, and delivers its rows
    decoded, delivered = sequential_window_bytes(cells, batches)
    assert f["bytes_decoded"] == sum(decoded)
    assert f["bytes_delivered"] == sum(delivered)
    assert f["amplification"] >= 1
    # the decode-only and decode + write loops ran over every window (a short epoch, and at
    # least 0.5 s of budget) and decoded the same units; decode + write stored what the loader
    # delivers (each unit its share, rounded down: within a byte per unit), a window of 8 MiB
    # or more with streamed stores, as the reader writes a batch that size, a smaller one with
    # memcpy
    for batch, streamed in ((B, True), (32, False)):
        if batch != B:
            rec, _ = run_json(cells, tmp_path, "--sampler", "sequential", "--batch", batch,
                              "--epochs", 1)
            decoded, delivered = sequential_window_bytes(cells,
                                                         sequential_timed_batches(N, batch, P))
        fb = rec["figures"]
        d, dw = fb["decode_only"], fb["decode_write"]
        assert d["windows"] == fb["timed_windows"] == len(decoded)
        assert d["bytes_decoded"] == dw["bytes_decoded"] == fb["bytes_decoded"] == sum(decoded)
        assert sum(delivered) - d["units"] <= dw["bytes_written"] <= sum(delivered)
        assert (max(delivered) >= 8 << 20) is streamed and dw["streamed"] is streamed

    # the synthetic cell lines are drawn independently per cell: sequential batches mix them as
    # well as random ones, but their ids are neighbours
    codes = ad.read_zarr(cells).obs["cell_line"].cat.codes.to_numpy()
    s = f["shuffle"]
    assert s["entropy_bits"] == pytest.approx(np.mean([entropy(codes[b]) for b in batches]))
    assert s["index_gap_score"] == pytest.approx(1 / (N / 3))
    assert s["random_index_gap_score"] == pytest.approx(1, abs=0.05)


def test_random_sampler_mixes_like_random_batches(cells, tmp_path):
    rec, _ = run_json(cells, tmp_path, "--sampler", "random", "--batch", B, "--seconds", 1,
                      "--seed", 5)
    assert rec["parameters"]["seed"] == 5
    s = rec["figures"]["shuffle"]
    assert s["column"] == "obs/cell_line" and s["codes"] == 50
    # 256 draws from 50 equally likely lines: about log2(50) - 49 / (2 * 256 * ln 2) bits
    assert s["random_entropy_bits"] == pytest.approx(math.log2(50) - 49 / (512 * math.log(2)),
                                                     abs=0.05)
    assert s["entropy_bits"] == pytest.approx(s["random_entropy_bits"], rel=0.10)
    assert s["index_gap_score"] == pytest.approx(1, abs=0.05)
    assert s["random_index_gap_score"] == pytest.approx(1, abs=0.05)
    assert rec["figures"]["amplification"] >= 1


def test_sequential_entropy_is_lower_on_a_sorted_column(sorted_cells, tmp_path):
    p, groups = sorted_cells
    rec, _ = run_json(p, tmp_path, "--sampler", "sequential", "--batch", B, "--epochs", 1,
                      "--obs-column", "group")
    s = rec["figures"]["shuffle"]
    assert s["column"] == "obs/group" and s["codes"] == 30
    batches = sequential_timed_batches(N, B, P)
    expected = np.mean([entropy(groups[b]) for b in batches])
    assert s["entropy_bits"] == pytest.approx(expected)
    assert s["entropy_bits"] < 0.5 * s["random_entropy_bits"]
    assert s["random_entropy_bits"] == pytest.approx(math.log2(30), abs=0.15)
    assert s["index_gap_score"] == pytest.approx(3 / N)
    assert rec["figures"]["amplification"] >= 1

    rec, _ = run_json(p, tmp_path, "--sampler", "random", "--batch", B, "--seconds", 0.5,
                      "--obs-column", "group")
    s = rec["figures"]["shuffle"]
    assert s["entropy_bits"] == pytest.approx(s["random_entropy_bits"], rel=0.10)


def test_transforms_and_other_samplers_run(cells, tmp_path):
    rec, _ = run_json(cells, tmp_path, "--sampler", "size_aware", "--batch", B, "--seconds",
                      0.3, "--transform", "log1p", "--transform", "normalize_total:100",
                      "--max-nnz", 200000)
    assert rec["parameters"]["transforms"] == ["log1p", "normalize_total:100"]
    assert rec["parameters"]["max_nnz"] == 200000
    assert rec["figures"]["samples_per_s"] > 0
    rec, _ = run_json(cells, tmp_path, "--sampler", "weighted", "--batch", B, "--seconds", 0.3,
                      "--transform", "densify")
    assert rec["figures"]["samples_per_s"] > 0


def test_write_mode_reports_sizes_files_and_ratio(tmp_path):
    out, res = tmp_path / "stores", tmp_path / "R"
    r = bench("--write", "--kind", "cells", "--n", 1500, "--genes", 2000, "--codec", "zstd:3",
              "--codec", "none", "--chunk-nnz", 16384, "--shard-nnz", 0, "--shard-nnz", 65536,
              "--out", out, "--results", res, "--json")
    rec = json.loads(r.stdout)
    files = list(res.glob("bench-*-write-cells.json"))
    assert len(files) == 1 and json.loads(files[0].read_text()) == rec
    assert rec["mode"] == "write"
    p = rec["parameters"]
    assert (p["kind"], p["n"], p["codecs"], p["chunk_nnz"], p["shard_nnz"]) == \
        ("cells", 1500, ["zstd:3", "none"], [16384], [0, 65536])
    runs = rec["runs"]
    assert [(x["codec"], x["chunk_nnz"], x["shard_nnz"]) for x in runs] == [
        ("zstd:3", 16384, None), ("zstd:3", 16384, 65536),
        ("none", 16384, None), ("none", 16384, 65536)]
    for x in runs:
        path = Path(x["path"])
        on_disk = [Path(d) / n for d, _, names in os.walk(path) for n in names]
        assert x["files"] == len(on_disk)
        assert x["bytes_on_disk"] == sum(q.stat().st_size for q in on_disk)
        # uncompressed: every fixed-size array of the store, as zarr-python sees it
        g = zarr.open_group(str(path), mode="r")
        logical = sum(a.nbytes for _, a in g.members(max_depth=None)
                      if isinstance(a, zarr.Array) and a.dtype.kind not in "OUT")
        assert x["uncompressed_bytes"] == logical
        assert x["write_mb_s"] == pytest.approx(logical / 1e6 / x["seconds"])
        assert x["samples_per_s"] == pytest.approx(1500 / x["seconds"])
    zstd, plain = runs[0], runs[2]
    assert zstd["compression_ratio"] > 1.5
    assert zstd["compression_ratio"] == pytest.approx(zstd["uncompressed_bytes"] /
                                                      zstd["stored_bytes"])
    # without a codec every stored chunk is its full, padded size
    g = zarr.open_group(plain["path"], mode="r")
    padded = sum(a.nchunks_initialized * math.prod(a.chunks) * a.dtype.itemsize
                 for _, a in g.members(max_depth=None)
                 if isinstance(a, zarr.Array) and a.dtype.kind not in "OUT")
    assert plain["stored_bytes"] == padded
    assert plain["compression_ratio"] == pytest.approx(plain["uncompressed_bytes"] / padded)
    assert zstd["bytes_on_disk"] < plain["bytes_on_disk"]
    assert runs[1]["files"] < runs[0]["files"]  # shards hold several chunks per file


def test_write_mode_without_out_leaves_nothing(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    r = subprocess.run([CLI, "bench", "--write", "--kind", "atoms", "--n", "50", "--results",
                        str(tmp_path / "R")], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "ratio" in r.stdout
    assert list((tmp_path / "tmp").iterdir()) == []
    rec = json.loads(next((tmp_path / "R").glob("*-write-atoms.json")).read_text())
    (x,) = rec["runs"]
    assert x["path"] is None and x["files"] > 0 and x["compression_ratio"] > 1


@pytest.mark.parametrize("args,needle", [
    ([], "STORE"),
    (["{store}", "--sampler", "shuffled"], "--sampler"),
    (["{store}", "--seconds", "1", "--epochs", "2"], "exclude"),
    (["{store}", "--batch", "0"], "--batch"),
    (["{store}", "--rounds", "0"], "--rounds"),
    (["{store}", "--transform", "sqrt"], "--transform"),
    (["{store}", "--obs-column", "nope", "--seconds", "0.1"], "nope"),
    (["{store}", "--obs-column", "X/data", "--seconds", "0.1"], "not a per-sample integer"),
    (["{store}", "--bogus"], "unknown option"),
    (["{store}", "--threads"], "needs a value"),
    (["--write", "--kind", "cells"], "--n"),
    (["--write", "--kind", "atoms", "--n", "10", "--chunk-nnz", "5"], "apply to --kind cells"),
    (["--write", "--kind", "cells", "--n", "10", "--chunk-nnz", "1000", "--shard-nnz", "1500"],
     "multiple"),
])
def test_bad_usage_exits_2(cells, tmp_path, args, needle):
    r = bench("--results", tmp_path / "R", *[a.format(store=cells) for a in args], check=False)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert needle in r.stderr
    assert not (tmp_path / "R").exists()
