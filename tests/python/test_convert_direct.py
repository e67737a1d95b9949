"""The direct path of zbatch convert: when every input matrix is CSR with its data and indices
stored contiguous and uncompressed (anndata's default .h5ad), the gather reads each cell's row
straight from its input instead of through the scatter's scratch files. Forced off with
ZBATCH_CONVERT_SCRATCH=1, the scratch path must give the same bytes; the oracle for the values
is anndata (check_cells compares every output row with its source row gene by gene).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anndata as ad
import h5py
import numpy as np
import pytest
import scipy.sparse as sp

from conftest import CLI, zbatch_api
from test_convert_collection import ALL_GENES, check_cells, make_adata, tree_bytes


@pytest.fixture(scope="module")
def h5ads(tmp_path_factory):
    """Three .h5ad inputs with different gene sets (a subset, a permutation: a gene map that
    reorders, a reversed one) and a layer whose type differs between inputs (float64 with
    fractions in one, float32 counts in the others: promoted to float64)."""
    d = tmp_path_factory.mktemp("direct")
    rng = np.random.default_rng(4)
    sets = [ALL_GENES[:30], list(rng.permutation(ALL_GENES[10:40])), ALL_GENES[5:35][::-1]]
    out = []
    for k, (n, genes) in enumerate(zip([230, 170, 95], sets)):
        a = make_adata(k, n, genes, ["B", "T", "NK"][: 2 + k % 2], seed=40 + k)
        layer = a.X.copy()
        layer.data = (layer.data / 3).astype(np.float64) if k == 1 else layer.data * 2
        a.layers["norm"] = layer
        if k == 2:  # empty rows
            X = a.X.tolil()
            X[::7] = 0
            a.X = X.tocsr()
            a.X.eliminate_zeros()
        p = d / f"in{k}.h5ad"
        a.write_h5ad(p)
        if k == 0:  # chunks of 7 elements: rows straddle chunks, read piece by piece
            with h5py.File(p, "r+") as f:
                for name in ("data", "indices"):
                    values = f["X"][name][:]
                    del f["X"][name]
                    f["X"].create_dataset(name, data=values, chunks=(7,))
        out.append((str(p), a))
    return out


def convert(paths, out, *extra, scratch=False, pread=False):
    """The command; pread: ZBATCH_MMAP_BYTES=0, the direct gather reads rows with pread instead
    of from mappings of the inputs."""
    env = dict(os.environ)
    env.pop("ZBATCH_CONVERT_SCRATCH", None)
    env.pop("ZBATCH_MMAP_BYTES", None)
    if scratch:
        env["ZBATCH_CONVERT_SCRATCH"] = "1"
    if pread:
        env["ZBATCH_MMAP_BYTES"] = "0"
    return subprocess.run([str(CLI), "convert", *paths, "-o", str(out), "--quiet", *extra],
                          capture_output=True, text=True, timeout=300, env=env)


def planned_direct(paths, out, scratch=False, **opts):
    """The plan's choice (plan.json "direct") and the scatter files' total size, from the
    Python API's phases (scratch: the option the package passes for ZBATCH_CONVERT_SCRATCH)."""
    z = zbatch_api()
    from zbatch import _zbatch
    o = {"dataset_size": 200, "var_join": "outer", "genes": None, "obs": None, "x": "X",
         "layers": [], "memory_bytes": 64 << 20, "seed": 0, "shuffle": True,
         "zarr_format": 3, "codec": None, "x_chunk": None, "x_shard": None,
         "num_threads": 1, "data_dtype": "auto", "index_dtype": "auto", "work_dir": None,
         "remote": None, "scratch_path": scratch}
    o.update(opts)
    plan = _zbatch.convert_plan(paths, str(out), o)
    doc = json.loads((Path(out) / ".zbatch-convert" / "plan.json").read_text())
    assert z is not None and plan["tasks"][0] == len(paths)
    return doc["direct"]


