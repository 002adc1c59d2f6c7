"""Offline SASS of the package kernels (no GPU): what ptxas made of them.

Run:  python dev/kernels/sass.py [--staged] [--moe] [--glue] [--dump DIR]
Per build (K2 gate/up and down at M = 1 and 16, the package's configs): registers, spill bytes,
instructions before / after the last griddepcontrol.wait (ACQBULK), 16-byte loads before / after it
(weights and, after the wait, x), those issued before the first MMA (what is in flight when the math
starts), calls of ptxas's 64-bit division routines, and the ten most frequent opcodes after the wait.
--staged: int4_staged.py's tilings at M = 64. --moe: the fused-MoE GEMMs at K2 width
(package configs for T = 64 and T = 16; no PDL wait there, so every count lands "after"). --dump: the
SASS listings.

--glue: the glue kernels of a K2 layer (norms, mla_prep, the router's two kernels, the SwiGLU down
projection, to_f16, add_rows, a1 with its norm, the attention core's q_rope and softmax), with registers
x threads against the SM's 64 K.

Pipeline: ``ops.sm90_build`` (numba's compile_ptx for sm_90, linked by nvJitLink under the kernel's own
register cap) -> nvdisasm. nvdisasm comes from the ``nvidia-cuda-nvdisasm`` wheel (``pip install
nvidia-cuda-nvdisasm``), from PATH, or from $NVDISASM. The local nvJitLink rejects static shared memory
over 48 KB (those builds are reported as failed). The kernel builders come from kernels_numba.ops
(dev/import_map.py --check).
"""

from __future__ import annotations

import argparse
import collections
import functools
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BUILDS = [(7168, (1, 16, 7)), (2048, (1, 4, 8)), (7168, (2, 16, 7)), (7168, (2, 16, 7, 2)), (2048, (2, 4, 8))]


@functools.cache
def nvdisasm() -> str:
    found = os.environ.get("NVDISASM") or shutil.which("nvdisasm")
    if not found:
        import site
        roots = site.getsitepackages() + [site.getusersitepackages()]
        hits = [p for r in roots for p in glob.glob(os.path.join(r, "nvidia", "cu*", "bin", "nvdisasm"))]
        found = hits[0] if hits else None
    if not found:
        raise SystemExit("sass.py: nvdisasm not found (pip install nvidia-cuda-nvdisasm, or set NVDISASM)")
    return found


def sass_of(kernel, sig) -> tuple[str, str]:
    """(SASS listing, ptxas's report) of a numba kernel for sm_90 (``ops.sm90_build``)."""
    from kernels_numba import ops
    build = ops.sm90_build(kernel, sig)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(build.cubin)
        f.flush()
        done = subprocess.run([nvdisasm(), "-c", f.name], capture_output=True, text=True, check=True)
    return done.stdout, build.log


