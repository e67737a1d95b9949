#!/usr/bin/env bash
# Gathers what scripts/gpu-check.sh needs to build zbatch on a GPU machine that has a compiler,
# CMake, nvcc and its own Python + CUDA torch but none of the Debian -dev libraries and no
# package registry: the codec libraries' headers, pkg-config files and shared libraries (with
# every library they load that is not part of glibc or the compiler's runtime), pkg-config and
# ninja themselves. Run here, after a build (build/ holds the extension it reads the shared
# libraries' closure from); it fills .gpu-deps/ (ignored by git), which the device run tool
# carries: run(..., carry=[".gpu-deps"]). About 28 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu-deps
root=$out/root
ext=$(ls build/_zbatch*.so 2>/dev/null | head -1 || true)
if [ -z "$ext" ] || [ ! -x build/zbatch ]; then
  echo "gpu-deps: build first (cmake --build build): build/_zbatch*.so and build/zbatch are read" >&2
  exit 1
fi
rm -rf "$out"
mkdir -p "$root/lib" "$root/bin"

# -dev packages: headers and pkg-config files (no static archives, no docs, no C++/Fortran
# bindings); the unversioned .so names the linker wants become, in gpu-check.sh, linker
# scripts pointing at the shared library copied below (devlinks: name -> soname), so no file
# is carried twice and no symlink at all
devs=(libblosc-dev libzstd-dev liblz4-dev libdeflate-dev libjson-c-dev libisal-dev libhdf5-dev
      libcurl4-openssl-dev libexpat1-dev libssl-dev)
: > "$out/devlinks"
for p in "${devs[@]}"; do
  dpkg -L "$p" | while read -r f; do
    [ -f "$f" ] || continue
    case "$f" in
      *cpp*|*fortran*|*_hl*|*hl_*|*.mod) continue ;;
      *.so)
        soname=$(objdump -p "$f" | awk '/SONAME/{print $2}')
        echo "${f#/} $soname" >> "$out/devlinks"
        continue ;;
      /usr/include/*|*/pkgconfig/*.pc) ;;
      *) continue ;;
    esac
    mkdir -p "$root$(dirname "$f")"
    cp -L "$f" "$root$f"
  done
done
# hdf5.pc is an alternatives link to hdf5-serial.pc on Debian
cp -L /usr/lib/x86_64-linux-gnu/pkgconfig/hdf5.pc "$root/usr/lib/x86_64-linux-gnu/pkgconfig/hdf5.pc"

# the shared libraries the extension and the command load, except glibc's and the
# compiler runtime's (every machine that runs Python has those)
skip='linux-vdso|ld-linux|/libc\.so|/libm\.so|/libpthread|/libdl\.so|/librt\.so|/libresolv|libstdc\+\+|libgcc_s'
for bin in "$ext" build/zbatch /usr/bin/pkgconf; do
  ldd "$bin" | awk '/=> \//{print $3}' | grep -Ev "$skip" || true
done | sort -u | while read -r lib; do
  cp -L "$lib" "$root/lib/$(basename "$lib")"
done

# Python 3.12's headers, for an interpreter that came without them (the extension is built
# by the GPU machine's own Python; PY312 names a 3.12 here, default: .venv-annbatch's)
py312=${PY312:-.venv-annbatch/bin/python}
if [ -x "$py312" ]; then
  inc=$("$py312" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
  mkdir -p "$out/python3.12"
  cp -rL "$inc" "$out/python3.12/include"
fi

cp -L /usr/bin/pkgconf "$root/bin/pkg-config"
if [ -x /usr/bin/ninja ]; then cp -L /usr/bin/ninja "$root/bin/ninja"; fi
echo "debian $(cat /etc/debian_version) glibc $(ldd --version | head -1 | awk '{print $NF}')" \
  > "$out/ORIGIN"
echo "gpu-deps: $(du -sh "$out" | cut -f1) in $out ($(ls "$root/lib" | wc -l) shared libraries)"
