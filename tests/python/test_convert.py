"""zbatch convert / zb_store_copy: re-encoded stores keep every value and attribute; anndata
opens the result with equal X, obs and var."""
import subprocess
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import zarr

CLI = str(Path(__file__).resolve().parents[2] / "build" / "zbatch")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    rng = np.random.default_rng(3)
    X = sp.random(300, 120, density=0.1, format="csr", dtype=np.float32, random_state=3)
    obs = pd.DataFrame({"ct": pd.Categorical(rng.choice(["a", "b", "c"], 300)),
                        "n": rng.integers(0, 9, 300), "ok": rng.random(300) > 0.5},
                       index=[f"c{i}" for i in range(300)])
    var = pd.DataFrame({"g": np.arange(120, dtype=np.int16)}, index=[f"g{i}" for i in range(120)])
    a = ad.AnnData(X=X, obs=obs, var=var)
    p = tmp_path_factory.mktemp("conv") / "src.zarr"
    with ad.settings.override(zarr_write_format=3):
        a.write_zarr(p)
    return a, p


@pytest.mark.parametrize("codec,fmt", [("none", "v3"), ("blosc:lz4:5:shuffle", "v2"),
                                       ("zstd:1", "v3"), ("gzip:1", "v2")])
def test_convert_anndata(source, tmp_path, codec, fmt):
    a, p = source
    out = tmp_path / "out.zarr"
    r = subprocess.run([CLI, "convert", str(p), str(out), "--codec", codec, "--format", fmt,
                        "--chunk-bytes", "4096"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    b = ad.read_zarr(out)
    assert (a.X != b.X).nnz == 0 and b.X.shape == a.X.shape
    pd.testing.assert_frame_equal(a.obs, b.obs)
    pd.testing.assert_frame_equal(a.var, b.var)
    x = zarr.open_array(out / "X" / "data", mode="r")
    assert x.metadata.zarr_format == (2 if fmt == "v2" else 3)
    assert x.chunks[0] == 1024  # 4096 bytes of float32 rows


def test_convert_refuses_existing_and_bad_usage(source, tmp_path):
    _, p = source
    r = subprocess.run([CLI, "convert", str(p), str(p)], capture_output=True, text=True)
    assert r.returncode == 1 and "exists" in r.stderr
    r = subprocess.run([CLI, "convert", str(p)], capture_output=True, text=True)
    assert r.returncode == 2
    r = subprocess.run([CLI, "convert", str(p), str(tmp_path / "x"), "--format", "v4"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "v2 or v3" in r.stderr
