#!/usr/bin/env bash
# Download the wheels of wheels.txt for the GPU machine (CPython 3.12, manylinux x86-64) into .whl/
# (git-ignored), then check that they and the tracked tree fit the 64 MiB a device call carries.
# Run here, from anywhere in the repository: bash dev/showcase/fetch_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
mkdir -p .whl
mapfile -t pins < <(grep -E '^[A-Za-z0-9]' dev/showcase/wheels.txt)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "${pins[@]}"
# exactly one wheel per pin: a stale second version would stop the offline install
want=$(printf '%s\n' "${pins[@]}" | sed 's/==.*//; s/[-_.]\+/_/g' | tr A-Z a-z | sort)
have=$(ls .whl/*.whl | xargs -n1 basename | sed 's/-.*//' | tr A-Z a-z | sed 's/[-_.]\+/_/g' | sort)
if [ "$want" != "$have" ]; then
  echo "fetch_wheels: .whl/ does not hold exactly the wheels of wheels.txt:" >&2
  diff <(echo "$want") <(echo "$have") >&2 || true
  exit 1
fi
wheels=$(du -cb .whl/*.whl | tail -1 | cut -f1)
tree=$(git ls-files -z | xargs -0 du -cb | grep total | awk '{s += $1} END {print s}')
limit=$((64 * 1024 * 1024))
echo "wheels: ${#pins[@]} files, $wheels bytes; tracked tree: $tree bytes; together $((wheels + tree)) of $limit"
[ $((wheels + tree)) -lt $limit ] || { echo "fetch_wheels: over the 64 MiB a device call carries" >&2; exit 1; }
