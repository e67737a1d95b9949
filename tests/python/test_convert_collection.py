"""zbatch convert INPUT... -o OUTPUT: AnnData inputs into a pre-shuffled collection.

The oracle is anndata itself: the inputs are AnnData objects written by anndata 0.12 (.h5ad and
Zarr v2/v3), the outputs are read back with anndata.read_zarr, and every output row is compared
with its source row (found through the src_path / src_row columns the converter adds) gene by
gene by name. Nothing is compared with zbatch's own reading of its own output alone.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from conftest import CLI, expect_error, zbatch_api

N_GENES = 40


def crc64_xz(data: bytes) -> int:
    """CRC-64/XZ (ECMA-182 reflected, init and xorout all ones): an independent implementation."""
    table = crc64_xz.table
    crc = 0xFFFFFFFFFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFFFFFFFFFF


def _table():
    poly = 0xC96C5795D7870F42
    out = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        out.append(c)
    return out


crc64_xz.table = _table()


def make_adata(k, n, genes, cats, *, seed, nullable=True, int_dtype=np.int32):
    rng = np.random.default_rng(seed)
    X = sp.random(n, len(genes), density=0.3, format="csr", dtype=np.float32, random_state=rng)
    X.data[:] = rng.integers(1, 50, X.nnz).astype(np.float32)
    obs = pd.DataFrame(
        {"cell_type": pd.Categorical(rng.choice(cats, n), categories=cats),
         "batch": pd.Categorical(rng.choice([f"b{k}x", f"b{k}y"], n)),
         "total": rng.integers(0, 10**6, n).astype(int_dtype),
         "qc": rng.standard_normal(n).astype(np.float32),
         "keep": rng.random(n) > 0.3,
         "donor": [f"donor_{k}_{i % 7}" for i in range(n)]},
        index=[f"in{k}_cell{i}" for i in range(n)])
    if nullable:
        vals = pd.array(rng.integers(0, 100, n), dtype="Int64")
        vals[rng.random(n) < 0.2] = pd.NA
        obs["age"] = vals
        flags = pd.array(rng.random(n) > 0.5, dtype="boolean")
        flags[rng.random(n) < 0.2] = pd.NA
        obs["flag"] = flags
    var = pd.DataFrame(index=list(genes))
    return ad.AnnData(X=X, obs=obs, var=var)


ALL_GENES = [f"gene_{i:03d}" for i in range(N_GENES)]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Three inputs with overlapping but different gene sets (in different orders), different
    category tables, nullable columns: an .h5ad, a Zarr v2 and a Zarr v3 store."""
    d = tmp_path_factory.mktemp("inputs")
    rng = np.random.default_rng(0)
    g0 = ALL_GENES[:30]
    g1 = list(rng.permutation(ALL_GENES[10:40]))
    g2 = ALL_GENES[5:35][::-1]
    a0 = make_adata(0, 230, g0, ["B", "T", "NK"], seed=1)
    a1 = make_adata(1, 170, g1, ["T", "mono"], seed=2, int_dtype=np.int64)
    a2 = make_adata(2, 95, g2, ["NK", "B", "DC"], seed=3)
    p0, p1, p2 = d / "a.h5ad", d / "b.zarr", d / "c.zarr"
    a0.write_h5ad(p0)
    with ad.settings.override(zarr_write_format=2):
        a1.write_zarr(p1)
    with ad.settings.override(zarr_write_format=3):
        a2.write_zarr(p2)
    return [(str(p0), a0), (str(p1), a1), (str(p2), a2)]


def convert_cli(inputs, out, *extra, timeout=300):
    r = subprocess.run([str(CLI), "convert", *inputs, "-o", str(out), "--quiet", *extra],
                       capture_output=True, text=True, timeout=timeout)
    return r


def read_collection(out):
    """Every dataset of the collection, read by anndata, concatenated in dataset order."""
    names = sorted((p.name for p in Path(out).iterdir() if p.name.startswith("dataset_")),
                   key=lambda s: int(s.split("_")[1]))
    parts = [ad.read_zarr(Path(out) / n) for n in names]
    return names, parts


