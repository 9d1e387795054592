#!/usr/bin/env bash
# One prepared check for a GPU machine: installs what is missing (offline, from a wheel folder),
# then runs scripts/gpu_check.py: the meta-step on CUDA against the CPU reference in fp32, bf16
# with fp32 master adapter weights, ZeRO-3 on one GPU, and the device benchmarks (a ~1B random
# Llama's tokens/s and MFU, meta-step against a plain LoRA loop). The last stdout line is one JSON
# object; the exit status is non-zero if a check failed.
#
# Usage: scripts/gpu_check.sh [--cpu] [--wheels DIR] [--out DIR] [--budget-s S] [--only A,B]
#   --cpu          dry run of everything on the CPU with small sizes (what the tests run)
#   --budget-s S   start no benchmark after S seconds (a lease is short; what ran is still reported)
#   --only A,B     run only these benchmarks, no correctness checks (a second try of a lease)
#   --wheels DIR   wheels to install from where a package is missing (default: wheels/,
#                  prepared on a networked machine with scripts/gpu_wheels.sh)
#   --out DIR      where runs and logs go (default: a temporary folder)
# PYTHON selects the interpreter (default: python3; the machine's torch, transformers and peft).
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=cuda
WHEELS=wheels
OUT=""
BUDGET=0
ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) DEVICE=cpu ;;
    --wheels) WHEELS=${2:?--wheels needs a folder}; shift ;;
    --out) OUT=${2:?--out needs a folder}; shift ;;
    --budget-s) BUDGET=${2:?--budget-s needs seconds}; shift ;;
    --only) ONLY=${2:?--only needs benchmark names}; shift ;;
    *) echo "error: unknown argument '$1' (allowed: --cpu, --wheels DIR, --out DIR, --budget-s S, --only A,B)" >&2; exit 2 ;;
  esac
  shift
done
PY=${PYTHON:-python3}

# A wheel is installed only where its distribution is missing, without dependencies and without
# the network, so nothing the machine already has (torch above all) is replaced.
# One Python process answers for every wheel (a process per package took seconds each).
wheels=()
if [ -d "$WHEELS" ]; then
  for whl in "$WHEELS"/*.whl; do
    [ -e "$whl" ] || continue
    wheels+=("$whl")
  done
fi
missing=()
if [ ${#wheels[@]} -gt 0 ]; then
  # prints each wheel whose distribution (the file name up to the first '-') is not installed
  mapfile -t missing < <("$PY" -c '
import importlib.metadata as m, os, sys
for whl in sys.argv[1:]:
    try:
        m.version(os.path.basename(whl).split("-")[0])
    except Exception:
        print(whl)
' "${wheels[@]}")
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${#missing[@]} wheels from $WHEELS" >&2
  "$PY" -m pip install -q --no-index --no-deps "${missing[@]}" >&2
fi
# What is still missing is named by gpu_check.py itself: it imports every module it needs before
# any check starts (a separate interpreter importing them all first took seconds more per run).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.gpu_check_extensions}
if [ "$DEVICE" = cpu ]; then export DS_ACCELERATOR=cpu; fi
exec "$PY" scripts/gpu_check.py --device "$DEVICE" --budget-s "$BUDGET" --only "$ONLY" --wheels "$WHEELS" \
  ${OUT:+--out "$OUT"}
