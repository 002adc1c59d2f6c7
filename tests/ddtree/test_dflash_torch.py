"""The reference drafter in the public DFlash layout equals the published layer written in torch
(tests/ddtree/torch_dflash.py) in float64, and its YaRN frequencies equal transformers'."""

import dataclasses

import numpy as np
import pytest

from tests.ddtree.common import dflash_model
from tests.ddtree.torch_dflash import config_json, draft_logits, hf_state
from workbench.config import preset
from workbench.ddtree.dflash import DFlashDrafter, drafter_inv_freq, kimi_k26_dflash


class _State:
    def __init__(self, bonus, start, new_features):
        self.bonus, self.start, self.new_features = bonus, start, new_features


@pytest.mark.parametrize("name", ["tiny", "tiny2"])
def test_reference_equals_the_published_layer(name):
    cfg, w, dcfg = dflash_model(name)
    feats = np.random.default_rng(5).standard_normal((13, dcfg.n_features * cfg.hidden_size))   # [13, F*D]
    c, sd = config_json(cfg, dcfg), hf_state(w)
    drafter = DFlashDrafter(cfg, w, dcfg, 32, np.float64)
    for bonus, a, b in ((4, 0, 6), (200, 6, 13)):                       # the second call appends context
        got = drafter.propose(_State(bonus, b, feats[a:b]))               # [L, V]
        want = draft_logits(c, sd, w["embed"], w["head"], feats[:b], bonus, b, dcfg.block_size,
                            dcfg.mask_token_id)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    # the comparison sees the layout: interleaved pairs give other logits
    inter = DFlashDrafter(cfg, w, dataclasses.replace(dcfg, rope_layout="interleaved"), 32, np.float64)
    assert not np.allclose(inter.propose(_State(200, 13, feats)), want, atol=1e-6)


def _hf_yarn(head_dim, theta, rs):
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    c = Qwen3Config(hidden_size=head_dim * 4, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=head_dim, rope_theta=theta, rope_scaling={"rope_type": "yarn", **rs},
                    max_position_embeddings=int(rs["original_max_position_embeddings"] * rs["factor"]))
    inv, att = ROPE_INIT_FUNCTIONS["yarn"](c, "cpu")
    return inv.double().numpy(), att


@pytest.mark.parametrize("which", ["test", "kimi"])
def test_yarn_frequencies_equal_transformers(which):
    dcfg = dflash_model("tiny")[2] if which == "test" else kimi_k26_dflash(preset("k2"))
    rs = {"factor": dcfg.rope_factor, "beta_fast": dcfg.beta_fast, "beta_slow": dcfg.beta_slow,
          "original_max_position_embeddings": dcfg.original_max_position_embeddings}
    theta, d = dcfg.rope_theta, dcfg.head_dim
    inv, att = _hf_yarn(d, theta, {**rs, "attention_factor": dcfg.rope_attention_factor})
    np.testing.assert_allclose(drafter_inv_freq(dcfg), inv, rtol=1e-6)  # transformers: float32
    assert att == dcfg.rope_attention_factor
    if which == "kimi":                                                  # the checkpoint's mscale pair: 1.0
        assert _hf_yarn(d, theta, {**rs, "mscale": 1.0, "mscale_all_dim": 1.0})[1] == 1.0
