"""HTTP redirects (issue 17): a plain http(s) store follows 301/302/307/308 for its GETs and
HEADs (a real nginx ``return``, remote_servers.NginxServer(redirects=...)); S3's signed requests
are never redirected. The oracle is the same store read locally."""
from __future__ import annotations

import time

import numpy as np
import pytest
import scipy.sparse as sp

import zbatch


@pytest.fixture(scope="module")
def www(tmp_path_factory):
    root = tmp_path_factory.mktemp("www")
    X = sp.random(400, 120, density=0.1, format="csr", random_state=3, dtype=np.float32)
    zbatch.write_anndata(root / "s.zarr", X, chunk_size=512, shard_size=4096)
    return root


def _all_rows(ds):
    return ds.read_many(list(range(len(ds))))["X"]


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_http_store_follows_redirects(www, nginx_serve, status):
    server = nginx_serve(www, redirects={"moved": status})
    ds = zbatch.open(f"{server.url}/moved/s.zarr")
    want = _all_rows(zbatch.open(str(www / "s.zarr")))
    got = _all_rows(ds)
    assert (got != want).nnz == 0 and got.shape == want.shape
    records = server.requests()
    redirected = [r for r in records if r.status == status]
    served = [r for r in records if r.status in (200, 206) and not r.path.startswith("/moved/")]
    assert redirected and served  # nginx answered with the redirect, then with the bytes
    # range reads kept their Range header across the redirect: 206 answers at the target
    assert any(r.status == 206 and r.range for r in served)


def test_redirect_loop_fails_clearly_and_bounded(www, nginx_serve):
    server = nginx_serve(www, redirects={"loop": (302, "loop")})
    t0 = time.monotonic()
    with pytest.raises(zbatch.ZbatchError) as e:
        zbatch.open(f"{server.url}/loop/s.zarr", storage_options={"max_retries": 1})
    assert time.monotonic() - t0 < 30
    msg = str(e.value).lower()
    assert "redirect" in msg and "/loop/s.zarr" in msg, msg


def test_s3_signed_requests_are_not_redirected(www, nginx_serve, moto_s3):
    """An S3 endpoint that answers 307 (nginx in front, pointing at moto): the signed request
    is not followed (its signature is for the first URL); the error names the status and holds
    no secret."""
    import remote_servers as rs
    rs.upload_directory(moto_s3.client(), www / "s.zarr", "redir", "s.zarr")
    server = nginx_serve(www, redirects={"redir": (307, f"{moto_s3.endpoint_url}/redir")})
    so = dict(moto_s3.storage_options(server.url), max_retries=0)
    with pytest.raises(zbatch.ZbatchError) as e:
        zbatch.open("s3://redir/s.zarr", storage_options=so)
    msg = str(e.value)
    assert "HTTP 307" in msg and moto_s3.secret_key not in msg, msg
    # the same store straight from moto reads as the local one
    ds = zbatch.open("s3://redir/s.zarr", storage_options=moto_s3.storage_options())
    assert (_all_rows(ds) != _all_rows(zbatch.open(str(www / "s.zarr")))).nnz == 0
