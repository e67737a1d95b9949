"""Self-tests of the loopback servers the remote-store tests and bench/remote.py use
(tests/python/remote_servers.py): nginx serves exact bytes with ranges, HEAD and keep-alive, and
adds the latency it is asked for; moto checks SigV4; the fault proxy injects each fault at its rate,
deterministically, and counts what it injected. The clients are independent of zbatch (requests,
http.client, boto3, zarr-python over s3fs)."""
from __future__ import annotations

import http.client
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
import zarr

import remote_servers as rs

SIZE = 1 << 20


@pytest.fixture
def www(tmp_path):
    """A served directory with one 1 MiB file of random bytes (and its bytes)."""
    root = tmp_path / "www"
    (root / "d").mkdir(parents=True)
    data = np.random.default_rng(7).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    (root / "d" / "blob.bin").write_bytes(data)
    return root, data


def _ranges(n, seed=0, max_len=4096):
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, SIZE - max_len, n)
    lens = rng.integers(1, max_len, n)
    return [(int(s), int(s + k - 1)) for s, k in zip(starts, lens)]


# ------------------------------------------------------------------------------------------------
# nginx
# ------------------------------------------------------------------------------------------------
def test_nginx_range_head_keepalive(www, nginx_serve):
    root, data = www
    server = nginx_serve(root)
    conn = http.client.HTTPConnection(rs.LOOPBACK, server.port, timeout=5)
    for first, last in [(0, 0), (10, 109), (SIZE - 100, SIZE - 1), *_ranges(5)]:
        conn.request("GET", "/d/blob.bin", headers={"Range": f"bytes={first}-{last}"})
        r = conn.getresponse()
        assert r.status == 206
        assert r.getheader("Content-Range") == f"bytes {first}-{last}/{SIZE}"
        assert r.read() == data[first:last + 1]
    conn.request("GET", "/d/blob.bin", headers={"Range": "bytes=-300"})  # a suffix range
    r = conn.getresponse()
    assert (r.status, r.read()) == (206, data[-300:])
    conn.request("HEAD", "/d/blob.bin")
    r = conn.getresponse()
    assert (r.status, int(r.getheader("Content-Length")), r.read()) == (200, SIZE, b"")
    conn.request("GET", "/d/missing.bin")
    r = conn.getresponse()
    r.read()
    assert r.status == 404
    conn.close()
    log = server.requests(count=11)
    # Every one of the 11 requests went over the one kept-alive connection.
    assert len(log) == 11 and len({rec.connection for rec in log}) == 1
    assert [rec.status for rec in log] == [206] * 9 + [200, 404]
    assert log[1].range == "bytes=10-109" and log[1].nbytes == 100
    assert log[9].method == "HEAD" and log[9].nbytes == 0


