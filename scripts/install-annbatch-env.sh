#!/usr/bin/env bash
# Creates annbatch's own environment (default .venv-annbatch) from requirements-annbatch.txt.
#
#   scripts/install-annbatch-env.sh [VENV_DIR]
#
# annbatch 0.3.1 needs Python >= 3.12 and zbatch's .venv is 3.11, so annbatch runs in a separate
# interpreter, never mixed with .venv: the tests and benchmarks call it in a subprocess
# (tests/python/annbatch_bridge.py). Run by scripts/install-deps.sh (so by `make`); idempotent,
# quiet when the environment is current, rebuilt when requirements-annbatch.txt changes.
#
# Python 3.12 is looked for, in order: $ZB_PYTHON312, python3.12 on PATH, pyenv's versions
# (`pyenv root`, else ~/.pyenv), /usr/local/bin and /usr/bin. None found is an error, never a
# silent skip: the annbatch tests would otherwise fail later with a less useful message.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${1:-.venv-annbatch}
reqs=requirements-annbatch.txt

is_312() {
  [ -n "$1" ] && "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1
}

find_python312() {
  local roots=() c
  [ -n "${ZB_PYTHON312:-}" ] && { is_312 "$ZB_PYTHON312" && echo "$ZB_PYTHON312"; return; }
  if c=$(command -v python3.12 2>/dev/null) && is_312 "$c"; then echo "$c"; return; fi
  command -v pyenv >/dev/null 2>&1 && roots+=("$(pyenv root)")
  roots+=("$HOME/.pyenv")
  # the newest 3.12.x first (sort -V orders 3.12.10 after 3.12.9)
  for c in $(for r in "${roots[@]}"; do ls -d "$r"/versions/3.12*/bin/python3.12 2>/dev/null; done |
             sort -V -r) /usr/local/bin/python3.12 /usr/bin/python3.12; do
    if is_312 "$c"; then echo "$c"; return; fi
  done
  return 1
}

stamp=$venv/.zbatch-reqs
want=$(sha256sum "$reqs" | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi

if ! py=$(find_python312); then
  echo "install-annbatch-env: Python 3.12 not found (annbatch 0.3.1 needs Python >= 3.12;" \
       "looked at \$ZB_PYTHON312, python3.12 on PATH, pyenv versions 3.12.*, /usr/bin)." \
       "Install it (e.g. 'pyenv install 3.12') or set ZB_PYTHON312=/path/to/python3.12." >&2
  exit 1
fi
echo "install-annbatch-env: creating $venv from $reqs with $py"
rm -rf "$venv"
"$py" -m venv "$venv"
log=$(mktemp)
# pip's notes about this machine's local index folders are noise; show the log on failure.
if ! { "$venv/bin/python" -m pip install -q --upgrade pip &&
       "$venv/bin/python" -m pip install -q -r "$reqs" &&
       "$venv/bin/python" -I -c 'import annbatch, zarrs'; } >"$log" 2>&1
then
  grep -v "WARNING: Location" "$log" >&2 || true
  rm -f "$log"
  echo "install-annbatch-env: pip install into $venv failed" >&2
  exit 1
fi
rm -f "$log"
echo "$want" > "$stamp"
