#!/usr/bin/env bash
# On an H200, from the repo root with the numpy/cffi/pycparser wheels in $WHEELS:
# the whole k2_slice on the engine against the reference (dev/k2_slice_engine.py, FP32 and W16A16
# dense), `bench k2` on layers $LAYERS with the dense projections held as $DENSE (fp32 and / or bf16 =
# W16A16), then the GPU tier of the BLAS path (op level and engine generations, W16A16 included) and
# of the router and fused MoE kernels, each under its own time cap. Everything goes to $OUT. About
# 15 minutes in all: split it over two device calls with SKIP_E2E=1 / SKIP_BENCH=1.
# The wheels (numba-cuda 0.30.4 needs numpy < 2.5), fetched here beforehand:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl_min numpy==2.4.6 cffi==2.0.0 pycparser
set -uo pipefail
WHEELS=${WHEELS:-.whl_min}
LAYERS=${LAYERS:-0,1}
DENSE=${DENSE:-fp32,bf16}
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$WHEELS"/*.whl && export PYTHONPATH=/tmp/site
export KDTREE_GIT_SHA=${KDTREE_GIT_SHA:?set KDTREE_GIT_SHA to the commit under test}
mkdir -p "$OUT/bench"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
if [ -z "${SKIP_E2E:-}" ]; then
  for d in fp32 bf16; do
    timeout "${E2E_S:-240}" python3 dev/k2_slice_engine.py --dense "$d" --out "$OUT/bench/k2_slice_engine_${d}_${KDTREE_GIT_SHA}.json" \
      > "$OUT/bench/k2_slice_engine_${d}_${KDTREE_GIT_SHA}.log" 2>&1
    echo "k2_slice_engine $d rc=$?"; tail -3 "$OUT/bench/k2_slice_engine_${d}_${KDTREE_GIT_SHA}.log"
  done
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  timeout "${BENCH_S:-330}" python3 -m workbench bench k2 --layers "$LAYERS" --dense "$DENSE" --out "$OUT/bench" > "$OUT/k2_console.log" 2>&1
  echo "bench k2 rc=$?"; tail -2 "$OUT/k2_console.log"
fi
tier() {  # tier NAME SECONDS PYTEST-ARGS...
  local name=$1 secs=$2; shift 2
  KDTREE_GPU=1 timeout "$secs" python3 -m pytest -q -p no:cacheprovider "$@" > "$OUT/tier.tmp" 2>&1
  echo "rc=$? (cap ${secs} s): $*" | tee "$OUT/bench/gpu_tier_${name}_${KDTREE_GIT_SHA}.log"
  grep -v -e "Warning" -e "warn(" -e "^$" -e "^tests/.*::" "$OUT/tier.tmp" | tail -20 >> "$OUT/bench/gpu_tier_${name}_${KDTREE_GIT_SHA}.log"
  tail -1 "$OUT/tier.tmp"; rm -f "$OUT/tier.tmp"
}
tier blas "${BLAS_S:-60}" tests/kernels/test_blas.py tests/engine tests/bench/test_k2_layer.py -k "blas or w16a16 and not k2_slice"
tier router_moe "${MOE_S:-60}" tests/kernels/test_router.py tests/kernels/test_moe.py
