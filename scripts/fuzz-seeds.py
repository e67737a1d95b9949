#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/NAME/seed-*) from real stores:
arrays and AnnData stores written by zarr-python 3.1 and anndata 0.12 (v2 and v3, every codec,
sharding, transpose, strings), atomistic stores written by `zbatch synth`, encoded chunks from
numcodecs. Run from the repository root after a build (the CLI is build/zbatch):

    .venv/bin/python scripts/fuzz-seeds.py

Inputs of crashes (crash-*, oom-*, timeout-*, leak-*) already in the corpus folders are kept:
they are the regression tests. The seeds are deterministic, so a rerun changes nothing."""
from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numcodecs
import numpy as np
import zarr
import zarr.codecs as zc

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "tests" / "fuzz" / "corpus"
warnings.filterwarnings("ignore")


def save(target: str, blob: bytes) -> None:
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / f"seed-{hashlib.sha1(blob).hexdigest()[:16]}").write_bytes(blob)


def serialise(root: Path, skip=()) -> bytes:
    """A store directory as fuzz_store_from reads it (tests/fuzz/fuzz_common.h)."""
    out = bytearray()
    for p in sorted(root.rglob("*")):
        if not p.is_file():
            continue
        key = p.relative_to(root).as_posix()
        if any(key.startswith(s) for s in skip) or len(key.encode()) > 255:
            continue
        data = p.read_bytes()
        out += bytes([len(key.encode())]) + key.encode() + struct.pack("<I", len(data)) + data
    return bytes(out + b"\0")


def arrays(tmp: Path):
    """(name, directory, zarr_format) of small root arrays covering the codec chains."""
    rng = np.random.default_rng(0)
    f4 = rng.standard_normal((6, 5)).astype("float32")
    i8 = rng.integers(-1000, 1000, (9, 3)).astype(">i8")
    strs = np.array(["a", "bé", "", "longer string", "x" * 40, "z"], dtype=object)
    specs = [
        ("v3_plain", 3, f4, dict(chunks=(4, 5), compressors=None)),
        ("v3_zstd", 3, f4, dict(chunks=(2, 5), compressors=zc.ZstdCodec(level=3, checksum=True))),
        ("v3_gzip_crc", 3, i8, dict(chunks=(4, 3), compressors=[zc.GzipCodec(), zc.Crc32cCodec()])),
        ("v3_blosc", 3, f4, dict(chunks=(3, 5), compressors=zc.BloscCodec(cname="lz4", clevel=5,
                                                                          shuffle="bitshuffle"))),
        ("v3_big_transpose", 3, i8, dict(chunks=(4, 3), serializer=zc.BytesCodec(endian="big"),
                                         filters=[zc.TransposeCodec(order=(1, 0))],
                                         compressors=None)),
        ("v3_shard", 3, f4, dict(chunks=(2, 5), shards=(4, 5), compressors=zc.ZstdCodec())),
        ("v3_strings", 3, strs, dict(chunks=(4,), dtype=str)),
        ("v2_blosc", 2, f4, dict(chunks=(4, 5), compressors=numcodecs.Blosc())),
        ("v2_lz4", 2, i8, dict(chunks=(4, 3), compressors=numcodecs.LZ4())),
        ("v2_zlib", 2, f4, dict(chunks=(4, 5), compressors=numcodecs.Zlib())),
        ("v2_none_fill", 2, f4[:5], dict(chunks=(2, 5), compressors=None, fill_value=np.nan)),
        ("v2_strings", 2, strs, dict(chunks=(4,), dtype=str)),
    ]
    for name, fmt, data, kw in specs:
        path = tmp / f"{name}.zarr"
        kw = dict(kw)
        dtype = kw.pop("dtype", data.dtype)
        a = zarr.create_array(str(path), shape=data.shape, dtype=dtype, zarr_format=fmt,
                              attributes={"note": name}, **kw)
        a[...] = data
        yield name, path, fmt


def seed_arrays(tmp: Path) -> None:
    for name, path, fmt in arrays(tmp):
        save("array", serialise(path))
        if fmt == 2:
            attrs = path / ".zattrs"
            save("meta_v2", (path / ".zarray").read_bytes() + b"\0" +
                 (attrs.read_bytes() if attrs.exists() else b""))
        else:
            save("meta_v3", (path / "zarr.json").read_bytes())
        if name == "v3_shard":
            meta = json.loads((path / "zarr.json").read_text())
            inner = meta["codecs"][0]["configuration"]["chunk_shape"]
            n = int(np.prod([s // c for s, c in zip(meta["chunk_grid"]["configuration"]
                                                    ["chunk_shape"], inner)]))
            for shard in sorted(path.rglob("c/*/*")):
                blob = shard.read_bytes()
                index = blob[-(16 * n + 4):]
                # spec byte: bit 2 = crc32c, index at the end, little-endian (zarr's default)
                save("shard_index", bytes([4]) + struct.pack("<HQ", n - 1, len(blob)) + index)


def seed_codecs() -> None:
    raw = np.arange(300, dtype="<i4").tobytes() + bytes(range(256)) * 3
    codecs = [(0, numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.SHUFFLE)),
              (0, numcodecs.Blosc(cname="zstd", shuffle=numcodecs.Blosc.BITSHUFFLE)),
              (1, numcodecs.Zstd(level=3)), (2, numcodecs.LZ4()), (3, numcodecs.GZip()),
              (4, numcodecs.Zlib()), (5, numcodecs.CRC32C())]
    for idx, codec in codecs:
        enc = bytes(codec.encode(raw))
        for known in (0, 1):
            save("codec", bytes([idx, known]) + len(raw).to_bytes(3, "little") + enc)


def shrink_shards(root: Path, inner_per_shard: int = 2) -> None:
    """Shards of `zbatch synth` hold 1024 inner chunks, so each is 16 KiB of index around a few
    hundred bytes of data. Rewrites each sharded array whose rows fit in `inner_per_shard` inner
    chunks with shards of that many (the index cut to their entries, its crc32c recomputed), so
    a fuzzed store is small; zarr-python reads the same values before and after."""
    for meta_path in sorted(root.rglob("zarr.json")):
        meta = json.loads(meta_path.read_text())
        codecs = meta.get("codecs") or []
        if not codecs or codecs[0]["name"] != "sharding_indexed":
            continue
        cfg = codecs[0]["configuration"]
        grid = meta["chunk_grid"]["configuration"]
        inner, outer = cfg["chunk_shape"], grid["chunk_shape"]
        assert cfg["index_location"] == "end" and cfg["index_codecs"][-1]["name"] == "crc32c"
        assert inner[1:] == outer[1:], meta_path
        n = outer[0] // inner[0]
        if meta["shape"][0] > inner[0] * inner_per_shard:
            continue
        for shard in (p for p in meta_path.parent.rglob("*") if p.is_file() and p != meta_path):
            blob = shard.read_bytes()
            index = blob[-(16 * n + 4):-4][:16 * inner_per_shard]
            shard.write_bytes(blob[:-(16 * n + 4)] + bytes(numcodecs.CRC32C().encode(index)))
        grid["chunk_shape"] = [inner[0] * inner_per_shard] + outer[1:]
        meta_path.write_text(json.dumps(meta, indent=2))


def seed_stores(tmp: Path) -> None:
    import anndata as ad
    import pandas as pd
    import scipy.sparse as sp

    rng = np.random.default_rng(1)
    n_obs, n_vars = 7, 6
    X = sp.random(n_obs, n_vars, density=0.4, format="csr", dtype=np.float32, random_state=1)
    obs = pd.DataFrame({"ct": pd.Categorical(rng.choice(["t", "b", "nk"], n_obs)),
                        "n": rng.integers(0, 9, n_obs),
                        "ok": rng.integers(0, 2, n_obs).astype(bool)},
                       index=[f"c{i}" for i in range(n_obs)])
    var = pd.DataFrame(index=[f"g{i}" for i in range(n_vars)])
    adata = ad.AnnData(X=X, obs=obs, var=var)
    for fmt in (2, 3):
        ad.settings.zarr_write_format = fmt
        for dense in (False, True):
            a = adata.copy()
            if dense:
                a.X = a.X.toarray()
            path = tmp / f"ad_v{fmt}_{'dense' if dense else 'csr'}.zarr"
            a.write_zarr(path)
            blob = serialise(path, skip=("uns", "obsm", "obsp", "varm", "varp", "layers"))
            save("read_many", blob)
            meta = path / (".zmetadata" if fmt == 2 else "zarr.json")
            save("consolidated", bytes([1 if fmt == 2 else 0]) + meta.read_bytes())
    cli = REPO / "build" / "zbatch"
    for codec in ("zstd:1",):
        path = tmp / f"atoms_{codec.replace(':', '')}.zarr"
        # seed 15: 39 atoms and 198 edges in the two structures (each run of the target reads
        # the whole input, so a small store is a fast one)
        subprocess.run([str(cli), "synth", "--kind", "atoms", "--n", "2", "--cutoff", "2.5",
                        "--seed", "15", "-o", str(path), "--codec", codec], check=True,
                       capture_output=True)
        shrink_shards(path)
        save("read_many", serialise(path))
    path = tmp / "cells.zarr"
    subprocess.run([str(cli), "synth", "--kind", "cells", "--n", "4", "--genes", "40",
                    "--chunk-nnz", "16", "--shard-nnz", "64", "-o", str(path)], check=True,
                   capture_output=True)
    save("read_many", serialise(path))


def seed_pointers() -> None:
    # X/indptr (8 int64), X/indices (16 int32), obs codes (8 int8): fuzz_pointers.c's layout;
    # each also with a byte past them whose low bit set opens the dataset afresh (the checks made
    # at open)
    good = (struct.pack("<8q", 0, 2, 2, 5, 6, 9, 10, 0) + struct.pack("<16i", 0, 3, 1, 2, 4, 0, 1,
                                                                        3, 4, 2, *[0] * 6) +
            struct.pack("<8b", 0, 1, 2, -1, 1, 0, 0, 0))
    for blob in (good,
                 struct.pack("<8q", 0, 5, 2, 5, 6, 9, 10, 0) + good[64:],  # decreasing
                 struct.pack("<8q", 0, 2, 2, 5, 6, 9, 99, 0) + good[64:],  # past the values
                 good[:64] + struct.pack("<16i", 0, 3, 1, 2, 7, *[0] * 11) + good[128:],
                 good[:128] + struct.pack("<8b", 0, 1, 5, -2, 1, 0, 0, 0)):
        save("pointers", blob)
        save("pointers", blob + b"\x01")


def main() -> int:
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        seed_arrays(tmp)
        seed_codecs()
        seed_stores(tmp)
        seed_pointers()
    for d in sorted(CORPUS.iterdir()):
        files = list(d.iterdir())
        print(f"{d.name}: {len(files)} inputs, {sum(f.stat().st_size for f in files)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
