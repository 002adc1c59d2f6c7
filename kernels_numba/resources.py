"""What ptxas makes of a kernel for sm_90, without a GPU: its PTX, cubin and register count.

A block launches only if its threads' registers fit the SM's register file (64 K 32-bit registers for
a block on the H200): a kernel of 512 threads at 191 registers compiles, passes every simulator test
and fails at its first launch. ``sm90_build`` links the kernel's PTX with nvJitLink (a numba-cuda
dependency, no driver needed), under the register cap the kernel was built with, and reads ptxas's
report, so the tests and ``dev/kernels/sass.py`` see the registers a launch needs before a GPU does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from unittest import mock

REGISTER_FILE = 65536           # 32-bit registers an SM gives one block (sm_90)


class _Sm90:
    """Stands in for the current device: numba compiles a kernel's non-inlined device functions for
    the current device's compute capability, which needs a driver to look up."""

    compute_capability = (9, 0)


@dataclass(frozen=True)
class Sm90Build:
    ptx: str
    cubin: bytes
    registers: int
    spill_bytes: int            # spill stores to local memory
    log: str                    # ptxas's report

    def fits(self, threads: int) -> bool:
        """Whether a block of ``threads`` threads has the registers to launch."""
        return self.registers * threads <= REGISTER_FILE


def sm90_build(kernel, sig) -> Sm90Build:
    """PTX and cubin of a numba kernel (a ``cuda.jit`` dispatcher) for ``sig`` on sm_90a (what numba-cuda
    compiles for on an H100 / H200: wgmma needs the ``a``), linked under its own ``max_registers`` (255
    without one) and, for a grid-wide sync, with the CUDA device runtime as numba links it."""
    from cuda.bindings import nvjitlink as nj
    from numba import cuda
    from numba.cuda import dispatcher

    with mock.patch.object(dispatcher, "get_current_device", _Sm90):
        ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0, "a"))
    cap = kernel.targetoptions.get("max_registers") or 255
    opts = ["-arch=sm_90a", "-verbose", f"-maxrregcount={cap}"]
    h = nj.create(len(opts), opts)
    try:
        data = ptx.encode()
        nj.add_data(h, nj.InputType.PTX, data, len(data), "kernel.ptx")
        if "cudaCGSynchronize" in ptx:                 # a grid-wide sync calls into the device runtime
            from numba.cuda.cudadrv import libs
            nj.add_file(h, nj.InputType.LIBRARY, libs.get_cudalib("cudadevrt", static=True))
        nj.complete(h)
        cubin = bytearray(nj.get_linked_cubin_size(h))
        nj.get_linked_cubin(h, cubin)
        log = bytearray(nj.get_info_log_size(h))
        nj.get_info_log(h, log)
    finally:
        nj.destroy(h)
    text = log.decode(errors="replace")
    regs = re.findall(r"[Uu]sed (\d+) registers", text)       # ptxas on the kernel first, then the linked
    spill = re.findall(r"(\d+) bytes spill stores", text)
    if not regs:
        raise RuntimeError(f"ptxas reported no register count: {text[:200]}")
    return Sm90Build(ptx, bytes(cubin), int(regs[0]), int(spill[0]) if spill else 0, text)


def register_cap(threads: int) -> dict:
    """``cuda.jit`` options that let a block of ``threads`` threads launch: the most registers a thread
    may use (a multiple of 8, at most 255); none under the simulator."""
    from .device import SIMULATED
    return {} if SIMULATED else {"max_registers": min(255, REGISTER_FILE // threads // 8 * 8)}
