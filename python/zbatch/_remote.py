"""Options of remote stores (``http(s)://`` and ``s3://``), from the keys fsspec/s3fs users
already pass as ``storage_options`` and from the standard AWS environment variables.

The C library reads no environment variable; this module does, for the Python package, and
hands libzbatch one flat dict (``zb_remote_opts``). Precedence, as botocore's:

- credentials: explicit ``key``/``secret``/``token``; with an explicit ``profile``, that
  profile of the shared files; else ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` /
  ``AWS_SESSION_TOKEN``; else the profile ``AWS_PROFILE`` names (or ``default``) of
  ``AWS_SHARED_CREDENTIALS_FILE`` (``~/.aws/credentials``) and ``AWS_CONFIG_FILE``
  (``~/.aws/config``); else anonymous access;
- region: explicit, then ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, then the profile's;
- endpoint: explicit, then ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, then the profile's.

A profile named explicitly (``profile`` or ``AWS_PROFILE``) that neither file has is an error
naming both files; the files are parsed by libzbatch (zb_aws_profile_load), whose errors name
the file and line and never a value. See docs/REMOTE.md.
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Optional

#: zbatch's own tuning keys, passed through as they are (docs/REMOTE.md).
TUNING = {
    "max_in_flight": int, "coalesce_gap": int, "max_request_bytes": int, "max_retries": int,
    "backoff_base_s": float, "backoff_max_s": float, "connect_timeout_s": float,
    "stall_timeout_s": float, "multipart_threshold": int, "part_bytes": int,
    "addressing": str, "insecure": bool,
}
_S3FS = {"anon", "key", "secret", "token", "endpoint_url", "client_kwargs", "region_name",
         "profile"}


def is_remote(path: str) -> bool:
    return isinstance(path, str) and path.startswith(("http://", "https://", "s3://"))


def remote_options(path: str, storage_options: Optional[Mapping[str, Any]] = None,
                   environ: Optional[Mapping[str, str]] = None) -> Optional[dict]:
    """The flat options dict libzbatch takes for ``path``, or None for a local path (where
    ``storage_options`` must be empty). Unknown keys are a ValueError naming them."""
    so = dict(storage_options or {})
    if not is_remote(path):
        if so:
            raise ValueError(f"{path}: storage_options apply to http(s):// and s3:// URLs only")
        return None
    env = os.environ if environ is None else environ
    unknown = sorted(set(so) - _S3FS - set(TUNING))
    if unknown:
        raise ValueError(f"storage_options: unknown key(s) {', '.join(map(repr, unknown))}; "
                         f"accepted: {', '.join(sorted(_S3FS | set(TUNING)))}")
    ck = dict(so.pop("client_kwargs", None) or {})
    bad = sorted(set(ck) - {"region_name", "endpoint_url"})
    if bad:
        raise ValueError(f"storage_options['client_kwargs']: unsupported key(s) "
                         f"{', '.join(map(repr, bad))} (region_name and endpoint_url are read)")
    out: dict[str, Any] = {}
    for k, conv in TUNING.items():
        if k in so:
            out[k] = conv(so[k])
    if "addressing" in out:
        modes = {"auto": 0, "path": 1, "virtual": 2}
        if out["addressing"] not in modes:
            raise ValueError(f"storage_options['addressing'] must be one of {sorted(modes)}")
        out["addressing"] = modes[out["addressing"]]
    if not path.startswith("s3://"):
        return out
    anon = bool(so.get("anon", False))
    key = so.get("key")
    secret = so.get("secret")
    token = so.get("token")
    region = (ck.get("region_name") or so.get("region_name") or env.get("AWS_REGION")
              or env.get("AWS_DEFAULT_REGION"))
    endpoint = (so.get("endpoint_url") or ck.get("endpoint_url")
                or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"))
    explicit = so.get("profile")
    if key is None and secret is None and not anon and explicit is None:
        key = env.get("AWS_ACCESS_KEY_ID")
        secret = env.get("AWS_SECRET_ACCESS_KEY")
        token = token if token is not None else env.get("AWS_SESSION_TOKEN")
    if (key is None and secret is None and not anon) or region is None or endpoint is None:
        p = aws_profile(explicit, env)
        if key is None and secret is None and not anon:
            key, secret = p.get("access_key_id"), p.get("secret_access_key")
            token = token if token is not None else p.get("session_token")
        region = region or p.get("region")
        endpoint = endpoint or p.get("endpoint_url")
    if (key is None) != (secret is None) and not anon:
        raise ValueError("storage_options: 'key' and 'secret' go together")
    out.update(anonymous=anon or not key)
    for name, value in (("access_key_id", key), ("secret_access_key", secret),
                        ("session_token", token), ("region", region),
                        ("endpoint_url", endpoint)):
        if value is not None and not anon:
            out[name] = str(value)
        elif name in ("region", "endpoint_url") and value is not None:
            out[name] = str(value)
    return out


def writable_options(path: str, storage_options: Optional[Mapping[str, Any]] = None
                     ) -> Optional[dict]:
    """remote_options for a store that will be written: None for a local path, the options for
    ``s3://``; an ``http(s)://`` URL is refused (a web server is read-only)."""
    if isinstance(path, str) and path.startswith(("http://", "https://")):
        raise ValueError(f"{path}: http(s):// stores are read-only; write to a directory or to "
                         "s3://bucket/prefix")
    return remote_options(path, storage_options)


def aws_profile(profile: Optional[str] = None,
                environ: Optional[Mapping[str, str]] = None) -> dict:
    """What the AWS shared files say for ``profile`` (None: ``AWS_PROFILE``, else
    ``default``): a dict with the keys found among access_key_id, secret_access_key,
    session_token, region and endpoint_url. A profile named explicitly (argument or
    ``AWS_PROFILE``) that neither file has is a ValueError naming the profile and both files;
    the ``default`` profile may be absent (nothing is read then)."""
    from . import _zbatch
    env = os.environ if environ is None else environ
    named = profile if profile is not None else (env.get("AWS_PROFILE")
                                                 or env.get("AWS_DEFAULT_PROFILE"))
    cred = os.path.expanduser(env.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials")
    conf = os.path.expanduser(env.get("AWS_CONFIG_FILE") or "~/.aws/config")
    p = _zbatch.aws_profile(cred, conf, named or "default")
    if named and not p["found"]:
        raise ValueError(f"AWS profile {named!r} is in neither {cred} nor {conf}")
    return p
