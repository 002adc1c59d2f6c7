#!/usr/bin/env bash
# On an H200, from the repo root with the numpy/cffi/pycparser wheels in $WHEELS: the issue-17 GPU
# runs as named steps, each under its own time cap, everything under $OUT. STEPS picks them (default:
# all but the k2_* fallbacks, about 16 minutes; a device call is capped at 10, so split them over calls):
#   k2           bench k2 --layers 0,1 --dense fp32,bf16 (checks overlapped with the timing)  470 s at 0ecd7be
# the same in pieces, if that run does not fit (merge them with dev/merge_sets.py):
#   k2_bf16      bench k2 --layers 0,1 --dense bf16 --fp32-layer -1: K2's layout only (W16A16 dense,
#                INT4 and BF16 experts), the three checks' references in parallel: the device part
#                427 s at dd77887 (the three references in parallel, BLAS threads shared)
#   k2_dense     bench k2 --layers 0 --dense fp32,bf16 (with checks)                        ~90 s
#   k2_moe_bf16  bench k2 --layers 1 --dense bf16 (with checks; the W16A16 reference is slow)  ~400 s
#   k2_moe_fp32  bench k2 --layers 1 --dense fp32 --no-check (with the FP32-experts line)     ~200 s
#   e2e_fp32     dev/k2_slice_engine.py --dense fp32 (the reference in a child process)     ~260 s
#   e2e_bf16x    the same with BF16 experts, outputs saved for a comparison on the CPU:
#                dev/k2_slice_engine.py --experts bf16 --engine <saved> --ref <dev/k2_slice_reference.py --experts bf16 --out>
#   engine       bench engine (tiny2's decode step: the row kernels' change)                 ~120 s
#   tier_blas    GPU tier of the BLAS path and W16A16 tests                                  ~150 s
#   tier_int4    GPU tier of int4_matmul (both kernels) and the engine tests (330 s cut it after 117 tests at 430af85)  ~500 s
#   tier_kernels GPU tier of tests/kernels on 8 pytest-xdist workers (the image has pytest-xdist)
#   tier_engine  GPU tier of tests/engine and tests/bench on 8 workers, less the Kimi-shape drafter
#                (drafter_k26) and the k2_slice cases (bench k2's checks): with tests/kernels on 12 workers
#                about 330 tests passed in 420 s at 778f5cf
#   kernels      bench kernels (int4_matmul, fused_moe against their baselines)              ~190 s
#   profile      dev/profile_k2_step.py: the MoE layer step by kernel (attention eagerly beside torch;
#                attention, the MoE block beside / after and the layer as CUDA graphs: launches, idle)  ~200 s
#   staged       dev/kernels/int4_matmul.py --staged: the staged W4A16 kernel's builds and tilings
#                beside the tiled kernel and cuBLAS at M = 33 / 48 / 64, each checked first   ~60 s
#   ep           bench ep --worlds 1: the split at P = 1, 2, 4, 8 rank after rank on this GPU, and the
#                expert-parallel layer on NCCL with one rank, each checked against the one-GPU layer,
#                then timed (on a machine of P GPUs, --worlds 1,2,4,8 gives the scaling run)  ~200 s
#   tier_ep      GPU tier of tests/parallel (NCCL, as many ranks as GPUs) and the routed-slice test  ~90 s
#   probe_random dev/probe_random_source.py: the random-weights test model against the reference, per layer  ~30 s
#   router       dev/kernels/router.py: the sliced router beside cuBLAS SGEMM logits at 1-65 rows, its parts
#                alone and six sliced-logits configurations, each checked first                    ~120 s
#   mla_core     dev/kernels/mla_core.py: the W16A16 attention core with its absorptions on the W16A16
#                kernel, and with the core kernel, beside the torch core at 1-65 rows, contexts 576 and
#                4096, each checked (and the kernel's rows against their decode alone) first
#   drafter_k26  GPU test of the device drafter at the Kimi-K2.6-DFlash shape (3.5 B parameters, W16A16)
#                against the reference (tests/engine/test_dflash.py -k kimi; ~40 GB of host memory)
#   w16a16       dev/kernels/w16a16.py at 1-65 rows (the NT column tiles' rows beside NT = 1, v3 beside the
#                pipelined v4) and the GPU test of the W16A16 kernel and the attention core
#   draft_attn   dev/kernels/draft_attention.py: the drafter's attention beside torch's SDPA at the
#                Kimi-K2.6-DFlash shape, contexts 256-4,096, each checked against float64 first   ~60 s
#   smoke        GPU tier of the kernels a K2 layer runs (W16A16 with its groups, folded norm and two batches
#                in flight, the attention core's kernels, norms, router, rows, fused_moe, the shared expert
#                beside it, the drafter's attention, the round's top-k, the shuffles, wgmma), on 8 workers: the first call after
#                kernels changed without a GPU                                                     ~240 s
#   gemv_sweep   dev/kernels/moe.py --gemv-sweep: fused_moe's per-pair GEMV tilings and register caps at
#                T = 1 and 8, each checked against the default's output                          ~120 s
#   wgmma        dev/kernels/int4_matmul.py --wgmma: the wgmma W4A16 kernel's tilings (both scale modes)
#                beside the staged default, the tiled kernel and cuBLAS bf16 at M = 33 / 48 / 64, each
#                checked first (its GPU tests, and the wgmma intrinsics', run in smoke)
#   k2_switched  bench k2 --layers 0,1 --dense bf16 --fp32-layer -1 --no-check with the kernels not yet defaults
#                on ($SWITCHES, default W16_FLASH=1 W16_PERSISTENT=1), into $OUT/k2_switched: beside a
#                default run of the same command (k2_nocheck) it says whether they go on  ~150 s each
#   k2_nocheck   the same command with the defaults, into $OUT/k2_nocheck
#   persistent   dev/kernels/persistent.py: the persistent W16A16 SwiGLU (one cooperative launch) beside the
#                three PDL launches at K2's shared expert and dense MLP, 1 and 8 rows, each checked first  ~90 s
# The wheels (numba-cuda 0.30.4 needs numpy < 2.5), fetched here beforehand:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl_min numpy==2.4.6 cffi==2.0.0 pycparser
set -uo pipefail
WHEELS=${WHEELS:-.whl_min}
STEPS=${STEPS:-k2 e2e_fp32 e2e_bf16x engine tier_blas}
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$WHEELS"/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1                         # a capped run's log keeps everything it printed
export KDTREE_GIT_SHA=${KDTREE_GIT_SHA:?set KDTREE_GIT_SHA to the commit under test}
mkdir -p "$OUT/bench"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
run() {  # run NAME SECONDS COMMAND...: the command's output to $OUT/NAME.log, its status and tail here
  local name=$1 secs=$2; shift 2
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? (cap $secs s)"; grep -v -e "Warning" -e "warn(" "$OUT/$name.log" | tail -3
  pkill -f "multiprocessing.spawn" || true   # a capped run's reference workers outlive it: not into the next step
}
for step in $STEPS; do
  case $step in
    k2) run k2 560 python3 -m workbench bench k2 --layers 0,1 --dense fp32,bf16 --out "$OUT/k2" ;;
    k2_bf16) run k2_bf16 560 python3 -m workbench bench k2 --layers 0,1 --dense bf16 --fp32-layer -1 \
               --out "$OUT/k2_bf16" ;;
    k2_dense) run k2_dense 150 python3 -m workbench bench k2 --layers 0 --dense fp32,bf16 --out "$OUT/k2_dense" ;;
    k2_moe_bf16) run k2_moe_bf16 480 python3 -m workbench bench k2 --layers 1 --dense bf16 --fp32-layer -1 \
                   --out "$OUT/k2_moe_bf16" ;;
    k2_moe_fp32) run k2_moe_fp32 300 python3 -m workbench bench k2 --layers 1 --dense fp32 --no-check \
                   --out "$OUT/k2_moe_fp32" ;;
    e2e_fp32) run e2e_fp32 300 python3 dev/k2_slice_engine.py --dense fp32 \
                --out "$OUT/bench/k2_slice_engine_fp32_${KDTREE_GIT_SHA}.json"; rm -f "$OUT"/bench/*.ref.npz ;;
    e2e_bf16x) run e2e_bf16x 300 python3 dev/k2_slice_engine.py --experts bf16 --ref none \
                 --save "$OUT/bench/k2_slice_engine_bf16x_${KDTREE_GIT_SHA}" --out "$OUT/e2e_bf16x.json" ;;
    engine) run engine 240 python3 -m workbench bench engine --out "$OUT/engine" ;;
    tier_blas) run tier_blas 240 env KDTREE_GPU=1 python3 -m pytest -q -p no:cacheprovider -p no:warnings \
                 tests/kernels/test_blas.py tests/engine tests/bench/test_k2_layer.py -k "blas or w16a16 and not k2_slice" ;;
    tier_int4) run tier_int4 540 env KDTREE_GPU=1 python3 -m pytest -q -p no:cacheprovider -p no:warnings \
                 tests/kernels/test_int4_matmul.py tests/engine ;;
    tier_kernels) run "gpu_tier_kernels_${KDTREE_GIT_SHA}" 540 env KDTREE_GPU=1 python3 -m pytest -q -n 8 \
                    -p no:cacheprovider -p no:warnings --durations=20 tests/kernels ;;
    tier_engine) run "gpu_tier_engine_${KDTREE_GIT_SHA}" 540 env KDTREE_GPU=1 python3 -m pytest -q -n 8 \
                   -p no:cacheprovider -p no:warnings --durations=20 tests/engine tests/bench -k "not kimi and not k2_slice" ;;
    kernels) run kernels 300 python3 -m workbench bench kernels --out "$OUT/kernels" ;;
    profile) run "profile_k2_step_${KDTREE_GIT_SHA}" 300 python3 dev/profile_k2_step.py --rows 1,17 ;;
    staged) run "int4_staged_${KDTREE_GIT_SHA}_h200" 330 python3 dev/kernels/int4_matmul.py --staged ;;
    ep) run ep 520 python3 -m workbench bench ep --worlds 1 --out "$OUT/ep" ;;
    tier_ep) run tier_ep 200 env KDTREE_GPU=1 python3 -m pytest -q -p no:cacheprovider -p no:warnings \
               tests/parallel tests/kernels/test_moe.py::test_routed_slice_is_the_stack_of_those_experts ;;
    probe_random) run probe_random 120 python3 dev/probe_random_source.py ;;
    router) run "router_${KDTREE_GIT_SHA}" 240 python3 dev/kernels/router.py ;;
    drafter_k26) run tier_drafter_k26 480 env KDTREE_GPU=1 python3 -m pytest -q -p no:cacheprovider -p no:warnings \
                   tests/engine/test_dflash.py -k kimi ;;
    mla_core) run "mla_core_${KDTREE_GIT_SHA}" 240 python3 dev/kernels/mla_core.py ;;
    w16a16) run "w16a16_${KDTREE_GIT_SHA}" 200 python3 dev/kernels/w16a16.py --rows 1,9,17,33,65
            run tier_w16a16 240 env KDTREE_GPU=1 python3 -m pytest -q -p no:cacheprovider -p no:warnings \
              tests/kernels/test_w16a16.py tests/kernels/test_mla.py tests/kernels/test_blas.py ;;
    draft_attn) run "draft_attention_${KDTREE_GIT_SHA}" 150 python3 dev/kernels/draft_attention.py ;;
    smoke) run "gpu_tier_smoke_${KDTREE_GIT_SHA}" 360 env KDTREE_GPU=1 python3 -m pytest -q -n 8 \
             -p no:cacheprovider -p no:warnings tests/kernels/test_w16a16.py tests/kernels/test_blas.py \
             tests/kernels/test_mla.py tests/kernels/test_rmsnorm.py tests/kernels/test_router.py \
             tests/kernels/test_ops.py tests/kernels/test_draft_attention.py tests/kernels/test_moe.py \
             tests/kernels/test_tree.py tests/kernels/test_launch.py tests/kernels/test_intrinsics.py \
             tests/kernels/test_wgmma.py tests/kernels/test_int4_matmul.py::test_gpu_wgmma_k2_shapes \
             tests/kernels/test_mla_flash.py tests/kernels/test_persistent.py \
             tests/engine/test_ar.py \
             tests/engine/test_dflash.py -k "not k2_slice and not kimi" ;;
    gemv_sweep) run "moe_gemv_sweep_${KDTREE_GIT_SHA}" 200 python3 dev/kernels/moe.py --gemv-sweep ;;
    wgmma) run "int4_wgmma_${KDTREE_GIT_SHA}_h200" 300 python3 dev/kernels/int4_matmul.py --wgmma ;;
    persistent) run "persistent_${KDTREE_GIT_SHA}" 200 python3 dev/kernels/persistent.py ;;
    k2_nocheck) run k2_nocheck 300 python3 -m workbench bench k2 --layers 0,1 --dense bf16 --fp32-layer -1 \
                  --no-check --out "$OUT/k2_nocheck" ;;
    k2_switched) run k2_switched 300 python3 -m workbench bench k2 --layers 0,1 --dense bf16 --fp32-layer -1 \
                   --no-check $(for s in ${SWITCHES:-W16_FLASH=1 W16_PERSISTENT=1}; do echo --switch "$s"; done) \
                   --out "$OUT/k2_switched" ;;
    *) echo "unknown step $step (see the header)"; exit 2 ;;
  esac
done
