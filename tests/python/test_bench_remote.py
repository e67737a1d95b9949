"""bench/remote.py's own parts: the zarr-python peer over HTTP reads the same CSR rows as
zarr-python locally, its block order visits every row once in contiguous blocks, and the summary
divides the right rows."""
from __future__ import annotations

import sys

import numpy as np
import scipy.sparse as sp
import zarr

from conftest import REPO

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from bench import remote  # noqa: E402


def test_zarr_rows_over_nginx_equal_local_csr(tmp_path, nginx_serve):
    rng = np.random.default_rng(0)
    x = sp.random(300, 50, density=0.1, format="csr", random_state=1, dtype=np.float32)
    g = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    xg = g.create_group("X")
    for name in ("data", "indices", "indptr"):
        xg.create_array(name, data=getattr(x, name), chunks=(64,))
    zarr.consolidate_metadata(str(tmp_path / "s.zarr"))
    server = nginx_serve(tmp_path)
    ds = remote.ZarrRows(server.url + "/s.zarr", 300, 50)
    ids = rng.choice(300, 40, replace=False)
    got = remote.CsrCollate(50)([ds[int(i)] for i in ids])
    want = x[ids]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.indptr, want.indptr)
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_array_equal(got.data, want.data)
    assert len(server.requests()) > 0


def test_block_order_visits_every_row_once_in_blocks():
    order = remote.BlockOrder(100, 16, seed=3)
    rows = list(order)
    assert sorted(rows) == list(range(100))
    p, starts = 0, []
    while p < len(rows):  # each block: a start at a multiple of 16, then its rows in order
        s = rows[p]
        n = min(16, 100 - s)
        assert s % 16 == 0 and rows[p:p + n] == list(range(s, s + n))
        starts.append(s)
        p += n
    assert sorted(starts) == list(range(0, 100, 16)) and starts != sorted(starts)
    order.set_epoch(1)
    assert list(order) != rows


def test_summary_ratios():
    rows = [{"tool": "zbatch", "where": "local", "sampler": "block", "latency_ms": None,
             "samples_per_s": 1000.0},
            {"tool": "zbatch", "where": "http", "sampler": "block", "latency_ms": 25,
             "threads": 2, "samples_per_s": 850.0},
            {"tool": "zbatch", "where": "http", "sampler": "block", "latency_ms": 25,
             "threads": 64, "samples_per_s": 990.0},
            {"tool": "zarr", "where": "http", "sampler": "block", "latency_ms": 25,
             "workers": 2, "samples_per_s": 20.0},
            {"tool": "zarr", "where": "http", "sampler": "block", "latency_ms": 25,
             "workers": 8, "samples_per_s": 50.0}]
    s = remote.summarize(rows, [25], ["block"], threads=2)
    (r,) = s["ratios"]
    assert r["http_over_local"] == 0.85 and r["zbatch_over_zarr"] == 17.0  # zarr: its best
    assert "met" in s["lines"][0] and "NOT met" not in s["lines"][0]


def test_summary_of_epoch_rounds_uses_medians():
    """--epochs rows: first epoch, its steady part and cached apart, the medians over the
    rounds (a round disturbed by load does not decide), the startups beside them, zarr-python
    at its best worker count."""
    def row(where, lat, first, cached, steady, startup):
        return {"tool": "zbatch", "where": where, "sampler": "random", "latency_ms": lat,
                "threads": 2, "first_per_s": first, "cached_per_s": cached,
                "steady_per_s": steady, "startup_s": startup}
    rows = [row("local", None, 1000.0, 2000.0, 1200.0, 0.2),
            row("local", None, 100.0, 2200.0, 1000.0, 0.1),
            row("local", None, 1100.0, 1800.0, 1500.0, 0.3),
            row("http", 25, 900.0, 1700.0, 1100.0, 0.6), row("http", 25, 800.0, 50.0, 10.0, 0.4),
            row("http", 25, 990.0, 1900.0, 1150.0, 0.5),
            {"tool": "zarr", "where": "http", "sampler": "random", "latency_ms": 25,
             "workers": 8, "samples_per_s": 30.0}]
    s = remote.summarize(rows, [25], ["random"], threads=2)
    (r,) = s["ratios"]
    assert r["first_http_over_local"] == 900.0 / 1000.0
    assert r["cached_http_over_local"] == 1700.0 / 2000.0
    assert r["first_zbatch_over_zarr"] == 900.0 / 30.0
    assert r["steady_http_over_local"] == 1100.0 / 1200.0
    assert (r["startup_s_local"], r["startup_s_http"]) == (0.2, 0.5)
    (line,) = s["lines"]
    assert "first met" in line and "steady met" in line and "cached met" in line
    assert "startup 0.20 s local, 0.50 s http" in line


def test_epochs_report_the_first_epochs_steady_part_and_startup_apart(tmp_path):
    """run_epochs (the --epochs rows): every epoch delivers every sample once; the first
    epoch's startup runs from before the open to its first batch, and its steady rate is the
    samples after that batch over the time after it (the figures add up to the epoch)."""
    from conftest import run_cli
    store = tmp_path / "cells.zarr"
    out = run_cli("synth", "--kind", "cells", "--n", "1500", "-o", store, "--seed", "1")
    assert out.returncode == 0, out.stderr
    r = remote.run_epochs({"target": str(store), "batch_size": 100, "sampler": "block",
                           "threads": 2, "seed": 0, "epochs": 2})
    assert [e["samples"] for e in r["epochs"]] == [1500, 1500]
    first = r["epochs"][0]
    t0, t_end = first["span"]
    t_first, t_end2 = first["steady_span"]
    assert t_end2 == t_end and t0 < t_first < t_end
    assert first["startup_s"] == t_first - t0 and 0 < r["open_s"] < first["startup_s"]
    assert first["steady_per_s"] == (1500 - 100) / (t_end - t_first)
