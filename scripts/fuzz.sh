#!/usr/bin/env bash
# Runs every fuzz target of tests/fuzz for FUZZ_SECONDS each (default 60), one after another,
# each from its checked-in corpus (tests/fuzz/corpus/NAME) plus what earlier runs found
# (build-fuzz/corpus/NAME). Prints one line per target: executions, executions/s, edges and
# features covered, peak memory. A crash stops the run with the input saved under
# build-fuzz/artifacts/NAME/; copy it into tests/fuzz/corpus/NAME/ (keeping its crash-* name)
# and it becomes a regression test that CTest replays in the plain and ASan builds.
#   FUZZ_SECONDS=600 FUZZ_TARGETS="codec meta_v3" scripts/fuzz.sh
# FUZZ_RUNS=N stops a target after N executions if that comes first (the campaign of
# docs/RELIABILITY.md: FUZZ_RUNS=10000000 FUZZ_SECONDS=1800 nice -n 19 make fuzz).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-60}
runs=${FUZZ_RUNS:--1}
bin=build-fuzz
targets=${FUZZ_TARGETS:-$(cd tests/fuzz/corpus && ls)}
status=0
printf '%-14s %12s %10s %8s %8s %8s\n' target executions execs/s cov ft rss_mb
for t in $targets; do
  mkdir -p "$bin/corpus/$t" "$bin/artifacts/$t"
  log="$bin/artifacts/$t/last.log"
  # -rss_limit_mb / -malloc_limit_mb: a single allocation past 2 GiB is a finding (the readers
  # bound what they allocate from untrusted sizes); -timeout: an input running 10 s is a hang.
  # malloc_context_size=0: no stack recorded per allocation (half the time of the store-level
  # targets, which allocate per JSON value); a crash's stacks come from replaying its input
  # (build-asan/replay_NAME FILE), which records them.
  if ! ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:malloc_context_size=0 \
       UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
       "$bin/fuzz_$t" -max_total_time="$secs" -runs="$runs" -print_final_stats=1 -rss_limit_mb=2560 \
       -malloc_limit_mb=2048 -timeout=10 -artifact_prefix="$bin/artifacts/$t/" \
       "$bin/corpus/$t" "tests/fuzz/corpus/$t" >"$log" 2>&1; then
    echo "$t: FAILED (log: $log)"; grep -m5 -E "ERROR|SUMMARY|Test unit written" "$log" || true
    status=1
    continue
  fi
  stat() { grep -m1 "^stat::$1:" "$log" | awk '{print $2}'; }
  cov=$(grep -E "^#[0-9]+.*(DONE|pulse|NEW|REDUCE|INITED)" "$log" | tail -1 |
        sed -E 's/.*cov: ([0-9]+).*/\1/')
  ft=$(grep -E "^#[0-9]+.*(DONE|pulse|NEW|REDUCE|INITED)" "$log" | tail -1 |
       sed -E 's/.*ft: ([0-9]+).*/\1/')
  printf '%-14s %12s %10s %8s %8s %8s\n' "$t" "$(stat number_of_executed_units)" \
    "$(stat average_exec_per_sec)" "$cov" "$ft" "$(stat peak_rss_mb)"
done
exit $status