@pytest.mark.parametrize("extra", [
    [],
    ["--var-join", "inner", "--data-dtype", "keep", "--layers", "norm"],
    ["--data-dtype", "uint16", "--threads", "3", "--memory", "64M"],
    ["--layers", "norm", "--dataset-size", "120", "--threads", "2"],
], ids=["outer-auto", "inner-keep-layer", "uint16", "layer-small-datasets"])
def test_direct_and_scratch_give_the_same_bytes(h5ads, tmp_path, extra):
    paths = [p for p, _ in h5ads]
    direct, scratch = tmp_path / "direct.zarr", tmp_path / "scratch.zarr"
    r = convert(paths, direct, *extra)
    assert r.returncode == 0, r.stderr
    r = convert(paths, scratch, *extra, scratch=True)
    assert r.returncode == 0, r.stderr
    ta, tb = tree_bytes(direct), tree_bytes(scratch)
    assert ta.keys() == tb.keys()
    assert [k for k in ta if ta[k] != tb[k]] == []
    inner = "inner" in extra
    genes = [g for g in ALL_GENES if all(g in a.var_names for _, a in h5ads)] if inner else \
        sorted({g for _, a in h5ads for g in a.var_names}, key=ALL_GENES.index)
    check_cells(direct, h5ads, genes)
    if "norm" in extra:  # the layer, gene by gene, against anndata's
        names = sorted((p for p in direct.iterdir() if p.name.startswith("dataset_")),
                       key=lambda p: int(p.name.split("_")[1]))
        for ds in names:
            got = ad.read_zarr(ds)
            assert got.layers["norm"].dtype == np.float64
            for i in range(0, got.n_obs, 7):
                k, row = int(got.obs["src_path"].cat.codes.iloc[i]), int(got.obs["src_row"].iloc[i])
                src = h5ads[k][1]
                want = dict(zip(src.var_names, src.layers["norm"][row].toarray()[0]))
                have = got.layers["norm"][i].toarray()[0]
                for g, v in zip(got.var_names, have):
                    assert v == want.get(g, 0.0), (ds.name, i, g)


def test_the_plan_chooses_the_path(h5ads, tmp_path):
    """Contiguous uncompressed h5ad: direct, with scratch files of a few bytes per cell; forced
    off by the variable; a compressed (chunked) X keeps the scratch path."""
    paths = [p for p, _ in h5ads]
    assert planned_direct(paths, tmp_path / "a.zarr") is True
    assert planned_direct(paths, tmp_path / "b.zarr", scratch=True) is False
    gz = tmp_path / "gz.h5ad"
    h5ads[0][1].write_h5ad(gz, compression="gzip")
    assert planned_direct([str(gz), paths[1]], tmp_path / "c.zarr") is False
    # a direct conversion's scatter files hold no matrix values: far smaller than the scratch
    # path's (the obs columns, the same in both, are most of what remains)
    from zbatch import _zbatch

    def scatter_bytes(out):
        for t in range(len(paths)):
            assert _zbatch.convert_task(str(out), 0, t, 1, 64 << 20)
        slices = json.loads((out / ".zbatch-convert" / "plan.json").read_text())["slices"]
        for t in range(len(slices)):
            assert _zbatch.convert_task(str(out), 1, t, 1, 64 << 20)
        return sum(f.stat().st_size for f in (out / ".zbatch-convert" / "scatter").iterdir())

    direct, scratch = scatter_bytes(tmp_path / "a.zarr"), scatter_bytes(tmp_path / "b.zarr")
    assert direct < scratch * 0.7, (direct, scratch)


def rewrite(src, dst, chunks=None, userblock=0):
    """dst: src's objects copied by h5py into a new file, X/data and X/indices rewritten with
    `chunks` (unfiltered) when given; `userblock` bytes before HDF5's own."""
    with h5py.File(src, "r") as f, h5py.File(dst, "w", userblock_size=userblock or None) as g:
        g.attrs.update(f.attrs)
        for k in f:
            f.copy(k, g)
        if chunks:
            for name in ("data", "indices"):
                values = g["X"][name][:]
                del g["X"][name]
                g["X"].create_dataset(name, data=values, chunks=(chunks,))
    return str(dst)


