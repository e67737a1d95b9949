"""Writers to S3 (issue 17): zbatch.write_array and AtomicWriter into s3:// on moto's server
with SigV4 enforced (tests/python/remote_servers.py, conftest's moto_s3 and fault_proxy).

Oracles: the same write into a local directory (the object bytes must be identical, the local
writer being deterministic), zarr-python 3 over s3fs reading the bucket, and zbatch's own reader
over S3 compared with its local read.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr

import zbatch
from zbatch import AtomicWriter


def _objects(client, bucket: str, prefix: str) -> dict[str, bytes]:
    """Every object below prefix/ as {relative key: bytes}."""
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                 Prefix=prefix + "/"):
        for o in page.get("Contents", []):
            body = client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
            out[o["Key"][len(prefix) + 1:]] = body
    return out


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _s3fs_options(moto_s3) -> dict:
    return {"key": moto_s3.access_key, "secret": moto_s3.secret_key,
            "endpoint_url": moto_s3.endpoint_url}


def _bucket(moto_s3, name: str):
    client = moto_s3.client()
    client.create_bucket(Bucket=name)
    return client


# ---- write_array ----------------------------------------------------------------------------------
ARRAYS = [
    # (path, data, keyword arguments)
    ("x", np.arange(1000, dtype=np.float64).reshape(250, 4) * 0.25,
     dict(chunks=16, shards=64, codec="zstd:3")),
    ("g/h/ints", np.arange(-500, 500, dtype=np.int32), dict(chunks=128, codec="blosc:lz4:5:shuffle")),
    ("names", np.array([f"cell-{i}" * (i % 3 + 1) for i in range(300)]), dict(chunks=64)),
]


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_write_array_to_s3_equals_the_local_write(tmp_path, moto_s3, zarr_format):
    """Every object of an S3 write is byte-identical to the file of the same local write, and
    zarr-python over s3fs reads the arrays back."""
    client = _bucket(moto_s3, f"wa{zarr_format}")
    url = f"s3://wa{zarr_format}/deep/a.zarr"
    so = moto_s3.storage_options()
    local = tmp_path / "a.zarr"
    for path, data, kw in ARRAYS:
        if zarr_format == 2:
            kw = {k: v for k, v in kw.items() if k != "shards"}
        zbatch.write_array(url, path, data, zarr_format=zarr_format, storage_options=so, **kw)
        zbatch.write_array(str(local), path, data, zarr_format=zarr_format, **kw)
    want = _files(local)
    got = _objects(client, f"wa{zarr_format}", "deep/a.zarr")
    assert sorted(got) == sorted(want)
    assert all(got[k] == want[k] for k in want), [k for k in want if got[k] != want[k]]
    g = zarr.open_group(f"{url}", mode="r", storage_options=_s3fs_options(moto_s3),
                        zarr_format=zarr_format)
    for path, data, _ in ARRAYS:
        np.testing.assert_array_equal(g[path][...], data)
    assert g["g"].attrs.asdict() == {} and isinstance(g["g/h"], zarr.Group)


def test_write_array_failure_leaves_nothing_that_opens(moto_s3, fault_proxy):
    """A chunk PUT that fails fails the write with the URL and status, and the bucket holds no
    array or group document: neither zarr-python nor zbatch opens anything there."""
    client = _bucket(moto_s3, "wafail")
    proxy = fault_proxy(moto_s3.endpoint_url, rates={"500": 1.0},
                        path_pattern=r"^/wafail/f\.zarr/grp/x/c/3$")
    so = dict(moto_s3.storage_options(proxy.url), max_retries=0)
    with pytest.raises(zbatch.ZbatchError) as e:
        zbatch.write_array("s3://wafail/f.zarr", "grp/x", np.arange(100.0), chunks=10,
                           storage_options=so)
    assert "HTTP 500" in str(e.value) and "grp/x/c/3" in str(e.value)
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="wafail").get("Contents", [])]
    assert keys and not [k for k in keys if k.endswith(("zarr.json", ".zarray", ".zgroup"))], keys
    with pytest.raises(Exception):
        zarr.open_group("s3://wafail/f.zarr", mode="r", storage_options=_s3fs_options(moto_s3))
    # the same write without the fault completes over the debris and reads back
    zbatch.write_array("s3://wafail/f.zarr", "grp/x", np.arange(100.0), chunks=10,
                       storage_options=moto_s3.storage_options())
    g = zarr.open_group("s3://wafail/f.zarr", mode="r", storage_options=_s3fs_options(moto_s3))
    np.testing.assert_array_equal(g["grp/x"][...], np.arange(100.0))


def test_write_array_refuses_http_and_checks_options(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="read-only"):
        zbatch.write_array("https://host/x.zarr", "a", np.arange(3))
    with pytest.raises(ValueError, match="read-only"):
        zbatch.write_anndata("http://host/x.zarr", np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="only"):
        zbatch.write_array(str(tmp_path / "l.zarr"), "a", np.arange(3),
                           storage_options={"anon": True})
    assert list(tmp_path.iterdir()) == []


# ---- AtomicWriter -------------------------------------------------------------------------------
def _atoms(n, seed):
    rng = np.random.default_rng(seed)
    k = 2 * n
    return {"positions": rng.random((n, 3)).astype(np.float32),
            "atomic_numbers": rng.integers(1, 30, n), "energy": float(rng.random()),
            "forces": rng.random((n, 3)).astype(np.float32),
            "neighbor_list": rng.integers(0, n, (k, 2)),
            "shifts": rng.random((k, 3)).astype(np.float32)}


def _all_samples(ds):
    b = ds.read_many(list(range(len(ds))))
    return {k: np.asarray(b[k]) for k in b.keys()}


def test_atomic_writer_to_s3_equals_the_local_store(tmp_path, moto_s3):
    """write, append, delete and add_custom into s3:// leave exactly the objects the same calls
    leave on disk; zbatch over S3 and zarr-python over s3fs read what the local store holds."""
    client = _bucket(moto_s3, "atoms")
    so = moto_s3.storage_options()
    cfg = {"core": {"chunk_rows": 64, "shard_rows": 256, "codec": "zstd:1"}}
    writers = [AtomicWriter("s3://atoms/run/a.zarr", cfg, storage_options=so),
               AtomicWriter(str(tmp_path / "a.zarr"), cfg)]
    for w in writers:
        w.write([_atoms(3 + i % 5, i) for i in range(120)])
        w.append([_atoms(2 + i % 4, 1000 + i) for i in range(50)])
        w.delete([3, 17, 150])
        w.add_custom("charge", np.arange(170, dtype=np.float32) * 0.5, "system")
    remote, local = writers
    assert remote.check() == local.check()
    assert remote.check()["num_live"] == 167
    want = _files(tmp_path / "a.zarr")
    got = _objects(client, "atoms", "run/a.zarr")
    assert sorted(got) == sorted(want)
    assert [k for k in want if got[k] != want[k]] == []
    a = _all_samples(zbatch.open("s3://atoms/run/a.zarr", storage_options=so))
    b = _all_samples(zbatch.open(str(tmp_path / "a.zarr")))
    assert sorted(a) == sorted(b)
    for k in b:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    g = zarr.open_group("s3://atoms/run/a.zarr", mode="r", storage_options=_s3fs_options(moto_s3))
    np.testing.assert_array_equal(g["custom/charge"][...], np.arange(170, dtype=np.float32) * 0.5)
    assert int(g.attrs["num_samples"]) == 170
    with pytest.raises(FileExistsError):
        remote.write([_atoms(3, 0)])


def test_atomic_writer_s3_failure_leaves_nothing(moto_s3, fault_proxy):
    """A new store whose chunk PUT fails is removed again: no object left under its name; an
    append whose PUT fails leaves the committed samples readable and unchanged."""
    client = _bucket(moto_s3, "atomfail")
    proxy = fault_proxy(moto_s3.endpoint_url, rates={"500": 1.0},
                        path_pattern=r"^/atomfail/b\.zarr/core/positions/c/")
    so = dict(moto_s3.storage_options(proxy.url), max_retries=0)
    with pytest.raises(zbatch.ZbatchError) as e:
        AtomicWriter("s3://atomfail/b.zarr", storage_options=so).write(
            [_atoms(4, i) for i in range(30)])
    assert "HTTP 500" in str(e.value)
    assert client.list_objects_v2(Bucket="atomfail").get("KeyCount", 0) == 0
    # a committed store, then an append that fails: the store reads as before
    good = moto_s3.storage_options()
    AtomicWriter("s3://atomfail/b.zarr", storage_options=good).write(
        [_atoms(4, i) for i in range(30)])
    before = _all_samples(zbatch.open("s3://atomfail/b.zarr", storage_options=good))
    with pytest.raises(zbatch.ZbatchError):
        AtomicWriter("s3://atomfail/b.zarr", storage_options=so).append(
            [_atoms(4, 100 + i) for i in range(3000)])
    after = _all_samples(zbatch.open("s3://atomfail/b.zarr", storage_options=good))
    assert sorted(after) == sorted(before)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)


def test_atomic_writer_url_checks():
    with pytest.raises(ValueError, match="name below the bucket"):
        AtomicWriter("s3://bucket", storage_options={"anon": True})
    with pytest.raises(ValueError, match="read-only"):
        AtomicWriter("http://host/a.zarr")


def test_atomic_defragment_on_s3_equals_the_local_one(tmp_path, moto_s3):
    """defragment moves objects one by one on S3 (copy, delete): the result is the store a local
    defragment makes, object for object, and no object is left under the side names."""
    client = _bucket(moto_s3, "defrag")
    so = moto_s3.storage_options()
    writers = [AtomicWriter("s3://defrag/d.zarr", storage_options=so),
               AtomicWriter(str(tmp_path / "d.zarr"))]
    for w in writers:
        w.write([_atoms(3 + i % 4, i) for i in range(60)])
        w.delete([0, 5, 59])
        w.defragment()
    assert writers[0].check() == writers[1].check()
    assert writers[0].check()["num_samples"] == 57
    want = _files(tmp_path / "d.zarr")
    got = _objects(client, "defrag", "d.zarr")
    assert sorted(got) == sorted(want)
    assert [k for k in want if got[k] != want[k]] == []
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="defrag")["Contents"]]
    assert all(k.startswith("d.zarr/") for k in keys), [k for k in keys if "zbatch-" in k][:5]
    a = _all_samples(zbatch.open("s3://defrag/d.zarr", storage_options=so))
    b = _all_samples(zbatch.open(str(tmp_path / "d.zarr")))
    for k in b:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
