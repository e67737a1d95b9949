"""The damage and kill campaign (issue 21): seeded, reproducible, under ASan + UBSan.

    .venv/bin/python scripts/campaign.py --seed 1 --cases 2000 --kills 400 --work /tmp/campaign

Damage: stores of every layout are built once (anndata v2/v3, CSR and dense, by anndata and
by zbatch's writer, sharded, narrow dtypes; zbatch's atomic layout; nvalchemi's own layout
with column chunks; a generic layout; a collection written by `zbatch convert`), then each case
copies one, damages it by a class drawn from the seed, and runs it through `zbatch info`,
`zbatch verify` (the CLI built with ASan + UBSan) and, in a worker Python process whose
extension is built with ASan + UBSan (libasan preloaded), `zbatch.info`, `read_array` of every
array, `open` + `read_many` of every sample and two loader epochs; every `--http-every`th case
is also read over HTTP from nginx. Each outcome is classified:

- error:   a ZbatchError (or exit status 1 of the CLI) with a message;
- equal:   the values of the undamaged store (the damage was not on the path);
- stored:  other values, and zarr-python reads the damaged arrays as changed too, in a valid
           encoding that breaks none of the layout's invariants (the store says so now);
- FINDING: a crash, a sanitizer report, a hang past --timeout, values other than the
           undamaged ones that zarr-python does not see (or refuses) or that break an invariant
           (pointers out of order, indices out of range) delivered without error, or
           `zbatch verify` clean on a store the reader refuses.

Kills: every writer (synth cells/atoms, write_anndata, write_array, AtomicWriter
write/append/delete+defragment, `zbatch convert` direct and with ZBATCH_CONVERT_SCRATCH=1) is
SIGKILLed at a random point of an uninterrupted run's duration; the killed output must be
refused at open or read equal to the uninterrupted one, and a restart with the same command
(for the writers that restart) must give byte-identical output.

Build the sanitized binaries first (`make campaign` does): build-asan-py/ with
-DZB_SANITIZE=ON (CLI and extension). Results: WORK/report.json and a summary on stdout; the
exit status is 1 when there is a finding. A case replays alone with --only ID.
"""
from __future__ import annotations

import argparse
import collections
import glob
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
META = {"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"}
# a sanitizer's report (its warning that an allocation failed and returned NULL, which the
# code handles, is not one)
SAN_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
             "UndefinedBehaviorSanitizer")

# ------------------------------------------------------------------------------------------------
# The worker: runs inside the ASan process, reads one store per request line
# ------------------------------------------------------------------------------------------------
WORKER = r"""
import hashlib, json, sys, warnings
import numpy as np
import zbatch

def digest(v):
    h = hashlib.sha1()
    if hasattr(v, "toarray"):
        v = v.toarray()
    if isinstance(v, (list, tuple)):
        for x in v:
            h.update(digest(x).encode())
        return h.hexdigest()[:16]
    if hasattr(v, "numpy") and not isinstance(v, np.ndarray):
        v = v.numpy()
    a = np.asarray(v)
    if a.dtype == object:
        h.update(repr(a.tolist()).encode())
    else:
        h.update(a.dtype.str.encode() + repr(a.shape).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]

def err(e):
    return ["err", getattr(e, "status", type(e).__name__), str(e)[:300]]

def batch_digest(b):
    return {k: digest(b[k]) for k in sorted(b)}

def run(req):
    out = {}
    path = req["path"]
    try:
        zbatch.info(path)
        out["info"] = ["ok"]
    except Exception as e:
        out["info"] = err(e)
    arrays = {}
    for a in req["arrays"]:
        try:
            arrays[a] = ["ok", digest(zbatch.read_array(req["store_path"], a))]
        except Exception as e:
            arrays[a] = err(e)
    out["read_array"] = arrays
    try:
        kw = {} if req["cache"] is None else {"cache_bytes": req["cache"]}
        ds = zbatch.open(path, **kw)
        n = len(ds)
        out["open"] = ["ok", n]
    except Exception as e:
        out["open"] = err(e)
        return out
    try:
        out["read_many"] = ["ok", batch_digest(ds.read_many(list(range(min(n, 4096)))))]
    except Exception as e:
        out["read_many"] = err(e)
    try:
        epochs = []
        loader = zbatch.DataLoader(ds, batch_size=7, prefetch_factor=2)
        for _ in range(2):
            keys = {}
            for b in loader:
                for k, d in batch_digest(b).items():
                    keys.setdefault(k, []).append(d)
            epochs.append(hashlib.sha1(json.dumps(keys, sort_keys=True).encode()).hexdigest()[:16])
        out["loader"] = ["ok", epochs]
    except Exception as e:
        out["loader"] = err(e)
    return out

warnings.simplefilter("ignore")
print("ready", flush=True)
for line in sys.stdin:
    req = json.loads(line)
    print(json.dumps(run(req)), flush=True)
"""


class Worker:
    """The sanitized reader process; restarted after a crash or a hang."""

    def __init__(self, pkg_dir: Path, timeout: float, sanitized: bool = True):
        self.pkg_dir, self.timeout, self.p, self.sanitized = pkg_dir, timeout, None, sanitized

    def start(self):
        env = dict(os.environ)
        env["PYTHONPATH"] = str(self.pkg_dir)
        libs = [subprocess.run(["gcc", f"-print-file-name={n}"], capture_output=True,
                               text=True).stdout.strip() for n in ("libasan.so", "libubsan.so")]
        if self.sanitized:
            env["LD_PRELOAD"] = ":".join(libs)
        # Python itself leaks by design; halt on the first report so a finding cannot pass
        env["ASAN_OPTIONS"] = "detect_leaks=0:halt_on_error=1:abort_on_error=1:allocator_may_return_null=1"
        env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
        self.errfile = tempfile.TemporaryFile()
        self.p = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=self.errfile, text=True,
                                  env=env)
        line = self.p.stdout.readline()
        if line.strip() != "ready":
            raise SystemExit(f"campaign: the worker did not start: {self.stderr()}")

    def stderr(self) -> str:
        self.errfile.seek(0)
        return self.errfile.read().decode(errors="replace")[-4000:]

    def ask(self, req: dict):
        """The worker's answer, or ("crash"|"hang", text)."""
        if self.p is None or self.p.poll() is not None:
            self.start()
        self.p.stdin.write(json.dumps(req) + "\n")
        self.p.stdin.flush()
        import select
        ready, _, _ = select.select([self.p.stdout], [], [], self.timeout)
        if not ready:
            self.p.kill()
            self.p.wait()
            self.p = None
            return ("hang", f"no answer in {self.timeout} s")
        line = self.p.stdout.readline()
        if not line:
            self.p.wait()
            text = self.stderr()
            self.p = None
            return ("crash", text)
        if any(m in self.stderr() for m in SAN_MARKS):
            text = self.stderr()
            self.stop()
            return ("crash", text)
        return json.loads(line)

    def stop(self):
        if self.p is not None and self.p.poll() is None:
            self.p.stdin.close()
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.p = None


