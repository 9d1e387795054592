#!/usr/bin/env bash
# Prepares wheels/ for scripts/gpu_check.sh on a GPU machine without the package index: the
# packages fmmeta needs beyond torch, transformers, peft and accelerate (which such machines
# have), at the versions of this checkout's .venv, as wheels for CPython $PY_VERSION on manylinux
# x86_64. Run it on a machine with the package index, after `make setup`; copy wheels/ along.
#
# Usage: scripts/gpu_wheels.sh [DIR]   (default DIR: wheels; PY_VERSION defaults to 3.12)
#   SKIP="NAME ..." leaves out packages the GPU machine already has. The folder travels with the
#   checkout, and most of its 110 MB is what a PyTorch GPU image usually holds (pyarrow alone is
#   55 MB); without these it is 18 MB: SKIP="pyarrow pandas matplotlib pillow fonttools
#   kiwisolver contourpy cycler pyparsing python-dateutil tqdm safetensors psutil py-cpuinfo
#   msgpack ninja einops fsspec xxhash pyyaml"
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-wheels}
PY_VERSION=${PY_VERSION:-3.12}
PIP=".venv/bin/python -m pip"
[ -x .venv/bin/python ] || { echo "error: no .venv: run 'make setup' first" >&2; exit 2; }
# deepspeed (first: it is built, not downloaded), its own dependencies, datasets' and gguf's, and
# fmmeta's small ones (gpu_check.sh installs only those the GPU machine lacks; SKIP keeps the
# others out of the folder).
PACKAGES="deepspeed hjson pydantic pydantic-core annotated-types typing-inspection py-cpuinfo
  msgpack ninja einops psutil datasets dill multiprocess xxhash pyarrow fsspec pandas
  python-dateutil tzdata gguf babel pyyaml matplotlib contourpy cycler fonttools kiwisolver
  pillow pyparsing tqdm safetensors"
mkdir -p "$DIR"
pins=()
SKIP=" $(echo ${SKIP:-}) "  # any whitespace between names
for name in $PACKAGES; do
  [[ "$SKIP" == *" $name "* ]] && { echo "skipping $name: in SKIP" >&2; continue; }
  version=$($PIP show "$name" 2>/dev/null | sed -n 's/^Version: //p')
  # Not in .venv: these versions do not need it (e.g. pytz for recent pandas).
  [ -n "$version" ] || { echo "skipping $name: not installed in .venv" >&2; continue; }
  pins+=("$name==$version")
done
# deepspeed publishes only a source archive: build its (pure Python) wheel here.
$PIP wheel -q --no-deps -w "$DIR" "${pins[0]}"
$PIP download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
  --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 -d "$DIR" "${pins[@]:1}"
# Liger's kernels, which benchmarks/throughput.py gives the Trainer baseline on a GPU: Triton
# kernels, so not in a CPU .venv and pinned here; a pure Python wheel, whose triton comes with the
# GPU machine's torch.
$PIP download -q --no-deps -d "$DIR" liger-kernel==0.8.5
ls -1 "$DIR"
echo "$(du -sh "$DIR" | cut -f1) in $DIR" >&2
