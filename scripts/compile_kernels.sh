#!/usr/bin/env bash
# Compile every CUDA source in kernels/ with nvcc alone (no torch) for sm_80, sm_90 and sm_90a (the wgmma kernel,
# MARLIN_SM90A), two files at a time, so a kernel that does not build fails CI on machines without a GPU; and the
# CUDA measurement tools in scripts/ (sm_90a only), so they do not rot; and checks that ptxas left the 2:4 wgmma kernels'
# metadata registers alone while their groups run (a GPU test checks the same on the built library).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvcc >/dev/null || { echo "nvcc not found: install the CUDA toolkit to compile kernels/" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
ls kernels/*.cu | xargs -P 2 -I{} sh -c \
  'nvcc -std=c++17 -O3 -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_90a,code=sm_90a -DMARLIN_SM90A -c "$1" -o "$2/$(basename "$1").o" && echo "compiled $1"' _ {} "$out"
# the 2:4 wgmma kernels' metadata registers (scripts/check_meta_hazards.py), on the object's sm_90a code
if ! report=$(python3 scripts/check_meta_hazards.py "$out/marlin24_sm90.cu.o"); then
  echo "$report"
  exit 1
fi
echo "${report##*$'\n'}"
for f in scripts/*.cu; do
  nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -o "$out/$(basename "$f" .cu)" "$f"
  echo "compiled $f"
done