def run_cli(cli: Path, args, timeout: float, env=None):
    """(rc, stderr) of the sanitized CLI; rc "hang" past the timeout."""
    e = dict(os.environ if env is None else env)
    e.setdefault("ASAN_OPTIONS", "detect_leaks=1:halt_on_error=1:abort_on_error=1")
    e.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
    try:
        r = subprocess.run([str(cli), *map(str, args)], capture_output=True, timeout=timeout,
                           env=e)
    except subprocess.TimeoutExpired:
        return "hang", ""
    out, err = (b.decode("utf-8", "backslashreplace") for b in (r.stdout, r.stderr))
    # a sanitizer's report starts with its stack (which says whose code it is) and ends with
    # the shadow-byte legend: keep both ends of a long one
    err = err if len(err) <= 6000 else err[:4000] + "\n...\n" + err[-2000:]
    return r.returncode, out[-2000:] + err


# ------------------------------------------------------------------------------------------------
# The stores
# ------------------------------------------------------------------------------------------------
def make_adata(seed, n_obs=60, n_vars=12, dense=False, narrow=False):
    import anndata as ad
    import pandas as pd
    import scipy.sparse as sp
    rng = np.random.default_rng(seed)
    X = sp.random(n_obs, n_vars, density=0.4, format="csr", dtype=np.float32, random_state=rng)
    X.data[:] = rng.integers(1, 100 if narrow else 10**4, X.nnz).astype(np.float32)
    obs = pd.DataFrame({"ct": pd.Categorical.from_codes(np.arange(n_obs) % 3, ["a", "b", "c"]),
                        "n": rng.integers(0, 1000, n_obs)},
                       index=[f"c{i}" for i in range(n_obs)])
    var = pd.DataFrame(index=[f"g{j}" for j in range(n_vars)])
    return ad.AnnData(X=X.toarray() if dense else X, obs=obs, var=var)


def build_anndata(path, fmt, dense):
    import anndata as ad
    with ad.settings.override(zarr_write_format=fmt):
        make_adata(1, dense=dense).write_zarr(str(path))


def build_zbatch_anndata(path, fmt, shards, narrow):
    import zbatch
    a = make_adata(2, narrow=narrow)
    zbatch.write_anndata(str(path), a.X, obs=a.obs, var=a.var, zarr_format=fmt, chunk_size=16,
                         shard_size=64 if shards else None, codec="zstd:1",
                         narrow_indices=narrow, data_dtype=np.uint8 if narrow else None)


def atom_samples(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.integers(2, 9))
        e = int(rng.integers(1, 2 * k))
        out.append({"positions": rng.standard_normal((k, 3)).astype(np.float32),
                    "atomic_numbers": rng.integers(1, 90, k),
                    "forces": rng.standard_normal((k, 3)).astype(np.float32),
                    "energy": np.float32(rng.standard_normal()),
                    "cell": np.eye(3, dtype=np.float32) * 8,
                    "pbc": np.array([True, True, False]),
                    "neighbor_list": rng.integers(0, k, (e, 2)),
                    "shifts": rng.standard_normal((e, 3)).astype(np.float32)})
    return out


def build_atomic(path, shards):
    import zbatch
    cfg = {"core": {"chunk_rows": 16}, "meta": {"chunk_rows": 8}}
    if shards:
        cfg["core"]["shard_rows"] = 64
    zbatch.AtomicWriter(str(path), config=cfg).write(atom_samples(30, 3))


def build_nvalchemi(path):
    """nvalchemi's own writer, 2-d core arrays rewritten in [7, 1] column chunks (and one in
    shards of 14 rows), as tests/python/test_nvlayout.py does."""
    import torch
    import zarr
    from nvalchemi.data import AtomicData
    from nvalchemi.data.datapipes import AtomicDataZarrWriter
    data = []
    for s in atom_samples(20, 4):
        data.append(AtomicData(
            positions=torch.from_numpy(s["positions"]),
            atomic_numbers=torch.from_numpy(s["atomic_numbers"]).long(),
            forces=torch.from_numpy(s["forces"]), energy=torch.tensor([[float(s["energy"])]]),
            cell=torch.from_numpy(s["cell"]).unsqueeze(0),
            pbc=torch.from_numpy(s["pbc"]).unsqueeze(0),
            neighbor_list=torch.from_numpy(s["neighbor_list"]).long(),
            shifts=torch.from_numpy(s["shifts"])))
    AtomicDataZarrWriter(str(path), config={"core": {"chunk_size": 7}}).write(data)
    root = zarr.open_group(str(path), mode="r+")
    for name in list(root["core"].array_keys()):
        a = root["core"][name]
        if a.ndim != 2 or a.shape[1] < 2:
            continue
        kw = dict(chunks=(7, 1), compressors=a.compressors, dtype=a.dtype)
        if name == "positions":
            kw["shards"] = (14, a.shape[1])
        values, attrs = a[:], dict(a.attrs)
        del root["core"][name]
        b = root["core"].create_array(name, shape=values.shape, **kw)
        b[:] = values
        b.attrs.update(attrs)


def build_generic(path):
    import zbatch
    rng = np.random.default_rng(5)
    n = 40
    sizes = rng.integers(0, 6, n)
    ptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    os.makedirs(path, exist_ok=True)
    zbatch.write_array(str(path), "ptr", ptr, chunks=16)
    zbatch.write_array(str(path), "x", rng.standard_normal((n, 4)).astype(np.float32),
                       chunks=8, shards=16, codec="zstd:1")
    zbatch.write_array(str(path), "v", rng.integers(0, 50, (int(ptr[-1]), 2)).astype(np.int16),
                       chunks=8, codec="lz4")
    local = np.concatenate([rng.integers(0, max(s, 1), s) for s in sizes]).astype(np.int32)
    zbatch.write_array(str(path), "nbr", local, chunks=8)
    with open(Path(path, "zarr.json"), "w") as f:
        json.dump({"zarr_format": 3, "node_type": "group", "attributes": {"zbatch": {
            "num_samples": n, "segments": {"s": "ptr"},
            "fields": {"x": {"array": "x", "kind": "per_sample"},
                       "v": {"array": "v", "kind": "ragged", "segment": "s"},
                       "nbr": {"array": "nbr", "kind": "index", "segment": "s",
                               "target": "s"}}}}}, f)


def h5ad_inputs(d: Path):
    """Three .h5ad inputs as anndata writes them; the second's X/data and X/indices rewritten in
    chunks of 4 elements (over a hundred chunks, a chunk index of several B-tree nodes, so
    damage reaches the chunk tables the direct path builds), the third's in chunks of 16 with
    shuffle and deflate (h5py's compression="gzip": chunks read raw and inflated by zbatch)."""
    import h5py
    paths = []
    for k in range(3):
        a = make_adata(10 + k, n_obs=80 + 30 * k)
        p = d / f"in{k}.h5ad"
        a.write_h5ad(p)
        if k:
            opts = dict(chunks=(4,)) if k == 1 else \
                dict(chunks=(16,), compression="gzip", shuffle=True)
            with h5py.File(p, "r+") as f:
                for name in ("data", "indices"):
                    values = f["X"][name][:]
                    del f["X"][name]
                    f["X"].create_dataset(name, data=values, **opts)
        paths.append(p)
    return paths


