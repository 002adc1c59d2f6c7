"""The independent oracle: transformers' DeepseekV3ForCausalLM (torch, CPU, float64) loads checkpoints written
by save_hf_checkpoint and must reproduce the reference's logits and greedy tokens.

transformers computes a few steps in float32 on purpose even in a float64 model (RMSNorm, the RoPE
tables, the router, the softmax). For the tight comparison those casts are promoted to float64 by
handing its modeling module a ``torch`` whose ``float32`` is float64; the math is HF's own code.
One test also runs stock HF (float32 islands kept) at a float32-sized tolerance.
"""

import types

import numpy as np
import pytest
import torch
import transformers
from transformers import modeling_rope_utils
from transformers.models.deepseek_v3 import modeling_deepseek_v3

from workbench.hf_checkpoint import save_hf_checkpoint
from workbench.reference.generate import greedy_generate
from workbench.reference.model import LatentCache, forward
from workbench.weights import random_weights

PROMPT = np.array([5, 17, 3, 88, 41, 0, 63])
N_NEW = 5
CONFIGS = {
    # K2's shape: q_lora, YaRN factor 32 betas 1/1, no group limit, 1 shared expert
    "k2_like": dict(model_type="kimi_k2"),
    # Moonlight-like: plain q_proj, no rope scaling, group limit on, 2 shared experts
    "qproj_norope_groups": dict(q_lora_rank=None, rope_scaling_type=None, rope_theta=10000.0, n_group=4,
                                topk_group=2, n_shared_experts=2, model_type="deepseek_v3"),
    # DeepSeek-V3 rope block with an mscale ratio != 1, one group kept of two, no renormalisation,
    # block-norm eps 1e-5 (HF keeps the MLA norms at 1e-6)
    "v3_yarn_groups": dict(rope_theta=10000.0, rope_factor=40.0, beta_fast=32.0, mscale_all_dim=0.707,
                           n_group=2, topk_group=1, norm_topk_prob=False, rms_norm_eps=1e-5,
                           routed_scaling_factor=2.5),
    # every layer MoE, plain q_proj with YaRN, 2 shared experts, more heads
    "all_moe": dict(q_lora_rank=None, first_k_dense_replace=0, n_shared_experts=2, num_attention_heads=4,
                    n_routed_experts=6, num_experts_per_tok=3, n_group=3, topk_group=2),
}


class _Float64Torch(types.ModuleType):
    """``torch`` with float32 / float meaning float64: promotes HF's deliberate float32 steps."""

    def __init__(self) -> None:
        super().__init__("torch")

    def __getattr__(self, name):
        return torch.float64 if name in ("float32", "float") else getattr(torch, name)


@pytest.fixture(autouse=True)
def _quiet():
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def _load(path, promote):
    with pytest.MonkeyPatch.context() as mp:
        if promote:
            mp.setattr(modeling_deepseek_v3, "torch", _Float64Torch())
            mp.setattr(modeling_rope_utils, "torch", _Float64Torch())
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float64, attn_implementation="eager", experts_implementation="eager")
    model.eval()
    assert type(model).__name__ == "DeepseekV3ForCausalLM"
    return model


def _run_hf(model, promote, ids, positions=None):
    """(full-sequence logits, greedy tokens, greedy step logits) from HF: one forward, then a prefill
    and token-by-token decode over HF's own DynamicCache, all float64."""
    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        if promote:
            mp.setattr(modeling_deepseek_v3, "torch", _Float64Torch())
        pos = None if positions is None else torch.tensor(positions)[None]
        logits = model(torch.tensor(ids)[None], position_ids=pos).logits[0].numpy()
        cache = transformers.DynamicCache(config=model.config)
        step_in, tokens, steps = torch.tensor(ids)[None], [], []
        for _ in range(N_NEW):
            last = model(step_in, cache=cache, use_cache=True).logits[0, -1]
            tokens.append(int(last.argmax()))
            steps.append(last.numpy())
            step_in = torch.tensor([[tokens[-1]]])
    return logits, np.array(tokens), np.stack(steps)


def _checkpoint(tmp_path, cfg, seed, **kw):
    w = random_weights(cfg, seed)                 # float32 values: exact in the float64 HF model
    save_hf_checkpoint(tmp_path / "ckpt", cfg, w, **kw)
    return {k: v.astype(np.float64) for k, v in w.items()}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_transformers_matches_the_reference_in_float64(tmp_path, make_cfg, name):
    cfg = make_cfg(**CONFIGS[name])
    shard = {"max_shard_bytes": 40_000} if name == "qproj_norope_groups" else {}   # sharded + index
    w = _checkpoint(tmp_path, cfg, seed=len(name), **shard)
    assert (tmp_path / "ckpt" / "model.safetensors.index.json").exists() == bool(shard)
    model = _load(tmp_path / "ckpt", promote=True)
    far = 3000 + np.arange(len(PROMPT))                         # long-range positions exercise YaRN
    for positions in (None, far):
        hf_logits, hf_tokens, hf_step_logits = _run_hf(model, True, PROMPT, positions)
        ref = forward(cfg, w, PROMPT, LatentCache.empty(cfg, 16, np.float64), positions=positions,
                      dtype=np.float64).logits
        scale = np.abs(ref).max()
        np.testing.assert_allclose(hf_logits, ref, rtol=0, atol=1e-12 * scale)
    g = greedy_generate(cfg, w, PROMPT, N_NEW, dtype=np.float64)
    np.testing.assert_array_equal(hf_tokens, g.tokens)
    np.testing.assert_allclose(hf_step_logits, g.logits, rtol=0, atol=1e-12 * np.abs(g.logits).max())


def test_stock_transformers_matches_at_float32_tolerance(tmp_path, make_cfg):
    cfg = make_cfg(**CONFIGS["v3_yarn_groups"])
    w = _checkpoint(tmp_path, cfg, seed=3)
    model = _load(tmp_path / "ckpt", promote=False)
    hf_logits, hf_tokens, _ = _run_hf(model, False, PROMPT)
    ref = forward(cfg, w, PROMPT, LatentCache.empty(cfg, 16, np.float64), dtype=np.float64).logits
    err = np.abs(hf_logits - ref).max() / np.abs(ref).max()
    assert 1e-12 < err < 1e-5                    # float32-sized differences, not float64 ones
    g = greedy_generate(cfg, w, PROMPT, N_NEW, dtype=np.float64)
    assert (g.margins > 1e-3).all()
    np.testing.assert_array_equal(hf_tokens, g.tokens)
