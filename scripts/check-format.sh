#!/usr/bin/env bash
# Checks (or with --fix, applies) the checked-in .clang-format over the C sources: include/, src/,
# cli/, bench/, tests/ and the Python extension, less what scripts/format-exclude.txt lists.
# Exits 1 naming each file clang-format would change. Run by `make format-check` (part of
# `make test`, so of CI); `make format` runs it with --fix.
set -euo pipefail
cd "$(dirname "$0")/.."
fix=0
[ "${1:-}" = "--fix" ] && fix=1
command -v clang-format >/dev/null || { echo "check-format: clang-format is not installed" >&2; exit 1; }

mapfile -t excluded < <(grep -v '^\s*#' scripts/format-exclude.txt | grep -v '^\s*$')
files=()
while IFS= read -r f; do
  skip=0
  for e in "${excluded[@]}"; do
    case "$e" in
      */) [[ "$f" == "$e"* ]] && skip=1 ;;  # a directory: everything under it
      *) [[ "$f" == "$e" ]] && skip=1 ;;
    esac
  done
  [ $skip -eq 1 ] || files+=("$f")
done < <(git ls-files --cached --others --exclude-standard -- include src cli bench tests \
           python/zbatch | grep -E '\.(c|h)$' | sort)

if [ $fix -eq 1 ]; then
  clang-format -i "${files[@]}"
  echo "check-format: formatted ${#files[@]} files"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  printf 'check-format: not formatted (clang-format -i FILE, or make format): %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted as .clang-format says"