def build_collection(path, cli, inputs):
    r = subprocess.run([str(cli), "convert", *map(str, inputs), "-o", str(path), "--quiet",
                        "--dataset-size", "64", "--chunk", "32", "--shard", "128",
                        "--threads", "1"], capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise SystemExit(f"campaign: convert failed: {r.stderr}")


def build_stores(base: Path, cli: Path):
    import zarr  # noqa: F401
    base.mkdir(parents=True, exist_ok=True)
    builders = {
        "ad_v3_csr": lambda p: build_anndata(p, 3, False),
        "ad_v2_csr": lambda p: build_anndata(p, 2, False),
        "ad_v3_dense": lambda p: build_anndata(p, 3, True),
        "zb_v3_sharded_narrow": lambda p: build_zbatch_anndata(p, 3, True, True),
        "zb_v3_chunked": lambda p: build_zbatch_anndata(p, 3, False, False),
        "zb_v2_narrow": lambda p: build_zbatch_anndata(p, 2, False, True),
        "atomic": lambda p: build_atomic(p, False),
        "atomic_sharded": lambda p: build_atomic(p, True),
        "nvalchemi_columns": build_nvalchemi,
        "generic": build_generic,
    }
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, fn in builders.items():
            p = base / name
            if not p.exists():
                fn(p)
            out[name] = p
        inputs = h5ad_inputs(base) if not (base / "in2.h5ad").exists() else \
            [base / f"in{k}.h5ad" for k in range(3)]
        p = base / "collection"
        if not p.exists():
            build_collection(p, cli, inputs)
        # the collection's first dataset as a store of its own, and the whole collection
        out["collection"] = p
    return out, inputs


def list_arrays(store: Path):
    """Array paths of a store (v2 and v3), relative to its root."""
    out = []
    for dirpath, dirs, files in os.walk(store):
        dirs[:] = [d for d in dirs if not d.startswith(".zbatch")]
        rel = os.path.relpath(dirpath, store)
        if ".zarray" in files:
            out.append(rel)
        elif "zarr.json" in files:
            try:
                doc = json.loads(Path(dirpath, "zarr.json").read_text())
            except (ValueError, UnicodeDecodeError):
                continue
            if isinstance(doc, dict) and doc.get("node_type") == "array":
                out.append(rel)
    return sorted(a for a in out if a != ".")


def zarr_view(store: Path, arrays):
    """What zarr-python reads from each array: its digest, or "refused"; and the values."""
    import zarr
    view, values = {}, {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for a in arrays:
            try:
                v = zarr.open_array(str(store / a), mode="r", use_consolidated=False)[...]
                values[a] = np.asarray(v)
                # strings (object, StringDType): by value; their bytes are pointers
                view[a] = hashlib.sha1(repr(values[a].tolist()).encode()).hexdigest()[:16] \
                    if values[a].dtype.kind not in "biufcmMSU" else \
                    hashlib.sha1(values[a].dtype.str.encode() + repr(values[a].shape).encode()
                                 + values[a].tobytes()).hexdigest()[:16]
            except Exception as e:  # noqa: BLE001 - any refusal of the oracle
                view[a] = "refused: " + type(e).__name__
    return view, values


def broken_invariant(values: dict) -> str:
    """An invariant of the layouts that the damaged values break ('' if none): pointer arrays
    monotone from 0, CSR column ids inside n_vars, categorical codes inside the categories,
    index values inside their structure."""
    for name, v in values.items():
        leaf = name.rsplit("/", 1)[-1]
        if leaf in ("indptr", "atoms_ptr", "edges_ptr", "ptr") and v.ndim == 1 and v.size:
            if v[0] != 0 or np.any(np.diff(v.astype(np.int64)) < 0):
                return f"{name} not monotone from 0"
    for grp in {n.rsplit("/", 1)[0] for n in values if n.endswith("/indptr")}:
        ip, ix = values.get(grp + "/indptr"), values.get(grp + "/indices")
        if ip is not None and ix is not None and ip.size and ip[-1] > ix.size:
            return f"{grp}/indptr past its indices"
    for name, v in values.items():
        if name.endswith("/codes"):
            cats = values.get(name[:-len("codes")] + "categories")
            if cats is not None and v.size and (v.min() < -1 or v.max() >= len(cats)):
                return f"{name} outside its categories"
    return ""


# ------------------------------------------------------------------------------------------------
# Damage classes
# ------------------------------------------------------------------------------------------------
HOSTILE = [0, -1, 1, 2**31, 2**62, 2**64, -(2**63), 1.5, "x", None, [], {}, [0], [2**40],
           [-1], [1, 1], True]


def data_files(store: Path):
    # sorted: the directory order differs between copies, the seed must pick the same file
    return sorted(p for p in store.rglob("*") if p.is_file() and p.name not in META
                  and ".zbatch" not in str(p.relative_to(store)))


def meta_files(store: Path):
    return sorted(p for p in store.rglob("*") if p.is_file() and p.name in META)


def sharded_arrays(store: Path):
    out = []
    for a in list_arrays(store):
        f = store / a / "zarr.json"
        if f.exists() and "sharding_indexed" in f.read_text():
            out.append(a)
    return out


def flip(rng, f: Path, lo=0, hi=None):
    b = bytearray(f.read_bytes())
    if not b:
        return "empty file"
    hi = len(b) if hi is None else hi
    lo = max(0, min(lo, len(b) - 1))
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(lo, max(lo + 1, hi))
        b[i] ^= 1 << rng.randrange(8)
    f.write_bytes(bytes(b))
    return f"flipped bytes of {f.name}"


def consolidated_docs(store: Path):
    """(file, loader, saver) for each consolidated document holding a copy of metadata."""
    out = []
    for f in (store / ".zmetadata", store / "zarr.json"):
        if f.exists():
            try:
                doc = json.loads(f.read_text())
            except ValueError:
                continue
            if f.name == ".zmetadata" and isinstance(doc.get("metadata"), dict):
                out.append((f, doc, doc["metadata"]))
            elif isinstance(doc.get("consolidated_metadata"), dict) and \
                    isinstance(doc["consolidated_metadata"].get("metadata"), dict):
                out.append((f, doc, doc["consolidated_metadata"]["metadata"]))
    return out


def edit_doc(store: Path, f: Path, fn, rng):
    """Applies fn(doc) to a metadata document and, half the time (or when it exists only
    there), to its consolidated copy too."""
    rel = str(f.relative_to(store))
    key = rel if f.name != "zarr.json" else os.path.dirname(rel)
    try:
        doc = json.loads(f.read_text())
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    what = fn(doc, rng)
    if what is None:
        return None
    f.write_text(json.dumps(doc))
    if rng.random() < 0.7:
        for cf, cdoc, entries in consolidated_docs(store):
            if key in entries and cf != f:
                entries[key] = json.loads(json.dumps(doc))
                cf.write_text(json.dumps(cdoc))
    return what


def set_path(doc, rng, keys):
    cands = [k for k in keys if k in doc]
    if not cands:
        return None
    k = rng.choice(cands)
    v = doc[k]
    choices = list(HOSTILE)
    if isinstance(v, list) and v and all(isinstance(x, int) for x in v):
        i = rng.randrange(len(v))
        choices += [v[:i] + [x] + v[i + 1:] for x in (0, -1, 2**40, 2**63 - 1, v[i] + 1,
                                                        max(v[i] - 1, 0))] * 3
        choices += [v + [1], v[:-1]]
    if isinstance(v, dict) and "configuration" in v:
        c = json.loads(json.dumps(v))
        cfg = c["configuration"]
        for ck in list(cfg):
            if isinstance(cfg[ck], list) and cfg[ck]:
                cfg[ck] = [rng.choice([0, -1, 2**40, 1, 3])] + cfg[ck][1:]
        choices += [c] * 5
    doc[k] = rng.choice(choices)
    return f"{k}={json.dumps(doc[k])[:60]}"


def dmg_meta_field(store, rng):
    docs = [f for f in meta_files(store) if f.name in ("zarr.json", ".zarray")]
    f = rng.choice(docs)

    def fn(doc, r):
        if doc.get("node_type") == "group" or ("zarr_format" in doc and "shape" not in doc):
            return None
        keys = ["shape", "chunks", "dtype", "compressor", "filters", "fill_value", "order",
                "chunk_grid", "data_type", "codecs", "chunk_key_encoding", "dimension_separator"]
        if r.random() < 0.3 and isinstance(doc.get("codecs"), list) and doc["codecs"]:
            i = r.randrange(len(doc["codecs"]))
            c = doc["codecs"][i]
            if isinstance(c, dict) and isinstance(c.get("configuration"), dict):
                cfg = c["configuration"]
                if cfg:
                    ck = r.choice(sorted(cfg))
                    cfg[ck] = r.choice(HOSTILE + ["zstd", "big", "little"])
                    return f"codecs[{i}].{ck}={json.dumps(cfg[ck])[:40]}"
            doc["codecs"][i] = r.choice([{"name": "gzip", "configuration": {"level": 1}},
                                         {"name": "bytes"}, {"name": "zstd"}, "x", None])
            return f"codecs[{i}] replaced"
        return set_path(doc, r, keys)
    return edit_doc(store, f, fn, rng)


def attr_paths(obj, prefix=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + (k,)
            yield from attr_paths(v, prefix + (k,))


def dmg_layout_attr(store, rng):
    docs = []
    for f in meta_files(store):
        try:
            doc = json.loads(f.read_text())
        except ValueError:
            continue
        if f.name == ".zattrs" or (f.name == "zarr.json" and isinstance(doc.get("attributes"),
                                                                       dict)
                                   and doc["attributes"]):
            docs.append(f)
    if not docs:
        return None
    f = rng.choice(docs)

    def fn(doc, r):
        attrs = doc if f.name == ".zattrs" else doc["attributes"]
        paths = list(attr_paths(attrs))
        if not paths:
            return None
        p = r.choice(paths)
        obj = attrs
        for k in p[:-1]:
            obj = obj[k]
        v = obj[p[-1]]
        if r.random() < 0.15:
            del obj[p[-1]]
            return f"{'.'.join(p)} deleted"
        choices = list(HOSTILE) + ["anndata", "csr_matrix", "array", "dataframe",
                                   "categorical", "0.1.0", "9.9.9", "system", "atom", "edge"]
        if isinstance(v, int) and not isinstance(v, bool):
            choices += [v + 1, v - 1, v * 2, 0, 2**40] * 2
        if isinstance(v, list) and v:
            choices += [v[:-1], v + v[-1:], v[::-1]] * 2
        obj[p[-1]] = r.choice(choices)
        return f"{'.'.join(p)}={json.dumps(obj[p[-1]])[:40]}"
    return edit_doc(store, f, fn, rng)


def dmg_whole_doc(store, rng):
    f = rng.choice(meta_files(store))
    b = f.read_bytes()
    choice = rng.randrange(6)
    if choice == 0:
        f.write_bytes(b"")
    elif choice == 1:
        f.write_bytes(b[: rng.randrange(max(len(b), 1))])
    elif choice == 2:
        f.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))))
    elif choice == 3:
        f.write_bytes(rng.choice([b"[]", b"null", b"{}", b"1e999", b'"x"', b"{\"a\":" * 2000]))
    elif choice == 4:
        other = rng.choice(meta_files(store))
        f.write_bytes(other.read_bytes())
        return f"{f.relative_to(store)} replaced by {other.relative_to(store)}"
    else:
        f.unlink()
        return f"{f.relative_to(store)} deleted"
    return f"{f.relative_to(store)} rewritten ({choice})"