def test_many_chunks_and_a_user_block_take_the_direct_path(h5ads, tmp_path):
    """Inputs whose chunk tables are long (more than 16,384 chunks: libhdf5 1.10 alone would
    find them in quadratic time), or whose file starts with a user block (chunk offsets then
    differ from libhdf5 1.10's own addresses), are read directly: the plan says so, and the
    bytes equal the scratch path's and anndata's values."""
    a = make_adata(0, 2000, ALL_GENES[:40], ["B", "T"], seed=9)
    a.X = sp.random(2000, 40, density=0.5, format="csr", dtype=np.float32, random_state=3)
    a.X.data = np.ceil(a.X.data * 20).astype(np.float32)
    base = tmp_path / "base.h5ad"
    a.write_h5ad(base)
    assert a.X.nnz > 2 * 16384
    many = rewrite(base, tmp_path / "many.h5ad", chunks=2)
    with h5py.File(many, "r") as f:
        assert f["X/data"].id.get_num_chunks() > 16384
    block = rewrite(base, tmp_path / "block.h5ad", chunks=100, userblock=512)
    with h5py.File(block, "r") as f:
        assert f.userblock_size == 512
    sources = [(many, a), (block, a), h5ads[1]]
    paths = [p for p, _ in sources]
    assert planned_direct(paths, tmp_path / "plan.zarr") is True
    direct, scratch = tmp_path / "direct.zarr", tmp_path / "scratch.zarr"
    for out, sc in ((direct, False), (scratch, True)):
        r = convert(paths, out, "--dataset-size", "1000", "--threads", "2", scratch=sc)
        assert r.returncode == 0, r.stderr
    ta, tb = tree_bytes(direct), tree_bytes(scratch)
    assert ta.keys() == tb.keys() and [k for k in ta if ta[k] != tb[k]] == []
    genes = sorted({g for _, x in sources for g in x.var_names}, key=ALL_GENES.index)
    check_cells(direct, sources, genes)


def test_a_bad_column_id_is_named_on_the_direct_path(h5ads, tmp_path):
    """An index beyond the input's genes, written into the file after anndata: the conversion
    fails naming the file and the element, on both paths, and leaves no dataset."""
    src = tmp_path / "bad.h5ad"
    h5ads[0][1].write_h5ad(src)
    with h5py.File(src, "r+") as f:
        f["X/indices"][7] = 1000
    for scratch in (False, True):
        out = tmp_path / f"out{int(scratch)}.zarr"
        r = convert([str(src)], out, scratch=scratch)
        assert r.returncode != 0
        assert str(src) in r.stderr and "X/indices" in r.stderr and "outside" in r.stderr, \
            r.stderr
        assert scratch or "element 7: index 1000" in r.stderr, r.stderr
        assert not list(out.glob("dataset_*/zarr.json"))


def test_dask_workers_read_the_inputs_directly(h5ads, tmp_path):
    """Gather tasks on Dask worker processes read the rows from the inputs themselves: the same
    bytes as the scratch path on the command's own threads."""
    from dask.distributed import Client, LocalCluster
    zb = zbatch_api()
    paths = [p for p, _ in h5ads]
    ref = tmp_path / "ref.zarr"
    assert convert(paths, ref, "--dataset-size", "100", "--memory", "64M",
                   scratch=True).returncode == 0
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        zb.convert(paths, tmp_path / "dask.zarr", dataset_size=100, memory="64M",
                   progress=False, client=client)
    ta, tb = tree_bytes(ref), tree_bytes(tmp_path / "dask.zarr")
    assert ta.keys() == tb.keys() and [k for k in ta if ta[k] != tb[k]] == []


