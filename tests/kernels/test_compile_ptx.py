"""CI compile tier: every shipped kernel compiles for sm_90 and contains the instructions it is built on.

The simulator replaces numba.cuda, so the check runs in a subprocess without NUMBA_ENABLE_CUDASIM. Each
test compiles only its own kernel family (``_ptx_probe.GROUPS``), so the families compile once each and,
under pytest-xdist, on whichever worker runs their test: the stream-K MoE GEMMs take most of the time.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def probe(group: str) -> dict:
    """Instruction counts of one ``_ptx_probe`` group, compiled for sm_90 in a subprocess."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, str(Path(__file__).with_name("_ptx_probe.py")), group], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def test_int4_matmul_uses_tensor_cores_and_wide_loads():
    mm = probe("int4_matmul")
    assert len(mm) == 15
    for name, c in mm.items():
        assert c["mma"] >= 2, name                  # mma.sync m16n8k16 (swap A/B)
        assert c["ldg_nc_v4"] + c["ldg_once_v4"] >= 1, name   # 16-byte read-once weight loads
        assert c["ldg_v4"] >= 1, name               # 16-byte activation loads
        assert c["lop3"] >= 4 and c["hfma2"] >= 2, name   # magic-number dequantization
        assert c["local"] == 0, name                # fragments stay in registers (unrolled loops)
        assert c["pdl_launch"] == 1, name           # programmatic dependent launch; one wait, or
        assert c["pdl_wait"] == 1 + c["pdl_wait_for"], name   # one pinned (two predicated instructions)
    assert [n for n, c in mm.items() if c["pdl_wait_for"]] == ["int4_matmul M=16 K=2048 G=32 (2, 4, 8)"]
    assert [n for n, c in mm.items() if c["ldg_once_v4"]] == ["int4_matmul M=32 K=2048 G=32 (4, 4, 8)"]
    assert mm["int4_matmul M=32 K=2048 G=32 (4, 4, 8)"]["ldg_nc_v4"] == 0
    paired = ["int4_matmul M=16 K=7168 G=32 (2, 16, 7, 2)", "int4_matmul M=32 K=7168 G=32 (4, 16, 7, 2)"]
    assert [n for n, c in mm.items() if c["st_async"]] == paired      # tile pairs: the halves meet by
    assert all(mm[n]["st_async"] == 1 and mm[n]["mbar_wait"] == 1 for n in paired)   # st.async + mbarrier


def test_int4_staged_stages_x_in_shared_memory():
    st = probe("int4_staged")
    assert len(st) == 3
    for name, c in st.items():
        assert c["mma"] >= 16 and c["cp_async"] >= 2 and c["lds_v4"] >= 9, name   # weights and x by cp.async,
        assert c["ldg_nc_v4"] == c["ldg_v4"] == 0, name                      # read back from shared memory
        assert c["local"] == 0, name                                  # slots and accumulators in registers
        assert c["pdl_launch"] == 1 and c["pdl_wait"] == 1, name
        split = int(name.split()[-1].removeprefix("staged").split("x")[2]) > 1   # (MT, NT, S, PW, PX)
        assert (c["atom_global"] == 1 and c["ld_cg"] >= 1) == split, name   # split K: counter, L2 reads


def test_int4_wgmma_keeps_its_warpgroup_mma_asynchronous():
    """The wgmma kernel for sm_90a: a chunk is 4 k16 steps of wgmma (64-column tiles of x from shared
    memory), two a step in the exact form (the scale's two halves), one prescaled, with the f16 scale
    products to match; x staged by 4-byte cp.async, unrolled, and made visible to wgmma by a proxy
    fence; accumulators in registers without spill; and ptxas kept the wgmma asynchronous (it says
    so when it must serialize them: notices C7510 .. C7519)."""
    wg = probe("int4_wgmma")
    assert len(wg) == 5
    for name, c in wg.items():
        terms = 1 if name.endswith("p") else 2
        assert c["wgmma"] == 4 * terms and c["hmul2"] == 16 * terms, (name, c)
        assert c["wgmma_fence"] == 1 and c["fence_proxy"] == 1, (name, c)
        assert c["wgmma_wait"] == 2, (name, c)                         # one in the chunk loop, one after it
        assert c["cp_async"] >= 2, (name, c)                            # weights and scales 16 B a copy;
        assert c["cp_async4"] == 3 * 16, (name, c)      # x 4 B, 16 a chunk, unrolled at 3 call sites
        assert c["local"] == 0 and c["spill"] == 0 and c["fits"], (name, c)
        assert not c["serialized"], (name, c)
        assert c["pdl_launch"] == 1 and c["pdl_wait"] == 1, (name, c)


def test_moe_stream_k_gemms():
    c = probe("moe_gemm")["moe down"]                       # (G != 32 only: G = 32 takes moe_gemv)
    assert c["mma"] >= 2 and c["ldg_nc_v4"] >= 1 and c["ldg_v4"] >= 1 and c["local"] == 0