def dmg_chunk_bytes(store, rng):
    f = rng.choice(data_files(store))
    return f"{f.relative_to(store)}: " + flip(rng, f)


def dmg_shard_index(store, rng):
    sh = sharded_arrays(store)
    files = sorted(p for a in sh for p in (store / a).rglob("*")
                   if p.is_file() and p.name not in META)
    if not files:
        return None
    f = rng.choice(files)
    n = f.stat().st_size
    b = bytearray(f.read_bytes())
    if rng.random() < 0.5:
        # an index entry (offset or size, little-endian uint64) set to a hostile value
        k = rng.randrange(1, 9)
        pos = n - 4 - 16 * k  # crc32c after the index by default
        if pos < 0:
            return None
        val = rng.choice([0, 1, n, n - 1, 2**63, 2**64 - 1, 2**64 - 2, 2**40, n // 2])
        at = pos + 8 * rng.randrange(2)
        b[at:at + 8] = val.to_bytes(8, "little")
        f.write_bytes(bytes(b))
        return f"{f.relative_to(store)}: index entry -{k} = {val}"
    return f"{f.relative_to(store)} index: " + flip(rng, f, n - 64, n)


def dmg_truncate(store, rng):
    f = rng.choice(data_files(store))
    n = f.stat().st_size
    k = rng.choice([0, 1, max(n - 1, 0), rng.randrange(max(n, 1))])
    with open(f, "r+b") as fh:
        fh.truncate(k)
    return f"{f.relative_to(store)} cut to {k} of {n}"


def dmg_delete_chunk(store, rng):
    f = rng.choice(data_files(store))
    f.unlink()
    return f"{f.relative_to(store)} deleted"


def dmg_values(store, rng):
    """Pointer, index and code arrays rewritten by zarr-python: valid encoding, bad values."""
    import zarr
    names = [a for a in list_arrays(store)
             if a.rsplit("/", 1)[-1] in ("indptr", "indices", "codes", "atoms_ptr", "edges_ptr",
                                         "ptr", "neighbor_list", "nbr", "samples_mask")]
    if not names:
        return None
    a = rng.choice(names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        z = zarr.open_array(str(store / a), mode="r+", use_consolidated=False)
        v = z[...]
        if v.size == 0:
            return None
        flat = v.reshape(-1)
        i = rng.randrange(flat.size)
        info = np.iinfo(v.dtype) if v.dtype.kind in "iu" else None
        cands = [flat[i] + 1, flat[i] - 1 if flat[i] > 0 or v.dtype.kind == "i" else 0,
                 int(flat.max()) + 1, 0]
        if info is not None:
            cands += [info.max, info.min, info.max // 2]
        if v.dtype.kind == "b":
            cands = [not flat[i]]
        new = rng.choice(cands)
        how = rng.randrange(3)
        if how == 0 or flat.size < 2:
            flat[i] = new
            what = f"[{i}]={new}"
        elif how == 1:
            j = rng.randrange(flat.size)
            flat[i], flat[j] = flat[j], flat[i]
            what = f"[{i}]<->[{j}]"
        else:
            flat[i:] = flat[i:] + (1 if v.dtype.kind != "b" else 0)
            what = f"[{i}:]+=1"
        z[...] = flat.reshape(v.shape)
    return f"{a}{what}"


CLASSES = {
    "chunk_bytes": dmg_chunk_bytes,
    "shard_index": dmg_shard_index,
    "truncate": dmg_truncate,
    "delete_chunk": dmg_delete_chunk,
    "meta_field": dmg_meta_field,
    "whole_doc": dmg_whole_doc,
    "layout_attr": dmg_layout_attr,
    "values": dmg_values,
}


# ------------------------------------------------------------------------------------------------
# The damage campaign
# ------------------------------------------------------------------------------------------------
REFUSALS = ("ZB_E_JSON", "ZB_E_METADATA", "ZB_E_CORRUPT", "ZB_E_TRUNCATED", "ZB_E_CHECKSUM",
            "ZB_E_SHARD_RANGE")


def classify(got, want, changed):
    """error | equal | stored | FINDING:... for one path's answer."""
    if got[0] == "err":
        if not got[2].strip():
            return "FINDING: error without a message"
        if got[1] not in (None,) and not str(got[1]).startswith("ZB_E_"):
            return f"FINDING: {got[1]} instead of ZbatchError: {got[2][:120]}"
        return "error"
    if got == want:
        return "equal"
    if changed == "same":
        return "FINDING: values differ from the undamaged store, which zarr-python still reads"
    if changed.startswith("refused"):
        return f"FINDING: values delivered where zarr-python refuses ({changed})"
    if changed.startswith("invalid"):
        return f"FINDING: values delivered that break an invariant ({changed})"
    return "stored"


def damage_campaign(args, stores, inputs, worker, cli, report, server):
    rng_master = random.Random(args.seed)
    layouts = sorted(stores)
    base_answers, base_views = {}, {}
    for name in layouts:
        arrays = list_arrays(stores[name])
        req = {"path": str(stores[name]), "store_path": str(stores[name]), "arrays": arrays,
               "cache": None}
        ans = worker.ask(req)
        if isinstance(ans, tuple) or any(
                v[0] == "err" for v in [ans["info"], ans["open"], ans.get("read_many", ["err"]),
                                        ans.get("loader", ["err"])]
                + list(ans["read_array"].values())):
            raise SystemExit(f"campaign: the undamaged store {name} does not read: {ans}")
        base_answers[name] = ans
        base_views[name] = zarr_view(stores[name], arrays)[0]
        rc, out = run_cli(cli, ["verify", stores[name]], args.timeout)
        if rc != 0:
            raise SystemExit(f"campaign: verify on the undamaged store {name}: {rc} {out}")
    recheck = None
    if args.recheck:
        old = json.loads((Path(args.recheck) / "report.json").read_text())
        recheck = {f["case"]: f for f in old["findings"] if f.get("layout") in stores}
        args.cases = max(recheck, default=-1) + 1
    cases_dir = Path(args.work) / "cases"
    cases_dir.mkdir(parents=True, exist_ok=True)
    findings = report["findings"]
    t0 = time.monotonic()
    for case in range(args.cases):
        rng = random.Random(rng_master.getrandbits(64))
        if args.only is not None and case != args.only:
            continue
        d = cases_dir / f"c{case}"
        if d.exists():
            shutil.rmtree(d)
        if recheck is not None:  # a store an earlier run kept as a finding, as it was damaged
            if case not in recheck:
                continue
            layout, cls, what = (recheck[case][k] for k in ("layout", "class", "damage"))
            shutil.copytree(Path(args.recheck) / "findings" / f"c{case}", d)
        else:
            if rng.random() < args.h5ad_share:
                h5ad_case(args, case, rng, inputs, cli, report)
                continue
            layout = rng.choice(layouts)
            cls = rng.choice(sorted(CLASSES))
            shutil.copytree(stores[layout], d)
            try:
                what = CLASSES[cls](d, rng)
            except (IndexError, ValueError):
                what = None
        if what is None:
            shutil.rmtree(d)
            report["skipped"] += 1  # the class does not apply (no shard in this store)
            continue
        arrays = list_arrays(stores[layout])
        http = server is not None and case % args.http_every == 0
        path = f"{server.url}/c{case}" if http else str(d)
        cache = rng.choice([None, "auto", 1 << 20])
        outcome = {"case": case, "layout": layout, "class": cls, "damage": what,
                   "http": http, "cache": cache}
        want = base_answers[layout]
        # the CLI under ASan
        for cmd in ("info", "verify"):
            rc, out = run_cli(cli, [cmd, path], args.timeout)
            if rc == "hang":
                outcome[cmd] = f"FINDING: hang past {args.timeout} s"
            elif any(m in out for m in SAN_MARKS) or rc not in (0, 1):
                outcome[cmd] = f"FINDING: exit {rc}: {out[-1500:]}"
            else:
                outcome[cmd] = "clean" if rc == 0 else "error"
                if rc == 1 and not out.strip():
                    outcome[cmd] = "FINDING: exit 1 without a message"
        ans = worker.ask({"path": path, "store_path": path, "arrays": arrays, "cache": cache})
        if isinstance(ans, tuple):
            outcome["reader"] = f"FINDING: {ans[0]}: {ans[1][-1500:]}"
        else:
            view = None

            def changed_for(names, invariants=True):
                nonlocal view
                if view is None:
                    v, values = zarr_view(d, arrays)
                    bad = broken_invariant({k: x for k, x in values.items()})
                    view = (v, bad)
                v, bad = view
                names = names or arrays
                if any(str(v[a]).startswith("refused") for a in names):
                    return "refused: " + ", ".join(a for a in names
                                                   if str(v[a]).startswith("refused"))
                if bad and invariants:
                    return "invalid: " + bad
                if all(v[a] == base_views[layout][a] for a in names):
                    return "same"
                return "changed"
            outcome["info_py"] = "error" if ans["info"][0] == "err" else "ok"
            ra = collections.Counter()
            for a in arrays:
                got, w = ans["read_array"][a], want["read_array"][a]
                c = classify(got, w, changed_for([a], invariants=False)
                             if got != w and got[0] == "ok" else "")
                ra[c] += 1
                if c.startswith("FINDING"):
                    outcome.setdefault("read_array_findings", []).append(f"{a}: {c}")
            outcome["read_array"] = dict(ra)
            if ans["open"][0] == "err":
                outcome["open"] = classify(ans["open"], want["open"], "")
            else:
                outcome["open"] = "ok"
                for p in ("read_many", "loader"):
                    got = ans[p]
                    if p == "read_many" and ans["open"][1] != want["open"][1] and got[0] == "ok":
                        got = ["ok", "count " + str(ans["open"][1])]
                    outcome[p] = classify(got, want[p], changed_for(None)
                                          if got != want[p] and got[0] == "ok" else "")
                    if (outcome[p].startswith("FINDING") and layout in ATOMIC_LAYOUTS
                            and fewer_fields(ans["read_many"], want["read_many"])):
                        # documented (FORMATS-zbatch.md, include/zbatch_atomic.h): a field the
                        # fields attribute names without its array is ignored (an interrupted
                        # add_custom leaves this); verify notes it
                        outcome[p] = "fewer fields (documented)"
                    if got[0] == "err":
                        outcome[p + "_error"] = got[1] + ": " + got[2][:200]
            refused = [p for p in ("read_many", "loader", "open") if ans.get(p, [""])[0] == "err"
                       and ans[p][1] in REFUSALS]
            if outcome.get("verify") == "clean" and refused:
                outcome["verify"] = (f"FINDING: verify clean, {refused[0]} refuses: "
                                     f"{ans[refused[0]][2][:200]}")
        report["by_class"].setdefault(cls, collections.Counter())[_summary(outcome)] += 1
        report["by_layout"].setdefault(layout, collections.Counter())[_summary(outcome)] += 1
        report["cases"] += 1
        report["outcomes"].append(outcome)
        if http:
            report["http_cases"] += 1
        if any("FINDING" in str(v) for v in outcome.values()):
            findings.append(outcome)
            print(f"FINDING case {case}: {json.dumps(outcome)[:1500]}", flush=True)
            keep = Path(args.work) / "findings" / f"c{case}"
            if keep.exists():
                shutil.rmtree(keep)
            shutil.copytree(d, keep)
        for k in ("info", "verify", "open", "read_many", "loader"):
            if k in outcome:
                report["by_path"].setdefault(k, collections.Counter())[
                    outcome[k].split(":")[0]] += 1
        for c, n in outcome.get("read_array", {}).items():
            report["by_path"].setdefault("read_array", collections.Counter())[
                c.split(":")[0]] += n
        shutil.rmtree(d)
        if case % 100 == 0:
            print(f"damage: case {case}, {time.monotonic() - t0:.0f} s, "
                  f"{len(findings)} findings", flush=True)


def collection_rows(path, inputs):
    """{(input, row): (X row, obs n)} of a converted collection, read by the plain build; a row
    is its stored values by gene name (genes are aligned by name, so a damaged gene name moves
    its column rather than changing a value)."""
    import zbatch
    ds = zbatch.open(str(path))
    genes = list(ds.var_names)
    b = ds.read_many(list(range(len(ds))))
    X = b["X"].toarray() if hasattr(b["X"], "toarray") else np.asarray(b["X"])
    out = {}
    for i in range(len(X)):
        key = (int(b["obs/src_path"][i]), int(b["obs/src_row"][i]))
        out[key] = (row_by_gene(genes, X[i]), int(b["obs/n"][i]))
    return out


def row_by_gene(genes, row):
    """The nonzero values of a dense row as sorted (gene name, float64 value) pairs."""
    return tuple(sorted((str(genes[j]), float(row[j])) for j in np.flatnonzero(row)))


def h5ad_rows(paths):
    """The same from the inputs as h5py reads the arrays convert takes (X's data, indices,
    indptr, obs/n and the gene names, var/_index; the oracle); None if h5py refuses them, they
    are not a valid CSR or the gene names repeat."""
    import h5py
    import scipy.sparse as sp
    out = {}
    try:
        for k, p in enumerate(paths):
            with h5py.File(p, "r") as h:
                data, ind, ptr = (h["X"][n][...] for n in ("data", "indices", "indptr"))
                n = h["obs"]["n"][...]
                genes = [g.decode() if isinstance(g, bytes) else str(g)
                         for g in h["var"]["_index"][...]]
            X = sp.csr_matrix((data, ind, ptr), shape=(len(ptr) - 1, len(genes))).toarray()
            if len(n) != X.shape[0] or np.any(~np.isfinite(X)) or len(set(genes)) != len(genes):
                return None
            for i in range(X.shape[0]):
                out[(k, i)] = (row_by_gene(genes, X[i].astype(np.float64)), int(n[i]))
    except Exception:  # noqa: BLE001 - any refusal of the oracle (or an invalid CSR)
        return None
    return out


_H5AD_BASE = {}


def h5ad_case(args, case, rng, inputs, cli, report):
    """An .h5ad input damaged (bytes flipped anywhere or in its largest dataset, or cut
    short), converted by the ASan CLI on the direct path or the scratch path."""
    import h5py
    d = Path(args.work) / "cases" / f"h{case}"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    paths = [d / p.name for p in inputs]
    for p, q in zip(inputs, paths):
        shutil.copy2(p, q)
    victim = rng.randrange(len(paths))
    f = paths[victim]
    size = f.stat().st_size
    how = rng.choice(["flip", "flip_data", "truncate"])
    if how == "truncate":
        k = rng.randrange(size)
        with open(f, "r+b") as fh:
            fh.truncate(k)
        what = f"{f.name} cut to {k} of {size}"
    elif how == "flip_data":
        with h5py.File(inputs[victim], "r") as h:
            ds = h[rng.choice(["X/data", "X/indices", "X/indptr", "obs/_index", "obs/n"])]
            name = ds.name
            if ds.chunks:
                c = ds.id.get_chunk_info(rng.randrange(ds.id.get_num_chunks()))
                off, n = c.byte_offset, c.size
            else:
                off, n = ds.id.get_offset(), ds.id.get_storage_size()
        what = f"{f.name} {name} at {off}: " + flip(rng, f, off, off + n)
    else:
        what = f"{f.name}: " + flip(rng, f)
    scratch = rng.random() < 0.5
    env = dict(os.environ)
    env.pop("ZBATCH_CONVERT_SCRATCH", None)
    if scratch:
        env["ZBATCH_CONVERT_SCRATCH"] = "1"
    out = d / "out"
    rc, text = run_cli(cli, ["convert", *map(str, paths), "-o", str(out), "--quiet",
                             "--dataset-size", "64", "--chunk", "32", "--shard", "128",
                             "--threads", "1"], args.timeout * 3, env)
    outcome = {"case": case, "layout": "h5ad_convert", "class": how, "damage": what,
               "path": "scratch" if scratch else "direct"}
    if rc == "hang":
        res = f"FINDING: convert hangs past {args.timeout * 3} s"
    elif any(m in text for m in SAN_MARKS) or rc not in (0, 1):
        # where the report's first stack frame past the sanitizer's own is in libhdf5, say so:
        # a defect of the HDF5 library zbatch links, not of zbatch's code
        frames = [ln for ln in text.splitlines() if ln.strip().startswith("#1 ")]
        where = " (in libhdf5)" if frames and "libhdf5" in frames[0] else ""
        res = f"FINDING{where}: convert exit {rc}: {text[-1500:]}"
    elif rc == 1:
        res = "error" if text.strip() else "FINDING: exit 1 without a message"
    else:
        if "base" not in _H5AD_BASE:
            _H5AD_BASE["base"] = h5ad_rows(inputs)
        try:
            got = collection_rows(out, inputs)
        except Exception as e:  # noqa: BLE001
            got = None
            res = f"FINDING: convert succeeded, its output does not read: {e}"
        if got is not None:
            oracle = h5ad_rows(paths)
            if got == _H5AD_BASE["base"]:
                res = "equal"
            elif oracle is not None and got == oracle:
                res = "stored"
            elif oracle is None:
                res = "FINDING: convert delivered other values from an input h5py refuses (or not CSR)"
            else:
                bad = [k for k in oracle if got.get(k) != oracle[k]][:3]
                res = f"FINDING: convert delivered values h5py does not read: rows {bad}"
    outcome["convert"] = res
    report["cases"] += 1
    report["outcomes"].append(outcome)
    report["by_class"].setdefault("h5ad_" + how, collections.Counter())[res.split(":")[0]] += 1
    report["by_path"].setdefault("convert_" + outcome["path"], collections.Counter())[
        res.split(":")[0]] += 1
    if res.startswith("FINDING"):
        report["findings"].append(outcome)
        print(f"FINDING case {case}: {json.dumps(outcome)[:1500]}", flush=True)
        keep = Path(args.work) / "findings" / f"h{case}"
        if keep.exists():
            shutil.rmtree(keep)
        shutil.copytree(d, keep)
    shutil.rmtree(d)


ATOMIC_LAYOUTS = ("atomic", "atomic_sharded", "nvalchemi_columns")


def fewer_fields(got, want):
    """read_many delivered a subset of the undamaged fields, each equal."""
    if got[0] != "ok" or want[0] != "ok" or not isinstance(got[1], dict):
        return False
    return set(got[1]) < set(want[1]) and all(want[1][k] == v for k, v in got[1].items())


def _summary(outcome):
    if any("FINDING" in str(v) for v in outcome.values()):
        return "finding"
    vals = [outcome.get(k) for k in ("open", "read_many", "loader")]
    if "error" in vals:
        return "refused"
    if "stored" in vals:
        return "stored"
    if any(str(v).startswith("fewer") for v in vals):
        return "fewer fields (documented)"
    return "equal"


# ------------------------------------------------------------------------------------------------
# The kill campaign
# ------------------------------------------------------------------------------------------------
WRITERS = {
    # name: (script or None for the CLI, args builder, restartable)
    "write_anndata": textwrap.dedent("""
        import sys, numpy as np, zbatch, scipy.sparse as sp
        rng = np.random.default_rng(8)
        X = sp.random(6000, 300, density=0.1, format="csr", dtype=np.float32, random_state=rng)
        zbatch.write_anndata(sys.argv[1], X, chunk_size=512, shard_size=4096, codec="zstd:3")
    """),
    "write_array": textwrap.dedent("""
        import sys, numpy as np, zbatch
        import os
        os.makedirs(sys.argv[1], exist_ok=True)
        for i in range(6):
            a = np.random.default_rng(i).integers(0, 10**6, (60000, 3), dtype=np.int32)
            zbatch.write_array(sys.argv[1], f"a{i}", a, chunks=1000, shards=8000, codec="zstd:1")
    """),
    "atomic_write_append": textwrap.dedent("""
        import sys, numpy as np
        sys.path.insert(0, sys.argv[2])
        from campaign import atom_samples
        from zbatch._atomic import AtomicWriter
        w = AtomicWriter(sys.argv[1], config={"core": {"chunk_rows": 64}, "meta": {"chunk_rows": 16}})
        w.write(atom_samples(300, 0))
        for k in range(1, 8):
            w.append(atom_samples(300, k))
    """),
    "atomic_delete_defragment": textwrap.dedent("""
        import sys
        from zbatch._atomic import AtomicWriter
        w = AtomicWriter(sys.argv[1])
        w.delete(range(0, 2400, 3))
        w.defragment()
    """),
}


def tree_bytes(root: Path):
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(root))] = hashlib.sha1(p.read_bytes()).hexdigest()
    return out


def read_all(path, arrays=False):
    """The digest of every sample of the dataset at path (open + read_many), or the error; for
    a store of plain arrays (write_array), each array's digest or error."""
    import zbatch
    if arrays:
        out = []
        for i in range(6):
            try:
                v = zbatch.read_array(str(path), f"a{i}")
                out.append(hashlib.sha1(v.tobytes()).hexdigest())
            except zbatch.ZbatchError as e:
                out.append(e.status)
        return ("arrays", 6, tuple(out))
    try:
        ds = zbatch.open(str(path))
        n = len(ds)
        b = ds.read_many(list(range(n)))
        h = hashlib.sha1()
        for k in sorted(b):
            v = b[k]
            v = v.toarray() if hasattr(v, "toarray") else np.asarray(v)
            h.update(k.encode() + (repr(v.tolist()).encode() if v.dtype == object
                                   else v.tobytes()))
        return ("ok", n, h.hexdigest())
    except zbatch.ZbatchError as e:
        return ("err", e.status, str(e)[:200])


def defrag_survivors_ok(path, samples):
    """The samples a killed delete + defragment left: whole originals (energy, positions), in
    their order, every one the delete keeps (ids not divisible by 3) among them."""
    import zbatch
    ds = zbatch.open(str(path))
    b = ds.read_many(list(range(len(ds))))
    by_energy = {float(s["energy"]): i for i, s in enumerate(samples)}
    try:
        ids = [by_energy[float(e)] for e in np.ravel(b["energy"])]
    except KeyError:
        return False
    if ids != sorted(set(ids)) or not {i for i in range(len(samples)) if i % 3} <= set(ids):
        return False
    want = np.concatenate([samples[i]["positions"] for i in ids])
    return np.array_equal(b["positions"], want)


def kill_campaign(args, cli_plain, inputs, report):
    rng = random.Random(args.seed * 7919 + 1)
    kdir = Path(args.work) / "kills"
    if kdir.exists():
        shutil.rmtree(kdir)
    kdir.mkdir(parents=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "python"), env.get("PYTHONPATH", "")])

    def cmd_of(name, out):
        if name == "synth_cells":
            return [str(cli_plain), "synth", "--kind", "cells", "--n", "4000", "--seed", "3",
                    "-o", str(out)], None
        if name == "synth_atoms":
            return [str(cli_plain), "synth", "--kind", "atoms", "--n", "600", "--seed", "3",
                    "-o", str(out)], None
        if name in ("convert_direct", "convert_scratch"):
            e = dict(env)
            e.pop("ZBATCH_CONVERT_SCRATCH", None)
            if name == "convert_scratch":
                e["ZBATCH_CONVERT_SCRATCH"] = "1"
            return [str(cli_plain), "convert", *map(str, inputs), "-o", str(out), "--quiet",
                    "--dataset-size", "32", "--chunk", "16", "--shard", "64",
                    "--threads", "1", "--memory", "64M"], e
        return [sys.executable, "-c", WRITERS[name], str(out), str(REPO / "scripts")], None

    names = ["synth_cells", "synth_atoms", "convert_direct", "convert_scratch", "write_anndata",
             "write_array", "atomic_write_append", "atomic_delete_defragment"]
    # restarted with the same command (the other writers refuse to write over a store a
    # killed run left: the directory is the caller's to clear)
    restartable = {"convert_direct", "convert_scratch"}
    if args.writers:
        names = [n for n in names if n in args.writers.split(",")]
    names = names[:min(args.kills, len(names))]  # the writers this run kills, in turn
    refs = {}
    defrag_src = kdir / "defrag_src"
    import zbatch
    if "atomic_delete_defragment" in names:
        zbatch.AtomicWriter(str(defrag_src), config={"core": {"chunk_rows": 256},
                                                     "meta": {"chunk_rows": 256}}).write(
            atom_samples(2400, 9))
        defrag_all = atom_samples(2400, 9)
    for name in names:
        out = kdir / f"ref_{name}"
        if name == "atomic_delete_defragment":
            shutil.copytree(defrag_src, out)
        cmd, e = cmd_of(name, out)
        t = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, env=e or env, timeout=600)
        took = time.monotonic() - t
        if r.returncode:
            raise SystemExit(f"campaign: writer {name} failed: {r.stderr}")
        refs[name] = (out, took, tree_bytes(out), read_all(out, name == "write_array"))
        print(f"kill: {name} takes {took:.2f} s uninterrupted", flush=True)
    # the states a killed atomistic writer may leave: every committed prefix
    append_prefixes = {}
    for k in range(1, 9 if "atomic_write_append" in names else 1):
        p = kdir / f"prefix{k}"
        w = zbatch.AtomicWriter(str(p), config={"core": {"chunk_rows": 64},
                                                "meta": {"chunk_rows": 16}})
        w.write([s for j in range(k) for s in atom_samples(300, j)])
        append_prefixes[k * 300] = read_all(p)
        shutil.rmtree(p)
    counts = report["kills"]
    for i in range(args.kills):
        name = names[i % len(names)]
        ref_out, took, ref_tree, ref_read = refs[name]
        out = kdir / f"k{i}"
        if out.exists():
            shutil.rmtree(out)
        if name == "atomic_delete_defragment":
            shutil.copytree(defrag_src, out)
        cmd, e = cmd_of(name, out)
        delay = rng.random() * took * 1.05
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             env=e or env)
        time.sleep(delay)
        killed = p.poll() is None
        p.send_signal(signal.SIGKILL)
        _, err = p.communicate(timeout=60)
        if not killed and p.returncode != 0:
            res = f"FINDING: writer failed on its own: {err.decode()[-500:]}"
        else:
            got = read_all(out, name == "write_array") if out.exists() else ("err", "absent", "")
            if name == "atomic_write_append":
                ok = got[0] == "err" or append_prefixes.get(got[1]) == got
                if got[0] == "err" and got[1] in ("ZB_E_INCOMPLETE",):
                    try:
                        zbatch.AtomicWriter(str(out)).recover()
                        got2 = read_all(out)
                    except zbatch.ZbatchError as e:  # a new store never committed
                        got2 = ("err", e.status, str(e))
                    ok = got2[0] == "err" or append_prefixes.get(got2[1]) == got2
            elif name == "atomic_delete_defragment":
                try:
                    zbatch.AtomicWriter(str(out)).recover()
                except zbatch.ZbatchError:
                    pass
                got = read_all(out)
                # include/zbatch_atomic.h: a killed delete leaves some samples deleted and the
                # rest untouched, never one half-deleted; a killed defragment, the samples
                # before or after it. So: the survivors are whole originals, in order, and
                # include every sample the delete keeps
                ok = got[0] == "ok" and defrag_survivors_ok(out, defrag_all)
            elif name == "write_array":
                # each array absent (no metadata yet) or whole
                ok = all(g == r or g == "ZB_E_NOTFOUND" for g, r in zip(got[2], ref_read[2]))
            else:
                ok = got[0] == "err" or got == ref_read
            res = ("refused" if got[0] == "err" else
                   "partial (each array absent or whole)" if got[0] == "arrays" and got != ref_read
                   else "survivors whole" if name == "atomic_delete_defragment"
                   else "equal (a committed state)")
            if not ok:
                res = f"FINDING: killed output reads other data: {got}"
            elif name in restartable:
                r = subprocess.run(cmd, capture_output=True, text=True, env=e or env,
                                   timeout=600)
                if r.returncode:
                    res = f"FINDING: restart failed: {r.stderr[-500:]}"
                elif tree_bytes(out) != ref_tree:
                    a, b = tree_bytes(out), ref_tree
                    diff = sorted(set(a) ^ set(b)) + [k for k in a if k in b and a[k] != b[k]]
                    res = f"FINDING: restart not byte-identical: {diff[:5]}"
                else:
                    res += ", restart identical"
        key = f"{name}: {'killed' if killed else 'finished'}: {res.split(':')[0]}"
        counts[key] = counts.get(key, 0) + 1
        if res.startswith("FINDING"):
            report["findings"].append({"kill": i, "writer": name, "delay": delay, "result": res})
            print(f"FINDING kill {i} {name} after {delay:.3f} s: {res}", flush=True)
        else:
            shutil.rmtree(out, ignore_errors=True)
        if i % 50 == 0:
            print(f"kill {i}: {key}", flush=True)