def check_cells(out, sources, genes):
    """Each output row equals its source row: X gene by gene (by name), every obs column."""
    names, parts = read_collection(out)
    whole = ad.concat(parts, merge="same") if len(parts) > 1 else parts[0]
    assert list(whole.var_names) == list(genes)
    paths = [p for p, _ in sources]
    src_path = whole.obs["src_path"]
    assert list(src_path.cat.categories) == paths
    seen = {k: np.zeros(a.n_obs, dtype=int) for k, (_, a) in enumerate(sources)}
    Xout = whole.X.toarray() if sp.issparse(whole.X) else np.asarray(whole.X)
    for k, (p, a) in enumerate(sources):
        rows = np.flatnonzero(src_path.to_numpy() == p)
        src_rows = whole.obs["src_row"].to_numpy()[rows]
        np.add.at(seen[k], src_rows, 1)
        # X: the output's genes that the input has must equal its values; the others are 0
        Xin = a.X.toarray()
        col = {g: j for j, g in enumerate(a.var_names)}
        for j, g in enumerate(genes):
            expect = Xin[src_rows, col[g]] if g in col else np.zeros(len(rows), np.float32)
            np.testing.assert_array_equal(Xout[rows, j], expect, err_msg=f"{p}: gene {g}")
        np.testing.assert_array_equal(whole.obs_names[rows], a.obs_names[src_rows])
        for c in ("cell_type", "batch", "donor"):
            np.testing.assert_array_equal(whole.obs[c].astype(str).to_numpy()[rows],
                                          a.obs[c].astype(str).to_numpy()[src_rows], err_msg=c)
        for c in ("total", "qc", "keep"):
            np.testing.assert_array_equal(whole.obs[c].to_numpy()[rows], a.obs[c].to_numpy()[src_rows])
        for c in ("age", "flag"):
            if c not in a.obs:
                continue
            got, want = whole.obs[c].iloc[rows], a.obs[c].iloc[src_rows]
            np.testing.assert_array_equal(got.isna().to_numpy(), want.isna().to_numpy(), err_msg=c)
            np.testing.assert_array_equal(got.dropna().to_numpy(), want.dropna().to_numpy())
    for k in seen:
        assert (seen[k] == 1).all(), f"input {k}: cells missing or repeated"
    return whole


