#!/usr/bin/env bash
# Installs what zbatch needs to build and test: the Debian -dev libraries and the project's
# virtual environment (.venv) from the pinned requirements files. Idempotent; quiet when all is
# present. Run by `make` when something is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

debs=(build-essential cmake pkg-config time libblosc-dev libzstd-dev liblz4-dev libdeflate-dev
      libjson-c-dev libisal-dev libcmocka-dev libcurl4-openssl-dev libssl-dev libexpat1-dev
      libhdf5-dev clang-format ninja-build
      nginx-extras)
# nginx-extras: the remote-store tests' HTTP server (tests/python/remote_servers.py) with its echo
# module (latency per request); the tests start their own nginx, the system service is not used.

missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing Debian packages: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

# The venv is rebuilt when a requirements file changed since it was made.
stamp=.venv/.zbatch-reqs
want=$(cat requirements.txt constraints.txt | sha256sum | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "install-deps: creating .venv from requirements.txt"
  rm -rf .venv
  python3 -m venv .venv
  log=$(mktemp)
  # pip's notes about this machine's local index folders are noise; show the log on failure.
  if ! { .venv/bin/python -m pip install -q --upgrade pip &&
         .venv/bin/python -m pip install -q -c constraints.txt -r requirements.txt; } >"$log" 2>&1
  then
    grep -v "WARNING: Location" "$log" >&2 || true
    rm -f "$log"
    echo "install-deps: pip install failed" >&2
    exit 1
  fi
  rm -f "$log"
  echo "$want" > "$stamp"
fi

# annbatch's own environment (Python 3.12, .venv-annbatch): the peer and oracle for annbatch
# collections; see the script.
bash scripts/install-annbatch-env.sh
