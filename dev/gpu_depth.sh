#!/usr/bin/env bash
# On an H200, from the repo root with the wheels installed and on PYTHONPATH (numba-cuda 0.30.4 needs
# numpy < 2.5; dev/gpu_k2.sh says how they are fetched): `bench depth` (build, layer checks, AR, parts,
# DDTree at every budget and oracle p with the drafter in each round, the pair replayed, the projection),
# its result set and console under $OUT. CAP: the bench's wall-clock cap in seconds; DEADLINE: no new
# run starts after it (the checks' references, projection and plot follow); DEPTH_ARGS: more flags.
set -uo pipefail
export PYTHONUNBUFFERED=1                         # a capped run's console keeps everything it printed
export KDTREE_GIT_SHA=${KDTREE_GIT_SHA:?set KDTREE_GIT_SHA to the commit under test}
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.mem --format=csv,noheader
timeout "${CAP:-500}" python3 -m workbench bench depth --out "$OUT" --deadline "${DEADLINE:-390}" \
  ${DEPTH_ARGS:-} > "$OUT/console.log" 2>&1
echo "bench depth rc=$? (cap ${CAP:-500} s)"
grep -v -e "Warning" -e "warn(" -e "table=part" "$OUT/console.log" | tail -45
