"""Loopback servers for the remote-store tests and bench/remote.py.

Three real components, each started on 127.0.0.1 on a free port, in a temporary directory, and
stopped cleanly (every wait is bounded):

- ``NginxServer``: Debian's nginx serving a directory (range requests, HEAD, keep-alive), with an
  optional fixed latency added to every request by nginx-extras' echo module (``echo_sleep``, then
  ``echo_exec`` to the static-file location). Its access log records each request's end time,
  duration, status and body size, from which ``request_stats`` derives requests/s, bytes per
  request and requests in flight.
- ``MotoServer``: moto's standalone S3 server (``ThreadedMotoServer`` in a child process) that
  checks AWS Signature V4: an IAM user with full S3 rights is made first, then moto is told to
  authenticate every later request (a wrong secret gets 403 SignatureDoesNotMatch).
  ``upload_directory`` copies a local store into a bucket with boto3.
- ``FaultProxy``: an HTTP/1.1 proxy (asyncio, in a child process of its own so that it never
  competes for the caller's GIL) in front of any HTTP server. At chosen rates it answers 500, 429
  or 503 (with S3's SlowDown body), resets the connection, stalls longer than any client timeout,
  truncates the body, sends more body than was asked for, or adds latency; it can add a fixed
  latency to every request. Faults are deterministic for a seed: the decision for a request is a
  hash of (seed, method, path, Range, how many times that request was seen before), so a retry
  draws afresh and a rerun repeats the same faults whatever the interleaving. It counts what it
  injected; ``stats()`` and ``configure()`` talk to it over its control path ``/__faults__``.

Nothing here needs root; when run as root, nginx's workers stay root so that they can read
pytest's private (0700) temporary directories.

Run as a script, this file is the proxy's child process:
    python remote_servers.py proxy --upstream http://127.0.0.1:PORT [--port 0]
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

NGINX = "/usr/sbin/nginx"
ECHO_MODULE = "/usr/lib/nginx/modules/ngx_http_echo_module.so"
LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0
CONTROL_PATH = "/__faults__"
FAULT_KINDS = ("500", "429", "503", "reset", "stall", "truncate", "overlong", "latency")
SLOWDOWN_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
                 b"<Message>Please reduce your request rate.</Message>"
                 b"<RequestId>zbatch-fault-proxy</RequestId></Error>")


# ------------------------------------------------------------------------------------------------
# Shared helpers
# ------------------------------------------------------------------------------------------------
def free_port() -> int:
    """A TCP port on loopback that was free a moment ago (callers retry if it is taken since)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, what: str, log: Path | None,
               timeout: float = START_TIMEOUT_S) -> None:
    """Waits until `port` accepts a connection; fails with the server's log if `proc` exits or
    the wait runs past `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} at start"
                               f"{_log_tail(log)}")
        with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), 0.2):
            return
        time.sleep(0.02)
    _stop_process(proc)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout:.0f} s"
                       f"{_log_tail(log)}")


def _log_tail(log: Path | None) -> str:
    if log is None or not log.exists():
        return ""
    return ":\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])


def _stop_process(proc: subprocess.Popen | None, sig: int = signal.SIGTERM) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(STOP_TIMEOUT_S)


class _Server:
    """start()/stop() and the context-manager protocol for the three servers."""

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()


# ------------------------------------------------------------------------------------------------
# nginx
# ------------------------------------------------------------------------------------------------
def nginx_missing_reason() -> str | None:
    """Why the nginx server cannot run here (None when it can): the binary or the echo module
    (Debian's nginx-extras, installed by scripts/install-deps.sh) is missing."""
    if not os.access(NGINX, os.X_OK):
        return f"{NGINX} missing (apt-get install nginx-extras; scripts/install-deps.sh does it)"
    if not os.path.exists(ECHO_MODULE):
        return f"{ECHO_MODULE} missing (the echo module comes with Debian's nginx-extras)"
    return None


# One line per request: end time (s, ms resolution), duration (s), status, body bytes, the
# connection's serial number and its request count, method, URI and the Range header.
_LOG_FORMAT = ('$msec $request_time $status $body_bytes_sent $connection $connection_requests '
               '"$request_method" "$uri" "$http_range"')
_LOG_LINE = re.compile(r'(\S+) (\S+) (\d+) (\d+) (\d+) (\d+) "([^"]*)" "([^"]*)" "([^"]*)"')


@dataclass(frozen=True)
class RequestRecord:
    """One request as a server saw it: [start, end) in seconds since the epoch."""
    start: float
    end: float
    status: int
    nbytes: int
    connection: int
    method: str
    path: str
    range: str


class NginxServer(_Server):
    """nginx serving directory `root` on loopback.

    latency_ms: added to every request (GET and HEAD) by ``echo_sleep`` before the file is
    served; 0 serves straight from the static handler. workers: nginx worker processes.
    redirects: {path prefix: status or (status, target)}: a request for /PREFIX/REST is answered
    with that status (301, 302, 303, 307 or 308) and ``Location: TARGET/REST`` (nginx's
    ``return``); TARGET is "" (this server's root), another prefix, or an absolute URL.
    """

    def __init__(self, root, *, latency_ms: float = 0.0, workers: int = 1, workdir=None,
                 redirects: dict | None = None):
        self.redirects = dict(redirects or {})
        reason = nginx_missing_reason()
        if reason:
            raise RuntimeError(reason)
        self.root = Path(root).resolve()
        self.latency_ms = float(latency_ms)
        self.workers = int(workers)
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="zb-nginx-"))
        self.access_log = self.workdir / "access.log"
        self.error_log = self.workdir / "error.log"
        self.port = 0
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def _config(self) -> str:
        wd = self.workdir
        # Running as root, nginx would hand its workers to "nobody", who cannot read pytest's
        # 0700 temporary directories.
        user = "user root root;" if os.geteuid() == 0 else ""
        temp = " ".join(f"{d}_temp_path {wd}/{d};"
                        for d in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        if self.latency_ms > 0:
            # echo_sleep takes seconds with at most three decimals (whole milliseconds).
            serve = (f"location / {{ echo_sleep {self.latency_ms / 1000:.3f}; "
                     f"echo_exec @files; }}\n    location @files {{ }}")
        else:
            serve = "location / { }"
        for prefix, how in self.redirects.items():
            status, target = (how, "") if isinstance(how, int) else how
            target = target if target.startswith("http") else "/" + target.strip("/")
            serve += (f"\n    location ~ ^/{prefix}/(.*)$ {{ "
                      f"return {int(status)} {target.rstrip('/')}/$1; }}")
        return f"""
load_module {ECHO_MODULE};
{user}
worker_processes {self.workers};
pid {wd}/nginx.pid;
error_log {self.error_log} warn;
daemon off;
events {{ worker_connections 4096; }}
http {{
  log_format zb '{_LOG_FORMAT}';
  access_log {self.access_log} zb;
  default_type application/octet-stream;
  sendfile on;
  tcp_nodelay on;
  keepalive_timeout 75s;
  keepalive_requests 1000000;
  {temp}
  server {{
    listen {LOOPBACK}:{self.port} reuseport;
    root {self.root};
    autoindex off;
    {serve}
  }}
}}
"""

    def start(self) -> "NginxServer":
        for _attempt in range(5):
            self.port = free_port()
            conf = self.workdir / "nginx.conf"
            conf.write_text(self._config())
            self.access_log.write_text("")
            self._proc = subprocess.Popen(
                [NGINX, "-p", str(self.workdir), "-c", str(conf), "-e", str(self.error_log)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            try:
                _wait_port(self.port, self._proc, "nginx", self.error_log)
                return self
            except RuntimeError as exc:
                if "Address already in use" not in str(exc):
                    raise
        raise RuntimeError("nginx: no free port after 5 tries")

    def stop(self) -> None:
        # SIGQUIT: graceful; SIGTERM: fast shutdown. Connections a client left open would hold a
        # graceful shutdown, so use the fast one.
        _stop_process(self._proc, signal.SIGTERM)
        self._proc = None
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def log_offset(self) -> int:
        """The access log's size now: pass it to ``requests`` to see only later requests."""
        return self.access_log.stat().st_size

    def requests(self, since: int = 0, count: int | None = None) -> list[RequestRecord]:
        """Every request logged after byte offset `since` of the access log.

        nginx logs a request after its response has gone out, so a client that has just read
        its last response can look before that line is written. With `count`, wait (up to 10 s)
        until that many requests are logged; without, until the log has not grown for 50 ms.
        """
        deadline, last, stable_since = time.monotonic() + 10, -1, time.monotonic()
        while True:
            with open(self.access_log, "rb") as f:
                f.seek(since)
                text = f.read().decode(errors="replace")
            now = time.monotonic()
            if len(text) != last:
                last, stable_since = len(text), now
            if count is not None:
                if text.count("\n") >= count or now > deadline:
                    break
            elif now - stable_since >= 0.05 or now > deadline:
                break
            time.sleep(0.005)
        out = []
        for line in text.splitlines():
            m = _LOG_LINE.fullmatch(line)
            if not m:
                continue
            end, dur = float(m[1]), float(m[2])
            out.append(RequestRecord(end - dur, end, int(m[3]), int(m[4]), int(m[5]), m[7],
                                     m[8], "" if m[9] == "-" else m[9]))
        return out


def request_stats(records, window: tuple[float, float] | None = None) -> dict:
    """Requests, requests/s, body bytes per request, and requests in flight (time-weighted mean,
    and the maximum) of a list of ``RequestRecord``.

    window: (t0, t1) in seconds since the epoch: count only the requests that end inside it and
    rate them, and the time they were in flight, against t1 - t0. Default: the span from the
    first start to the last end.
    """
    records = list(records)
    if window is not None:
        t0, t1 = window
        records = [r for r in records if t0 <= r.end <= t1]
    else:
        t0 = min((r.start for r in records), default=0.0)
        t1 = max((r.end for r in records), default=0.0)
    if not records:
        return {"requests": 0, "requests_per_s": 0.0, "bytes": 0, "bytes_per_request": 0.0,
                "in_flight_mean": 0.0, "in_flight_max": 0, "connections": 0}
    wall = t1 - t0
    nbytes = sum(r.nbytes for r in records)
    # In flight: sweep the starts and ends (an end before a start at the same instant).
    events = sorted([(max(r.start, t0), 1) for r in records] + [(r.end, -1) for r in records])
    cur = peak = 0
    for _t, d in events:
        cur += d
        peak = max(peak, cur)
    busy = sum(r.end - max(r.start, t0) for r in records)
    return {"requests": len(records),
            "requests_per_s": len(records) / wall if wall > 0 else float("inf"),
            "bytes": nbytes,
            "bytes_per_request": nbytes / len(records),
            "in_flight_mean": busy / wall if wall > 0 else float(len(records)),
            "in_flight_max": peak,
            "connections": len({r.connection for r in records})}


# ------------------------------------------------------------------------------------------------
# moto (S3 with Signature V4)
# ------------------------------------------------------------------------------------------------
_MOTO_CHILD = """
import sys
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()  # until the parent closes the pipe (or dies)
server.stop()
"""

_S3_POLICY = json.dumps({"Version": "2012-10-17",
                         "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]})


class MotoServer(_Server):
    """moto's S3 server on loopback that authenticates every request with SigV4.

    After ``start()``: ``endpoint_url``, ``access_key``, ``secret_key`` and ``region`` are the
    credentials of an IAM user allowed ``s3:*``; ``client()`` is a boto3 S3 client with them
    (path-style addressing); ``storage_options()`` the same as fsspec/s3fs keys.
    """

    region = "us-east-1"

    def __init__(self, *, authenticate: bool = True):
        self.authenticate = authenticate
        self.port = 0
        self.access_key = self.secret_key = ""
        self._proc: subprocess.Popen | None = None
        self._log = Path(tempfile.mkstemp(prefix="zb-moto-", suffix=".log")[1])

    @property
    def endpoint_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> "MotoServer":
        env = dict(os.environ)
        for k in list(env):  # the child must not pick up a real account by accident
            if k.startswith("AWS_"):
                del env[k]
        with open(self._log, "wb") as log:
            self._proc = subprocess.Popen([sys.executable, "-c", _MOTO_CHILD], env=env,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=log)
        line = _readline_bounded(self._proc, START_TIMEOUT_S)
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"moto server did not start (said {line!r}){_log_tail(self._log)}")
        self.port = int(line)
        _wait_port(self.port, self._proc, "moto server", self._log)
        self._make_user()
        return self

    def _make_user(self) -> None:
        import boto3
        iam = boto3.client("iam", endpoint_url=self.endpoint_url, region_name=self.region,
                           aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
        iam.create_user(UserName="zbatch")
        iam.put_user_policy(UserName="zbatch", PolicyName="s3", PolicyDocument=_S3_POLICY)
        key = iam.create_access_key(UserName="zbatch")["AccessKey"]
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]
        if self.authenticate:
            # From now on moto checks every request's signature against IAM's keys.
            req = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset-auth", data=b"0",
                                         method="POST",
                                         headers={"Content-Type": "text/plain"})
            with urllib.request.urlopen(req, timeout=10) as r:
                assert r.status == 200

    def stop(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
            try:
                self._proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _stop_process(self._proc)
            self._proc.stdout.close()
            self._proc = None
        self._log.unlink(missing_ok=True)

    def client(self, *, secret_key: str | None = None, endpoint_url: str | None = None):
        """A boto3 S3 client (path-style) with this server's credentials (or another secret)."""
        import boto3
        from botocore.config import Config
        return boto3.client(
            "s3", endpoint_url=endpoint_url or self.endpoint_url, region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key if secret_key is None else secret_key,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))

    def storage_options(self, endpoint_url: str | None = None) -> dict:
        """The fsspec/s3fs ``storage_options`` for this server."""
        return {"key": self.access_key, "secret": self.secret_key,
                "endpoint_url": endpoint_url or self.endpoint_url,
                "client_kwargs": {"region_name": self.region}}


def _readline_bounded(proc: subprocess.Popen, timeout: float) -> str:
    """The child's first stdout line, or '' after `timeout` seconds."""
    import selectors
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            return ""
    return proc.stdout.readline().decode(errors="replace")


def upload_directory(client, local_dir, bucket: str, prefix: str = "", *,
                     create_bucket: bool = True) -> list[str]:
    """Copies every file under `local_dir` to s3://bucket/prefix/<relative path> with the boto3
    `client`; returns the keys written, sorted."""
    local_dir = Path(local_dir)
    if create_bucket:
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=bucket)
    keys = []
    for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(local_dir).as_posix()
        key = f"{prefix.strip('/')}/{rel}" if prefix.strip("/") else rel
        client.upload_file(str(path), bucket, key)
        keys.append(key)
    return sorted(keys)


# ------------------------------------------------------------------------------------------------
# The fault-injecting proxy: the parent's handle
# ------------------------------------------------------------------------------------------------
class FaultProxy(_Server):
    """A fault-injecting HTTP/1.1 proxy on loopback in front of `upstream` (a URL).

    rates: {kind: probability} for kinds in FAULT_KINDS (their sum at most 1). latency_s: added to
    every request; fault_latency_s: what a "latency" fault adds; stall_s: how long a "stall" holds
    the connection before closing it; overlong_bytes: what an "overlong" fault appends;
    max_faults_per_request: at most this many faults for one (method, path, Range), so that a
    client with that many retries always succeeds (None: no cap); path_pattern: a regular
    expression; only requests whose path it matches (re.search) draw faults.
    """

    def __init__(self, upstream: str, *, seed: int = 0, rates: dict | None = None,
                 latency_s: float = 0.0, fault_latency_s: float = 0.2, stall_s: float = 30.0,
                 overlong_bytes: int = 16, max_faults_per_request: int | None = None,
                 path_pattern: str | None = None):
        self.upstream = upstream
        self.config = {"seed": seed, "rates": dict(rates or {}), "latency_s": latency_s,
                       "fault_latency_s": fault_latency_s, "stall_s": stall_s,
                       "overlong_bytes": overlong_bytes,
                       "max_faults_per_request": max_faults_per_request,
                       "path_pattern": path_pattern}
        _check_config(self.config)
        self.port = 0
        self._proc: subprocess.Popen | None = None
        self._log = Path(tempfile.mkstemp(prefix="zb-proxy-", suffix=".log")[1])

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> "FaultProxy":
        with open(self._log, "wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "proxy",
                 "--upstream", self.upstream, "--config", json.dumps(self.config)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        line = _readline_bounded(self._proc, START_TIMEOUT_S)
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"fault proxy did not start (said {line!r}){_log_tail(self._log)}")
        self.port = int(line)
        return self

    def stop(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
            _stop_process(self._proc)
            self._proc.stdout.close()
            self._proc = None
        self._log.unlink(missing_ok=True)

    def _control(self, method: str, doc: dict | None = None) -> dict:
        data = json.dumps(doc).encode() if doc is not None else None
        req = urllib.request.Request(self.url + CONTROL_PATH, data=data, method=method)
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def stats(self) -> dict:
        """What the proxy saw since the last reset: requests, injected {kind: n}, status
        {code: n} of the answers, bytes sent to clients, in_flight_max, in_flight_mean (over the
        time since the first request), seconds."""
        return self._control("GET")

    def configure(self, reset: bool = True, **changes) -> dict:
        """Changes settings (the constructor's keywords) and, by default, zeroes the counters and
        the per-request draw history, so that the same seed draws the same faults again."""
        self.config.update(changes)
        _check_config(self.config)
        return self._control("PUT", {"config": self.config, "reset": reset})

    def reset(self) -> dict:
        return self.configure(reset=True)


def _check_config(cfg: dict) -> None:
    unknown = set(cfg["rates"]) - set(FAULT_KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {FAULT_KINDS}")
    if any(r < 0 for r in cfg["rates"].values()) or sum(cfg["rates"].values()) > 1 + 1e-9:
        raise ValueError(f"fault rates must be >= 0 and sum to at most 1: {cfg['rates']}")


# ------------------------------------------------------------------------------------------------
# The fault-injecting proxy: the child process (asyncio)
# ------------------------------------------------------------------------------------------------
_HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te",
                "trailer", "upgrade", "content-length", "expect"}


class _Closed(Exception):
    """The peer closed the connection between requests."""


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, list[tuple[str, str]]]:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise _Closed() from None
        raise
    lines = raw.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers.append((name.strip(), value.strip()))
    return lines[0], headers


def _header(headers, name: str) -> str | None:
    name = name.lower()
    for k, v in headers:
        if k.lower() == name:
            return v
    return None


async def _read_body(reader, headers, *, until_close: bool = False) -> bytes:
    """A message body by Content-Length, chunked coding (decoded) or, for a response without
    either, until the connection closes."""
    te = (_header(headers, "transfer-encoding") or "").lower()
    if "chunked" in te:
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                    pass
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
    length = _header(headers, "content-length")
    if length is not None:
        return await reader.readexactly(int(length))
    return await reader.read() if until_close else b""


class _ProxyState:
    def __init__(self, upstream: str, config: dict):
        u = urlsplit(upstream)
        self.up_host, self.up_port = u.hostname, u.port or 80
        self.apply(config, reset=True)

    def apply(self, config: dict, reset: bool) -> None:
        self.config = config
        self.pattern = re.compile(config["path_pattern"]) if config.get("path_pattern") else None
        if reset:
            self.seen: dict[str, int] = {}
            self.faulted: dict[str, int] = {}
            self.requests = 0
            self.injected = {k: 0 for k in FAULT_KINDS}
            self.status: dict[str, int] = {}
            self.bytes_out = 0
            self.in_flight = self.in_flight_max = 0
            self.t0 = None
            self.t_last = 0.0
            self.area = 0.0  # integral of in_flight over time

    def _tick(self, delta: int) -> None:
        now = time.monotonic()
        if self.t0 is None:
            self.t0 = self.t_last = now
        self.area += self.in_flight * (now - self.t_last)
        self.t_last = now
        self.in_flight += delta
        self.in_flight_max = max(self.in_flight_max, self.in_flight)

    def draw(self, method: str, path: str, rng: str) -> str | None:
        """The fault for this request (None: forward it), from hash(seed, request, attempt)."""
        key = f"{method} {path} {rng}"
        n = self.seen.get(key, 0)
        self.seen[key] = n + 1
        cfg = self.config
        if self.pattern is not None and not self.pattern.search(path):
            return None
        cap = cfg.get("max_faults_per_request")
        if cap is not None and self.faulted.get(key, 0) >= cap:
            return None
        digest = hashlib.blake2b(f"{cfg['seed']}|{key}|{n}".encode(), digest_size=8).digest()
        u = int.from_bytes(digest, "little") / 2.0**64
        acc = 0.0
        for kind in FAULT_KINDS:
            acc += cfg["rates"].get(kind, 0.0)
            if u < acc:
                self.faulted[key] = self.faulted.get(key, 0) + 1
                return kind
        return None

    def snapshot(self) -> dict:
        now = time.monotonic()
        elapsed = (now - self.t0) if self.t0 is not None else 0.0
        area = self.area + self.in_flight * (now - self.t_last) if self.t0 is not None else 0.0
        return {"requests": self.requests, "injected": dict(self.injected),
                "status": dict(self.status), "bytes_out": self.bytes_out,
                "in_flight": self.in_flight, "in_flight_max": self.in_flight_max,
                "in_flight_mean": area / elapsed if elapsed > 0 else 0.0, "seconds": elapsed,
                "config": self.config}


def _response(status: int, reason: str, body: bytes, headers=(), keep_alive=True) -> bytes:
    head = [f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(body)}",
            f"Connection: {'keep-alive' if keep_alive else 'close'}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def _reset(writer: asyncio.StreamWriter) -> None:
    """Closes with a TCP RST (SO_LINGER 0) instead of an orderly FIN."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    writer.transport.abort()


class _Upstream:
    """One keep-alive connection to the upstream server, reopened when it closes."""

    def __init__(self, state: _ProxyState):
        self.state = state
        self.reader = self.writer = None

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
        self.reader = self.writer = None

    async def exchange(self, head: bytes, body: bytes, method: str):
        """Sends one request; returns (status line, headers, body). A stale kept-alive
        connection is retried once on a fresh one."""
        for attempt in (0, 1):
            fresh = self.writer is None
            if fresh:
                self.reader, self.writer = await asyncio.open_connection(
                    self.state.up_host, self.state.up_port, limit=1 << 20)
            try:
                self.writer.write(head + body)
                await self.writer.drain()
                status_line, headers = await _read_head(self.reader)
            except (_Closed, ConnectionError, asyncio.IncompleteReadError):
                await self.close()
                if fresh or attempt:
                    raise
                continue
            code = int(status_line.split()[1])
            no_body = method == "HEAD" or code in (204, 304) or 100 <= code < 200
            conn = (_header(headers, "connection") or "").lower()
            until_close = conn == "close" or status_line.startswith("HTTP/1.0")
            data = b"" if no_body else await _read_body(self.reader, headers,
                                                        until_close=until_close)
            if until_close:
                await self.close()
            return status_line, headers, data
        raise AssertionError("unreachable")


async def _handle_control(state, method, body, writer) -> None:
    if method == "PUT":
        doc = json.loads(body or b"{}")
        state.apply(doc["config"], reset=doc.get("reset", True))
    writer.write(_response(200, "OK", json.dumps(state.snapshot()).encode(),
                           ["Content-Type: application/json"]))
    await writer.drain()


async def _serve_one(state: _ProxyState, up: _Upstream, reader, writer) -> bool:
    """Serves one request on a client connection; False when the connection must end."""
    request_line, headers = await _read_head(reader)
    method, target, _version = request_line.split(" ", 2)
    if (_header(headers, "expect") or "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # the body comes after this
    body = await _read_body(reader, headers)
    path = urlsplit(target).path
    if path == CONTROL_PATH:
        await _handle_control(state, method, body, writer)
        return True
    client_close = (_header(headers, "connection") or "").lower() == "close"
    state.requests += 1
    state._tick(+1)
    try:
        return await _forward(state, up, writer, method, target, path, headers, body,
                              client_close)
    finally:
        state._tick(-1)


async def _forward(state, up, writer, method, target, path, headers, body, client_close):
    cfg = state.config
    fault = state.draw(method, path, _header(headers, "range") or "")
    if cfg["latency_s"] > 0:
        await asyncio.sleep(cfg["latency_s"])
    if fault is not None and fault not in ("truncate", "overlong"):
        state.injected[fault] += 1
    if fault in ("500", "429", "503"):
        body_out = SLOWDOWN_BODY if fault == "503" else f"injected {fault}\n".encode()
        extra = ["Content-Type: application/xml"] if fault == "503" else []
        reason = {"500": "Internal Server Error", "429": "Too Many Requests",
                  "503": "Slow Down"}[fault]
        state.status[fault] = state.status.get(fault, 0) + 1
        writer.write(_response(int(fault), reason, body_out, extra, keep_alive=not client_close))
        await writer.drain()
        return not client_close
    if fault == "reset":
        _reset(writer)
        return False
    if fault == "stall":
        await asyncio.sleep(cfg["stall_s"])
        _reset(writer)
        return False
    if fault == "latency":
        await asyncio.sleep(cfg["fault_latency_s"])

    lines = [f"{method} {target} HTTP/1.1"]
    lines += [f"{k}: {v}" for k, v in headers if k.lower() not in _HOP_HEADERS]
    lines += [f"Content-Length: {len(body)}"] if body or method in ("PUT", "POST") else []
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    status_line, rheaders, data = await up.exchange(head, body, method)
    code = status_line.split()[1]
    state.status[code] = state.status.get(code, 0) + 1

    declared = _header(rheaders, "content-length") if method == "HEAD" else str(len(data))
    out_body = data
    cut = None
    if fault == "truncate" and data:
        cut = len(data) // 2
        state.injected["truncate"] += 1
    elif fault == "overlong" and method != "HEAD" and code[0] == "2":
        out_body = data + bytes(cfg["overlong_bytes"])
        declared = str(len(out_body))
        state.injected["overlong"] += 1
    keep = not client_close and cut is None
    out = [status_line]
    out += [f"{k}: {v}" for k, v in rheaders if k.lower() not in _HOP_HEADERS]
    if declared is not None:
        out.append(f"Content-Length: {declared}")
    out.append(f"Connection: {'keep-alive' if keep else 'close'}")
    writer.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1"))
    writer.write(out_body if cut is None else out_body[:cut])
    state.bytes_out += len(out_body) if cut is None else cut
    await writer.drain()
    if cut is not None:
        writer.close()  # an orderly close: the client sees fewer bytes than Content-Length
    return keep


async def _client(state: _ProxyState, reader, writer) -> None:
    up = _Upstream(state)
    try:
        while await _serve_one(state, up, reader, writer):
            pass
    except (_Closed, ConnectionError, asyncio.IncompleteReadError):
        pass
    except Exception as exc:  # noqa: BLE001 - one bad exchange must not stop the proxy
        print(f"fault proxy: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):
            writer.write(_response(502, "Bad Gateway", f"{exc}\n".encode(), keep_alive=False))
            await writer.drain()
    finally:
        await up.close()
        with contextlib.suppress(Exception):
            writer.close()


async def _proxy_main(upstream: str, config: dict, port: int) -> None:
    state = _ProxyState(upstream, config)
    server = await asyncio.start_server(lambda r, w: _client(state, r, w), LOOPBACK, port,
                                        limit=1 << 20, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def finish():
        if not done.done():
            done.set_result(0)
    # The parent holds our stdin: EOF means it stopped us or died.
    loop.add_reader(sys.stdin.fileno(), finish)
    loop.add_signal_handler(signal.SIGTERM, finish)
    await done
    # Not `async with server`: its wait_closed() would wait for clients' open connections
    # (a stalled one for stall_s); asyncio.run cancels those tasks instead.
    server.close()


def main(argv: list[str]) -> int:
    import argparse
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    px = sub.add_parser("proxy", help="run the fault-injecting proxy (prints its port)")
    px.add_argument("--upstream", required=True)
    px.add_argument("--port", type=int, default=0)
    px.add_argument("--config", default="{}", help="JSON: FaultProxy's settings")
    args = p.parse_args(argv)
    config = {"seed": 0, "rates": {}, "latency_s": 0.0, "fault_latency_s": 0.2, "stall_s": 30.0,
              "overlong_bytes": 16, "max_faults_per_request": None, "path_pattern": None}
    config.update(json.loads(args.config))
    _check_config(config)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_proxy_main(args.upstream, config, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
