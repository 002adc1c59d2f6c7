#!/usr/bin/env bash
# On an H200, from the repo root with the numpy/cffi/pycparser wheels in $WHEELS (as dev/gpu_k2.sh): a
# Kimi-K2.6-layout checkpoint at K2's dimensions (dense layer 0 + one MoE layer of 384 INT4 experts,
# ~16 GB, random), opened lazily, and bench k2 --checkpoint on both layers with the reference checks;
# the peak host RSS is logged. Everything under $OUT; under four minutes (write capped at 45 s, bench at
# 175 s: expected ~20 s and ~150 s, most of the latter fused_moe's first compiles and the MoE reference).
set -uo pipefail
WHEELS=${WHEELS:-.whl_min}
if [ -z "${CK:-}" ]; then   # in memory where there is room (tmpfs writes at memory speed), else on disk
  free=$(df -k --output=avail /dev/shm 2>/dev/null | tail -1)
  if [ "${free:-0}" -gt 25000000 ]; then CK=/dev/shm/k26_checkpoint; else CK=/tmp/k26_checkpoint; fi
fi
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$WHEELS"/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
export KDTREE_GIT_SHA=${KDTREE_GIT_SHA:?set KDTREE_GIT_SHA to the commit under test}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
rm -rf "$CK"; echo "checkpoint folder $CK"
capped() {  # capped SECONDS LOG COMMAND...: in its own process group, which is ended with it (workers too)
  local secs=$1 log=$2; shift 2
  setsid timeout -k 5 "$secs" "$@" > "$log" 2>&1 &
  local pid=$!; wait "$pid"; local rc=$?
  kill -- -"$pid" 2>/dev/null || true
  return "$rc"
}
capped 45 "$OUT/write.log" python3 dev/gpu_checkpoint.py write "$CK" --layers 2 --workers 16
echo "write rc=$?"; tail -2 "$OUT/write.log"
# the MoE layer first: if the cap cuts the run short, it is the dense layer that is left out
capped 175 "$OUT/bench.log" python3 dev/gpu_checkpoint.py bench "$CK" "$OUT/k2_checkpoint" --layers 1,0
echo "bench rc=$?"; grep -v -e "Warning" -e "warn(" "$OUT/bench.log" | grep -e "opened" -e "built in" -e "check layer" \
  -e "checks:" -e "host RSS" -e "FAILED" | tail -20
rm -rf "$CK"
