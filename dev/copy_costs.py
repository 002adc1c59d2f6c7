"""Host cost of the small host <-> device copies a DDTree round makes (GPU only).

Median host wall time (us) of each way to copy an int32 control block of a few KB to the device and
back, each followed by a stream synchronisation, on torch's current stream.

    python dev/copy_costs.py [--n 2048] [--reps 300]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=300)
    a = ap.parse_args()
    import torch
    from numba import cuda

    s = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
    dev = cuda.to_device(np.zeros(a.n, np.int32))
    pinned = cuda.pinned_array(a.n, np.int32)
    pageable = np.zeros(a.n, np.int32)
    th = torch.empty(a.n, dtype=torch.int32, pin_memory=True)
    td = torch.as_tensor(dev, device="cuda")
    tp = torch.from_numpy(pinned)

    def wall(fn):
        ts = []
        for _ in range(a.reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts)) * 1e6

    ways = {
        "numba copy_to_device(pinned, stream=s) + s.synchronize": lambda: (
            dev.copy_to_device(pinned, stream=s), s.synchronize()),
        "numba copy_to_device(pageable, stream=s) + s.synchronize": lambda: (
            dev.copy_to_device(pageable, stream=s), s.synchronize()),
        "numba copy_to_device(pinned) (no stream)": lambda: dev.copy_to_device(pinned),
        "numba copy_to_host(pinned, stream=s) + s.synchronize": lambda: (dev.copy_to_host(pinned, stream=s),
                                                                        s.synchronize()),
        "s.synchronize alone": lambda: s.synchronize(),
        "torch.cuda.current_stream().synchronize alone": lambda: torch.cuda.current_stream().synchronize(),
        "torch cached: td.copy_(torch pinned) + stream sync": lambda: (td.copy_(th, non_blocking=True),
                                                                      torch.cuda.current_stream().synchronize()),
        "torch cached: td.copy_(from_numpy(numba pinned)) + sync": lambda: (td.copy_(tp, non_blocking=True),
                                                                           torch.cuda.current_stream().synchronize()),
        "torch uncached: as_tensor(dev).copy_(from_numpy(pinned)) + sync": lambda: (
            torch.as_tensor(dev, device="cuda").copy_(torch.from_numpy(pinned), non_blocking=True),
            torch.cuda.current_stream().synchronize()),
        "torch cached D2H: th.copy_(td) + sync": lambda: (th.copy_(td, non_blocking=True),
                                                         torch.cuda.current_stream().synchronize()),
        "torch.as_tensor(dev) alone": lambda: torch.as_tensor(dev, device="cuda"),
    }
    print(f"int32 [{a.n}], median of {a.reps}, {torch.cuda.get_device_name()}")
    for name, fn in ways.items():
        print(f"  {wall(fn):8.1f} us  {name}")


if __name__ == "__main__":
    main()