def test_moe_align_gemv_and_combine():
    ptx_counts = probe("moe_glue")
    assert ptx_counts["moe align"]["atom_shared"] >= 2 and ptx_counts["moe align"]["bar"] >= 4
    assert ptx_counts["moe combine"]["mma"] == 0 and ptx_counts["moe combine"]["pdl_wait"] == 1
    for name in ("moe gemv", "moe gemv tiled"):              # per pair and over expert tiles (moe_gemv.py)
        for stage in ("gate_up", "down"):
            c = ptx_counts[f"{name} {stage}"]
            assert c["mma"] >= 2 and c["local"] == 0 and c["pdl_wait"] == 1 and c["pdl_launch"] == 1, name
            assert c["div64"] == c["rem64"] == 0, name      # a block's pair -> row: no 64-bit routine
        assert ptx_counts[f"{name} gate_up"]["ldg_nc_v4"] >= 1
        assert ptx_counts[f"{name} down"]["ldg_once_v4"] >= 1 and ptx_counts[f"{name} down"]["ldg_nc_v4"] == 0
        glu = ptx_counts[f"{name} gate_up glu"]                  # both halves, then h in float16
        assert glu["mma"] >= 4 and glu["local"] == 0 and glu["cvt_f16"] >= 1 and glu["pdl_wait"] == 1, name
    assert ptx_counts["moe act"]["pdl_wait"] == 1


@pytest.fixture(scope="module")
def row_counts():
    return probe("rows")


def test_rmsnorm_holds_its_row_in_registers(row_counts):
    """K2's rmsnorm: 7 features a thread held (no local memory), the warp sums by shuffles, float32 only."""
    c = row_counts["rmsnorm K=7168"]
    assert c["local"] == 0 and c["shfl_bfly"] == 5 and c["f64"] == 0 and c["pdl_wait"] == 1


def test_argmax_keeps_its_loads_in_registers(row_counts):
    """The step's argmax: 16 logits a thread in flight (no local memory), the (value, id) pairs meet by
    five butterfly shuffles each, float32 only."""
    c = row_counts["argmax"]
    assert c["local"] == 0 and c["shfl_bfly"] == 10 and c["f64"] == 0 and c["pdl_wait"] == 1


def test_row_glue_kernels(row_counts):
    """ops' float16 rounding and residual add between the engine's float32 rows and the W4A16 kernels."""
    ptx_counts = row_counts
    assert ptx_counts["rows to_f16"]["cvt_f16"] >= 1 and ptx_counts["rows to_f16"]["local"] == 0
    assert ptx_counts["rows add"]["mma"] == 0 and ptx_counts["rows add"]["local"] == 0
    for name in ("rows to_f16", "rows add"):                  # launched with PDL: wait, then let the next go
        assert ptx_counts[name]["pdl_wait"] == 1 and ptx_counts[name]["pdl_launch"] == 1, name


def test_latent_stores_round_only_into_a_bf16_cache(row_counts):
    ptx_counts = row_counts
    assert ptx_counts["stored_as bf16"]["cvt_bf16"] == 1
    assert ptx_counts["stored_as float32"]["cvt_bf16"] == 0


def test_sliced_router_logits_keep_their_accumulators_in_registers():
    c = probe("router")["router slices"]
    assert c["local"] == 0 and c["bar"] >= 2 and c["pdl_wait"] == 1 and c["pdl_launch"] == 1
    f16 = probe("router")["router slices f16"]                # also f16(x) for the fused MoE
    assert f16["local"] == 0 and f16["cvt_f16"] >= 1 and c["cvt_f16"] == 0


def test_route_picks_with_one_warp_from_registers():
    """K2's route kernel: the 12 experts a lane holds stay in registers, and each of the K picks is five
    butterfly shuffles (value and index), no barrier (the block's two come before them), in float32."""
    c = probe("router")["route K2"]
    assert c["local"] == 0 and c["bar"] == 2 and c["bar_warp"] == 0 and c["pdl_wait"] == 1
    assert c["shfl_bfly"] == 8 * 5 * 2 and c["f64"] == 0


