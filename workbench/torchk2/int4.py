"""The K2 model's INT4 weights in torch: dequantization where the weights live, and the seeded model's
routed-expert stacks built on a device chunk by chunk (no float32 copy of a whole stack on the host).

Legend: E routed experts, I expert width, D model width, N rows, K columns, G INT4 group size.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..config import ModelConfig


def _torch():
    import torch
    return torch


def _workers(workers: int | None) -> int:
    return workers or min(16, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 4)


def dequantize_int4_torch(packed, scale, dtype):
    """INT4 words int32 [..., N, K/8] (pack_int4 order: low nibble = lowest column, q + 8) and scales
    float16 [..., N, K/G] -> (q - 8) * scale [..., N, K] in float32, rounded once to ``dtype``.

    The same values as ``workbench.quant.int4.dequantize_packed`` (products exact in float32)."""
    torch = _torch()
    shifts = torch.arange(0, 32, 4, device=packed.device, dtype=torch.int32)
    q = (packed.unsqueeze(-1) >> shifts) & 0xF                                  # [..., N, K/8, 8]
    n, k = packed.shape[-2], packed.shape[-1] * 8
    g = k // scale.shape[-1]
    w = (q.reshape(*packed.shape[:-1], k // g, g) - 8).float() * scale.float().unsqueeze(-1)
    return w.reshape(*packed.shape[:-2], n, k).to(dtype)


def seeded_bf16_experts(cfg: ModelConfig, seed: int, layer: int, device: Any = "cuda", dtype: Any = None,
                        chunk: int = 32, workers: int | None = None) -> tuple[Any, Any]:
    """The seeded layer's routed experts in the ``bf16`` layout's values, built on ``device``: w13
    [E, 2I, D] (gate rows, then up) and w2 [E, D, I] in ``dtype`` (default bf16). The INT4 words and
    scales of ``chunk`` experts at a time are generated on ``workers`` host threads while the device
    dequantizes the previous chunk: no float32 expert copy on the host."""
    torch = _torch()
    from .. import seeded
    dtype = torch.bfloat16 if dtype is None else dtype
    workers = _workers(workers)
    e, mi, d = cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.hidden_size
    w13 = torch.empty(e, 2 * mi, d, device=device, dtype=dtype)
    w2 = torch.empty(e, d, mi, device=device, dtype=dtype)

    def host(e0: int):
        ids = range(e0, min(e0 + chunk, e))
        return e0, [seeded.expert_stack(cfg, seed, layer, proj, experts=ids, workers=workers)
                    for proj in ("w1", "w3", "w2")]
    with ThreadPoolExecutor(1) as pool:
        nxt = pool.submit(host, 0)
        for _ in range(0, e, chunk):
            e0, stacks = nxt.result()
            if e0 + chunk < e:
                nxt = pool.submit(host, e0 + chunk)
            (p1, s1), (p3, s3), (p2, s2) = [
                (torch.from_numpy(p).to(device), torch.from_numpy(s).to(device)) for p, s in stacks]
            e1 = e0 + p1.shape[0]
            w13[e0:e1, :mi] = dequantize_int4_torch(p1, s1, torch.bfloat16)  # the bf16 layout's
            w13[e0:e1, mi:] = dequantize_int4_torch(p3, s3, torch.bfloat16)  # values, in any dtype
            w2[e0:e1] = dequantize_int4_torch(p2, s2, torch.bfloat16)
    return w13, w2


def seeded_fp32_stack(cfg: ModelConfig, seed: int, layer: int, device: Any = "cuda", workers: int = 1,
                      chunk: int = 8) -> dict[str, Any]:
    """The seeded layer's routed experts as float32 (the INT4 values dequantized, exact) on ``device`` in
    the portable FFN kernels' layout: w1t, w3t [E, D, I], w2t [E, I, D], ``chunk`` experts at a time."""
    torch = _torch()
    from .. import seeded
    e, d, i = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
    t = {"w1t": torch.empty(e, d, i, device=device), "w3t": torch.empty(e, d, i, device=device),
         "w2t": torch.empty(e, i, d, device=device)}
    for e0 in range(0, e, chunk):
        ids = range(e0, min(e0 + chunk, e))
        for p in ("w1", "w3", "w2"):
            packed, scale = seeded.expert_stack(cfg, seed, layer, p, experts=ids, workers=workers)
            w = dequantize_int4_torch(torch.from_numpy(packed).to(device), torch.from_numpy(scale).to(device),
                                      torch.float32)                                  # [c, N, K]
            t[p + "t"][e0:e0 + len(ids)] = w.transpose(1, 2)
    return t
