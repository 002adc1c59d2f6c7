"""The expert-parallel stack: a whole target forward on P ranks, every MoE layer's experts split.

Each rank builds the engine (``engine.runtime.Engine``) from the same weights with ``experts=False``:
embedding, attention with the latent cache, norms, dense MLP layers, final norm and head are uploaded
and run replicated, by the engine's own launch sequence (``engine.model.launch_forward``). Each MoE
layer instead gets ``moe_block`` = that layer's ``EPMoE`` (``ep_moe``), holding only this rank's
E / P experts (repacked once, here), the replicated router and the shared expert. Every rank runs the
same steps on the same tokens, so every rank holds the same residual rows before each MoE block and
ends with the same logits; prefill, decode and tree-verify steps are the engine's (``engine.ar``,
``engine.rounds``).

Steps run eagerly (no CUDA graphs): the all-to-all splits reach the host each step. The block covers
all of a step's grid rows (a verify of N < budget nodes still moves budget + 1 rows).
"""

from __future__ import annotations

from typing import Any

from kernels_numba import ops
from kernels_numba.device import SIMULATED

from ..config import ConfigError, ModelConfig
from ..engine.build import MappingSource
from ..engine.runtime import Engine
from ..engine.weights import moe_experts
from .ep_moe import EPMoE, ep_weights
from .experts import ExpertSplit


def _layer_block(cfg: ModelConfig, weights: dict[str, Any], layer: int, split: ExpertSplit, rank: int,
                 max_rows: int, fast: bool, group) -> EPMoE:
    f, src = f"layers.{layer}.ffn", MappingSource(cfg, weights, fast)
    rt = src.router(f)
    local = ops.moe_weights(rt, moe_experts(weights, f, split.experts(rank)), None, fast)
    if local.path != ops.FUSED_MOE:
        raise ConfigError(f"layer {layer}: rank {rank}'s experts do not fit fused_moe (INT4 experts of "
                          "widths fused_moe takes are needed)")
    return EPMoE(ep_weights(split, rank, rt, local.fused, src.shared(f)), max_rows,
                 "cpu" if SIMULATED else "cuda", group)


def ep_engine(cfg: ModelConfig, weights: dict[str, Any], max_len: int, max_rows: int, taps: tuple = (),
              fast_kernels: bool = True, group=None) -> Engine:
    """This rank's engine of the expert-parallel stack (module docstring); call it on every rank of
    ``group`` (an initialised torch.distributed group) with the same arguments. ``eng.ep_blocks``:
    {MoE layer index: its EPMoE}."""
    import torch.distributed as dist
    if not dist.is_initialized():
        raise ConfigError("the expert-parallel stack needs an initialised torch.distributed process group")
    split = ExpertSplit(cfg.n_routed_experts, dist.get_world_size(group))
    rank = dist.get_rank(group)
    eng = Engine(cfg, weights, max_len, max_rows, taps, use_graphs=False, fast_kernels=fast_kernels,
                 experts=False)
    eng.ep_blocks = {}
    for i, lay in enumerate(eng.model.layers):
        if not cfg.is_moe_layer(i):
            continue
        block = _layer_block(cfg, weights, i, split, rank, max_rows, fast_kernels, group)
        eng.ep_blocks[i] = block

        def run(h, x, rows, s, block=block):
            block(ops.torch_view(h)[:rows], ops.torch_view(x)[:rows])      # torch views of the engine's rows
        lay.moe_block = run
    return eng
