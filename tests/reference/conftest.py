"""Small random configs for the reference tests (a few ms per forward)."""

import pytest

from workbench.config import ModelConfig

SMALL = dict(
    vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
    num_attention_heads=2, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
    v_head_dim=8, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
    max_position_embeddings=4096, bos_token_id=None, eos_token_id=None,
)


def small_config(**changes) -> ModelConfig:
    """A 3-layer (1 dense + 2 MoE) model with K2's rope block (YaRN factor 32, betas 1/1)."""
    return ModelConfig(**{**SMALL, **changes})


@pytest.fixture
def make_cfg():
    return small_config