def test_w16a16_linear_streams_weights_into_bf16_mma():
    c = probe("w16a16")
    builds = {"w16a16 K=7168 MT=1 NT=1": 8, "w16a16 K=8192 MT=9 NT=1": 72,   # MMAs unrolled: the steps
              "w16a16 K=7168 MT=3 NT=4": 24, "w16a16 K=8192 MT=5 NT=2": 40}   # of a load x MT x NT
    for name, mmas in builds.items():
        k = c[name]
        assert k["mma_bf16"] == mmas and k["ldg_v4"] == mmas // int(name[-1]), name   # one x load, NT MMAs
        assert k["ldg_nc_v4"] >= 8 and k["cvt_bf16x2"] >= 2 * k["ldg_v4"], name
        assert k["local"] == 0 and k["pdl_wait"] == 1 and k["pdl_launch"] == 1, name   # all in registers
    pipe = c["w16a16 K=7168 pipelined"]       # two batches a loop pass: 2 x 8 MMAs; weights 2 x 8 loads ahead
    assert pipe["mma_bf16"] == 16 and pipe["ldg_v4"] == 16 and pipe["ldg_nc_v4"] == 32     # and 2 x 8 in it
    assert pipe["local"] == 0 and pipe["pdl_wait"] == 1 and pipe["pdl_launch"] == 1
    norm = c["w16a16 K=7168 norm"]         # the RMSNorm folded in: 16-byte loads of x and of its weight per
    assert norm["mma_bf16"] == 16 and norm["ldg_v4"] == 32 and norm["local"] == 0     # step; the scales'
    assert norm["bar"] == 5                                                           # three barriers
    glu = c["w16a16 K=2048 GLU"]                      # silu(g) * u in registers: no 16-byte x load, no local
    assert glu["mma_bf16"] == 8 and glu["ldg_v4"] == 0 and glu["cvt_bf16x2"] >= 16 and glu["local"] == 0
    for name in ("w16a16 W_UK", "w16a16 W_UV"):     # the attention's grouped absorptions, rounded to bf16
        k = c[name]
        assert k["mma_bf16"] == 8 and k["ldg_v4"] == 8 and k["local"] == 0 and k["pdl_wait"] == 1, name
    assert c["w16a16 W_UK"]["cvt_bf16"] >= 1                  # bf16 bits into the query rows


def test_mla_flash_runs_on_tensor_cores_and_launches():
    """The one-pass core's chunk kernel: bf16 MMAs for the scores and p @ c_kv, 16-byte staging of the
    keys, three barriers a tile, one PDL wait; registers x threads within the SM's 64 K (ptxas for sm_90)
    and at most a few setup values spilled under the 128-register cap (its 64-bit key and index arithmetic
    had spilled 260 bytes, reloaded in the tile loop; 0 to 36 since, as ptxas schedules each version)."""
    c = probe("mla_flash")
    k = c["mla_flash chunks"]
    assert k["mma_bf16"] >= 2 and k["ldg_v4"] >= 1 and k["bar"] >= 3 and k["pdl_wait"] == 1, k
    assert k["local"] == 0 and k["fits"] and k["registers"] * k["threads"] <= 65536 and k["spill"] <= 64, k
    cb = c["mla_flash combine"]
    assert cb["fits"] and cb["spill"] == 0 and cb["pdl_wait"] == 1, cb


def test_persistent_swiglu_keeps_two_blocks_an_sm_and_nothing_across_its_barriers():
    """The persistent SwiGLU at K2's shapes: both products' bf16 MMAs (8 a batch, two batches a pass),
    two grid syncs, the L2 prefetch of the first W2 tile, one PDL wait; at most 128
    registers (two blocks of 256 threads an SM: the cooperative grid) and no spill (weights held across
    the grid sync, a call, had gone to the stack)."""
    for name, c in probe("persistent").items():
        assert c["mma_bf16"] == 2 * 16 and c["grid_sync"] == 2 and c["prefetch_l2"] >= 1, (name, c)
        assert c["pdl_wait"] == 1 and c["local"] == 0 and c["div64"] == 0, (name, c)
        assert c["fits"] and c["registers"] <= 128 and c["spill"] <= 8, (name, c)


def test_mla_core_keeps_its_accumulators_in_registers():
    """The chunk kernel: one accumulator per head and column of its pair, hg x 2 FMAs a key, unrolled,
    none in local memory; a barrier after the ancestors' map and after p; p rounded to bf16."""
    for name, c in probe("mla_core").items():
        hg = int(name.split("=")[1])
        assert c["local"] == 0 and c["fma_f32"] >= hg * 2 and c["bar"] >= 2, (name, c)
        assert c["cvt_bf16"] >= 1, (name, c)



def test_k2_layer_kernels_have_the_registers_to_launch():
    """registers x threads within the SM's 64 K for every wide block of a K2 layer (ptxas for sm_90 via
    nvJitLink): a block that does not fit compiles and simulates, and fails at its first launch; none
    spills (the router's logits hold 32 gate values and 8 staged inputs a thread under a 128 cap)."""
    fits = probe("launch_fit")
    assert {"w16a16 K=7168 norm MT=2", "norm_rows K=7168", "softmax16", "q_rope"} <= set(fits)
    for name, c in fits.items():
        assert c["fits"] and c["registers"] * c["threads"] <= 65536, (name, c)
        assert c["spill"] == 0, (name, c)
    da = fits["draft_attention part d=128"]                       # two blocks an SM: one wave of the
    assert 2 * da["registers"] * da["threads"] <= 65536, da        # drafter's 256 blocks
