"""The torch drafter's multi-anchor forward equals the numpy drafter at every anchor."""

import numpy as np
import pytest
import torch

from tests.torchk2.test_model import CFG
from workbench.ddtree.config import DrafterConfig
from workbench.ddtree.dflash import DraftCache, dflash_propose, random_drafter_weights
from workbench.errors import InputError
from workbench.torchk2.model import TorchTarget
from workbench.train.drafter import TorchDrafter, anchor_labels, block_loss
from workbench.weights import random_weights

DCFG = DrafterConfig(block_size=4, n_layers=2, n_heads=2, head_dim=8, intermediate_size=48,
                     target_layer_ids=(0, 2), mask_token_id=CFG.vocab_size - 1)


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def _pair(seed):
    w = random_weights(CFG, seed, dtype=np.float64)
    w.update({k: v.astype(np.float64) for k, v in random_drafter_weights(CFG, DCFG, seed + 1).items()})
    target = TorchTarget(CFG).double()
    target.load_weights_dict(w)
    drafter = TorchDrafter(CFG, DCFG).double()
    drafter.load_weights_dict(w)
    return w, target, drafter


def test_every_anchor_matches_dflash_propose():
    w, target, drafter = _pair(11)
    rng = np.random.default_rng(0)
    t = 14
    tokens = rng.integers(0, CFG.vocab_size - 1, (2, t))
    feats = rng.standard_normal((2, t, DCFG.n_features * CFG.hidden_size))
    anchors = np.array([[0, 3, 10, 7], [5, 1, 2, 10]])
    got = drafter(target, torch.from_numpy(tokens), torch.from_numpy(feats), torch.from_numpy(anchors))
    assert got.shape == (2, 4, DCFG.n_drafted, CFG.vocab_size)
    for b in range(2):
        for j, a in enumerate(anchors[b]):
            cache = DraftCache.empty(DCFG, t + DCFG.block_size, np.float64)
            ref = dflash_propose(CFG, DCFG, w, cache, int(tokens[b, a]), int(a), feats[b, :a],
                                 dtype=np.float64)
            np.testing.assert_allclose(got[b, j].numpy(), ref, rtol=0, atol=1e-9)


def test_weights_round_trip_and_labels():
    w, _, drafter = _pair(12)
    back = drafter.weights_dict()
    assert sorted(back) == sorted(k for k in w if k.startswith("drafter."))
    for k, v in back.items():
        np.testing.assert_array_equal(v, w[k].astype(np.float32))
    tokens = torch.arange(20).view(2, 10)
    lab = anchor_labels(tokens, torch.tensor([[0, 5], [2, 6]]), 3)
    assert lab.tolist() == [[[1, 2, 3], [6, 7, 8]], [[13, 14, 15], [17, 18, 19]]]


def test_block_loss_weights_early_positions_more():
    logits = torch.zeros(1, 1, 3, 5)
    labels = torch.zeros(1, 1, 3, dtype=torch.long)
    assert abs(float(block_loss(logits, labels, 2.0)) - np.log(5)) < 1e-6
    good_first = logits.clone()
    good_first[0, 0, 0, 0] = 10.0
    good_last = logits.clone()
    good_last[0, 0, 2, 0] = 10.0
    assert block_loss(good_first, labels, 2.0) < block_loss(good_last, labels, 2.0)


def test_anchor_too_late_is_a_one_line_error():
    _, target, drafter = _pair(13)
    with pytest.raises(InputError, match="anchors must lie"):
        feats = torch.zeros(1, 6, 2 * CFG.hidden_size, dtype=torch.float64)
        drafter(target, torch.zeros(1, 6, dtype=torch.long), feats, torch.tensor([[3]]))
