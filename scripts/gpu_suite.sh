#!/usr/bin/env bash
# The whole GPU test suite (`pytest -m gpu`) in about a third of its serial time, for a GPU machine with many
# CPU cores: the tests that read a clock or the device's free memory run alone on the GPU first, then the
# rest run in parallel (pytest-xdist, one worker per test file). Same tests as `python -m pytest -m gpu`.
# Then the benchmark tests (`pytest -m benchmark`: timing figures that move with the host's noise, reported
# rather than gating), alone on the GPU; their figures go to LOGDIR/benchmarks/*.json and into benchmark.log.
# Then every notebook at smoke size on the GPU (`pytest -m notebook`: papermill runs each notebook's GPU branch and
# the test asserts on what it recorded), into notebooks.log.
#   bash scripts/gpu_suite.sh [LOGDIR] [WORKERS]
#   LEGS="notebooks" bash scripts/gpu_suite.sh LOGDIR    # only some legs: alone benchmark parallel notebooks
set -uo pipefail
case "${1:-}" in
  -h|--help) echo "usage: bash scripts/gpu_suite.sh [LOGDIR] [WORKERS]"; sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) echo "gpu_suite.sh: unknown option $1 (usage: bash scripts/gpu_suite.sh [LOGDIR] [WORKERS])" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
logdir="${1:-build/gpu-tests}"; workers="${2:-6}"; legs=" ${LEGS:-alone benchmark parallel notebooks} "
leg() { [[ "$legs" == *" $1 "* ]]; }
rc1=0; rc2=0; rc3=0; rc4=0
mkdir -p "$logdir"
alone=(tests/test_timing.py tests/test_ddp.py tests/test_buckets.py tests/test_show.py tests/test_capture_stream.py
       tests/test_first_replay_order.py
       "tests/test_pitfalls_gpu.py::test_advise_predicts_the_small_and_large_gelu")
ignore=(); for f in "${alone[@]}"; do [[ "$f" == *::* ]] || ignore+=(--ignore "$f"); done
if leg alone; then
  python -m pytest -m gpu -v --durations=15 "${alone[@]}" > "$logdir/alone.log" 2>&1; rc1=$?
fi
if leg benchmark; then
  python -m pytest -m benchmark -v -rP --benchmark-dir "$logdir/benchmarks" > "$logdir/benchmark.log" 2>&1; rc3=$?
  { echo; echo "== figures written to $logdir/benchmarks"; for f in "$logdir"/benchmarks/*.json; do
      [[ -e "$f" ]] && { echo "-- $f"; cat "$f"; }; done; } >> "$logdir/benchmark.log"
  grep -h "^BENCHMARK \|passed\|failed" "$logdir/benchmark.log" | tail -n 20
fi
if leg parallel; then
  python -m pytest -m gpu -v --durations=15 -n "$workers" --dist loadfile "${ignore[@]}" \
      --deselect "tests/test_pitfalls_gpu.py::test_advise_predicts_the_small_and_large_gelu" \
      > "$logdir/parallel.log" 2>&1; rc2=$?
fi
if leg notebooks; then  # smoke size: the assertions are on what each notebook recorded, not on its timings
  python -m pytest -m notebook -v --durations=15 -n 4 --dist loadfile tests/test_nb_0*.py \
      > "$logdir/notebooks.log" 2>&1; rc4=$?
fi
for f in alone parallel notebooks; do [[ -e "$logdir/$f.log" ]] && tail -n 1 "$logdir/$f.log"; done
# A benchmark test fails only when its measurement breaks (an exception), never on a slow figure.
exit $(( rc1 || rc2 || rc3 || rc4 ))
