"""zbatch convert stores values in the narrowest exact type (issue 19).

X/data (and each layer's data) is uint8 when every value of the whole input is an integer in
[0, 255], uint16 in [0, 65,535], else the inputs' type; column ids are uint8/uint16 up to 65,535
genes. The choice is one for the whole collection (every dataset the same), survives a restart
and a Dask run, and anndata's own reading gives back the input's values.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import zarr

from conftest import CLI, zbatch_api
from test_convert_collection import convert_cli, tree_bytes


def make_counts(n, n_genes, *, seed, dtype=np.float32, special=None, layer=False):
    """Counts 0..200 (stored nonzeros 1..200), and `special` (a value) put in one cell."""
    rng = np.random.default_rng(seed)
    X = sp.random(n, n_genes, density=0.2, format="csr", dtype=np.float64, random_state=rng)
    X.data[:] = rng.integers(1, 201, X.nnz)
    if special is not None:
        X.data[X.nnz // 2] = special
    X = X.astype(dtype)
    obs = pd.DataFrame({"batch": pd.Categorical(rng.choice(["a", "b"], n))},
                       index=[f"s{seed}_c{i}" for i in range(n)])
    a = ad.AnnData(X=X, obs=obs, var=pd.DataFrame(index=[f"g{i}" for i in range(n_genes)]))
    if layer:
        L = X.astype(np.float32)
        L.data[:] = L.data / 7.0
        a.layers["norm"] = L
    return a


def write_inputs(tmp_path, adatas):
    paths = []
    for k, a in enumerate(adatas):
        p = tmp_path / f"in{k}.h5ad"
        a.write_h5ad(p)
        paths.append(str(p))
    return paths


def stored_types(out):
    """{dataset: {array: data_type}} from the Zarr v3 metadata of every dataset's matrices."""
    got = {}
    for ds in sorted(Path(out).glob("dataset_*")):
        got[ds.name] = {}
        for arr in ds.glob("**/zarr.json"):
            rel = str(arr.parent.relative_to(ds))
            if rel.endswith(("/data", "/indices")):
                got[ds.name][rel] = json.loads(arr.read_text())["data_type"]
    return got


def check_values(out, paths, adatas, key=None):
    """anndata's reading of every dataset: each output row equals its input row."""
    parts = [ad.read_zarr(p) for p in sorted(Path(out).glob("dataset_*"))]
    whole = ad.concat(parts, merge="same") if len(parts) > 1 else parts[0]
    M = whole.layers[key] if key else whole.X
    out_dense = M.toarray()
    for p, a in zip(paths, adatas):
        rows = np.flatnonzero(whole.obs["src_path"].to_numpy() == p)
        src = whole.obs["src_row"].to_numpy()[rows]
        want = (a.layers[key] if key else a.X).toarray()[src]
        np.testing.assert_array_equal(out_dense[rows], want)


@pytest.mark.parametrize("dtype,special,expect", [
    (np.float32, None, "uint8"),
    (np.float32, 300, "uint16"),
    (np.float32, 2.5, "float32"),
    (np.float32, -1, "float32"),
    (np.float32, np.nan, "float32"),
    (np.int32, 70000, "int32"),
    (np.int32, 65535, "uint16"),
    (np.int64, None, "uint8"),
])
def test_the_narrowest_exact_type_for_the_whole_collection(tmp_path, dtype, special, expect):
    """The special value sits in one cell of one input only: every dataset still gets the type
    it needs, and anndata reads the input's values back."""
    adatas = [make_counts(120, 40, seed=1, dtype=dtype),
              make_counts(90, 40, seed=2, dtype=dtype, special=special)]
    paths = write_inputs(tmp_path, adatas)
    out = tmp_path / "out.zarr"
    r = convert_cli(paths, out, "--dataset-size", "50")
    assert r.returncode == 0, r.stderr
    codec = "blosc:lz4:5:" + ("noshuffle" if expect in ("uint8", "uint16") else "shuffle")
    assert (f"stored X/data {expect} ({codec}), X/indices uint8 (blosc:lz4:5:noshuffle)"
            in r.stdout)
    types = stored_types(out)
    assert len(types) == 5
    for ds, t in types.items():
        assert t == {"X/data": expect, "X/indices": "uint8"}, ds
        for arr, want in (("X/data", codec), ("X/indices", "blosc:lz4:5:noshuffle")):
            (c,) = zarr.open_array(str(out / ds / arr)).compressors
            assert f"blosc:{c.cname.value}:{c.clevel}:{c.shuffle.value}" == want, (ds, arr)
    manifest = json.loads((out / "zbatch-manifest.json").read_text())
    assert manifest["dtypes"] == {"X/data": expect, "X/indices": "uint8"}
    assert manifest["args"]["data_dtype"] == "auto"
    if special is None or np.isfinite(special):
        check_values(out, paths, adatas)


