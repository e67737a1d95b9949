"""Remote stores (issue 17): http(s):// through nginx, s3:// through moto with SigV4, faults
through the tests' own proxy. Every server runs on loopback, started by the fixtures of
remote_servers.py (conftest: nginx_serve, moto_s3, fault_proxy).

The oracle is always the same store read locally by zbatch (itself tested against zarr-python,
anndata and nvalchemi elsewhere), and zarr-python 3 over s3fs for what zbatch writes to S3.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest
import scipy.sparse as sp
import zarr

import zbatch
from conftest import run_cli
from zbatch._remote import remote_options

# retries fast and bounded for the fault tests: 1 s without a byte is a stall
FAST = {"max_retries": 6, "backoff_base_s": 0.01, "backoff_max_s": 0.05,
        "stall_timeout_s": 1, "connect_timeout_s": 2}


# ---- stores of every layout ----------------------------------------------------------------------
def _csr(n_obs, n_vars, seed):
    X = sp.random(n_obs, n_vars, density=0.08, format="csr", random_state=seed,
                  dtype=np.float32)
    X.data = np.round(X.data * 50).astype(np.float32) + 1
    return X


def _big_csr(seed):
    """7.2 MB of float32 values: one shard of X/data above the 5 MiB multipart threshold."""
    return sp.random(3000, 2000, density=0.3, format="csr", random_state=seed, dtype=np.float32)


def _atoms(n, seed):
    rng = np.random.default_rng(seed)
    k = 2 * n
    return {"positions": rng.random((n, 3)).astype(np.float32),
            "atomic_numbers": rng.integers(1, 30, n), "energy": float(rng.random()),
            "neighbor_list": rng.integers(0, n, (k, 2)),
            "shifts": rng.random((k, 3)).astype(np.float32)}


def _make_stores(root):
    import pandas as pd
    from zbatch._atomic import AtomicWriter
    obs = pd.DataFrame({"cell_type": pd.Categorical(np.array(["a", "b", "c"])[
        np.arange(600) % 3])}, index=[f"c{i}" for i in range(600)])
    X = _csr(600, 300, 0)
    zbatch.write_anndata(root / "csr_v3_sharded.zarr", X, obs=obs, chunk_size=1024,
                         shard_size=8192)
    zbatch.write_anndata(root / "csr_v2.zarr", X, obs=obs, zarr_format=2, chunk_size=2048)
    zbatch.write_anndata(root / "dense_v3.zarr", X.toarray(), chunk_size=50, shard_size=200)
    w = AtomicWriter(str(root / "atomic.zarr"))
    w.write([_atoms(3 + i % 5, i) for i in range(200)])
    g = zarr.open_group(str(root / "generic.zarr"), mode="w", zarr_format=3)
    lens = np.arange(400) % 7
    ptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    g.create_array("ptr", data=ptr, chunks=(64,))
    g.create_array("vals", data=np.arange(ptr[-1], dtype=np.float64) * 0.5, chunks=(100,),
                   shards=(400,))
    g.create_array("label", data=np.arange(400, dtype=np.int32) % 11, chunks=(50,))
    g.attrs["zbatch"] = {"segments": {"s": "ptr"},
                         "fields": {"vals": {"array": "vals", "kind": "ragged", "segment": "s"},
                                    "label": {"array": "label", "kind": "per_sample"}}}
    for name in ("atomic.zarr", "generic.zarr"):  # HTTP cannot list: consolidate
        zarr.consolidate_metadata(str(root / name))
    return ["csr_v3_sharded.zarr", "csr_v2.zarr", "dense_v3.zarr", "atomic.zarr",
            "generic.zarr"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("remote_stores")
    return root, _make_stores(root)


def _batches(ds, sampler, batch_size=64, **kw):
    loader = zbatch.DataLoader(ds, batch_size=batch_size, sampler=sampler, seed=3,
                               output="numpy", num_threads=2, prefetch_factor=4, **kw)
    return list(loader)


def _assert_same_batches(got, want):
    assert len(got) == len(want) and len(want) > 0
    for g, w in zip(got, want):
        assert sorted(g.keys()) == sorted(w.keys())
        for k in w.keys():
            a, b = g[k], w[k]
            if sp.issparse(b):
                assert (a != b).nnz == 0 and a.shape == b.shape, k
            else:
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=k)


# ---- HTTP ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("sampler", ["block", "random"])
def test_http_every_layout_reads_as_local(stores, nginx_serve, sampler):
    root, names = stores
    server = nginx_serve(root)
    for name in names:
        local = zbatch.open(str(root / name))
        remote = zbatch.open(f"{server.url}/{name}")
        assert remote.layout == local.layout and len(remote) == len(local), name
        _assert_same_batches(_batches(remote, sampler), _batches(local, sampler))
        st = remote.store_stats()
        assert st["requests"] > 0 and st["retries"] == 0 and st["bytes"] > 0, (name, st)


def test_http_get_ranges_concurrent_and_coalesced(stores, nginx_serve):
    """Many ranges in one read_many: byte-identical to local; the counters show one request
    per coalesced group, not per range."""
    root, _ = stores
    server = nginx_serve(root)
    ids = np.random.default_rng(0).permutation(600)[:300]
    local = zbatch.open(str(root / "csr_v3_sharded.zarr")).read_many(ids)
    ds = zbatch.open(f"{server.url}/csr_v3_sharded.zarr",
                     storage_options={"max_in_flight": 8, "coalesce_gap": 1 << 20})
    got = ds.read_many(ids)
    assert (got["X"] != local["X"]).nnz == 0
    np.testing.assert_array_equal(got["obs/cell_type"], local["obs/cell_type"])
    assert ds.store_stats()["retries"] == 0


def _check_ranges(url, root, name, ranges, opts):
    """One get_ranges call of `ranges` over `url`; every range against the local file."""
    got, stats = zbatch._zbatch.read_ranges(url, opts, ranges)
    data = (root / name).read_bytes()
    for (key, off, n), (status, b, _) in zip(ranges, got):
        if key != name:
            assert status == "ZB_E_NOTFOUND", (key, status)
        else:
            assert status == "ZB_OK" and b == data[off:off + n], (key, off, n, status, len(b))
    return stats


def test_get_ranges_many_in_flight_coalesced_and_under_faults(tmp_path, nginx_serve,
                                                              fault_proxy):
    """zb_store_get_ranges over HTTP: 400 ranges of one object (some past its end, some of a
    missing object) in one call: the bytes of the local file, requests in flight together,
    nearby ranges coalesced; then the same through every kind of fault."""
    rng = np.random.default_rng(7)
    (tmp_path / "blob").write_bytes(rng.integers(0, 256, 3_000_000, dtype=np.uint8).tobytes())
    ranges = [("blob", int(o), int(n)) for o, n in
              zip(rng.integers(0, 3_000_100, 400), rng.integers(1, 20_000, 400))]
    ranges += [("missing", 0, 10), ("blob", 2_999_990, 100), ("blob", 3_000_000, 5)]
    server = nginx_serve(tmp_path)
    opts = dict(FAST, coalesce_gap=4096, max_request_bytes=65536)
    stats = _check_ranges(server.url, tmp_path, "blob", ranges, opts)
    assert stats["retries"] == 0 and stats["ranges"] == len(ranges)
    assert 50 < stats["requests"] < len(ranges)  # coalesced (and the 404 is one request)
    assert stats["max_in_flight"] == min(256, stats["requests"])  # all at once (default 256)
    proxy = fault_proxy(server.url, seed=5, rates=FAULTS, fault_latency_s=0.02,
                        max_faults_per_request=3)
    stats = _check_ranges(proxy.url, tmp_path, "blob", ranges, opts)
    injected = proxy.stats()["injected"]
    failures = sum(v for k, v in injected.items() if k != "latency")
    assert failures > 20 and failures - injected["reset"] <= stats["retries"] <= failures


SUFFIX = 2**64 - 1  # ZB_RANGE_SUFFIX: the object's last `length` bytes


def test_get_ranges_suffix_is_one_request_and_survives_faults(tmp_path, nginx_serve, fault_proxy):
    """A suffix range (how a reader asks for a shard's index): the object's last bytes in one
    request "bytes=-N" (no HEAD), where they began given back as the range's offset; an object
    shorter than asked comes whole, a missing one is ZB_E_NOTFOUND; through faults (truncated
    bodies resumed from the first missing byte, 5xx, resets) the same bytes."""
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, 100_000, dtype=np.uint8).tobytes()
    (tmp_path / "blob").write_bytes(data)
    (tmp_path / "small").write_bytes(data[:10])
    ranges = [("blob", SUFFIX, 16388), ("small", SUFFIX, 100), ("missing", SUFFIX, 8),
              ("blob", 0, 100), ("blob", SUFFIX, 5)]
    want = [("ZB_OK", data[-16388:], 100_000 - 16388), ("ZB_OK", data[:10], 0),
            ("ZB_E_NOTFOUND", b"", SUFFIX), ("ZB_OK", data[:100], 0),
            ("ZB_OK", data[-5:], 100_000 - 5)]
    server = nginx_serve(tmp_path)
    got, stats = zbatch._zbatch.read_ranges(server.url, FAST, ranges)
    assert got == want
    # one request per range: a suffix joins no other range of its object
    assert sorted((r.method, r.path, r.range) for r in server.requests(count=5)) == sorted(
        [("GET", "/blob", "bytes=-16388"), ("GET", "/small", "bytes=-100"),
         ("GET", "/missing", "bytes=-8"), ("GET", "/blob", "bytes=0-99"),
         ("GET", "/blob", "bytes=-5")])
    assert stats["requests"] == 5 and stats["retries"] == 0
    proxy = fault_proxy(server.url, seed=9, rates=FAULTS, fault_latency_s=0.02,
                        max_faults_per_request=3)
    retries = 0
    for _ in range(15):
        got, stats = zbatch._zbatch.read_ranges(proxy.url, FAST, ranges)
        assert got == want
        retries += stats["retries"]
    assert retries > 5, proxy.stats()["injected"]


@pytest.fixture
def https_serve(tmp_path):
    """nginx over TLS with a fresh self-signed certificate for 127.0.0.1: a factory
    https_serve(root) -> base URL."""
    import subprocess
    import remote_servers as rs
    if rs.nginx_missing_reason():
        pytest.skip(rs.nginx_missing_reason())
    d = tmp_path / "tls"
    d.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
                   check=True, capture_output=True, timeout=60)
    procs = []

    def start(root):
        port = rs.free_port()
        user = "user root;" if os.geteuid() == 0 else ""
        (d / "nginx.conf").write_text(f"""
{user} daemon off; worker_processes 1; pid {d}/nginx.pid; error_log {d}/error.log;
events {{ worker_connections 256; }}
http {{ access_log off; client_body_temp_path {d}/b; proxy_temp_path {d}/p;
  fastcgi_temp_path {d}/f; uwsgi_temp_path {d}/u; scgi_temp_path {d}/s;
  server {{ listen {rs.LOOPBACK}:{port} ssl; ssl_certificate {d}/cert.pem;
           ssl_certificate_key {d}/key.pem; root {root}; }} }}
""")
        p = subprocess.Popen([rs.NGINX, "-c", str(d / "nginx.conf"), "-e", str(d / "error.log")])
        procs.append(p)
        rs._wait_port(port, p, "nginx (tls)", d / "error.log")
        return f"https://{rs.LOOPBACK}:{port}"

    yield start
    for p in procs:
        rs._stop_process(p)


def test_https_reads_and_refuses_an_untrusted_certificate(stores, https_serve):
    root, _ = stores
    url = https_serve(root) + "/csr_v3_sharded.zarr"
    local = zbatch.open(str(root / "csr_v3_sharded.zarr"))
    ds = zbatch.open(url, storage_options={"insecure": True})
    _assert_same_batches(_batches(ds, "random"), _batches(local, "random"))
    with pytest.raises(zbatch.ZbatchError) as e:  # a self-signed certificate: no retry loop
        zbatch.open(url, storage_options={"max_retries": 2})
    assert "certificate" in str(e.value).lower() and url in str(e.value)


def test_http_missing_chunk_is_fill_value(tmp_path, nginx_serve):
    """A missing chunk (404) reads as the fill value, as on local disk."""
    g = zarr.open_group(str(tmp_path / "s.zarr"), mode="w", zarr_format=3)
    a = g.create_array("x", shape=(40,), chunks=(10,), dtype="int32", fill_value=7)
    a[0:10] = np.arange(10)
    a[30:40] = np.arange(10)
    zarr.consolidate_metadata(str(tmp_path / "s.zarr"))
    server = nginx_serve(tmp_path)
    want = zbatch.read_array(str(tmp_path / "s.zarr"), "x")
    np.testing.assert_array_equal(want[10:30], 7)
    np.testing.assert_array_equal(zbatch.read_array(f"{server.url}/s.zarr", "x"), want)


def test_http_unconsolidated_store_needs_consolidated_metadata(tmp_path, nginx_serve):
    g = zarr.open_group(str(tmp_path / "u.zarr"), mode="w", zarr_format=3)
    g.create_array("x", data=np.arange(5.0), chunks=(5,))
    g.attrs["zbatch"] = {"fields": {"x": {"array": "x", "kind": "per_sample"}}}
    server = nginx_serve(tmp_path)
    with pytest.raises(zbatch.ZbatchError) as e:
        zbatch.open(f"{server.url}/u.zarr")
    assert e.value.status == "ZB_E_UNSUPPORTED"
    assert "cannot list" in str(e.value) and "consolidated metadata" in str(e.value)


def test_cli_info_verify_bench_over_http(stores, nginx_serve):
    root, _ = stores
    server = nginx_serve(root)
    url = f"{server.url}/csr_v3_sharded.zarr"
    r = run_cli("info", url)
    assert r.returncode == 0, r.stderr
    assert "layout anndata, consolidated metadata" in r.stdout and "csr" in r.stdout
    r = run_cli("verify", url)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_cli("bench", url, "--batch", "64", "--epochs", "1", "--results", str(root / "results"))
    assert r.returncode == 0, r.stdout + r.stderr


# ---- faults --------------------------------------------------------------------------------------
# stalls cost a second each (the stall timeout): test_stall_is_a_timeout_not_a_hang has them
FAULTS = {"500": 0.06, "503": 0.06, "429": 0.03, "reset": 0.04, "truncate": 0.05,
          "overlong": 0.04, "latency": 0.05}


def test_faults_deliver_the_fault_free_batches(stores, nginx_serve, fault_proxy):
    root, _ = stores
    name = "csr_v3_sharded.zarr"
    server = nginx_serve(root)
    want = _batches(zbatch.open(str(root / name)), "random")
    proxy = fault_proxy(server.url, seed=11, rates=FAULTS, stall_s=3.0, fault_latency_s=0.05,
                        max_faults_per_request=3)
    t0 = time.monotonic()
    ds = zbatch.open(f"{proxy.url}/{name}", storage_options=FAST)
    got = _batches(ds, "random")
    _assert_same_batches(got, want)
    injected = proxy.stats()["injected"]
    failures = sum(v for k, v in injected.items() if k != "latency")
    assert failures > 5, injected
    # every injected failure cost one retry, except a reset of a reused idle connection,
    # which libcurl itself retries once on a fresh connection before zbatch sees it
    retries = ds.store_stats()["retries"]
    assert failures - injected.get("reset", 0) <= retries <= failures, (retries, injected)
    assert time.monotonic() - t0 < 120


def test_faults_beyond_the_budget_fail_clearly_and_bounded(stores, nginx_serve, fault_proxy):
    root, _ = stores
    server = nginx_serve(root)
    proxy = fault_proxy(server.url, seed=1, rates={"503": 1.0}, path_pattern="/X/data/")
    opts = dict(FAST, max_retries=2)
    ds = zbatch.open(f"{proxy.url}/csr_v3_sharded.zarr", storage_options=opts)
    t0 = time.monotonic()
    with pytest.raises(zbatch.ZbatchError) as e:
        ds.read_many([1, 2, 3])
    assert time.monotonic() - t0 < 10
    msg = str(e.value)
    assert e.value.status == "ZB_E_IO"
    assert f"{proxy.url}/csr_v3_sharded.zarr/X/data/c/0" in msg
    assert "HTTP 503" in msg and "3 attempts" in msg
    # a GET names its byte range and S3's error code from the body
    if msg.split(": ", 1)[1].startswith("GET"):
        assert "bytes=" in msg and "SlowDown" in msg


def test_stall_is_a_timeout_not_a_hang(stores, nginx_serve, fault_proxy):
    root, _ = stores
    server = nginx_serve(root)
    proxy = fault_proxy(server.url, seed=2, rates={"stall": 1.0}, stall_s=30.0,
                        path_pattern="/X/indices/")
    ds = zbatch.open(f"{proxy.url}/csr_v3_sharded.zarr",
                     storage_options=dict(FAST, max_retries=1))
    t0 = time.monotonic()
    with pytest.raises(zbatch.ZbatchError) as e:
        ds.read_many([0])
    assert time.monotonic() - t0 < 8
    assert "X/indices" in str(e.value) and "2 attempts" in str(e.value)


# ---- S3 ------------------------------------------------------------------------------------------
def test_s3_reads_a_store_uploaded_with_boto3(stores, moto_s3):
    import remote_servers as rs
    root, names = stores
    client = moto_s3.client()
    so = moto_s3.storage_options()
    # use_consolidated=False: the tree comes from ListObjectsV2 (paged: moto pages at 1000 keys,
    # the C tests parse truncated pages)
    for name, consolidated in (("csr_v3_sharded.zarr", True), ("csr_v2.zarr", False)):
        rs.upload_directory(client, root / name, "upload", f"deep/{name}")
        ds = zbatch.open(f"s3://upload/deep/{name}", storage_options=so,
                         use_consolidated=consolidated)
        _assert_same_batches(_batches(ds, "block"),
                             _batches(zbatch.open(str(root / name)), "block"))


def test_s3_write_then_zarr_python_reads_it(moto_s3):
    """zbatch writes an AnnData store to s3:// (shards large enough for multipart upload);
    zarr-python 3 over s3fs reads the same matrix back, and no temporary or incomplete marker
    object is left."""
    client = moto_s3.client()
    client.create_bucket(Bucket="outbkt")
    X = _big_csr(5)
    so = dict(moto_s3.storage_options(), multipart_threshold=5 << 20, part_bytes=5 << 20)
    zbatch.write_anndata("s3://outbkt/w.zarr", X, chunk_size=4096 * 64, shard_size=4096 * 512,
                         codec="none", storage_options=so)
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="outbkt")["Contents"]]
    assert "w.zarr/zarr.json" in keys and "w.zarr/X/data/c/0" in keys
    assert client.head_object(Bucket="outbkt", Key="w.zarr/X/data/c/0")["ContentLength"] > 5 << 20
    assert not [k for k in keys if "tmp" in k or "incomplete" in k], keys
    assert client.list_multipart_uploads(Bucket="outbkt").get("Uploads", []) == []
    g = zarr.open_group("s3://outbkt/w.zarr", mode="r",
                        storage_options={"key": moto_s3.access_key, "secret": moto_s3.secret_key,
                                         "endpoint_url": moto_s3.endpoint_url})
    M = sp.csr_matrix((g["X/data"][:], g["X/indices"][:], g["X/indptr"][:]), shape=X.shape)
    assert (M != X).nnz == 0
    ds = zbatch.open("s3://outbkt/w.zarr", storage_options=so)
    assert (ds.read_many([7, 2999])["X"] != X[[7, 2999]]).nnz == 0


def _seed_failing_only_part_uploads(path):
    """A proxy seed for which, on `path` at a 500 rate of 0.5, the first PUT (a part) fails
    while the first POST (create / complete), DELETE (abort), HEAD and GET pass: the proxy's
    draws are a pure function of (seed, method, path, Range, repeat) (remote_servers.py)."""
    import remote_servers as rs
    for seed in range(1000):
        cfg = {"seed": seed, "rates": {"500": 0.5}, "path_pattern": None,
               "max_faults_per_request": None}
        st = rs._ProxyState("http://127.0.0.1:1", cfg)
        if st.draw("PUT", path, "") == "500" and not any(
                st.draw(m, path, "") for m in ("POST", "DELETE", "HEAD", "GET")):
            return seed
    raise AssertionError("no seed")


def test_s3_failed_multipart_upload_is_aborted(moto_s3, fault_proxy):
    client = moto_s3.client()
    client.create_bucket(Bucket="half")
    shard = "/half/w.zarr/X/data/c/0"
    proxy = fault_proxy(moto_s3.endpoint_url, seed=_seed_failing_only_part_uploads(shard),
                        rates={"500": 0.5}, path_pattern=f"^{shard}$")
    so = dict(moto_s3.storage_options(proxy.url), multipart_threshold=5 << 20,
              part_bytes=5 << 20, max_retries=0)
    with pytest.raises(zbatch.ZbatchError) as e:
        zbatch.write_anndata("s3://half/w.zarr", _big_csr(6), chunk_size=4096 * 64,
                             shard_size=4096 * 512, codec="none", storage_options=so)
    assert "aborted" in str(e.value) and "HTTP 500" in str(e.value)
    assert client.list_multipart_uploads(Bucket="half").get("Uploads", []) == []
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="half").get("Contents", [])]
    assert "w.zarr/X/data/c/0" not in keys
    with pytest.raises(zbatch.ZbatchError):  # never a store that opens as whole
        zbatch.open("s3://half/w.zarr", storage_options=moto_s3.storage_options())


def test_s3_wrong_secret_is_a_clear_403_without_the_secret(stores, moto_s3):
    import remote_servers as rs
    root, _ = stores
    rs.upload_directory(moto_s3.client(), root / "csr_v2.zarr", "sec", "s.zarr")
    wrong = "Wr0ngSecretValue/abcdefghijklmnopqrstuv"
    so = dict(moto_s3.storage_options(), secret=wrong)
    with pytest.raises(zbatch.ZbatchError) as e:
        zbatch.open("s3://sec/s.zarr", storage_options=so)
    msg = str(e.value)
    assert e.value.status == "ZB_E_DENIED", msg
    assert "HTTP 403" in msg and "check the credentials" in msg and "/sec/s.zarr/" in msg
    assert wrong not in msg and moto_s3.secret_key not in msg
    # a bad session token: refused too, and the token is in no message either
    token = "SessionTokenValue1234567890abcdef"
    with pytest.raises(zbatch.ZbatchError) as e:
        zbatch.open("s3://sec/s.zarr", storage_options=dict(so, token=token))
    assert token not in str(e.value) and wrong not in str(e.value)
    assert e.value.status in ("ZB_E_DENIED", "ZB_E_IO"), str(e.value)


def test_cli_reads_aws_environment(stores, moto_s3, monkeypatch):
    import os
    import remote_servers as rs
    root, _ = stores
    rs.upload_directory(moto_s3.client(), root / "atomic.zarr", "clibkt", "a.zarr")
    env = {"AWS_ACCESS_KEY_ID": moto_s3.access_key, "AWS_SECRET_ACCESS_KEY": moto_s3.secret_key,
           "AWS_ENDPOINT_URL": moto_s3.endpoint_url, "AWS_REGION": "us-east-1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    r = run_cli("info", "s3://clibkt/a.zarr")
    assert r.returncode == 0, r.stderr
    assert "atomic" in r.stdout
    r = run_cli("verify", "s3://clibkt/a.zarr")
    assert r.returncode == 0, r.stdout + r.stderr
    # zbatch convert SRC DST re-encodes a store into s3:// (the listing of S3 drives verify)
    r = run_cli("convert", root / "csr_v2.zarr", "s3://clibkt/v3.zarr", "--format", "v3",
                "--codec", "zstd:3")
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_cli("verify", "s3://clibkt/v3.zarr")
    assert r.returncode == 0, r.stdout + r.stderr
    so = moto_s3.storage_options()
    _assert_same_batches(_batches(zbatch.open("s3://clibkt/v3.zarr", storage_options=so),
                                  "random"),
                         _batches(zbatch.open(str(root / "csr_v2.zarr")), "random"))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-0123456789")
    r = run_cli("info", "s3://clibkt/a.zarr")
    assert r.returncode != 0 and "403" in r.stderr and "wrong-secret" not in r.stderr
    # Python reads the same variables when storage_options leaves them out
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", moto_s3.secret_key)
    assert len(zbatch.open("s3://clibkt/a.zarr")) == 200
    assert os.environ["AWS_ENDPOINT_URL"] == moto_s3.endpoint_url


def test_storage_options_mapping():
    env = {"AWS_ACCESS_KEY_ID": "EK", "AWS_SECRET_ACCESS_KEY": "ES", "AWS_SESSION_TOKEN": "ET",
           "AWS_DEFAULT_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "http://e:1"}
    assert remote_options("s3://b/p", None, env) == {
        "anonymous": False, "access_key_id": "EK", "secret_access_key": "ES",
        "session_token": "ET", "region": "eu-west-1", "endpoint_url": "http://e:1"}
    # explicit keys win over the environment; client_kwargs carries the region
    o = remote_options("s3://b/p", {"key": "K", "secret": "S",
                                    "client_kwargs": {"region_name": "us-west-2"},
                                    "max_in_flight": 16}, env)
    assert (o["access_key_id"], o["secret_access_key"], o["region"], o["max_in_flight"]) == \
        ("K", "S", "us-west-2", 16)
    assert "session_token" not in o
    # anon ignores every credential
    o = remote_options("s3://b/p", {"anon": True}, env)
    assert o["anonymous"] and "access_key_id" not in o and o["endpoint_url"] == "http://e:1"
    no_files = {"AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/c", "AWS_CONFIG_FILE": "/nonexistent/f"}
    assert remote_options("s3://b/p", None, no_files)["anonymous"]
    assert remote_options("/local/dir", None, env) is None
    assert remote_options("https://h/x", {"max_retries": 2}, env) == {"max_retries": 2}
    with pytest.raises(ValueError, match="'bogus'"):
        remote_options("s3://b/p", {"bogus": 1}, env)
    with pytest.raises(ValueError, match="go together"):
        remote_options("s3://b/p", {"key": "K"}, {})
    with pytest.raises(ValueError, match="only"):
        remote_options("/local", {"anon": True}, env)
