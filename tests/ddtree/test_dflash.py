"""The dflash drafter: preset configs, random weights, context-cache bookkeeping, bad inputs."""

import dataclasses

import numpy as np
import pytest

from tests.ddtree.common import model
from workbench.config import ConfigError, preset
from workbench.ddtree.config import DrafterConfig
from workbench.ddtree.dflash import (
    DFlashDrafter,
    DraftCache,
    default_drafter_config,
    dflash_propose,
    drafter_param_count,
    drafter_shapes,
    random_drafter_weights,
)
from workbench.errors import InputError


@dataclasses.dataclass
class _State:
    bonus: int
    start: int
    new_features: np.ndarray


def test_default_configs_and_sizes():
    tiny, tiny2 = default_drafter_config(preset("tiny")), default_drafter_config(preset("tiny2"))
    assert tiny.target_layer_ids == (0, 1, 2) and tiny.n_layers == 2 and tiny.mask_token_id == 511
    assert tiny2.target_layer_ids == (0, 2, 4) and tiny2.n_layers == 1 and tiny2.mask_token_id == 399
    assert drafter_param_count(preset("tiny2"), tiny2) <= 350_000
    assert default_drafter_config(preset("k2")).target_layer_ids == (1, 15, 30, 44, 58)
    for name in ("tiny", "tiny2"):
        cfg = preset(name)
        w = random_drafter_weights(cfg, default_drafter_config(cfg), 0)
        assert {k: v.shape for k, v in w.items()} == drafter_shapes(cfg, default_drafter_config(cfg))
        assert all(k.startswith("drafter.") for k in w)


def test_random_weights_deterministic_and_float16_exact():
    cfg = preset("tiny")
    dcfg = default_drafter_config(cfg)
    a, b, c = (random_drafter_weights(cfg, dcfg, s) for s in (1, 1, 2))
    for k in a:
        assert a[k].dtype == np.float32
        np.testing.assert_array_equal(a[k], b[k])
        np.testing.assert_array_equal(a[k].astype(np.float16).astype(np.float32), a[k])
        assert not np.array_equal(a[k], c[k])


def test_config_round_trip_and_validation():
    dcfg = default_drafter_config(preset("tiny2"))
    assert DrafterConfig.from_dict(dcfg.to_dict()) == dcfg
    for bad in ({"block_size": 1}, {"head_dim": 7}, {"target_layer_ids": ()}, {"target_layer_ids": (1, 1)},
                {"mask_token_id": -1}, {"rope_theta": 0.0}):
        with pytest.raises(ConfigError):
            dataclasses.replace(dcfg, **bad)
    with pytest.raises(ConfigError):
        DrafterConfig.from_dict({**dcfg.to_dict(), "extra": 1})
    with pytest.raises(ConfigError):
        dataclasses.replace(dcfg, target_layer_ids=(0, 6)).check_target(preset("tiny2"))
    with pytest.raises(ConfigError):
        dataclasses.replace(dcfg, mask_token_id=400).check_target(preset("tiny2"))


def test_cache_bookkeeping_incremental_equals_one_shot():
    # features fed over three calls give the same logits as all at once; block rows are never kept
    cfg, weights, dcfg = model("tiny")
    rng = np.random.default_rng(0)
    feats = rng.standard_normal((11, dcfg.n_features * cfg.hidden_size))          # [11, F*D]
    inc = DFlashDrafter(cfg, weights, dcfg, 32, np.float64)
    for bonus, a, b in ((4, 0, 5), (9, 5, 6), (30, 6, 11)):
        got = inc.propose(_State(bonus, b, feats[a:b]))
        assert inc.cache.length == b
    fresh = DFlashDrafter(cfg, weights, dcfg, 32, np.float64)
    want = fresh.propose(_State(30, 11, feats))
    assert got.shape == (dcfg.n_drafted, cfg.vocab_size)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # the drafts depend on the bonus, on the context and on the drafter weights
    def fresh_propose(bonus, f):
        return DFlashDrafter(cfg, weights, dcfg, 32, np.float64).propose(_State(bonus, 11, f))
    assert not np.allclose(want, fresh_propose(31, feats))
    feats2 = feats.copy()
    feats2[0] += 1.0
    assert not np.allclose(want, fresh_propose(30, feats2))


def test_drafter_bad_inputs():
    cfg, weights, dcfg = model("tiny")
    target_only = {k: v for k, v in weights.items() if not k.startswith("drafter.")}
    with pytest.raises(InputError, match="drafter"):
        DFlashDrafter(cfg, target_only, dcfg, 16)
    wrong = dict(weights)
    wrong["drafter.fc"] = wrong["drafter.fc"][:, :-1]
    with pytest.raises(InputError, match="drafter.fc"):
        DFlashDrafter(cfg, wrong, dcfg, 16)
    cache = DraftCache.empty(dcfg, 16, np.float32)
    with pytest.raises(InputError):       # cache (0) + 3 new rows != bonus position 4
        dflash_propose(cfg, dcfg, weights, cache, 1, 4, np.zeros((3, dcfg.n_features * cfg.hidden_size)))
