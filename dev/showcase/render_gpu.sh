#!/usr/bin/env bash
# Render the committed showcase (reports/) on the GPU machine, from the repository root there:
#   bash dev/showcase/render_gpu.sh [report options]          (default: --profile full)
# The image there has no papermill/nbconvert/jupytext/ipykernel/pandas: they come as the wheels in
# .whl/ (fetch_wheels.sh), installed offline into $SITE. Notebooks 04 and 05 show the committed
# benchmark results of reports/bench/ (RERUN=1 re-runs both benchmarks into it first: about 6 more
# minutes). The last showcase is replaced whole (reports/bench/ stays). With $OUT set (the device
# tool), the rendered showcase also goes to $OUT/showcase.tgz. A tree sent without its .git names its
# commit in WORKBENCH_COMMIT (e.g. WORKBENCH_COMMIT=$(git rev-parse HEAD), run where the checkout is),
# so that the index and every page say which commit they show; with git, a tree that differs from
# HEAD outside reports/ is refused: the showcase must show a commit. WHEELS_INSTALLED=1 skips the
# install, for packages unpacked into $SITE beforehand where the wheels beside the tree pass the device
# tool's 64 MiB: here, `pip install --no-deps --only-binary=:all: --python-version 3.12 --platform
# manylinux_2_28_x86_64 ... --target /tmp/sb .whl/*.whl`, then in /tmp/sb `rm -rf pandas/tests */tests
# numpy/f2py numpy/_core/include numpy/_pyinstaller`, every __pycache__ and *.pyi removed (not
# IPython/testing: IPython imports it; and no `strip`: it breaks numpy's OpenBLAS), `tar cJf
# .whl_site/site.tar.xz -C /tmp/sb .` (19.8 MB at 48 MB of tracked tree); there, `tar xJf
# .whl_site/site.tar.xz -C $SITE`. Then no other wheels travel: the site holds numpy 2.4.6 too. Tree and
# site pass 64 MiB together unless the last showcase (reports/[0-9]*.html, index.html, manifest.json,
# data, figures, logs: ~7 MB) is moved out of the working tree for the call: the render replaces it.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
if git rev-parse HEAD >/dev/null 2>&1; then
  [ -z "$(git status --porcelain -- . ':(exclude)reports')" ] || {
    echo "render_gpu: uncommitted changes outside reports/ (commit them first):" >&2
    git status --short -- . ':(exclude)reports' >&2; exit 2; }
elif [ -z "${WORKBENCH_COMMIT:-}" ]; then
  echo "render_gpu: no git here: set WORKBENCH_COMMIT to the commit of the tree sent" >&2; exit 2
fi
export WORKBENCH_COMMIT=${WORKBENCH_COMMIT:-}
if [ "${WHEELS_INSTALLED:-0}" != 1 ]; then       # 1: $SITE already holds them (unpacked beforehand)
  ls .whl/*.whl >/dev/null || { echo "render_gpu: no wheels in .whl/ (run dev/showcase/fetch_wheels.sh)" >&2; exit 2; }
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
# the kdtree-workbench kernel for this python, and nbconvert's templates from the wheels' data
"$PY" -m ipykernel install --prefix "$SITE/kernel" --name kdtree-workbench --display-name kdtree-workbench >/dev/null
export JUPYTER_PATH="$SITE/kernel/share/jupyter:$SITE/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}"
export PYTHONUNBUFFERED=1
"$PY" -c "import numpy, pandas, papermill, torch; print('numpy', numpy.__version__, 'pandas', pandas.__version__,
'papermill', papermill.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
[ $# -gt 0 ] || set -- --profile full
if [[ " $* " != *" --only"* ]]; then          # the whole showcase: replace the last one whole
  rm -rf reports/[0-9]*.html reports/index.html reports/manifest.json reports/data reports/figures reports/logs
  [ "${RERUN:-0}" = 1 ] || set -- "$@" -p 'rerun_on_gpu=false' -p 'rerun_engine_on_gpu=false'
fi                                               # (with --only, name any -p yourself)
status=0
"$PY" -m workbench report --out reports "$@" || status=$?
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/showcase.tgz" reports/index.html reports/manifest.json reports/0*.html reports/data \
    reports/figures reports/logs $([ "${RERUN:-0}" = 1 ] && echo reports/bench)
  ls -l "$OUT/showcase.tgz"
fi
exit $status
