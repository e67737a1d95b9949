#!/usr/bin/env bash
# The GPU check of issue 22 (docs/GPU.md): builds the library, the command and the Python
# extension on a GPU machine, then runs scripts/gpu_check.py: device batches against host
# batches bit for bit, host-to-device bandwidth, and the copy/compute overlap. Under 5 minutes
# on a machine with 16 cores.
#
# The machine may lack the Debian -dev libraries and any package registry: then the build uses
# .gpu-deps/ (made here by scripts/gpu-deps.sh and carried with the working tree): headers and
# pkg-config files under .gpu-deps/root/usr, the shared libraries under .gpu-deps/root/lib,
# pkg-config and ninja under .gpu-deps/root/bin.
#
#   scripts/gpu-check.sh             build (system libraries if complete, else .gpu-deps), check
#   scripts/gpu-check.sh --dry-run   build against .gpu-deps only (system -dev libraries hidden
#                                    from pkg-config and CMake; headers checked to come from
#                                    .gpu-deps), load the extension with .gpu-deps' libraries,
#                                    then run the check (which, without a GPU, says so)
# Environment: PYTHON (default: the first python3 / python that imports torch), JOBS.
# Exit status: 0 pass, 1 failure or mismatch, 77 no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
dry=0
[ "${1:-}" = "--dry-run" ] && dry=1
start=$SECONDS
say() { echo "gpu-check: $*"; }

py=${PYTHON:-}
if [ -z "$py" ]; then
  for c in python3 python .venv/bin/python; do
    if command -v "$c" >/dev/null && "$c" -c "import torch" 2>/dev/null; then py=$c; break; fi
  done
fi
[ -n "$py" ] || { say "no Python with torch found (set PYTHON)"; exit 1; }

if [ $dry = 0 ]; then
  if ! gpu=$("$py" -c "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else '')" 2>&1) || [ -z "$gpu" ]; then
    say "no GPU here (torch.cuda.is_available() is False with $("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null)); nothing built or measured. --dry-run builds against .gpu-deps."
    exit 77
  fi
  say "GPU: $gpu"
fi

deps=$PWD/.gpu-deps/root
extra=()
use_deps=$dry
if [ $dry = 0 ] && ! { command -v pkg-config >/dev/null &&
     pkg-config --exists blosc libzstd liblz4 libdeflate json-c hdf5 libcurl expat libcrypto 2>/dev/null; }; then
  use_deps=1
fi
if [ $use_deps = 1 ]; then
  [ -d "$deps" ] || { say "no -dev libraries here and no .gpu-deps: run scripts/gpu-deps.sh where they are and carry .gpu-deps"; exit 1; }
  say "building against .gpu-deps ($(cat .gpu-deps/ORIGIN))"
  # the unversioned names the linker wants: linker scripts naming the carried libraries
  while read -r name soname; do
    mkdir -p "$deps/$(dirname "$name")"
    echo "INPUT($deps/lib/$soname)" > "$deps/$name"
  done < .gpu-deps/devlinks
  export PKG_CONFIG_LIBDIR=$deps/usr/lib/x86_64-linux-gnu/pkgconfig:$deps/usr/share/pkgconfig
  export PKG_CONFIG_SYSROOT_DIR=$deps
  pc=$(command -v pkg-config || true)
  if [ -z "$pc" ] || [ $dry = 1 ]; then
    mkdir -p build-gpu
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/lib exec %s/bin/pkg-config "$@"\n' "$deps" "$deps" \
      > build-gpu/pkg-config
    chmod +x build-gpu/pkg-config
    pc=$PWD/build-gpu/pkg-config
  fi
  extra+=(-DPKG_CONFIG_EXECUTABLE="$pc" -DISAL_LIB="$deps/lib/libisal.so.2"
          -DISAL_INCLUDE="$deps/usr/include")
fi
# an interpreter without its C headers: the carried 3.12 headers (scripts/gpu-deps.sh)
if ! "$py" -c "import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"; then
  pyver=$("$py" -c "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')")
  if [ -f ".gpu-deps/python$pyver/include/Python.h" ]; then
    say "Python $pyver has no headers: using .gpu-deps/python$pyver/include"
    extra+=(-DPython3_INCLUDE_DIR="$PWD/.gpu-deps/python$pyver/include")
  fi
fi
gen=()
if command -v ninja >/dev/null; then gen=(-G Ninja)
elif [ -x "$deps/bin/ninja" ]; then gen=(-G Ninja -DCMAKE_MAKE_PROGRAM="$deps/bin/ninja"); fi

cmake -S . -B build-gpu "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DZB_BUILD_TESTS=OFF \
  -DZB_BUILD_BENCH=OFF -DPython3_EXECUTABLE="$(command -v "$py")" "${extra[@]}" >/dev/null
cmake --build build-gpu -j "${JOBS:-$(nproc)}" >build-gpu/build.log 2>&1 ||
  { tail -30 build-gpu/build.log; say "FAIL: build"; exit 1; }
cp build-gpu/_zbatch*.so python/zbatch/
say "built in $((SECONDS - start)) s"

if [ $use_deps = 1 ] && [ "${gen[0]:-}" = "-G" ]; then
  # no header of a codec library came from the system
  ninja_bin=$(command -v ninja || echo "$deps/bin/ninja")
  leaked=$("$ninja_bin" -C build-gpu -t deps | grep -E '^ +/usr/include/(zstd|blosc|lz4|libdeflate|json-c|isa-l|hdf5|H5|curl|expat|openssl)' | sort -u || true)
  [ -z "$leaked" ] || { echo "$leaked"; say "FAIL: system headers used instead of .gpu-deps"; exit 1; }
fi
ext=$(ls build-gpu/_zbatch*.so | head -1)
if [ $use_deps = 1 ] && { [ $dry = 1 ] || ldd "$ext" | grep -q "not found"; }; then
  export LD_LIBRARY_PATH=$deps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
if ldd "$ext" | grep "not found"; then say "FAIL: the extension's libraries do not load"; exit 1; fi
if [ $dry = 1 ]; then
  n=$(ldd "$ext" | grep -c "$deps/lib" || true)
  say "dry run: the extension loads $n libraries from .gpu-deps"
fi
rc=0
PYTHONPATH=$PWD/python "$py" scripts/gpu_check.py --cli build-gpu/zbatch || rc=$?
say "done in $((SECONDS - start)) s (exit $rc)"
if [ $dry = 1 ] && [ $rc = 77 ]; then exit 0; fi
exit $rc
