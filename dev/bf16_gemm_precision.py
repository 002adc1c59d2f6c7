"""How exact are torch's bf16 GEMMs on this GPU? The error W16A16 on cuBLAS carries (GPU only).

    python dev/bf16_gemm_precision.py [--rows 1,17,65] [--out bf16_gemm_precision.json]

W16A16 (``workbench.quant.w16a16``) defines a projection as bf16 operands, exact products, float32
sums. On the H200, ``bench k2``'s W16A16 check of the dense layer found the engine 2.9e-3 (decode) and
4.5e-3 (verify) away from the numpy reference, and ~5% of the latent cache's bf16 roundings different:
far more than float32 sum-order noise would flip. This times nothing; per K2 shape (a1 = [wq_a ||
wkv_a], wq_b, wo, dense gate/up and down) and row count it measures, against a float64 product of the
same bf16 values:
  - ``mm_out_dtype``: ``torch.mm(a, b, out_dtype=torch.float32)`` (what ``kernels_numba.blas._mm`` runs),
  - ``mm_out_dtype_out``: the same with ``out=`` (its non-accumulating call),
  - ``mm_bf16``: ``torch.mm(a, b)`` rounded to bf16 by cuBLAS (``blas._bmm16``),
  - ``mm_fp32``: the float32 SGEMM of the widened operands (TF32 off),
each as the largest error in units of the float32 spacing of the row's largest |value| and the
fraction of outputs whose bf16 rounding differs from the exact product's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SHAPES = {"a1 (7168 -> 2112)": (7168, 2112), "wq_b (1536 -> 12288)": (1536, 12288),
          "wo (8192 -> 7168)": (8192, 7168), "dense gate/up (7168 -> 36864)": (7168, 36864),
          "dense down (18432 -> 7168)": (18432, 7168)}


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,17,65")
    ap.add_argument("--out", type=Path, default=Path("bf16_gemm_precision.json"))
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    g = torch.Generator(device="cuda").manual_seed(0)
    results = []
    for name, (k, n) in SHAPES.items():
        w = (torch.randn(k, n, device="cuda", generator=g) / k ** 0.5).bfloat16()
        for m in (int(r) for r in a.rows.split(",")):
            x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
            exact = x.double() @ w.double()                  # bf16 products are exact in float64
            spacing = torch.finfo(torch.float32).eps * exact.abs().amax(dim=1, keepdim=True)
            out = torch.empty(m, n, device="cuda", dtype=torch.float32)
            torch.mm(x, w, out_dtype=torch.float32, out=out)
            got = {"mm_out_dtype": torch.mm(x, w, out_dtype=torch.float32).double(),
                   "mm_out_dtype_out": out.double(),
                   "mm_bf16": torch.mm(x, w).double(),
                   "mm_fp32": torch.mm(x.float(), w.float()).double()}
            row = {"shape": name, "rows": m}
            for key, y in got.items():
                row[f"{key}_err_ulps"] = float(((y - exact).abs() / spacing).max())
                row[f"{key}_bf16_flips"] = float((y.bfloat16() != exact.bfloat16()).double().mean())
            results.append(row)
            print(" ".join(f"{k_}={v:.3g}" if isinstance(v, float) else f"{k_}={v}" for k_, v in row.items()))
    a.out.write_text(json.dumps({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
                                 "results": results}, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
