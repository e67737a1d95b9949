"""Credentials from the AWS shared files (~/.aws/credentials, ~/.aws/config) for s3:// stores:
the Python package (storage_options={"profile": ...}, AWS_PROFILE) and the command, against
moto's server with SigV4 enforced. The expected precedence is botocore's (docs/REMOTE.md)."""
from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

import zbatch
from conftest import CLI
from zbatch._remote import remote_options

SECRET = "Pr0fileSecret/abcdefghijklmnopqrstuvwxyz"


def _files(tmp_path, cred: str, conf: str = "") -> dict:
    (tmp_path / "credentials").write_text(cred)
    (tmp_path / "config").write_text(conf)
    return {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"),
            "AWS_CONFIG_FILE": str(tmp_path / "config")}


CRED = f"""[default]
aws_access_key_id = AKIDDEFAULT
aws_secret_access_key = {SECRET}

[work]
aws_access_key_id = AKIDWORK
aws_secret_access_key = secretWORK
aws_session_token = tokenWORK
"""
CONF = """[default]
region = eu-west-1
[profile work]
region = us-west-2
endpoint_url = http://127.0.0.1:9
"""


def test_profile_precedence(tmp_path):
    env = _files(tmp_path, CRED, CONF)
    # no variables: the default profile, its region
    o = remote_options("s3://b/p", None, env)
    assert (o["access_key_id"], o["secret_access_key"], o["region"], o["anonymous"]) == \
        ("AKIDDEFAULT", SECRET, "eu-west-1", False)
    assert "endpoint_url" not in o
    # AWS_PROFILE picks another, with its token, region and endpoint
    o = remote_options("s3://b/p", None, dict(env, AWS_PROFILE="work"))
    assert (o["access_key_id"], o["session_token"], o["region"], o["endpoint_url"]) == \
        ("AKIDWORK", "tokenWORK", "us-west-2", "http://127.0.0.1:9")
    # credential variables win over the files; the variables' region over the profile's
    env_keys = dict(env, AWS_ACCESS_KEY_ID="EK", AWS_SECRET_ACCESS_KEY="ES",
                    AWS_REGION="ca-central-1")
    o = remote_options("s3://b/p", None, env_keys)
    assert (o["access_key_id"], o["region"]) == ("EK", "ca-central-1")
    # an explicit profile wins over the credential variables (botocore's rule)
    o = remote_options("s3://b/p", {"profile": "work"}, env_keys)
    assert (o["access_key_id"], o["secret_access_key"]) == ("AKIDWORK", "secretWORK")
    # explicit keys win over everything
    o = remote_options("s3://b/p", {"profile": "work", "key": "K", "secret": "S"}, env)
    assert (o["access_key_id"], o["secret_access_key"]) == ("K", "S")
    # anon: no credentials, whatever the files hold
    o = remote_options("s3://b/p", {"anon": True}, env)
    assert o["anonymous"] and "access_key_id" not in o
    # no files at all, no variables: anonymous, as before
    none = {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no1"),
            "AWS_CONFIG_FILE": str(tmp_path / "no2")}
    assert remote_options("s3://b/p", None, none) == {"anonymous": True}


def test_missing_profile_and_bad_files_are_clear(tmp_path):
    env = _files(tmp_path, CRED, CONF)
    with pytest.raises(ValueError) as e:
        remote_options("s3://b/p", {"profile": "nosuch"}, env)
    msg = str(e.value)
    assert "'nosuch'" in msg and env["AWS_SHARED_CREDENTIALS_FILE"] in msg
    assert env["AWS_CONFIG_FILE"] in msg
    with pytest.raises(ValueError, match="'gone'"):
        remote_options("s3://b/p", None, dict(env, AWS_PROFILE="gone"))
    bad = _files(tmp_path, CRED + f"aws_secret_access_key {SECRET}\n", CONF)
    with pytest.raises(zbatch.ZbatchError) as e:
        remote_options("s3://b/p", None, bad)
    msg = str(e.value)
    assert f"{bad['AWS_SHARED_CREDENTIALS_FILE']}:9:" in msg and SECRET not in msg
    assert e.value.status == "ZB_E_INVALID"


def _store(moto_s3, bucket):
    client = moto_s3.client()
    client.create_bucket(Bucket=bucket)
    zbatch.write_array(f"s3://{bucket}/a.zarr", "x", np.arange(50, dtype=np.int64), chunks=16,
                       storage_options=moto_s3.storage_options())


def _moto_files(tmp_path, moto_s3, secret=None):
    return _files(tmp_path, f"""[moto]
aws_access_key_id = {moto_s3.access_key}
aws_secret_access_key = {secret or moto_s3.secret_key}
""", f"""[profile moto]
region = us-east-1
endpoint_url = {moto_s3.endpoint_url}
""")


def test_python_profile_against_moto(moto_s3, tmp_path, monkeypatch):
    _store(moto_s3, "prof")
    for k in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(k)
    for k, v in _moto_files(tmp_path, moto_s3).items():
        monkeypatch.setenv(k, v)
    # credentials, region and endpoint all from the profile
    zbatch.write_array("s3://prof/b.zarr", "y", np.arange(7.0), storage_options={"profile": "moto"})
    monkeypatch.setenv("AWS_PROFILE", "moto")
    zbatch.write_array("s3://prof/c.zarr", "y", np.arange(5.0))
    import zarr
    so = {"key": moto_s3.access_key, "secret": moto_s3.secret_key,
          "endpoint_url": moto_s3.endpoint_url}
    np.testing.assert_array_equal(zarr.open_array("s3://prof/b.zarr/y", mode="r",
                                                  storage_options=so)[...], np.arange(7.0))
    np.testing.assert_array_equal(zarr.open_array("s3://prof/c.zarr/y", mode="r",
                                                  storage_options=so)[...], np.arange(5.0))


def _cli(args, env):
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, timeout=120,
                          env=env)


def test_cli_profile_against_moto(moto_s3, tmp_path):
    _store(moto_s3, "cliprof")
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env = dict(base, AWS_PROFILE="moto", **_moto_files(tmp_path, moto_s3))
    r = _cli(["info", "s3://cliprof/a.zarr"], env)
    assert r.returncode == 0, r.stderr
    assert "x" in r.stdout
    r = _cli(["info", "s3://cliprof/a.zarr"], dict(env, AWS_PROFILE="nosuch"))
    assert r.returncode != 0 and "'nosuch'" in r.stderr
    assert env["AWS_SHARED_CREDENTIALS_FILE"] in r.stderr and env["AWS_CONFIG_FILE"] in r.stderr
    # a wrong secret in the file: a clear 403 that does not show it
    wrong = _moto_files(tmp_path / "..", moto_s3, secret=SECRET)
    r = _cli(["info", "s3://cliprof/a.zarr"], dict(base, AWS_PROFILE="moto", **wrong))
    assert r.returncode != 0 and "403" in r.stderr and SECRET not in r.stderr, r.stderr
    # a malformed file names file and line, never the value
    (tmp_path / "credentials").write_text(f"[moto]\n{SECRET}\n")
    r = _cli(["info", "s3://cliprof/a.zarr"], env)
    assert r.returncode != 0 and f"{tmp_path / 'credentials'}:2:" in r.stderr
    assert SECRET not in r.stderr