@pytest.mark.parametrize("latency_ms", [5, 25])
def test_nginx_latency_is_what_was_asked(www, nginx_serve, latency_ms):
    """Sequential requests take the latency plus the no-latency time (within 5 ms); 32 at once
    all finish within ~one latency, so the delay holds no worker (it does not serialise)."""
    root, data = www
    plain, slow = nginx_serve(root), nginx_serve(root, latency_ms=latency_ms)

    def fastest(url, session, rg):
        t = time.perf_counter()
        r = session.get(url + "/d/blob.bin", headers={"Range": f"bytes={rg[0]}-{rg[1]}"})
        took = time.perf_counter() - t
        assert r.content == data[rg[0]:rg[1] + 1]
        return took

    # Interleaved, and the fastest of each: noise on a shared machine only ever adds time.
    with requests.Session() as a, requests.Session() as b:
        pairs = [(fastest(plain.url, a, rg), fastest(slow.url, b, rg))
                 for rg in _ranges(20, seed=1)]
    added = (min(p[1] for p in pairs) - min(p[0] for p in pairs)) * 1000
    assert latency_ms - 1 <= added <= latency_ms + 5, f"added {added:.1f} ms, asked {latency_ms}"
    head = requests.head(slow.url + "/d/blob.bin", timeout=5)
    assert int(head.headers["Content-Length"]) == SIZE
    # The server's own log agrees: every request's duration is at least the latency.
    assert min(r.end - r.start for r in slow.requests()) >= latency_ms / 1000 - 0.0015

    def concurrent(url):
        with ThreadPoolExecutor(32) as pool:
            t = time.perf_counter()
            got = list(pool.map(lambda rg: requests.get(
                url + "/d/blob.bin", headers={"Range": f"bytes={rg[0]}-{rg[1]}"}, timeout=5),
                _ranges(32, seed=2)))
            wall = time.perf_counter() - t
        assert all(r.status_code == 206 for r in got)
        return wall

    base_wall = concurrent(plain.url)
    offset = slow.log_offset()
    extra = concurrent(slow.url) - base_wall
    # Serialised, the delay would add 32 latencies; overlapped, about one.
    assert extra < 32 * latency_ms / 1000 / 3, f"32 concurrent requests took {extra:.3f} s more"
    stats = rs.request_stats(slow.requests(offset))
    assert stats["requests"] == 32
    assert stats["bytes"] == sum(b - a + 1 for a, b in _ranges(32, seed=2))
    # the log sees them overlap: 32 Python threads on a loaded 2-core machine keep fewer in
    # flight when each request is short (seen: 7 at 5 ms while a build ran), so the bar rises
    # with the latency
    assert stats["in_flight_max"] >= min(8, max(2, latency_ms // 2))


def test_request_stats_on_known_records():
    recs = [rs.RequestRecord(0.0, 1.0, 206, 100, 1, "GET", "/a", "bytes=0-99"),
            rs.RequestRecord(0.5, 1.5, 206, 300, 2, "GET", "/a", "bytes=0-299"),
            rs.RequestRecord(1.5, 2.0, 200, 0, 2, "HEAD", "/a", "")]
    st = rs.request_stats(recs)
    assert st["requests"] == 3 and st["bytes"] == 400
    assert st["bytes_per_request"] == pytest.approx(400 / 3)
    assert st["requests_per_s"] == pytest.approx(1.5)
    assert st["in_flight_mean"] == pytest.approx(2.5 / 2.0)
    assert st["in_flight_max"] == 2 and st["connections"] == 2
    # A window counts the requests that end in it, and their time inside it.
    st = rs.request_stats(recs, window=(1.2, 1.8))
    assert st["requests"] == 1 and st["bytes"] == 300
    assert st["requests_per_s"] == pytest.approx(1 / 0.6)
    assert st["in_flight_mean"] == pytest.approx(0.3 / 0.6)


# ------------------------------------------------------------------------------------------------
# moto
# ------------------------------------------------------------------------------------------------
def test_moto_sigv4_round_trip_and_wrong_secret(moto_s3):
    from botocore.exceptions import ClientError
    s3 = moto_s3.client()
    s3.create_bucket(Bucket="roundtrip")
    payload = bytes(range(256)) * 1000
    s3.put_object(Bucket="roundtrip", Key="a/b.bin", Body=payload)
    assert s3.get_object(Bucket="roundtrip", Key="a/b.bin")["Body"].read() == payload
    part = s3.get_object(Bucket="roundtrip", Key="a/b.bin", Range="bytes=1000-1999")
    assert part["Body"].read() == payload[1000:2000]
    with pytest.raises(ClientError) as ei:
        moto_s3.client(secret_key="not-the-secret").get_object(Bucket="roundtrip", Key="a/b.bin")
    err = ei.value.response
    assert err["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert err["Error"]["Code"] == "SignatureDoesNotMatch"


def test_upload_directory_reads_back_through_zarr_over_s3fs(tmp_path, moto_s3):
    data = np.arange(600, dtype=np.float32).reshape(100, 6)
    zarr.create_array(str(tmp_path / "store"), data=data, chunks=(16, 6))
    keys = rs.upload_directory(moto_s3.client(), tmp_path / "store", "uploads", "x/store.zarr")
    assert "x/store.zarr/zarr.json" in keys and len(keys) == 1 + 7  # metadata + 7 chunks
    z = zarr.open_array("s3://uploads/x/store.zarr", mode="r",
                        storage_options=moto_s3.storage_options())
    np.testing.assert_array_equal(z[:], data)


# ------------------------------------------------------------------------------------------------
# The fault proxy
# ------------------------------------------------------------------------------------------------
def _outcome(session, url, first, last, data, timeout=2.0, late_s=None):
    """What the client saw for one range GET: 'ok', '500', '429', '503', 'reset', 'stall',
    'truncate', 'overlong' or, if late_s is given, 'latency' (right, but late_s or later)."""
    t = time.perf_counter()
    try:
        r = session.get(url, headers={"Range": f"bytes={first}-{last}"}, timeout=timeout)
    except requests.exceptions.Timeout:
        return "stall"
    except requests.exceptions.ChunkedEncodingError:
        return "truncate"  # urllib3 enforces Content-Length: fewer bytes than it said
    except requests.exceptions.ConnectionError:
        return "reset"
    if r.status_code != 206:
        assert r.status_code in (500, 429, 503), r.status_code
        if r.status_code == 503:
            assert b"<Code>SlowDown</Code>" in r.content
        return str(r.status_code)
    want = data[first:last + 1]
    if len(r.content) > len(want):
        assert r.content[:len(want)] == want
        return "overlong"
    assert r.content == want
    late = late_s is not None and time.perf_counter() - t >= late_s
    return "latency" if late else "ok"


def _run_outcomes(url, ranges, data, workers=16, timeout=2.0, late_s=None):
    def one(rg):
        with requests.Session() as s:
            return _outcome(s, url, rg[0], rg[1], data, timeout, late_s)
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, ranges))


@pytest.mark.parametrize("kind", rs.FAULT_KINDS)
def test_proxy_injects_each_fault_at_its_rate(www, nginx_serve, fault_proxy, kind):
    """120 distinct range GETs at rate 0.25: the client sees the fault as many times as the proxy
    counted, and that count is within 4 standard deviations of 30."""
    root, data = www
    proxy = fault_proxy(nginx_serve(root).url, seed=11, rates={kind: 0.25}, stall_s=1.0,
                        fault_latency_s=0.4)
    ranges = _ranges(120, seed=3)
    late = 0.3 if kind == "latency" else None
    seen = _run_outcomes(proxy.url + "/d/blob.bin", ranges, data, timeout=0.6 if kind == "stall"
                         else 2.0, late_s=late)
    stats = proxy.stats()
    n = seen.count(kind)
    assert set(seen) <= {"ok", kind}, sorted(set(seen))
    assert stats["injected"][kind] == n
    assert sum(stats["injected"].values()) == n
    assert abs(n - 30) <= 4 * (120 * 0.25 * 0.75) ** 0.5, f"{n} {kind} faults in 120 at 0.25"
    assert stats["requests"] == 120


def test_proxy_is_deterministic_per_seed(www, nginx_serve, fault_proxy):
    root, data = www
    rates = {"500": 0.1, "503": 0.1, "reset": 0.1, "truncate": 0.1, "overlong": 0.1}
    proxy = fault_proxy(nginx_serve(root).url, seed=5, rates=rates)
    ranges = _ranges(60, seed=4)
    first = _run_outcomes(proxy.url + "/d/blob.bin", ranges, data, workers=1)
    proxy.configure(seed=5)  # counters and draw history zeroed: the same draws again
    again = _run_outcomes(proxy.url + "/d/blob.bin", ranges[::-1], data, workers=8)[::-1]
    proxy.configure(seed=6)
    other = _run_outcomes(proxy.url + "/d/blob.bin", ranges, data, workers=1)
    assert first == again
    assert first != other
    assert {"500", "503", "reset", "truncate", "overlong"} <= set(first)


def test_proxy_retry_draws_afresh_and_cap(www, nginx_serve, fault_proxy):
    """The same request asked again draws a new fault; max_faults_per_request=2 at rate 1 fails
    the first two attempts and lets the third through."""
    root, data = www
    proxy = fault_proxy(nginx_serve(root).url, rates={"503": 1.0}, max_faults_per_request=2)
    with requests.Session() as s:
        got = [_outcome(s, proxy.url + "/d/blob.bin", 100, 199, data) for _ in range(4)]
    assert got == ["503", "503", "ok", "ok"]
    st = proxy.stats()
    assert st["injected"]["503"] == 2 and st["status"] == {"503": 2, "206": 2}


def test_proxy_latency_is_concurrent(www, nginx_serve, fault_proxy):
    """latency_s is added to every request, and 64 requests at once take about one latency
    (the proxy overlaps them), which the proxy's in-flight count confirms."""
    root, data = www
    proxy = fault_proxy(nginx_serve(root).url, latency_s=0.05)
    with requests.Session() as s:
        t = time.perf_counter()
        assert _outcome(s, proxy.url + "/d/blob.bin", 0, 99, data) == "ok"
        assert time.perf_counter() - t >= 0.05
    proxy.reset()
    t = time.perf_counter()
    assert set(_run_outcomes(proxy.url + "/d/blob.bin", _ranges(64), data, workers=64)) == {"ok"}
    wall = time.perf_counter() - t
    st = proxy.stats()
    assert wall < 64 * 0.05 / 4, wall
    assert st["requests"] == 64 and st["in_flight_max"] >= 16


def test_proxy_in_front_of_moto_keeps_sigv4_and_boto3_retries_slowdown(moto_s3, fault_proxy):
    """The proxy forwards headers untouched (SigV4 still verifies); boto3 reads its 503 SlowDown
    as throttling and retries; the proxy counted the injected faults."""
    from botocore.config import Config
    import boto3
    s3 = moto_s3.client()
    s3.create_bucket(Bucket="proxied")
    s3.put_object(Bucket="proxied", Key="k", Body=b"0123456789" * 100)
    proxy = fault_proxy(moto_s3.endpoint_url, rates={"503": 1.0}, max_faults_per_request=2)
    via = boto3.client("s3", endpoint_url=proxy.url, region_name=moto_s3.region,
                       aws_access_key_id=moto_s3.access_key,
                       aws_secret_access_key=moto_s3.secret_key,
                       config=Config(s3={"addressing_style": "path"},
                                     retries={"mode": "standard", "max_attempts": 3}))
    resp = via.get_object(Bucket="proxied", Key="k", Range="bytes=10-29")
    assert resp["Body"].read() == b"0123456789" * 2
    assert resp["ResponseMetadata"]["RetryAttempts"] == 2
    assert proxy.stats()["injected"]["503"] == 2