def summary(listing: str, log: str) -> str:
    lines = [ln for ln in listing.splitlines() if re.match(r"\s*/\*[0-9a-f]+\*/", ln)]
    waits = [i for i, ln in enumerate(lines) if "ACQBULK" in ln]
    cut = waits[-1] if waits else -1
    is_w = re.compile(r"LDG\.E(\.NA)?\.128")                      # 16-byte loads (weights; x loads too)
    before = sum(1 for ln in lines[:cut] if is_w.search(ln)) if waits else 0
    after = sum(1 for ln in lines[cut + 1:] if is_w.search(ln))
    opcodes = collections.Counter()
    for ln in lines[cut + 1:]:
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", ln)
        if m:
            opcodes[m.group(2)] += 1
    regs = re.findall(r"used (\d+) registers", log)
    spill = re.findall(r"(\d+) bytes spill stores", log)
    stack = re.findall(r"(\d+) bytes stack frame", log)
    top = " ".join(f"{k} {v}" for k, v in opcodes.most_common(10))
    mma = next((i for i, ln in enumerate(lines) if "HMMA" in ln or "HGMMA" in ln), len(lines))
    in_flight = sum(1 for ln in lines[:mma] if is_w.search(ln))     # issued before the first MMA
    divs = sum(1 for ln in lines if re.search(r"CALL.*__cuda_sm20_(div|rem)", ln))   # 64-bit routines
    return (f"{regs[0] if regs else '?'} registers, {spill[0] if spill else '?'} B spill, "
            f"{stack[0] if stack else '?'} B stack, {len(lines)} instructions: "
            f"{max(cut, 0)} / {len(lines) - cut - 1} before / after the wait, 16-B loads {before} / {after}, "
            f"{in_flight} before the first MMA, {divs} 64-bit division calls | after: {top}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--moe", action="store_true", help="also the fused-MoE GEMMs at K2 width")
    ap.add_argument("--staged", action="store_true", help="also the staged kernel, K2 shapes, M = 64")
    ap.add_argument("--glue", action="store_true", help="also the glue kernels of a K2 layer")
    ap.add_argument("--dump", metavar="DIR", help="write each SASS listing to DIR")
    args = ap.parse_args(argv)
    from numba import types as T

    from kernels_numba import ops
    a = lambda d: T.Array(d, 1, "C")                              # noqa: E731
    sig = (a(T.float32), a(T.float16), a(T.uint32), a(T.uint32), T.int64, T.int64)
    builds = [(f"package K={k} {cfg}", ops.make_int4_matmul_kernel(k, 32, *cfg), sig) for k, cfg in BUILDS]
    if args.moe:
        builds += moe_builds(a)
    if args.staged:
        builds += staged_builds(a)
    if args.glue:
        builds += glue_builds()
    for label, kernel, ksig in builds:
        try:
            listing, log = sass_of(kernel, ksig)
        except Exception as e:  # noqa: BLE001 - a build the local linker rejects is reported
            print(f"{label}: failed {type(e).__name__}: {str(e)[:80]}")
            continue
        threads = re.search(r"threads=(\d+)", label)
        regs = re.findall(r"used (\d+) registers", log)
        fits = ""
        if threads and regs:                          # the SM's register file: 64 K per block at most
            need = int(regs[0]) * int(threads.group(1))
            fits = f" [{need} of 65536 registers: {'fits' if need <= 65536 else 'CANNOT LAUNCH'}]"
        print(f"{label}: {summary(listing, log)}{fits}", flush=True)
        if args.dump:
            Path(args.dump).mkdir(parents=True, exist_ok=True)
            Path(args.dump, re.sub(r"\W+", "_", label) + ".sass").write_text(listing)
    return 0


def staged_builds(a):
    """(label, kernel, signature) of int4_staged.py at K2 gate/up and down, M = 64: the default tiling and
    the ladder's (dev/kernels/int4_matmul.py --staged)."""
    from numba import types as T

    from kernels_numba import ops
    sys.path.insert(0, str(Path(__file__).parent))
    from int4_matmul import _staged_plans
    out = []
    for (n, k), plan in _staged_plans().items():
        cfgs = {ops.choose_config(64, k, 32, n), *plan}
        for c in sorted(cfgs, key=str):
            cnt = T.int32 if c.splits > 1 else T.uint32
            sig = (a(T.float32), a(T.float16), a(T.uint32), a(T.uint32), a(T.float32), a(cnt), T.int64,
                   T.int64)
            kernel = ops.make_int4_staged_kernel(k, 32, c.mt, c.nt, c.splits, c.pw, c.px)
            out.append((f"staged N={n} K={k} {c}", kernel, sig))
    return out


