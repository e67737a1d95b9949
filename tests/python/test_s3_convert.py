"""zbatch convert (AnnData inputs into a pre-shuffled collection) with an s3:// output, on moto's
server with SigV4 enforced (tests/python/remote_servers.py; conftest's moto_s3).

Oracles: the same conversion into a local directory (deterministic: every object must equal
its file byte for byte), anndata reading the datasets through zarr-python over s3fs, and
zbatch's collection reader over S3 against its local read.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import anndata as ad
import numpy as np
import pytest
import zarr

import zbatch
from conftest import CLI
from test_convert_collection import ALL_GENES, make_adata, tree_bytes

ARGS = ["--dataset-size", "300", "--memory", "64M", "--chunk", "512", "--threads", "2"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("s3conv_inputs")
    a0 = make_adata(0, 700, ALL_GENES[:30], ["B", "T", "NK"], seed=1)
    a1 = make_adata(1, 500, ALL_GENES[10:40], ["T", "mono"], seed=2)
    p0, p1 = d / "a.h5ad", d / "b.zarr"
    a0.write_h5ad(p0)
    a1.write_zarr(p1)
    return [str(p0), str(p1)]


@pytest.fixture(scope="module")
def reference(inputs, tmp_path_factory):
    """The local conversion every S3 one must equal."""
    out = tmp_path_factory.mktemp("s3conv_ref") / "ref.zarr"
    r = subprocess.run([str(CLI), "convert", *inputs, "-o", str(out), "--quiet", *ARGS],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


def _env(moto_s3, tmpdir, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=moto_s3.access_key, AWS_SECRET_ACCESS_KEY=moto_s3.secret_key,
               AWS_ENDPOINT_URL=moto_s3.endpoint_url, AWS_REGION="us-east-1",
               TMPDIR=str(tmpdir))
    env.update(extra)
    return env


def _objects(client, bucket, prefix):
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                 Prefix=prefix + "/"):
        for o in page.get("Contents", []):
            out[o["Key"][len(prefix) + 1:]] = client.get_object(
                Bucket=bucket, Key=o["Key"])["Body"].read()
    return out


def _same_objects(client, bucket, prefix, local: Path):
    got, want = _objects(client, bucket, prefix), tree_bytes(local)
    assert sorted(got) == sorted(want)
    assert [k for k in want if got[k] != want[k]] == []


def _convert(inputs, url, env, *extra):
    return subprocess.run([str(CLI), "convert", *inputs, "-o", url, "--quiet", *ARGS, *extra],
                          capture_output=True, text=True, timeout=300, env=env)


def test_cli_convert_to_s3_equals_the_local_convert(inputs, reference, moto_s3, tmp_path):
    """Every object equals the local file; anndata over s3fs reads each dataset as the local
    one; zbatch over S3 reads the collection as locally; the local work directory is gone."""
    client = moto_s3.client()
    client.create_bucket(Bucket="conv")
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    r = _convert(inputs, "s3://conv/atlas/c.zarr", _env(moto_s3, tmpdir))
    assert r.returncode == 0, r.stderr
    assert "stored X/data uint8" in r.stdout  # the manifest, read back from the bucket
    _same_objects(client, "conv", "atlas/c.zarr", reference)
    assert list(tmpdir.iterdir()) == []  # the work directory was removed at the end
    so = {"key": moto_s3.access_key, "secret": moto_s3.secret_key,
          "endpoint_url": moto_s3.endpoint_url}
    g = zarr.open_group("s3://conv/atlas/c.zarr", mode="r", storage_options=so)
    assert g.attrs["encoding-type"] == "annbatch-preshuffled"
    names = sorted((n for n in g.group_keys() if n.startswith("dataset_")),
                   key=lambda s: int(s.split("_")[1]))
    assert names == [f"dataset_{d}" for d in range(4)]
    for n in names:
        got = ad.io.read_elem(g[n])
        want = ad.read_zarr(reference / n)
        assert (got.X != want.X).nnz == 0 and got.X.dtype == want.X.dtype
        assert got.obs.equals(want.obs) and list(got.var_names) == list(want.var_names)
    ds = zbatch.open("s3://conv/atlas/c.zarr", storage_options=moto_s3.storage_options())
    local = zbatch.open(str(reference))
    ids = list(np.random.default_rng(0).permutation(len(local))[:300])
    a, b = ds.read_many(ids), local.read_many(ids)
    assert (a["X"] != b["X"]).nnz == 0
    np.testing.assert_array_equal(a["dataset"], b["dataset"])
    # run again: a finished collection is verified against the bytes in the bucket and kept
    r = _convert(inputs, "s3://conv/atlas/c.zarr", _env(moto_s3, tmpdir))
    assert r.returncode == 0, r.stderr
    # an object changed in the bucket is caught, naming the dataset
    key = next(k for k in sorted(_objects(client, "conv", "atlas/c.zarr"))
               if k.startswith("dataset_2/X/data/c/"))
    body = bytearray(client.get_object(Bucket="conv", Key=f"atlas/c.zarr/{key}")["Body"].read())
    body[len(body) // 2] ^= 0xFF
    client.put_object(Bucket="conv", Key=f"atlas/c.zarr/{key}", Body=bytes(body))
    r = _convert(inputs, "s3://conv/atlas/c.zarr", _env(moto_s3, tmpdir))
    assert r.returncode == 1 and "checksum mismatch" in r.stderr, r.stderr
    assert "s3://conv/atlas/c.zarr/dataset_2" in r.stderr


def test_python_convert_to_s3(inputs, reference, moto_s3, tmp_path):
    client = moto_s3.client()
    client.create_bucket(Bucket="pyconv")
    work = tmp_path / "work"
    manifest = zbatch.convert(inputs, "s3://pyconv/c.zarr", dataset_size=300, memory="64M",
                              chunk=512, num_threads=2, progress=False, work_dir=work,
                              storage_options=moto_s3.storage_options())
    assert manifest == json.loads((reference / "zbatch-manifest.json").read_text())
    _same_objects(client, "pyconv", "c.zarr", reference)
    assert not work.exists()
    with pytest.raises(ValueError, match="local outputs only"):
        zbatch.convert(inputs, "s3://pyconv/d.zarr", client=object(),
                       storage_options=moto_s3.storage_options())


def test_s3_output_must_be_empty_and_credentials_right(inputs, moto_s3, tmp_path):
    client = moto_s3.client()
    client.create_bucket(Bucket="busy")
    client.put_object(Bucket="busy", Key="c.zarr/something", Body=b"x")
    r = _convert(inputs, "s3://busy/c.zarr", _env(moto_s3, tmp_path))
    assert r.returncode == 1 and "not empty" in r.stderr and "s3://busy/c.zarr" in r.stderr
    wrong = "WrongSecret0123456789abcdefghij"
    r = _convert(inputs, "s3://busy/d.zarr", _env(moto_s3, tmp_path, AWS_SECRET_ACCESS_KEY=wrong))
    assert r.returncode == 1 and "403" in r.stderr and wrong not in r.stderr, r.stderr
    r = _convert(inputs, "http://127.0.0.1:9/c.zarr", _env(moto_s3, tmp_path))
    assert r.returncode == 1 and "read-only" in r.stderr, r.stderr


def test_killed_and_restarted_into_s3(inputs, reference, moto_s3, tmp_path):
    """kill -9 during the gather phase (some datasets complete in the bucket): nothing there
    opens as a collection; the restart skips the datasets already complete (their objects are
    not written again) and the result equals the local conversion byte for byte."""
    client = moto_s3.client()
    client.create_bucket(Bucket="killed")
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = _env(moto_s3, tmpdir)
    url = "s3://killed/c.zarr"
    cmd = [str(CLI), "convert", *inputs, "-o", url, "--quiet", *ARGS, "--threads", "1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    gather = None
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        works = list(tmpdir.glob("zbatch-convert-*"))
        gather = works[0] / "gather" if works else None
        if gather is not None and gather.exists() and \
                len([p for p in gather.iterdir() if p.suffix == ".json"]) >= 1:
            break
        time.sleep(0.002)
    assert proc.poll() is None, "the conversion ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = sorted(p.stem for p in gather.iterdir() if p.suffix == ".json")
    assert done and len(done) < 4
    keys = _objects(client, "killed", "c.zarr")
    assert ".zbatch-incomplete" in keys and "zarr.json" not in keys
    assert "zbatch-manifest.json" not in keys
    with pytest.raises(zbatch.ZbatchError):
        zbatch.open(url, storage_options=moto_s3.storage_options())
    first = done[0].replace("d", "dataset_")
    before = client.head_object(Bucket="killed", Key=f"c.zarr/{first}/zarr.json")
    time.sleep(1.1)  # S3's LastModified has whole seconds
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    after = client.head_object(Bucket="killed", Key=f"c.zarr/{first}/zarr.json")
    assert after["LastModified"] == before["LastModified"]  # skipped, not rewritten
    _same_objects(client, "killed", "c.zarr", reference)
    assert list(tmpdir.iterdir()) == []


def test_local_output_with_a_work_dir_elsewhere(inputs, reference, tmp_path):
    """--work-dir moves the plan and scratch out of a local output too: same bytes, nothing of
    the work left in either place; a Dask client with work_dir is refused."""
    out, work = tmp_path / "o.zarr", tmp_path / "scratch" / "w"
    r = subprocess.run([str(CLI), "convert", *inputs, "-o", str(out), "--quiet", *ARGS,
                        "--work-dir", str(work)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    want, got = tree_bytes(reference), tree_bytes(out)
    assert sorted(got) == sorted(want) and [k for k in want if got[k] != want[k]] == []
    assert not work.exists() and not (out / ".zbatch-convert").exists()
    with pytest.raises(ValueError, match="work_dir"):
        zbatch.convert(inputs, str(tmp_path / "d.zarr"), client=object(), work_dir=work)


def test_failed_put_mid_convert_then_rerun(inputs, reference, moto_s3, fault_proxy, tmp_path):
    """Every PUT into dataset_1's X fails (500, no retries): the conversion fails naming the
    object and status; nothing in the bucket opens as the collection (no root zarr.json, the
    marker present) nor as dataset_1; run again without the fault, it finishes identical to the
    local conversion."""
    client = moto_s3.client()
    client.create_bucket(Bucket="fault")
    proxy = fault_proxy(moto_s3.endpoint_url, rates={"500": 1.0},
                        path_pattern=r"^/fault/c\.zarr/dataset_1/X/")
    work = tmp_path / "work"
    kw = dict(dataset_size=300, memory="64M", chunk=512, num_threads=2, progress=False,
              work_dir=work)
    with pytest.raises(zbatch.ZbatchError) as e:
        zbatch.convert(inputs, "s3://fault/c.zarr",
                       storage_options=dict(moto_s3.storage_options(proxy.url), max_retries=0),
                       **kw)
    msg = str(e.value)
    assert "HTTP 500" in msg and "dataset_1/X/" in msg, msg
    keys = _objects(client, "fault", "c.zarr")
    assert ".zbatch-incomplete" in keys and "zarr.json" not in keys
    assert "dataset_1/zarr.json" not in keys and "zbatch-manifest.json" not in keys
    so = moto_s3.storage_options()
    with pytest.raises(zbatch.ZbatchError):
        zbatch.open("s3://fault/c.zarr", storage_options=so)
    manifest = zbatch.convert(inputs, "s3://fault/c.zarr", storage_options=so, **kw)
    assert manifest == json.loads((reference / "zbatch-manifest.json").read_text())
    _same_objects(client, "fault", "c.zarr", reference)


def test_zarr_v2_collection_into_s3_equals_the_local_one(inputs, moto_s3, tmp_path):
    """The root's consolidated metadata is built from each dataset's own when the output is a
    bucket: the v2 documents (.zarray, .zattrs, .zmetadata) must still equal the local ones."""
    client = moto_s3.client()
    client.create_bucket(Bucket="conv2")
    local = tmp_path / "v2.zarr"
    r = _convert(inputs, str(local), _env(moto_s3, tmp_path), "--format", "v2")
    assert r.returncode == 0, r.stderr
    r = _convert(inputs, "s3://conv2/v2.zarr", _env(moto_s3, tmp_path), "--format", "v2")
    assert r.returncode == 0, r.stderr
    _same_objects(client, "conv2", "v2.zarr", local)
    assert (local / ".zmetadata").exists()