def test_outer_join_collection(inputs, tmp_path):
    out = tmp_path / "coll.zarr"
    r = convert_cli([p for p, _ in inputs], out, "--dataset-size", "128", "--memory", "64M",
                    "--seed", "7")
    assert r.returncode == 0, r.stderr
    genes = sorted(set().union(*[set(a.var_names) for _, a in inputs]))
    whole = check_cells(out, inputs, genes)
    n = sum(a.n_obs for _, a in inputs)
    names, parts = read_collection(out)
    assert [p.n_obs for p in parts] == [128] * (n // 128) + ([n % 128] if n % 128 else [])
    # one category table everywhere: the sorted union, so a code means the same in every dataset
    for p in parts:
        assert list(p.obs["cell_type"].cat.categories) == ["B", "DC", "NK", "T", "mono"]
    assert whole.obs["age"].dtype == "Int64" and whole.obs["flag"].dtype == "boolean"
    assert whole.obs["total"].dtype == np.int64  # int32 and int64 inputs promote as numpy does
    # root: annbatch's attributes; zbatch opens it as one collection of all cells
    root = json.loads((out / "zarr.json").read_text())
    assert root["attributes"] == {"encoding-type": "annbatch-preshuffled",
                                  "encoding-version": "0.1.0"}
    assert not (out / ".zbatch-convert").exists() and not (out / ".zbatch-incomplete").exists()
    # zarr-python sees the same tree through the root's consolidated metadata as by listing
    import zarr

    def tree(g, prefix=""):
        out_ = {}
        for name, node in g.members():
            path = f"{prefix}{name}"
            if isinstance(node, zarr.Group):
                out_[path] = "group"
                out_.update(tree(node, path + "/"))
            else:
                out_[path] = (node.shape, str(node.dtype))
        return out_

    consolidated = zarr.open_group(out, mode="r")
    assert consolidated.metadata.consolidated_metadata is not None
    listed = zarr.open_group(out, mode="r", use_consolidated=False)
    assert tree(consolidated) == tree(listed)
    assert len(tree(listed)) > 20
    zb = zbatch_api()
    ds = zb.open(str(out))
    assert len(ds) == n
    b = ds.read_many(list(range(n)))
    np.testing.assert_array_equal(b["X"].toarray(), whole.X.toarray())


def test_inner_join_and_gene_list(inputs, tmp_path):
    common = [g for g in inputs[0][1].var_names
              if all(g in set(a.var_names) for _, a in inputs)]
    out = tmp_path / "inner.zarr"
    r = convert_cli([p for p, _ in inputs], out, "--var-join", "inner", "--dataset-size", "1000")
    assert r.returncode == 0, r.stderr
    check_cells(out, inputs, common)  # inner: the first input's order
    genes = ["gene_039", "gene_000", "gene_017", "not_a_gene"]
    gf = tmp_path / "genes.txt"
    gf.write_text("\n".join(genes) + "\n")
    out2 = tmp_path / "list.zarr"
    r = convert_cli([p for p, _ in inputs], out2, "--genes", str(gf))
    assert r.returncode == 0, r.stderr
    check_cells(out2, inputs, genes)


def test_same_genes_keep_their_order_and_python_api(tmp_path):
    zb = zbatch_api()
    genes = [f"g{i}" for i in (5, 3, 9, 1, 7)]
    a = make_adata(0, 60, genes, ["x", "y"], seed=5, nullable=False)
    b = make_adata(1, 40, genes, ["x", "y"], seed=6, nullable=False)
    pa, pb = tmp_path / "a.h5ad", tmp_path / "b.h5ad"
    a.write_h5ad(pa)
    b.write_h5ad(pb)
    seen = []
    manifest = zb.convert([pa, pb], tmp_path / "out.zarr", dataset_size=30, memory="64M",
                          progress=seen.append)
    check_cells(tmp_path / "out.zarr", [(str(pa), a), (str(pb), b)], genes)
    assert manifest["n_cells"] == 100 and manifest["n_genes"] == 5
    assert [d["cells"] for d in manifest["datasets"]] == [30, 30, 30, 10]
    for entry, path in zip(manifest["inputs"], (pa, pb)):
        assert entry["crc64"] == f"{crc64_xz(path.read_bytes()):016x}"
        assert entry["bytes"] == path.stat().st_size
    assert {s["phase"] for s in seen} == {"prepare", "scatter", "gather"}
    assert seen[-1]["cells_done"] == seen[-1]["cells_total"] == 100


def test_shuffle_spreads_labels(tmp_path):
    """An input sorted by label comes out with every dataset's label proportions near the
    global ones; the same input converted without shuffling fails the same check."""
    n = 4000
    labels = np.repeat(["a", "b", "c", "d"], n // 4)
    X = sp.random(n, 8, density=0.5, format="csr", dtype=np.float32, random_state=1)
    a = ad.AnnData(X=X, obs=pd.DataFrame({"label": pd.Categorical(labels)},
                                         index=[f"c{i}" for i in range(n)]),
                   var=pd.DataFrame(index=[f"g{i}" for i in range(8)]))
    p = tmp_path / "sorted.h5ad"
    a.write_h5ad(p)

    def worst_deviation(out):
        _, parts = read_collection(out)
        worst = 0.0
        for part in parts:
            m = part.n_obs
            for lab in "abcd":
                k = int((part.obs["label"] == lab).sum())
                # binomial standard deviations from the global quarter
                worst = max(worst, abs(k - m / 4) / np.sqrt(m * 0.25 * 0.75))
        return worst

    shuffled, ordered = tmp_path / "s.zarr", tmp_path / "o.zarr"
    assert convert_cli([str(p)], shuffled, "--dataset-size", "500").returncode == 0
    assert convert_cli([str(p)], ordered, "--dataset-size", "500", "--no-shuffle").returncode == 0
    assert worst_deviation(shuffled) < 4.5  # 8 datasets x 4 labels: a 4.5-sigma bound
    assert worst_deviation(ordered) > 10


def tree_bytes(root):
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            path = Path(dirpath) / f
            out[str(path.relative_to(root))] = path.read_bytes()
    return out


def test_byte_identical_across_threads_and_memory(inputs, tmp_path):
    paths = [p for p, _ in inputs]
    a, b = tmp_path / "a.zarr", tmp_path / "b.zarr"
    assert convert_cli(paths, a, "--threads", "1", "--memory", "64M").returncode == 0
    assert convert_cli(paths, b, "--threads", "3", "--memory", "1G").returncode == 0
    ta, tb = tree_bytes(a), tree_bytes(b)
    assert ta.keys() == tb.keys() and all(ta[k] == tb[k] for k in ta)


def test_killed_and_restarted_is_byte_identical(tmp_path):
    """kill -9 at random moments, restart with the same command until it finishes: the result
    equals an uninterrupted run byte for byte."""
    rng = np.random.default_rng(11)
    paths = []
    for k in range(3):
        a = make_adata(k, 6000, ALL_GENES, ["p", "q", "r"], seed=20 + k)
        p = tmp_path / f"in{k}.h5ad"
        a.write_h5ad(p)
        paths.append(str(p))
    args = ["--dataset-size", "1000", "--memory", "64M", "--chunk", "512", "--threads", "2"]
    ref = tmp_path / "ref.zarr"
    t0 = time.monotonic()
    assert convert_cli(paths, ref, *args).returncode == 0
    full = time.monotonic() - t0
    out = tmp_path / "killed.zarr"
    work = out / ".zbatch-convert"
    random.seed(5)
    cmd = [str(CLI), "convert", *paths, "-o", str(out), "--quiet", *args]

    def files(d):
        return [p for p in d.iterdir() if not p.name.endswith(tuple(f".tmp{i}" for i in range(10)))] \
            if d.exists() else []

    # killed as soon as each stage shows progress (so every phase is interrupted), then at
    # random moments
    stages = [lambda: files(work / "prepare"), lambda: files(work / "scatter"),
              lambda: list(out.glob("dataset_*")), lambda: files(work / "gather"),
              lambda: len(files(work / "gather")) >= 2]
    kills = 0
    for attempt in range(len(stages) + 3):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if attempt < len(stages):
            while proc.poll() is None and not stages[attempt]():
                time.sleep(0.001)
            if attempt == 1 and proc.poll() is None:  # a second run meanwhile is refused
                second = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
                assert second.returncode == 1 and "another conversion" in second.stderr, \
                    second.stderr
        else:
            time.sleep(random.uniform(0.0, 0.5) * full)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
    assert kills >= 4
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    ta, tb = tree_bytes(ref), tree_bytes(out)
    assert ta.keys() == tb.keys()
    assert [k for k in ta if ta[k] != tb[k]] == []


def test_dask_local_cluster_gives_the_same_bytes(inputs, tmp_path):
    from dask.distributed import Client, LocalCluster
    zb = zbatch_api()
    paths = [p for p, _ in inputs]
    ref = tmp_path / "ref.zarr"
    zb.convert(paths, ref, dataset_size=100, memory="64M", progress=False)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        manifest = zb.convert(paths, tmp_path / "dask.zarr", dataset_size=100, memory="64M",
                              progress=False, client=client)
    ta, tb = tree_bytes(ref), tree_bytes(tmp_path / "dask.zarr")
    assert ta.keys() == tb.keys() and all(ta[k] == tb[k] for k in ta)
    assert manifest["n_cells"] == sum(a.n_obs for _, a in inputs)


def test_restart_refuses_other_options_and_changed_inputs(inputs, tmp_path):
    paths = [p for p, _ in inputs]
    out = tmp_path / "x.zarr"
    assert convert_cli(paths, out, "--seed", "1").returncode == 0
    r = convert_cli(paths, out, "--seed", "2")
    assert r.returncode == 1 and "seed" in r.stderr and "other inputs or options" in r.stderr
    r = convert_cli(paths, out, "--seed", "1")  # the same command: verified, left as it is
    assert r.returncode == 0, r.stderr
    # a conversion in progress (planned, not run) whose input then changes is refused
    zb = zbatch_api()
    pending = tmp_path / "pending.zarr"
    copy = tmp_path / "copy.h5ad"
    copy.write_bytes(Path(paths[0]).read_bytes())
    zb._zbatch.convert_plan([str(copy)], str(pending), {})
    with open(copy, "ab") as f:
        f.write(b"\0")
    r = convert_cli([str(copy)], pending)
    assert r.returncode == 1 and "changed since" in r.stderr and "copy.h5ad" in r.stderr, r.stderr
    r = convert_cli([str(copy)], pending, "--seed", "3")
    assert r.returncode == 1 and "seed" in r.stderr, r.stderr


def test_tampered_output_is_caught(inputs, tmp_path):
    paths = [p for p, _ in inputs]
    out = tmp_path / "t.zarr"
    assert convert_cli(paths, out, "--dataset-size", "200").returncode == 0
    victim = next(p for p in sorted((out / "dataset_1" / "X" / "data").rglob("*")) if p.is_file()
                  and p.name != "zarr.json")
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    r = convert_cli(paths, out, "--dataset-size", "200")
    assert r.returncode == 1
    assert "ZB_E_CHECKSUM" in r.stderr or "checksum" in r.stderr and "dataset_1" in r.stderr


@pytest.mark.parametrize("case", ["missing", "not_anndata", "dup_var", "kind_clash", "obs_missing"])
def test_bad_inputs_are_refused_by_name(case, tmp_path, inputs):
    good = inputs[0][0]
    out = tmp_path / "o.zarr"
    if case == "missing":
        r = convert_cli([good, str(tmp_path / "nope.h5ad")], out)
        want = "nope.h5ad"
    elif case == "not_anndata":
        p = tmp_path / "plain.txt"
        p.write_text("hello")
        r = convert_cli([str(p)], out)
        want = "plain.txt"
    elif case == "dup_var":
        a = make_adata(0, 10, ["g1", "g2", "g1"], ["x"], seed=1, nullable=False)
        p = tmp_path / "dup.h5ad"
        a.write_h5ad(p)
        r = convert_cli([str(p)], out)
        want = "g1"
    elif case == "kind_clash":
        a = make_adata(0, 10, ALL_GENES[:5], ["x"], seed=1, nullable=False)
        a.obs["cell_type"] = np.arange(10)  # numbers here, a categorical in the other input
        p = tmp_path / "clash.h5ad"
        a.write_h5ad(p)
        r = convert_cli([good, str(p)], out, "--obs", "cell_type")
        want = "cell_type"
    else:
        r = convert_cli([good], out, "--obs", "cell_type,nonexistent")
        want = "nonexistent"
    assert r.returncode == 1, r.stderr
    assert want in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "Segmentation" not in r.stderr


def test_memory_stays_bounded(tmp_path):
    """An input several times larger than --memory: the converter's peak RSS stays under the
    budget plus the stated constant (docs/CONVERT.md: 64 MiB, when the budget holds a dataset
    writer's shards: 8 MiB here with shards of 262,144 elements)."""
    n, genes = 60000, 2000
    rng = np.random.default_rng(4)
    nnz_per = 400
    indptr = np.arange(n + 1, dtype=np.int64) * nnz_per
    indices = np.sort(rng.integers(0, genes, (n, nnz_per)), axis=1).astype(np.int32).ravel()
    X = sp.csr_matrix((rng.random(n * nnz_per, dtype=np.float32), indices, indptr),
                      shape=(n, genes))
    X.sum_duplicates()
    a = ad.AnnData(X=X, obs=pd.DataFrame({"c": pd.Categorical(rng.choice(["a", "b"], n))},
                                         index=[f"c{i}" for i in range(n)]),
                   var=pd.DataFrame(index=[f"g{i}" for i in range(genes)]))
    p = tmp_path / "big.h5ad"
    a.write_h5ad(p)
    size = X.data.nbytes + X.indices.nbytes
    memory = 64 << 20
    assert size > 2.5 * memory
    # GNU time forks the converter from itself: a child forked from pytest would start with
    # pytest's pages counted in its peak
    r = subprocess.run(["/usr/bin/time", "-f", "maxrss_kb=%M", str(CLI), "convert", str(p), "-o",
                        str(tmp_path / "o.zarr"), "--quiet", "--memory", "64M",
                        "--dataset-size", "20000", "--threads", "2", "--shard", "262144"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    peak = int(r.stderr.strip().splitlines()[-1].split("=")[1]) * 1024
    assert peak < memory + (64 << 20), f"peak RSS {peak / 2**20:.0f} MiB"
    # and the conversion is right: every cell once, X equal row by row
    names, parts = read_collection(tmp_path / "o.zarr")
    got = ad.concat(parts)
    order = np.argsort(got.obs["src_row"].to_numpy())
    assert (got.obs["src_row"].to_numpy()[order] == np.arange(n)).all()
    assert (got.X[order] != a.X).nnz == 0


def test_cli_runs_the_python_jobs(inputs, tmp_path):
    """--scheduler and --from ase run in the Python package: the same bytes as the command's own
    threads on a Dask cluster, and ASE structures into an atomic store."""
    from dask.distributed import LocalCluster
    paths = [p for p, _ in inputs]
    env = dict(os.environ, ZBATCH_PYTHON=str(Path(CLI).parents[1] / ".venv" / "bin" / "python"))
    ref, viad = tmp_path / "ref.zarr", tmp_path / "dask.zarr"
    assert convert_cli(paths, ref, "--dataset-size", "150").returncode == 0
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster:
        r = subprocess.run([str(CLI), "convert", *paths, "-o", str(viad), "--quiet",
                            "--dataset-size", "150", "--scheduler", cluster.scheduler_address],
                           capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    ta, tb = tree_bytes(ref), tree_bytes(viad)
    assert ta.keys() == tb.keys() and all(ta[k] == tb[k] for k in ta)

    from ase.build import bulk
    from ase.io import write
    frames = []
    for i in range(4):
        a = bulk("Cu", "fcc", a=3.6).repeat((2, 2, 2))
        a.rattle(0.05, seed=i)
        frames.append(a)
    src = tmp_path / "s.extxyz"
    write(src, frames)
    out = tmp_path / "atoms.zarr"
    r = subprocess.run([str(CLI), "convert", "--from", "ase", str(src), "-o", str(out),
                        "--cutoff", "3.0"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    ds = zbatch_api().open(str(out))
    assert len(ds) == 4
    from ase.io import read
    b = ds.read_many([2])
    back = read(src, index=2)  # extended XYZ keeps 8 decimals: ASE's own reading is the oracle
    np.testing.assert_array_equal(b["positions"], back.positions.astype(np.float32))


def test_csc_dense_raw_and_layers(tmp_path):
    """A CSC X (transposed out of core), a dense X, raw/X as the output's X, and a layer carried
    along: every value lands in its cell, gene by gene."""
    rng = np.random.default_rng(9)
    genes = [f"g{i}" for i in range(25)]

    def adata(k, n, fmt):
        X = sp.random(n, len(genes), density=0.3, format="csr", dtype=np.float32,
                      random_state=rng)
        X.data[:] = rng.integers(1, 30, X.nnz)
        counts = X.copy()
        counts.data = counts.data * 10
        a = ad.AnnData(X=X.tocsc() if fmt == "csc" else X.toarray() if fmt == "dense" else X,
                       obs=pd.DataFrame({"k": np.full(n, k)}, index=[f"{fmt}{i}" for i in range(n)]),
                       var=pd.DataFrame(index=genes))
        a.layers["counts"] = counts
        a.raw = ad.AnnData(X=counts * 2, var=pd.DataFrame(index=genes))
        return a

    a0, a1 = adata(0, 140, "csc"), adata(1, 90, "dense")
    p0, p1 = tmp_path / "csc.h5ad", tmp_path / "dense.zarr"
    a0.write_h5ad(p0)
    with ad.settings.override(zarr_write_format=3):
        a1.write_zarr(p1)
    paths = [str(p0), str(p1)]
    out = tmp_path / "layers.zarr"
    r = convert_cli(paths, out, "--layers", "counts", "--dataset-size", "100", "--memory", "64M")
    assert r.returncode == 0, r.stderr
    _, parts = read_collection(out)
    whole = ad.concat(parts, merge="same")
    for k, a in enumerate((a0, a1)):
        rows = np.flatnonzero(whole.obs["src_path"].to_numpy() == paths[k])
        src = whole.obs["src_row"].to_numpy()[rows]
        X = a.X.toarray() if sp.issparse(a.X) else a.X
        np.testing.assert_array_equal(whole.X[rows].toarray(), X[src])
        np.testing.assert_array_equal(whole.layers["counts"][rows].toarray(),
                                      a.layers["counts"][src].toarray())
    out2 = tmp_path / "raw.zarr"
    r = convert_cli(paths, out2, "--x", "raw/X", "--dataset-size", "1000")
    assert r.returncode == 0, r.stderr
    _, parts = read_collection(out2)
    whole = parts[0]
    for k, a in enumerate((a0, a1)):
        rows = np.flatnonzero(whole.obs["src_path"].to_numpy() == paths[k])
        src = whole.obs["src_row"].to_numpy()[rows]
        np.testing.assert_array_equal(whole.X[rows].toarray(), a.raw.X[src].toarray())


def test_progress_lines_in_a_log(inputs, tmp_path):
    """Without a terminal the command prints a line per phase with its rate and time."""
    r = subprocess.run([str(CLI), "convert", *[p for p, _ in inputs], "-o", str(tmp_path / "p.zarr")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    for phase in ("prepare", "scatter", "gather"):
        done = [l for l in lines if l.startswith(phase) and "100.0%" in l]
        assert done and "cells/s" in done[-1] and "took" in done[-1], r.stderr
    assert "\r" not in r.stderr


def test_a_column_of_an_unknown_encoding_is_left_out(tmp_path):
    """An obs column whose encoding no reader here knows (an awkward-array group, added with
    h5py and zarr-python beside anndata's columns) is left out by default, named in the
    manifest, and refused by name when asked for; the other columns convert."""
    import h5py
    import zarr
    a = make_adata(0, 40, ALL_GENES[:10], ["x", "y"], seed=4, nullable=False)
    h5, zs = tmp_path / "odd.h5ad", tmp_path / "odd.zarr"
    a.write_h5ad(h5)
    with ad.settings.override(zarr_write_format=3):
        a.write_zarr(zs)
    with h5py.File(h5, "r+") as f:
        g = f["obs"].create_group("ragged")
        g.attrs["encoding-type"] = "awkward-array"
        g.attrs["encoding-version"] = "0.1.0"
        f["obs"].attrs["column-order"] = list(f["obs"].attrs["column-order"]) + ["ragged"]
    root = zarr.open_group(zs, mode="r+")
    g = root["obs"].create_group("ragged")
    g.attrs.update({"encoding-type": "awkward-array", "encoding-version": "0.1.0"})
    root["obs"].attrs["column-order"] = list(root["obs"].attrs["column-order"]) + ["ragged"]
    zarr.consolidate_metadata(zs)  # anndata consolidated the store: the snapshot must say it too
    for src in (h5, zs):
        out = tmp_path / f"{src.stem}-{src.suffix[1:]}.zarr"
        r = convert_cli([str(src)], out)
        assert r.returncode == 0, r.stderr
        manifest = json.loads((out / "zbatch-manifest.json").read_text())
        assert len(manifest["skipped_columns"]) == 1
        assert "'ragged'" in manifest["skipped_columns"][0]
        assert "awkward-array" in manifest["skipped_columns"][0]
        _, parts = read_collection(out)
        assert "ragged" not in parts[0].obs and "cell_type" in parts[0].obs
        r = convert_cli([str(src)], tmp_path / "asked.zarr", "--obs", "cell_type,ragged")
        assert r.returncode == 1 and "ragged" in r.stderr and "awkward-array" in r.stderr, r.stderr


def test_limit_measures_the_conversions_output(inputs, tmp_path):
    """`--limit` reads every input and copies X in input order through the same writer, with
    the stored types the conversion would choose: counts of 1..49 as uint8 with uint16 gene
    ids (3 bytes per nonzero), 8 with --data-dtype keep --index-dtype int32; it leaves nothing
    behind."""
    import json
    paths = [p for p, _ in inputs]
    nnz = sum(a.X.nnz for _, a in inputs)
    cells = sum(a.n_obs for _, a in inputs)
    for extra, per_nonzero in (((), 3), (("--data-dtype", "keep", "--index-dtype", "int32"), 8)):
        out = tmp_path / "limit.zarr"
        r = convert_cli(paths, out, "--limit", *extra)
        assert r.returncode == 0, r.stderr
        m = json.loads(r.stdout.strip().splitlines()[-1])
        assert m["cells"] == cells
        assert m["output_bytes"] == nnz * per_nonzero, extra
        assert m["input_bytes"] > 0 and m["read_s"] > 0 and m["compress_s"] >= 0
        assert not out.exists()
