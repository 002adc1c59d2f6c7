"""Offline SASS of the int4_matmul builds (no GPU): what ptxas made of them.

Run:  python dev/kernels/sass.py [--staged] [--moe] [--dump DIR]
Per build (K2 gate/up and down at M = 1 and 16, the package's configs): registers, spill bytes,
instructions before / after the last griddepcontrol.wait (ACQBULK), 16-byte loads before / after it
(weights and, after the wait, x), and the ten most frequent opcodes after it. --staged:
int4_staged.py's tilings at M = 64. --moe: the fused-MoE GEMMs at K2 width
(package configs for T = 64 and T = 16; no PDL wait there, so every count lands "after"). --dump: the
SASS listings.

Pipeline: numba's compile_ptx (sm_90) -> nvJitLink (cuda.bindings, a numba-cuda dependency) ->
nvdisasm. nvdisasm comes from the ``nvidia-cuda-nvdisasm`` wheel (``pip install
nvidia-cuda-nvdisasm``), from PATH, or from $NVDISASM. Register caps are the package's: the kernel
factory's ``max_registers`` is passed to nvJitLink as -maxrregcount.
The local nvJitLink rejects static shared memory over 48 KB (those builds are reported as failed).
The kernel builders come from kernels_numba.ops (dev/import_map.py --check).
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


def sass_of(kernel, sig, maxreg: int) -> tuple[str, str]:
    """(SASS listing, nvJitLink info log) of a numba kernel for sm_90."""
    from cuda.bindings import nvjitlink as nj
    from numba import cuda
    ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
    opts = ["-arch=sm_90", "-verbose", f"-maxrregcount={maxreg}"]
    h = nj.create(len(opts), opts)
    try:
        data = ptx.encode()
        nj.add_data(h, nj.InputType.PTX, data, len(data), "kernel.ptx")
        nj.complete(h)
        cubin = bytearray(nj.get_linked_cubin_size(h))
        nj.get_linked_cubin(h, cubin)
        log = bytearray(nj.get_info_log_size(h))
        nj.get_info_log(h, log)
    finally:
        nj.destroy(h)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        done = subprocess.run([nvdisasm(), "-c", f.name], capture_output=True, text=True, check=True)
    return done.stdout, log.decode(errors="replace")


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
    return (f"{regs[0] if regs else '?'} registers, {spill[0] if spill else '?'} B spill, "
            f"{stack[0] if stack else '?'} B stack, {len(lines)} instructions: "
            f"{max(cut, 0)} / {len(lines) - cut - 1} before / after the wait, 16-B loads {before} / {after} "
            f"| after: {top}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--moe", action="store_true", help="also the fused-MoE GEMMs at K2 width")
    ap.add_argument("--staged", action="store_true", help="also the staged kernel, K2 shapes, M = 64")
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
    for label, kernel, ksig in builds:
        cap = kernel.targetoptions.get("max_registers") or 255
        try:
            listing, log = sass_of(kernel, ksig, cap)
        except Exception as e:  # noqa: BLE001 - a build the local linker rejects is reported
            print(f"{label}: failed {type(e).__name__}: {str(e)[:80]}")
            continue
        print(f"{label}: {summary(listing, log)}", flush=True)
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
