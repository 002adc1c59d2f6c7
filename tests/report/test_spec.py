"""Speculative-decoding analysis helpers: histograms, a captured round, coverage, the bytes model."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.bundle import read_bundle
from workbench.config import preset
from workbench.ddtree import DrafterConfig, ddtree_generate
from workbench.ddtree.speculative import RoundStats
from workbench.errors import InputError
from workbench.report import spec

REFS = __import__("pathlib").Path(__file__).resolve().parents[2] / "refs"


def test_accepted_histogram():
    rounds = [RoundStats(4, a, 3) for a in (1, 3, 3, 4)]
    assert spec.accepted_histogram(rounds, 5).tolist() == [0, 1, 0, 2, 1, 0]
    with pytest.raises(InputError):
        spec.accepted_histogram(rounds, 3)


def test_capture_round_is_the_round_ddtree_generate_ran():
    b = read_bundle(REFS / "tiny.kdtr")
    w, dcfg = b.weights(), DrafterConfig.from_dict(b.meta["drafter"])
    ref = ddtree_generate(
        b.config, w, b.prompt, 16, drafter="oracle", budget=8, drafter_config=dcfg, oracle_p=0.7
    )
    emitted = 1
    for i in range(3):
        t = spec.capture_round(
            b.config, w, b.prompt, 16, i, drafter="oracle", budget=8, drafter_config=dcfg, oracle_p=0.7
        )
        assert (t.tree.n_nodes, len(t.accepted)) == (ref.rounds[i].tree_size, ref.rounds[i].accepted_len)
        path = [int(t.tree.tokens[j - 1]) for j in t.accepted[1:]] + [t.bonus]
        assert (
            t.root == ref.tokens[emitted - 1] and path == ref.tokens[emitted : emitted + len(path)].tolist()
        )
        emitted += len(path)
    with pytest.raises(InputError, match="before round"):
        spec.capture_round(b.config, w, b.prompt, 2, 5, drafter="oracle", budget=8, drafter_config=dcfg)


def test_coverage():
    np.testing.assert_allclose(spec.analytic_coverage(384, 8, [0, 1]), [0, 8])
    assert spec.analytic_coverage(384, 8, 10_000) == pytest.approx(384)
    assert spec.coverage_curve(np.array([[0, 1], [1, 2], [0, 2]]), [1, 2, 3]).tolist() == [2, 3, 3]
    k2 = preset("k2")
    gate, bias = spec.random_router(k2, 0)
    idx = spec.route_tokens(k2, [5, 9, 5], gate, bias, 0)
    assert idx.shape == (3, 8) and idx.min() >= 0 and idx.max() < 384
    assert np.array_equal(idx[0], idx[2]) and not np.array_equal(np.sort(idx[0]), np.sort(idx[1]))
    f = spec.token_features([7, 7, 8], 64, 1)
    assert np.array_equal(f[0], f[1]) and np.allclose(np.sqrt((f**2).mean(-1)), 1, atol=1e-3)


def test_forward_weight_bytes_counts_each_expert_once():
    k2 = preset("k2")
    per_expert = 3 * k2.hidden_size * k2.moe_intermediate_size * (0.5 + 2 / 32)
    diff = spec.forward_weight_bytes(k2, 9) - spec.forward_weight_bytes(k2, 8)
    assert diff == pytest.approx(k2.n_moe_layers * per_expert)
    assert spec.forward_weight_bytes(k2, 8, group_size=128) < spec.forward_weight_bytes(k2, 8, group_size=32)
