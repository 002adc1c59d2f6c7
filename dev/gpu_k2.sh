#!/usr/bin/env bash
# On an H200 (the device tool), from the repo root with the numpy/cffi/pycparser wheels in $WHEELS:
# the GPU tier of the BLAS path (op level and engine generations) and `bench k2` on layers $LAYERS.
# Logs and the result set go to $OUT.
set -uo pipefail
WHEELS=${WHEELS:-.whl_min}
LAYERS=${LAYERS:-0,1}
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$WHEELS"/*.whl && export PYTHONPATH=/tmp/site
export KDTREE_GIT_SHA=${KDTREE_GIT_SHA:?set KDTREE_GIT_SHA to the commit under test}
mkdir -p "$OUT/bench"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
KDTREE_GPU=1 timeout 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_blas.py tests/engine \
  -k blas 2>&1 | tail -25 > "$OUT/bench/gpu_tier_blas_${KDTREE_GIT_SHA}.log"
tail -3 "$OUT/bench/gpu_tier_blas_${KDTREE_GIT_SHA}.log"
timeout 330 python3 -m workbench bench k2 --layers "$LAYERS" --out "$OUT/bench" > "$OUT/k2_console.log" 2>&1
echo "bench k2 rc=$?"; tail -4 "$OUT/k2_console.log"
