#!/usr/bin/env bash
# The whole GPU test suite (`pytest -m gpu`) in about a third of its serial time, for a GPU machine with many
# CPU cores: the tests that read a clock or the device's free memory run alone on the GPU first, then the
# rest run in parallel (pytest-xdist, one worker per test file). Same tests as `python -m pytest -m gpu`.
# Then the benchmark tests (`pytest -m benchmark`: timing figures that move with the host's noise, reported
# rather than gating), alone on the GPU; their figures go to LOGDIR/benchmarks/*.json and into benchmark.log.
#   bash scripts/gpu_suite.sh [LOGDIR] [WORKERS]
set -uo pipefail
cd "$(dirname "$0")/.."
logdir="${1:-build/gpu-tests}"; workers="${2:-6}"
mkdir -p "$logdir"
alone=(tests/test_timing.py tests/test_ddp.py tests/test_buckets.py tests/test_show.py tests/test_capture_stream.py
       "tests/test_pitfalls_gpu.py::test_advise_predicts_the_small_and_large_gelu")
ignore=(); for f in "${alone[@]}"; do [[ "$f" == *::* ]] || ignore+=(--ignore "$f"); done
python -m pytest -m gpu -v --durations=15 "${alone[@]}" > "$logdir/alone.log" 2>&1; rc1=$?
python -m pytest -m benchmark -v -rP --benchmark-dir "$logdir/benchmarks" > "$logdir/benchmark.log" 2>&1; rc3=$?
{ echo; echo "== figures written to $logdir/benchmarks"; for f in "$logdir"/benchmarks/*.json; do
    [[ -e "$f" ]] && { echo "-- $f"; cat "$f"; }; done; } >> "$logdir/benchmark.log"
python -m pytest -m gpu -v --durations=15 -n "$workers" --dist loadfile "${ignore[@]}" \
    --deselect "tests/test_pitfalls_gpu.py::test_advise_predicts_the_small_and_large_gelu" \
    > "$logdir/parallel.log" 2>&1; rc2=$?
tail -n 1 "$logdir/alone.log" "$logdir/parallel.log"
grep -h "^BENCHMARK \|passed\|failed" "$logdir/benchmark.log" | tail -n 20
# A benchmark test fails only when its measurement breaks (an exception), never on a slow figure.
exit $(( rc1 || rc2 || rc3 ))