def test_an_explicit_dtype_that_cannot_hold_a_value_fails_alike(h5ads, tmp_path):
    """--data-dtype uint8 on a layer of fractions: both paths refuse it with the same message
    (input, matrix, row, value) and leave no dataset."""
    msgs = []
    for scratch in (False, True):
        out = tmp_path / f"o{int(scratch)}.zarr"
        r = convert([h5ads[1][0]], out, "--layers", "norm", "--data-dtype", "uint8",
                    "--threads", "1", scratch=scratch)
        assert r.returncode != 0
        assert "layers/norm" in r.stderr and "cannot hold it exactly" in r.stderr, r.stderr
        assert not list(out.glob("dataset_*/zarr.json"))
        msgs.append(r.stderr[r.stderr.index(h5ads[1][0]):].splitlines()[0])
    assert msgs[0] == msgs[1]
    # the row it names holds that value (anndata's reading)
    row = int(msgs[0].split(", row ")[1].split(":")[0])
    value = float(msgs[0].split("the value ")[1].split(" ")[0])
    assert value in h5ads[1][1].layers["norm"][row].data



def test_a_csc_input_is_read_from_its_transposed_file(h5ads, tmp_path):
    """A CSC X is transposed by prepare into a CSR file, which the direct gather reads like an
    h5ad: the plan stays direct, and the bytes equal the scratch path's."""
    csc = tmp_path / "csc.h5ad"
    a = h5ads[1][1].copy()
    a.X = a.X.tocsc()
    a.layers.clear()
    a.write_h5ad(csc)
    paths = [h5ads[0][0], str(csc)]
    assert planned_direct(paths, tmp_path / "plan.zarr") is True
    direct, scratch = tmp_path / "d.zarr", tmp_path / "s.zarr"
    assert convert(paths, direct, "--dataset-size", "150").returncode == 0
    assert convert(paths, scratch, "--dataset-size", "150", scratch=True).returncode == 0
    ta, tb = tree_bytes(direct), tree_bytes(scratch)
    assert ta.keys() == tb.keys() and [k for k in ta if ta[k] != tb[k]] == []
    genes = sorted({g for p in (h5ads[0][1], a) for g in p.var_names}, key=ALL_GENES.index)
    check_cells(direct, [(h5ads[0][0], h5ads[0][1]), (str(csc), a)], genes)


# ---- the stored-type statistics folded into the prepare pass --------------------------------


def run_prepare(paths, out, **opts):
    """Plans a conversion and runs its prepare tasks only (the Python API's phases); returns
    each input's prepare record (prepare/i<k>.json)."""
    from zbatch import _zbatch
    planned_direct(paths, out, **opts)
    for k in range(len(paths)):
        assert _zbatch.convert_task(str(out), 0, k, 1, 64 << 20)
    work = Path(out) / ".zbatch-convert" / "prepare"
    return [json.loads((work / f"i{k}.json").read_text()) for k in range(len(paths))]


