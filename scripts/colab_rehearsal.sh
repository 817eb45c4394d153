#!/usr/bin/env bash
# The Colab rehearsal: every notebook at full size through `reproduce`, under a Colab T4 runtime's limits, on a
# bigger GPU (an H200): 2 CPU cores (taskset), GPU memory capped at what a T4 leaves after its CUDA context, no bf16 (CUDAGRAPH_KIT_NO_BF16=1),
# Inductor's compile threads as on 2 cores. Per notebook: wall time, peak GPU memory, peak host memory of the
# kernel, in build/colab_rehearsal/rehearsal.{json,csv} and a printed table. cudagraph_kit/course/running/colab_rehearsal.py
# describes it all; this script only pins the CPUs and starts it.
#
#   bash scripts/colab_rehearsal.sh                  # every notebook (far more than 10 minutes: split it, below)
#   bash scripts/colab_rehearsal.sh 01 02            # these notebooks (a new rehearsal run)
#   bash scripts/colab_rehearsal.sh 03 04 --resume   # go on with that run (same code, GPU, PyTorch, limits)
#   bash scripts/colab_rehearsal.sh --resume         # ... every notebook it has not finished yet
#   bash scripts/colab_rehearsal.sh --dry-run 01     # what it would run, with which limits; starts nothing
#   bash scripts/colab_rehearsal.sh --help           # every option (--out DIR, --cpus, --gpu-memory-gib, ...)
#
# --cpus LIST (or CGK_REHEARSAL_CPUS; default 0,1) picks the two cores; PYTHON (default python) the interpreter.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1
cpus="${CGK_REHEARSAL_CPUS:-0,1}"
python="${PYTHON:-$(command -v python || command -v python3 || echo python)}"
dry_run=0
given=0
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do  # --cpus given: taskset pins to those (the Python side checks the list)
  case "${args[i]}" in
    --dry-run|-h|--help) dry_run=1 ;;  # starts nothing: no taskset needed
    --cpus) cpus="${args[i + 1]:-}"; given=1 ;;
    --cpus=*) cpus="${args[i]#--cpus=}"; given=1 ;;
  esac
done
if [ -z "$cpus" ]; then echo "colab_rehearsal.sh: --cpus needs a CPU list, e.g. --cpus 0,1" >&2; exit 2; fi
command=("$python" -m cudagraph_kit.course.running.colab_rehearsal)
if [ "$given" = 0 ]; then command+=(--cpus "$cpus"); fi
command+=("$@")
if command -v taskset >/dev/null 2>&1; then
  command=(taskset -c "$cpus" "${command[@]}")
elif [ "$dry_run" = 0 ]; then
  echo "colab_rehearsal.sh: taskset (util-linux) is not installed; it pins the rehearsal to 2 cores. Fix: install" \
       "util-linux (apt-get install util-linux), or run ${command[*]} (it pins itself)." >&2
  exit 2
fi
echo "colab_rehearsal.sh: ${command[*]}"
exec "${command[@]}"
