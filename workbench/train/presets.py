"""Sizes and recipes of the trained pair: ``full`` (the committed bundles, one H200) and ``toy`` (CPU, CI).

full target: V 2048 (the tokenizer), D 128, 4 layers (1 dense + 3 MoE), 4 heads, MLA q_lora 64 /
kv_lora 64 / nope 32 / rope 16 / v 32, 32 routed experts of width 64 (top-4) + 1 shared, YaRN factor 4
over the 1024-token training context: 3.32 M parameters. Drafter: 2 layers, block 16, taps of all 4
target layers: 0.39 M. The three bundles (BF16, INT4 ``experts``, INT4 ``mlp``) come to about 15.5 MB
(docs/training.md has the byte count); widths are multiples of 64 as the INT4 kernels want.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..config import ConfigError, ModelConfig
from ..ddtree.config import DrafterConfig


@dataclass(frozen=True)
class TargetRecipe:
    seq_len: int = 1024            # training context (= YaRN's original_max_position_embeddings)
    batch: int = 64                # sequences per step
    max_steps: int = 5000
    minutes: float | None = 8.5    # wall-clock budget of the stage (set-up included): steps are cut to fit
    lr: float = 3e-3
    min_lr_ratio: float = 0.1      # cosine decays to lr * this
    warmup: int = 200
    weight_decay: float = 0.1      # matrices only (not embeddings, norms, router bias)
    clip: float = 1.0
    bias_rate: float = 1e-3        # router correction-bias step per training step
    eval_every: int = 500
    eval_windows: int = 64         # held-out windows of seq_len per evaluation
    eval_prompts: int | None = None  # HumanEval prompts scored per evaluation (None: all 164)
    log_every: int = 20
    ckpt_seconds: float = 60.0
    seed: int = 0
    max_files: int | None = None   # read only the first N train / heldout files (toy runs)
    n_completions: int = 3         # HumanEval prompts completed greedily in the report
    completion_tokens: int = 64


@dataclass(frozen=True)
class DrafterRecipe:
    prompt_lens: tuple[int, ...] = (64, 128, 192, 256)   # corpus windows the target continues
    body_fraction: float = 0.5     # of the prompts: windows ending where a function body starts
    new_tokens: int = 256          # greedy target tokens per sequence (the drafter's training text)
    n_seqs: int = 16384
    gen_batch: int = 512
    n_eval_seqs: int = 128         # from held-out prompts, for the acceptance estimate
    batch: int = 64                # sequences per step
    anchors: int = 64              # random anchors per sequence per step (fresh every step)
    gamma: float = 7.0             # loss weight exp(-(k-1)/gamma), DFlash's value for block 16
    max_steps: int = 8000
    minutes: float | None = 8.0    # the stage, generation included: one 10-minute device call
    lr: float = 1.5e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.0
    clip: float = 1.0
    eval_every: int = 500
    log_every: int = 20
    ckpt_seconds: float = 60.0
    seed: int = 1


@dataclass(frozen=True)
class Size:
    target: ModelConfig
    drafter: DrafterConfig
    target_recipe: TargetRecipe
    drafter_recipe: DrafterRecipe


_FULL_TARGET = ModelConfig(
    vocab_size=2048, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
    num_hidden_layers=4, num_attention_heads=4, q_lora_rank=64, kv_lora_rank=64, qk_nope_head_dim=32,
    qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=32, n_shared_experts=1, num_experts_per_tok=4,
    first_k_dense_replace=1, rope_theta=50000.0, rope_factor=4.0, original_max_position_embeddings=1024,
    beta_fast=32.0, beta_slow=1.0, max_position_embeddings=4096, bos_token_id=None, eos_token_id=0,
)
_FULL_DRAFTER = DrafterConfig(block_size=16, n_layers=2, n_heads=4, head_dim=32, intermediate_size=256,
                              target_layer_ids=(0, 1, 2, 3), mask_token_id=1)
_TOY_TARGET = _FULL_TARGET.replace(
    hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
    num_attention_heads=2, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
    v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, original_max_position_embeddings=64,
    max_position_embeddings=1024)
_TOY_DRAFTER = DrafterConfig(block_size=4, n_layers=1, n_heads=2, head_dim=16, intermediate_size=64,
                             target_layer_ids=(0, 1), mask_token_id=1)

SIZES: dict[str, Size] = {
    "full": Size(_FULL_TARGET, _FULL_DRAFTER, TargetRecipe(), DrafterRecipe()),
    "toy": Size(_TOY_TARGET, _TOY_DRAFTER,
                TargetRecipe(seq_len=64, batch=8, max_steps=40, minutes=None, lr=1e-2, warmup=4,
                             eval_every=40, eval_windows=4, eval_prompts=8, log_every=5, max_files=6,
                             n_completions=1, completion_tokens=8),
                DrafterRecipe(prompt_lens=(16, 24), new_tokens=24, n_seqs=32, gen_batch=16, n_eval_seqs=4,
                              batch=8, anchors=8, gamma=4.0, max_steps=30, minutes=None, lr=1e-2, warmup=3,
                              eval_every=15, log_every=5)),
}


def size(name: str, **recipe_changes) -> Size:
    """The named size, with ``target_*`` / ``drafter_*`` keyword overrides of its recipes."""
    if name not in SIZES:
        raise ConfigError(f"unknown size {name!r} (choose from {', '.join(SIZES)})")
    s = SIZES[name]
    def pick(prefix: str) -> dict:
        return {k[len(prefix):]: v for k, v in recipe_changes.items()
                if k.startswith(prefix) and v is not None}
    t, d = pick("target_"), pick("drafter_")
    return dataclasses.replace(s, target_recipe=dataclasses.replace(s.target_recipe, **t),
                               drafter_recipe=dataclasses.replace(s.drafter_recipe, **d))