def glue_builds():
    """(label, kernel, signature) of the glue kernels at K2's shapes, with the block each launches with;
    signatures from example host arrays of the engine's dtypes."""
    import numpy as np
    from numba import typeof
    from numba import types as T

    from kernels_numba import ops
    KS, TPB, norm_slices = ops.KS, ops.TPB, ops.norm_slices
    f32, i32, u16 = (lambda *s: np.zeros(s, np.float32)), (lambda *s: np.zeros(s, np.int32)), \
        (lambda *s: np.zeros(s, np.uint16))
    sig = lambda *args: tuple(typeof(x) if isinstance(x, np.ndarray) else x for x in args)  # noqa: E731
    meta, d, t = i32(8), 7168, 4
    s = ops.logit_slice_count(d)
    route = ops.make_route(384, 8, 1, 1, True, 2.827, slices=s)
    norm_t = TPB * norm_slices(d)
    prep_t = TPB * norm_slices(1536)
    out = [(f"rmsnorm K={d} threads={norm_t}", ops.rmsnorm_kernel,
            sig(f32(t, d), f32(t, d), f32(d), T.float32, meta)),
           (f"mla_prep threads={prep_t}", ops.mla_prep_kernel,
            sig(f32(t, 1536), np.zeros((8, 576), np.int16), f32(t, 2112), f32(1536), f32(512), f32(8, 32),
                f32(8, 32), i32(t), meta, T.int64, T.int64, T.float32)),
           (f"logit_slices threads={TPB * ops.SLICE_WARPS}", ops.logit_slices_kernel,
            sig(f32(s * t, 384), f32(t, d), f32(d, 384), meta, u16(t, d))),
           (f"logit_slices f16 threads={TPB * ops.SLICE_WARPS}", ops.logit_slices_f16_kernel,
            sig(f32(s * t, 384), f32(t, d), f32(d, 384), meta, u16(t, d))),
           (f"route S={s} threads={TPB * KS}", route,
            sig(i32(t, 8), f32(t, 8), f32(s * t, 384), f32(d, 384), f32(384), meta)),
           ("to_f16 threads=32", ops.to_f16_kernel, sig(u16(t, d), f32(t, d), meta)),
           ("add_rows threads=32", ops.add_rows_kernel, sig(f32(t, d), f32(t, d), meta))]
    for k, n in ((2048, 7168), (18432 // 8, 7168)):          # shared expert / drafter-like down with GLU
        ks, cpw, nb = ops.w16_tiling(k)
        kern = ops.make_w16a16_kernel(k, ks, cpw, nb, 1, 1, False, True)
        out.append((f"w16a16 glu K={k} threads={ks * 32}", kern,
                    sig(f32(t, n), f32(2 * k * t), np.zeros(n * k // 2, np.uint32), T.int64, f32(k),
                        T.float32)))
    ks, cpw, nb = ops.w16_tiling(d)                          # a1 at decode: the attention norm folded in
    a1 = ops.make_w16a16_kernel(d, ks, cpw, nb, 1, 1, False, PIPE=True, NORM=True)
    out += [(f"w16a16 a1 + norm threads={ks * 32}", a1,
             sig(f32(t, 2112), f32(t * d), np.zeros(2112 * d // 2, np.uint32), T.int64, f32(d), T.float32)),
            (f"q_rope threads={TPB}", ops.mla.q_rope_kernel,
             sig(np.zeros((t, 64 * 576), np.int16), f32(t, 64 * 192), f32(8, 32), f32(8, 32), i32(t), meta,
                 T.int32, T.int32, T.int32)),
            (f"softmax16 threads={TPB * KS}", ops.mla.softmax16_kernel,
             sig(np.zeros((t * 64, 4096), np.int16), f32(t * 64, 4096), np.zeros((t, 4096), np.uint8),
                 T.int32, T.float32))]
    return out


def moe_builds(a):
    """(label, kernel, signature) of the package's fused-MoE gate/up and down GEMMs, K2 width."""
    from numba import types as T

    from kernels_numba import ops
    gsig = (a(T.uint16), a(T.float16), a(T.uint32), a(T.uint32), a(T.int32), a(T.int32), a(T.int32),
            a(T.float32), T.int64, T.int64, a(T.float32), a(T.int32), a(T.int32), T.int64)
    dsig = (a(T.float32), a(T.uint16)) + gsig[2:]
    out = []
    for t in (64, 16):                    # the stream-K tilings (T <= 8 takes moe_gemv.py's path)
        cfg = ops.choose_moe_config(7168, 2048, tokens=t)
        out.append((f"moe gate_up T={t} {cfg['gu']}",
                    ops.make_moe_gemm_kernel(7168, 2048, 32, True, *cfg["gu"], cfg["maxreg"]), gsig))
        out.append((f"moe down T={t} {cfg['dn']}",
                    ops.make_moe_gemm_kernel(2048, 7168, 32, False, *cfg["dn"], cfg["maxreg"]), dsig))
    return out


if __name__ == "__main__":
    sys.exit(main())
