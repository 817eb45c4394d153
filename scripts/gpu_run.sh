#!/usr/bin/env bash
# On the GPU machine (see ../shared/gpu/README.md): GPU tests and/or notebook executions, logs and results packed
# into $OUT/gpu-run.tgz for the development machine. Each step is guarded so that one failure does not hide the rest.
#   bash scripts/gpu_run.sh tests            # the pytest -m gpu suite, via scripts/gpu_suite.sh (~7 min on an H200)
#   bash scripts/gpu_run.sh nb 01 02 03      # reproduce these notebooks (writes notebooks/*.ipynb, figures/)
#   bash scripts/gpu_run.sh bench            # overhead benchmark + cross-check (after the notebooks)
set -u
usage() { echo "usage: bash scripts/gpu_run.sh {tests | nb NN ... | bench}"; sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; }
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  tests|nb|bench) ;;
  *) echo "gpu_run.sh: say what to run: tests, nb NN ..., or bench (got '${1:-}')" >&2; usage >&2; exit 2 ;;
esac
export PYTHONUNBUFFERED=1  # no MPLBACKEND: the executed notebooks show their figures inline
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/logs"
what=$1; shift
case "$what" in
  tests) bash scripts/gpu_suite.sh "$OUT/logs" "${WORKERS:-6}"; echo "gpu tests rc=$?" ;;
  nb)    for n in "$@"; do
           timeout "${NB_TIMEOUT:-420}" python3 -m cudagraph_kit reproduce "$n" > "$OUT/logs/reproduce-$n.log" 2>&1
           echo "notebook $n rc=$?"; grep -E "done in|Error|error" "$OUT/logs/reproduce-$n.log" | tail -3
         done ;;
  bench) python3 -c "from cudagraph_kit.course.running.reproduce import run_benchmarks, FIGURES_DIR; run_benchmarks(FIGURES_DIR)" \
           > "$OUT/logs/bench.log" 2>&1; echo "bench rc=$?"; tail -16 "$OUT/logs/bench.log" ;;
esac
tar czf "$OUT/gpu-run-$what.tgz" notebooks/*.ipynb figures/ -C "$OUT" logs 2>/dev/null