def value_stats(values):
    """[flags, max] as the prepare task records them, from numpy (the oracle): flags 1 when
    there are values, | 2 when one is not an integer in [0, 65535]; max the largest value when
    none is."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return [0, 0]
    wide = bool(np.any((v < 0) | (v > 65535) | (v != np.floor(v)) | np.isnan(v)))
    ints = v[(v >= 0) & (v <= 65535) & (v == np.floor(v))]
    return [1 | (2 if wide else 0), int(ints.max()) if ints.size else 0]


@pytest.mark.parametrize("special,expect", [(None, "uint8"), (300, "uint16"), (2.5, "float32")])
def test_prepare_folds_the_values_the_scatter_read_before(tmp_path, special, expect):
    """On the direct path with every gene kept, the prepare task's CRC-64 pass folds X/data's
    values (numpy's view of them is the oracle), the scatter reads none, and the stored type and
    every byte equal the scratch path's, whose scatter folds them from the rows it reads."""
    from test_convert_narrow import make_counts, stored_types, write_inputs
    adatas = [make_counts(120, 40, seed=1), make_counts(90, 40, seed=2, special=special)]
    paths = write_inputs(tmp_path, adatas)
    records = run_prepare(paths, tmp_path / "plan.zarr")
    for rec, a in zip(records, adatas):
        assert rec["values"] == [value_stats(a.X.data)], rec
    # the same input with X in chunks of 7 elements (extents of every size, merged)
    chunked = tmp_path / "chunked.h5ad"
    adatas[1].write_h5ad(chunked)
    with h5py.File(chunked, "r+") as f:
        values = f["X/data"][:]
        del f["X/data"]
        f["X"].create_dataset("data", data=values, chunks=(7,))
    rec = run_prepare([str(chunked)], tmp_path / "plan2.zarr")[0]
    assert rec["values"] == [value_stats(adatas[1].X.data)]
    outs = {}
    for scratch in (False, True):
        outs[scratch] = tmp_path / f"out{int(scratch)}.zarr"
        r = convert(paths + [str(chunked)], outs[scratch], "--dataset-size", "100",
                    scratch=scratch)
        assert r.returncode == 0, r.stderr
        assert all(t["X/data"] == expect for t in stored_types(outs[scratch]).values())
    ta, tb = tree_bytes(outs[False]), tree_bytes(outs[True])
    assert ta.keys() == tb.keys() and [k for k in ta if ta[k] != tb[k]] == []


def test_a_gene_subset_keeps_the_scatters_fold(tmp_path):
    """A value of 300 in a gene the output drops must not widen the stored type: the prepare
    task folds nothing for that input (its map drops a gene), the scatter folds the kept values,
    and the result is uint8 with the scratch path's bytes. Keep and an explicit uint16 fold
    nothing in prepare either."""
    from test_convert_narrow import make_counts, stored_types, write_inputs
    a = make_counts(90, 40, seed=2, special=300)
    dropped = int(a.X.indices[a.X.nnz // 2])
    assert a.X.data[a.X.nnz // 2] == 300
    paths = write_inputs(tmp_path, [make_counts(120, 40, seed=1), a])
    genes = tmp_path / "genes.txt"
    genes.write_text("".join(f"g{i}\n" for i in range(40) if i != dropped))
    rec = run_prepare(paths, tmp_path / "plan.zarr", genes=str(genes))
    assert [r["values"] for r in rec] == [[None], [None]]
    for choice in ("keep", "uint16"):
        rec = run_prepare(paths, tmp_path / f"plan-{choice}.zarr", data_dtype=choice)
        assert [r["values"] for r in rec] == [[None], [None]]
    outs = {}
    for scratch in (False, True):
        outs[scratch] = tmp_path / f"out{int(scratch)}.zarr"
        r = convert(paths, outs[scratch], "--genes", str(genes), "--dataset-size", "100",
                    scratch=scratch)
        assert r.returncode == 0, r.stderr
        assert all(t["X/data"] == "uint8" for t in stored_types(outs[scratch]).values())
    ta, tb = tree_bytes(outs[False]), tree_bytes(outs[True])
    assert ta.keys() == tb.keys() and [k for k in ta if ta[k] != tb[k]] == []


def test_a_prepare_record_without_values_is_folded_by_the_scatter(tmp_path):
    """A work directory whose prepare records hold no values (an earlier zbatch's, or a record
    rewritten so) restarts into the same bytes: the scatter folds the values itself. And a
    conversion killed after prepare restarts into the bytes of an uninterrupted one."""
    from test_convert_narrow import make_counts, stored_types, write_inputs
    adatas = [make_counts(120, 40, seed=1), make_counts(90, 40, seed=2, special=300)]
    paths = write_inputs(tmp_path, adatas)
    ref = tmp_path / "ref.zarr"
    assert convert(paths, ref, "--dataset-size", "100").returncode == 0
    for strip in (False, True):
        out = tmp_path / f"out{int(strip)}.zarr"
        run_prepare(paths, out, dataset_size=100)
        if strip:
            for p in (out / ".zbatch-convert" / "prepare").glob("i*.json"):
                rec = json.loads(p.read_text())
                del rec["values"]
                p.write_text(json.dumps(rec))
        r = convert(paths, out, "--dataset-size", "100")
        assert r.returncode == 0, r.stderr
        assert all(t["X/data"] == "uint16" for t in stored_types(out).values())
        ta, tb = tree_bytes(ref), tree_bytes(out)
        assert ta.keys() == tb.keys() and [k for k in ta if ta[k] != tb[k]] == []


# ---- rows from mappings of the inputs, or with pread ----------------------------------------


@pytest.mark.parametrize("special,expect,subset", [
    (None, "uint8", False), (300, "uint16", False), (2.5, "float32", False),
    (2.5, "float32", True),
], ids=["uint8", "uint16", "float32", "float32-gene-subset"])
def test_mapped_and_pread_rows_give_the_same_bytes(tmp_path, special, expect, subset):
    """The direct gather takes rows from read-only mappings of the inputs by default and with
    pread under ZBATCH_MMAP_BYTES=0: the same bytes, and the scratch path's (which reads no
    input rows in the gather); anndata's reading of every row is the oracle for the values. One
    input has X in chunks of 7 elements, so rows straddle chunks; a gene subset drops and
    reorders columns (the remapping path instead of the identity copy)."""
    from test_convert_narrow import check_values, make_counts, stored_types, write_inputs
    adatas = [make_counts(150, 40, seed=5), make_counts(110, 40, seed=6, special=special),
              make_counts(80, 40, seed=7)]
    paths = write_inputs(tmp_path, adatas)
    with h5py.File(paths[2], "r+") as f:
        for name in ("data", "indices"):
            values = f["X"][name][:]
            del f["X"][name]
            f["X"].create_dataset(name, data=values, chunks=(7,))
    extra = ["--dataset-size", "128", "--threads", "2"]
    if subset:
        keep = [f"g{i}" for i in range(40) if i % 3][::-1]  # every gene the map keeps: reordered
        genes = tmp_path / "genes.txt"
        genes.write_text("".join(g + "\n" for g in keep))
        extra += ["--genes", str(genes)]
    outs = {}
    for mode in ("map", "pread", "scratch"):
        outs[mode] = tmp_path / f"{mode}.zarr"
        r = convert(paths, outs[mode], *extra, pread=mode == "pread", scratch=mode == "scratch")
        assert r.returncode == 0, r.stderr
        assert all(t["X/data"] == expect for t in stored_types(outs[mode]).values())
    assert planned_direct(paths, tmp_path / "plan.zarr") is True
    ref = tree_bytes(outs["map"])
    for mode in ("pread", "scratch"):
        got = tree_bytes(outs[mode])
        assert got.keys() == ref.keys() and [k for k in ref if ref[k] != got[k]] == [], mode
    if subset:
        parts = [ad.read_zarr(p) for p in sorted(outs["map"].glob("dataset_*"))]
        whole = ad.concat(parts, merge="same")
        assert list(whole.var_names) == keep
        for p, a in zip(paths, adatas):
            rows = np.flatnonzero(whole.obs["src_path"].to_numpy() == p)
            want = a[:, keep].X.toarray()[whole.obs["src_row"].to_numpy()[rows]]
            np.testing.assert_array_equal(whole.X.toarray()[rows], want)
    else:
        check_values(outs["map"], paths, adatas)


GATHER_AFTER_CHANGE = """
import sys
from zbatch import _zbatch
try:
    _zbatch.convert_task(sys.argv[1], 2, 0, 1, 64 << 20, sys.argv[2] == "pread")
except Exception as e:
    print(type(e).__name__, e)
    sys.exit(3)
"""


@pytest.mark.parametrize("change", ["truncated", "touched", "replaced"])
@pytest.mark.parametrize("mode", ["map", "pread"])
def test_an_input_changed_before_the_gather_is_an_error(tmp_path, change, mode):
    """An input truncated in place, given a new modification time, or replaced by another file
    of the same size between the scatter and the gather: the gather task fails naming the file
    (with a mapping, a truncated file would otherwise be SIGBUS in the reader), in a process of
    its own as a Dask worker's, and writes no dataset."""
    from zbatch import _zbatch
    from test_convert_narrow import make_counts, write_inputs
    zbatch_api()
    paths = write_inputs(tmp_path, [make_counts(150, 40, seed=5), make_counts(60, 40, seed=6)])
    out = tmp_path / "out.zarr"
    planned_direct(paths, out)
    for t in range(len(paths)):
        assert _zbatch.convert_task(str(out), 0, t, 1, 64 << 20)
    slices = json.loads((out / ".zbatch-convert" / "plan.json").read_text())["slices"]
    for t in range(len(slices)):
        assert _zbatch.convert_task(str(out), 1, t, 1, 64 << 20)
    victim = Path(paths[0])
    st = victim.stat()
    if change == "truncated":  # in place: the inode a mapping would hold
        with open(victim, "r+b") as f:
            f.truncate(st.st_size // 2)
        os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))  # only the size tells
    elif change == "touched":
        os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    else:
        other = tmp_path / "other.h5ad"
        other.write_bytes(victim.read_bytes())
        os.replace(other, victim)
    r = subprocess.run([sys.executable, "-c", GATHER_AFTER_CHANGE, str(out), mode],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    assert str(victim) in r.stdout and "changed since the conversion was planned" in r.stdout, \
        r.stdout
    assert ("its size" if change == "truncated" else "its modification time") in r.stdout
    assert not list(out.glob("dataset_*/zarr.json"))


TRUNCATE_DURING_RUN = """
import os, sys
import zbatch
victim, out = sys.argv[1], sys.argv[2]
def progress(p):
    if p["phase"] == "scatter" and p["tasks_done"] == p["tasks_total"]:
        st = os.stat(victim)
        with open(victim, "r+b") as f:  # in place, while the run holds the file open
            f.truncate(st.st_size // 3)
try:
    zbatch.convert(sys.argv[3:], out, dataset_size=100, memory="64M", progress=progress)
except Exception as e:
    print(type(e).__name__, e)
    sys.exit(3)
"""


@pytest.mark.parametrize("mode", ["map", "pread"])
def test_an_input_truncated_during_the_run_is_an_error(tmp_path, mode):
    """The realistic case for a mapping: one process plans (opening the inputs), scatters and
    gathers; an input truncated in place after the scatter, while the process holds it open, is
    an error naming the file when the gather starts, not SIGBUS, with and without mappings."""
    from test_convert_narrow import make_counts, write_inputs
    paths = write_inputs(tmp_path, [make_counts(150, 40, seed=5), make_counts(60, 40, seed=6)])
    env = dict(os.environ)
    env.pop("ZBATCH_CONVERT_SCRATCH", None)
    env["ZBATCH_MMAP_BYTES"] = "0" if mode == "pread" else str(1 << 30)
    out = tmp_path / "out.zarr"
    r = subprocess.run([sys.executable, "-c", TRUNCATE_DURING_RUN, paths[0], str(out), *paths],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    assert paths[0] in r.stdout and "changed since the conversion was planned (its size" in \
        r.stdout, r.stdout
    assert not list(out.glob("dataset_*/zarr.json"))


def gather_preads(paths, out, mmap_bytes, *extra):
    """pread64 calls of a whole conversion under strace (every thread), with ZBATCH_MMAP_BYTES
    set to mmap_bytes (None: unset); the output's bytes."""
    env = dict(os.environ)
    env.pop("ZBATCH_CONVERT_SCRATCH", None)
    env.pop("ZBATCH_MMAP_BYTES", None)
    if mmap_bytes is not None:
        env["ZBATCH_MMAP_BYTES"] = str(mmap_bytes)
    r = subprocess.run(["strace", "-f", "-c", "-e", "trace=pread64", str(CLI), "convert", *paths,
                        "-o", str(out), "--quiet", "--threads", "2", *extra],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    calls = [int(line.split()[3]) for line in r.stderr.splitlines()
             if line.rstrip().endswith("pread64")]
    return (calls[0] if calls else 0), tree_bytes(out)


def test_inputs_are_mapped_within_the_budget(tmp_path):
    """Which inputs the gather maps: those that fit ZBATCH_MMAP_BYTES (default 1 GiB) and half
    of --memory, in input order; the others are read with pread, two calls per row (indices,
    data). strace's count of pread64 calls tells them apart; every way gives the same bytes."""
    import shutil
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    from test_convert_narrow import make_counts, write_inputs
    adatas = [make_counts(400, 40, seed=5), make_counts(300, 40, seed=6)]
    paths = write_inputs(tmp_path, adatas)
    sizes = [os.path.getsize(p) for p in paths]
    runs = {name: gather_preads(paths, tmp_path / f"{name}.zarr", mmap)
            for name, mmap in [("default", None), ("none", 0), ("first", sizes[0]),
                               ("both", sum(sizes))]}
    ref = runs["none"][1]
    for name, (_, tree) in runs.items():
        assert tree.keys() == ref.keys() and [k for k in ref if ref[k] != tree[k]] == [], name
    n = {name: calls for name, (calls, _) in runs.items()}
    rows = [a.n_obs for a in adatas]
    # without mappings the gather adds two preads per row; mapping an input takes its rows' off
    def off(calls, rows):  # two per row, and a few of libhdf5's own that vary run to run
        return 2 * rows <= n["none"] - calls <= 2 * rows + 8

    assert off(n["both"], sum(rows)), n
    assert n["default"] == n["both"], n
    # in input order, each while it fits: a budget one byte short of the first input maps
    # only the second (the smaller); test_memory_stays_bounded holds the bound by --memory
    # (its input is larger than half of --memory, so it is read with pread)
    assert sizes[1] < sizes[0]
    second, _ = gather_preads(paths, tmp_path / "second.zarr", sizes[0] - 1)
    assert off(second, rows[1]), (n, second)
    assert off(n["first"], rows[0]), n


@pytest.mark.parametrize("compression", [None, "gzip"])
@pytest.mark.parametrize("scratch", [False, True], ids=["direct", "scratch"])
@pytest.mark.parametrize("name", ["data", "indices"])
def test_a_chunk_of_the_matrix_not_stored_is_an_error(tmp_path, compression, scratch, name):
    """X/data or X/indices with a chunk that is not stored (written in part, or a chunk index
    damaged so that libhdf5 does not find it): libhdf5 reads such a chunk as the fill value
    (zeros), which would be a silent wrong answer; convert refuses the input naming the file,
    the array and the chunk, on both paths, unfiltered and deflated (the chunks zbatch reads
    raw and inflates itself)."""
    from test_convert_narrow import make_counts, write_inputs
    a = make_counts(120, 40, seed=3)
    paths = write_inputs(tmp_path, [a])
    with h5py.File(paths[0], "r+") as f:
        values = f["X"][name][:]
        del f["X"][name]
        opts = {"compression": "gzip", "shuffle": True} if compression else {}
        d = f["X"].create_dataset(name, shape=values.shape, dtype=values.dtype, chunks=(16,),
                                  **opts)
        d[:len(values) // 2] = values[:len(values) // 2]   # the chunks past it never written
        assert d.id.get_num_chunks() < -(-len(values) // 16)
    r = convert(paths, tmp_path / "out.zarr", scratch=scratch)
    assert r.returncode == 1, r.stderr
    assert f"{Path(paths[0]).name}: X/{name}: the chunk at element" in r.stderr, r.stderr
    assert "is not stored" in r.stderr, r.stderr