def asan_package(work: Path, build: Path) -> Path:
    """A copy of python/zbatch with the ASan extension in it."""
    d = work / "asan-pkg"
    if d.exists():
        shutil.rmtree(d)
    shutil.copytree(REPO / "python" / "zbatch", d / "zbatch",
                    ignore=shutil.ignore_patterns("_zbatch*.so", "__pycache__", "bin"))
    sos = glob.glob(str(build / "_zbatch*.so"))
    if not sos:
        raise SystemExit(f"campaign: no ASan extension in {build} (make campaign builds it)")
    shutil.copy2(sos[0], d / "zbatch")
    (d / "zbatch" / "bin").mkdir()
    shutil.copy2(build / "zbatch", d / "zbatch" / "bin" / "zbatch")
    return d


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=200, help="damaged stores")
    ap.add_argument("--kills", type=int, default=40, help="SIGKILLed writers")
    ap.add_argument("--work", default=None, help="work directory (default: a temporary one)")
    ap.add_argument("--asan-build", default=str(REPO / "build-asan-py"))
    ap.add_argument("--plain", action="store_true",
                    help="read with the plain build instead (no sanitizers: the pytest slice)")
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per path: a hang")
    ap.add_argument("--http-every", type=int, default=10,
                    help="every Nth case also read over HTTP from nginx (0: never)")
    ap.add_argument("--h5ad-share", type=float, default=0.15,
                    help="share of the cases that damage an .h5ad input of zbatch convert")
    ap.add_argument("--only", type=int, default=None, help="replay this case only")
    ap.add_argument("--writers", default=None, help="kill only these writers (comma-separated)")
    ap.add_argument("--recheck", default=None,
                    help="the work directory of an earlier run: read the damaged stores it kept "
                         "as findings (WORK/findings/cN) again, with today's binaries")
    args = ap.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="zb-campaign-"))
    args.work = str(work)
    work.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO / "python"))
    # copies of the binaries, so that a rebuild while the campaign runs does not change them
    asan_pkg = asan_package(work, Path(args.build if args.plain else args.asan_build))
    cli = asan_pkg / "zbatch" / "bin" / "zbatch"
    cli_plain = work / "zbatch-plain"
    shutil.copy2(Path(args.build) / "zbatch", cli_plain)
    stores, inputs = build_stores(work / "base", cli_plain)
    report = {"seed": args.seed, "cases": 0, "http_cases": 0, "by_class": {}, "by_layout": {},
              "by_path": {}, "kills": {}, "findings": [], "outcomes": [], "skipped": 0}
    server = None
    if args.http_every and args.cases:
        sys.path.insert(0, str(REPO / "tests" / "python"))
        import remote_servers as rs
        if rs.nginx_missing_reason():
            print(f"campaign: no HTTP cases: {rs.nginx_missing_reason()}")
        else:
            (work / "cases").mkdir(exist_ok=True)
            server = rs.NginxServer(work / "cases").start()
    t0 = time.monotonic()
    try:
        if args.cases:
            worker = Worker(asan_pkg, args.timeout, sanitized=not args.plain)
            try:
                damage_campaign(args, stores, inputs, worker, cli, report, server)
            finally:
                worker.stop()
        if args.kills and args.only is None:
            kill_campaign(args, cli_plain, inputs, report)
    finally:
        if server is not None:
            server.stop()
    report["seconds"] = round(time.monotonic() - t0)
    (work / "report.json").write_text(json.dumps(report, indent=1, default=dict))
    print(json.dumps({k: report[k] for k in ("seed", "cases", "skipped", "http_cases", "by_class",
                                             "by_layout", "by_path", "kills", "seconds")},
                     indent=1, default=dict))
    print(f"{len(report['findings'])} findings; report in {work / 'report.json'}")
    return 1 if report["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
