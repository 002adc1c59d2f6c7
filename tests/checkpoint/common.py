"""Small checkpoints in Kimi-K2.6's exact layout (``workbench.checkpoint.synthetic``) and their configs."""

import base64
import json

from workbench.config import preset

# 8 layers (1 dense + 7 MoE), routed experts INT4 group 32; the experts dominate each MoE layer's bytes
CFG8 = preset("k2_6").replace(
    vocab_size=528, hidden_size=128, intermediate_size=256, moe_intermediate_size=128, num_hidden_layers=8,
    num_attention_heads=2, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16,
    v_head_dim=16, n_routed_experts=32, n_shared_experts=1, num_experts_per_tok=4, first_k_dense_replace=1,
    bos_token_id=None, eos_token_id=None)

# a tiktoken.model of the 256 bytes and a few merges; "e" + the first byte of "中" merges across the
# Han boundary, which Kimi's pre-tokenizer never lets BPE see
HAN = "中".encode()
MERGES = [b"de", b"def", b" x", b"in", b"ing", b"e" + HAN[:1], b" t", b"th"]
SPECIALS = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 5: "<|im_user|>"}   # offsets after the ranks


def tiktoken_files(d, merges=MERGES):
    """Write tiktoken.model and tokenizer_config.json into folder d; returns the number of ranks."""
    ranks = [bytes([b]) for b in range(256)] + list(merges)
    lines = [f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(ranks)]
    (d / "tiktoken.model").write_text("".join(lines))
    added = {str(len(ranks) + k): {"content": v, "special": True} for k, v in SPECIALS.items()}
    (d / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": added,
                                                         "tokenizer_class": "TikTokenTokenizer"}))
    return len(ranks)