def test_layers_choose_their_own_type_and_indices_follow_the_genes(tmp_path):
    adatas = [make_counts(80, 300, seed=3, layer=True), make_counts(60, 300, seed=4, layer=True)]
    paths = write_inputs(tmp_path, adatas)
    out = tmp_path / "out.zarr"
    r = convert_cli(paths, out, "--layers", "norm", "--dataset-size", "64")
    assert r.returncode == 0, r.stderr
    want = {"X/data": "uint8", "X/indices": "uint16", "layers/norm/data": "float32",
            "layers/norm/indices": "uint16"}
    assert all(t == want for t in stored_types(out).values())
    assert json.loads((out / "zbatch-manifest.json").read_text())["dtypes"] == want
    check_values(out, paths, adatas)
    check_values(out, paths, adatas, key="norm")


def test_explicit_types_and_int32_indices(tmp_path):
    adatas = [make_counts(70, 40, seed=5), make_counts(50, 40, seed=6, special=300)]
    paths = write_inputs(tmp_path, adatas)
    cases = {("--data-dtype", "uint16"): {"X/data": "uint16", "X/indices": "uint8"},
             ("--data-dtype", "keep", "--index-dtype", "int32"):
                 {"X/data": "float32", "X/indices": "int32"},
             ("--data-dtype", "float32", "--index-dtype", "narrow"):
                 {"X/data": "float32", "X/indices": "uint8"}}
    for i, (flags, want) in enumerate(cases.items()):
        out = tmp_path / f"o{i}.zarr"
        r = convert_cli(paths, out, "--dataset-size", "40", *flags)
        assert r.returncode == 0, r.stderr
        assert all(t == want for t in stored_types(out).values()), flags
        check_values(out, paths, adatas)


def test_an_explicit_type_that_cannot_hold_a_value_is_refused(tmp_path):
    adatas = [make_counts(70, 40, seed=7), make_counts(50, 40, seed=8, special=300)]
    paths = write_inputs(tmp_path, adatas)
    out = tmp_path / "o.zarr"
    r = convert_cli(paths, out, "--data-dtype", "uint8")
    assert r.returncode == 1
    assert paths[1] in r.stderr and "300" in r.stderr and "uint8" in r.stderr, r.stderr
    row = int(np.argwhere(adatas[1].X.toarray() == 300)[0][0])
    assert f"row {row}:" in r.stderr  # the cell make_counts put it in
    assert not (out / "zbatch-manifest.json").exists() and not list(out.glob("dataset_*"))
    # fractional values do not fit uint16 either; the Python call raises the same error
    (tmp_path / "f").mkdir()
    frac = write_inputs(tmp_path / "f", [make_counts(30, 40, seed=9, special=0.5)])
    with pytest.raises(Exception, match=r"in0\.h5ad.*0\.5.*uint16"):
        zbatch_api().convert(frac, tmp_path / "p.zarr", data_dtype=np.uint16, progress=False)
    with pytest.raises(ValueError, match="data_dtype"):
        zbatch_api().convert(frac, tmp_path / "q.zarr", data_dtype="int8", progress=False)


