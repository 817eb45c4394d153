#!/usr/bin/env bash
# On the GPU machine (see ../shared/gpu/README.md): GPU tests and/or notebook executions, logs and results packed
# into $OUT/gpu-run.tgz for the development machine. Each step is guarded so that one failure does not hide the rest.
#   bash scripts/gpu_run.sh tests            # python -m pytest -m gpu
#   bash scripts/gpu_run.sh nb 01 02 03      # reproduce these notebooks (writes notebooks/*.ipynb, figures/)
#   bash scripts/gpu_run.sh bench            # overhead benchmark + cross-check (after the notebooks)
set -u
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/logs"
what=$1; shift
case "$what" in
  tests) timeout "${TESTS_TIMEOUT:-400}" python3 -m pytest -m gpu -q -rs -s "$@" > "$OUT/logs/gpu-tests.log" 2>&1
         echo "gpu tests rc=$?"; grep -E "passed|failed|error" "$OUT/logs/gpu-tests.log" | tail -3 ;;
  nb)    for n in "$@"; do
           timeout "${NB_TIMEOUT:-420}" python3 -m cudagraph_kit reproduce "$n" > "$OUT/logs/reproduce-$n.log" 2>&1
           echo "notebook $n rc=$?"; grep -E "done in|Error|error" "$OUT/logs/reproduce-$n.log" | tail -3
         done ;;
  bench) python3 -c "from cudagraph_kit.course.reproduce import run_benchmarks, FIGURES_DIR; run_benchmarks(FIGURES_DIR)" \
           > "$OUT/logs/bench.log" 2>&1; echo "bench rc=$?"; tail -16 "$OUT/logs/bench.log" ;;
esac
tar czf "$OUT/gpu-run-$what.tgz" notebooks/*.ipynb figures/ -C "$OUT" logs 2>/dev/null
