#!/usr/bin/env bash
# The whole GPU test suite (`pytest -m gpu`) in about a third of its serial time, for a GPU machine with many
# CPU cores: the tests that read a clock or the device's free memory run alone on the GPU first, then the
# rest run in parallel (pytest-xdist, one worker per test file). Same tests as `python -m pytest -m gpu`.
#   bash scripts/gpu_suite.sh [LOGDIR] [WORKERS]
set -uo pipefail
cd "$(dirname "$0")/.."
logdir="${1:-build/gpu-tests}"; workers="${2:-6}"
mkdir -p "$logdir"
alone=(tests/test_timing.py tests/test_ddp.py tests/test_buckets.py tests/test_show.py tests/test_capture_stream.py
       "tests/test_pitfalls_gpu.py::test_advise_predicts_the_small_and_large_gelu")
ignore=(); for f in "${alone[@]}"; do [[ "$f" == *::* ]] || ignore+=(--ignore "$f"); done
python -m pytest -m gpu -v --durations=15 "${alone[@]}" > "$logdir/alone.log" 2>&1; rc1=$?
python -m pytest -m gpu -v --durations=15 -n "$workers" --dist loadfile "${ignore[@]}" \
    --deselect "tests/test_pitfalls_gpu.py::test_advise_predicts_the_small_and_large_gelu" \
    > "$logdir/parallel.log" 2>&1; rc2=$?
tail -n 1 "$logdir/alone.log" "$logdir/parallel.log"
exit $(( rc1 || rc2 ))