def test_many_genes_keep_int32_indices(tmp_path):
    """Past 65,535 genes the default is int32 (anndata's narrow rule would give uint32)."""
    n_genes = 70000
    rng = np.random.default_rng(10)
    X = sp.random(30, n_genes, density=0.002, format="csr", dtype=np.float32, random_state=rng)
    X.data[:] = rng.integers(1, 9, X.nnz)
    X = X.tolil()
    X[3, n_genes - 1] = 5  # the last column id is used
    a = ad.AnnData(X=X.tocsr(), var=pd.DataFrame(index=[f"g{i}" for i in range(n_genes)]))
    paths = write_inputs(tmp_path, [a])
    for flags, idx in (((), "int32"), (("--index-dtype", "narrow"), "uint32")):
        out = tmp_path / f"o{idx}.zarr"
        r = convert_cli(paths, out, *flags)
        assert r.returncode == 0, r.stderr
        assert stored_types(out)["dataset_0"] == {"X/data": "uint8", "X/indices": idx}
        check_values(out, paths, [a])


@pytest.fixture(scope="module")
def large_value_inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("narrow")
    adatas = [make_counts(3000, 300, seed=11), make_counts(2500, 300, seed=12, special=300)]
    return write_inputs(d, adatas), adatas


ARGS = ["--dataset-size", "700", "--memory", "64M", "--chunk", "512"]


def test_byte_identical_across_threads_restart_and_dask(large_value_inputs, tmp_path):
    """Threads 1 and 2, a restart after the scatter phase (the choice comes from what the
    scatter tasks stored, not from the process that ran them), a kill during the gathers, and a
    Dask cluster of two processes: the same bytes, uint16 everywhere."""
    paths, adatas = large_value_inputs
    ref = tmp_path / "ref.zarr"
    assert convert_cli(paths, ref, *ARGS, "--threads", "1").returncode == 0
    want = tree_bytes(ref)
    assert json.loads((ref / "zbatch-manifest.json").read_text())["dtypes"] == \
        {"X/data": "uint16", "X/indices": "uint16"}
    check_values(ref, paths, adatas)

    two = tmp_path / "two.zarr"
    assert convert_cli(paths, two, *ARGS, "--threads", "2").returncode == 0
    assert tree_bytes(two) == want

    # plan, prepare and scatter here; then a new process gathers and finishes
    zb = zbatch_api()
    resumed = tmp_path / "resumed.zarr"
    opts = {"dataset_size": 700, "memory_bytes": 64 << 20, "x_chunk": 512}
    plan = zb._zbatch.convert_plan(paths, str(resumed), opts)
    for phase in (0, 1):
        for i in range(plan["tasks"][phase]):
            zb._zbatch.convert_task(str(resumed), phase, i, 1, 64 << 20)
    assert not list(resumed.glob("dataset_*"))
    r = convert_cli(paths, resumed, *ARGS, "--threads", "2")
    assert r.returncode == 0, r.stderr
    assert tree_bytes(resumed) == want

    # killed once the gathers started (every scatter file written), then run again
    killed = tmp_path / "killed.zarr"
    proc = subprocess.Popen([str(CLI), "convert", *paths, "-o", str(killed), "--quiet", *ARGS,
                             "--threads", "1"], stdout=subprocess.DEVNULL)
    while proc.poll() is None and not (killed / ".zbatch-convert" / "gather").exists():
        time.sleep(0.001)
    proc.kill()
    proc.wait()
    assert convert_cli(paths, killed, *ARGS).returncode == 0
    assert tree_bytes(killed) == want

    from dask.distributed import Client, LocalCluster
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        manifest = zb.convert(paths, tmp_path / "dask.zarr", dataset_size=700, memory="64M",
                              chunk=512, progress=False, client=client)
    assert tree_bytes(tmp_path / "dask.zarr") == want
    assert manifest["dtypes"] == {"X/data": "uint16", "X/indices": "uint16"}


def test_restart_with_another_data_dtype_is_refused(large_value_inputs, tmp_path):
    paths, _ = large_value_inputs
    out = tmp_path / "x.zarr"
    assert convert_cli(paths, out, "--dataset-size", "4000").returncode == 0
    r = convert_cli(paths, out, "--dataset-size", "4000", "--data-dtype", "keep")
    assert r.returncode == 1 and "data_dtype" in r.stderr, r.stderr
    r = convert_cli(paths, out, "--dataset-size", "4000", "--index-dtype", "int32")
    assert r.returncode == 1 and "index_dtype" in r.stderr, r.stderr
