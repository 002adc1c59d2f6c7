"""Bad generation requests give a one-line InputError."""

import numpy as np
import pytest

from tests.ddtree.common import PROMPT, model
from workbench.ddtree import SamplingParams, ar_generate, ddtree_generate
from workbench.errors import InputError


def _target_only(weights):
    return {k: v for k, v in weights.items() if not k.startswith("drafter.")}


@pytest.mark.parametrize("kwargs, match", [
    ({"drafter": "eagle"}, "unknown drafter"),
    ({"budget": 0}, "budget"),
    ({"budget": -3}, "budget"),
    ({"budget": 2.5}, "budget"),
    ({"budget": 1025}, r"budget must be an int in \[1, 1024\]"),
    ({"budget": 1_000_000}, r"budget must be an int in \[1, 1024\]"),
    ({"prompt": [1, 2, 512]}, "outside the vocabulary"),
    ({"prompt": []}, "empty"),
    ({"n_tokens": 0}, "n_tokens"),
    ({"sampling": 0.5}, "SamplingParams"),
    ({"drafter_config": {"block_size": 8, "bogus": 1}}, "bogus"),
    ({"drafter_config": {"target_layer_ids": [0, 9]}}, "target_layer_ids"),
    ({"oracle_p": 2.0, "drafter": "oracle"}, "oracle p"),
])
def test_bad_requests(kwargs, match):
    cfg, weights, dcfg = model("tiny")
    args = {"prompt": PROMPT, "n_tokens": 4, "drafter": "dflash", "budget": 4, "sampling": SamplingParams(),
            "drafter_config": dcfg} | kwargs
    with pytest.raises(InputError, match=match) as err:
        ddtree_generate(cfg, weights, args.pop("prompt"), args.pop("n_tokens"), **args)
    assert "\n" not in str(err.value)


def test_dflash_without_drafter_weights():
    cfg, weights, dcfg = model("tiny")
    with pytest.raises(InputError, match="drafter"):
        ddtree_generate(cfg, _target_only(weights), PROMPT, 4, "dflash", 4, drafter_config=dcfg)
    # the oracle needs no drafter weights
    res = ddtree_generate(cfg, _target_only(weights), PROMPT, 4, "oracle", 4, drafter_config=dcfg)
    assert res.tokens.shape == (4,)


def test_ar_bad_requests():
    cfg, weights, _ = model("tiny")
    with pytest.raises(InputError):
        ar_generate(cfg, weights, np.array([600]), 3)
    with pytest.raises(InputError):
        ar_generate(cfg, weights, PROMPT, -1)


def test_budget_must_fit_the_context():
    from workbench.ddtree.inputs import check_budget
    cfg, _, _ = model("tiny")
    small = cfg.replace(max_position_embeddings=64)
    assert check_budget(63, small) == 63
    with pytest.raises(InputError, match="does not fit the model's context"):
        check_budget(64, small)
