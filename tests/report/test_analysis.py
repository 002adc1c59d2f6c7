"""FP32 vs INT4 comparison helpers against direct computations on the tiny config."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.config import preset
from workbench.errors import InputError
from workbench.reference.generate import greedy_generate
from workbench.report import analysis
from workbench.weights import random_weights


def test_kl_matches_the_definition_and_is_shift_invariant():
    rng = np.random.default_rng(0)
    p, q = rng.standard_normal((5, 11)), rng.standard_normal((5, 11))
    pp = np.exp(p) / np.exp(p).sum(-1, keepdims=True)
    qq = np.exp(q) / np.exp(q).sum(-1, keepdims=True)
    want = (pp * np.log(pp / qq)).sum(-1)
    np.testing.assert_allclose(analysis.kl_divergence(p, q), want, rtol=1e-12)
    np.testing.assert_allclose(analysis.kl_divergence(p + 3.0, q - 7.0), want, rtol=1e-9)
    assert np.all(analysis.kl_divergence(p, p) == 0)
    with pytest.raises(InputError):
        analysis.kl_divergence(p, q[:, :5])


def test_first_divergence():
    assert analysis.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert analysis.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert analysis.first_divergence([4], [5, 6]) == 0


def test_teacher_forcing_reproduces_greedy_logits():
    cfg = preset("tiny")
    w = random_weights(cfg, 3)
    prompt = [1, 2, 3, 4]
    g = greedy_generate(cfg, w, prompt, 6)
    tf = analysis.teacher_forced(cfg, w, prompt, g.tokens, capture=(0, 3))
    assert tf.logits.shape == (6, cfg.vocab_size) and tf.hidden[3].shape == (6, cfg.hidden_size)
    np.testing.assert_allclose(tf.logits, g.logits, atol=2e-4, rtol=1e-4)
    assert np.array_equal(tf.logits.argmax(-1), g.tokens)
    s = analysis.forced_summary(tf, tf, g.tokens, g.margins)
    assert s["mean_kl_nats"] == 0 and s["top1_agreement"] == 1 and s["fp32_reproduces_forced"] == 1


def test_relative_and_hidden_errors():
    a = np.array([[3.0, 4.0], [0.0, 0.0]])
    np.testing.assert_allclose(analysis.relative_error(a, a * 1.1, axis=-1), [0.1, 0.0])
    assert analysis.relative_error(np.zeros(2), np.ones(2)) == np.inf
    rows = analysis.hidden_errors({0: a[:1], 2: a[:1]}, {0: a[:1], 2: 2 * a[:1]})
    assert (
        [r["layer"] for r in rows] == [0, 2] and rows[0]["mean_rel_err"] == 0 and rows[1]["max_rel_err"] == 1
    )


def test_quantization_errors_and_group_sizes():
    cfg = preset("tiny").replace(moe_intermediate_size=128)
    w = random_weights(cfg, 1)
    assert analysis.group_size_fits(cfg, w, "mlp", 128)
    assert not analysis.group_size_fits(preset("tiny"), random_weights(preset("tiny"), 1), "mlp", 128)
    rows = analysis.quantization_errors(cfg, w, (32, 128))
    assert {r["kind"] for r in rows} == {
        f"{k} w{i}" for k in ("dense", "expert", "shared") for i in (1, 2, 3)
    }
    assert all(
        0 < r["rel_frobenius_err"] < 0.2 and 0 < r["max_abs_err_over_max_w"] <= 1 / 14 + 1e-3 for r in rows
    )
    by_g = {g: np.mean([r["rel_frobenius_err"] for r in rows if r["group_size"] == g]) for g in (32, 128)}
    assert by_g[32] < by_g[128]  # finer groups, smaller scales, smaller error
    assert analysis.matrix_kind("layers.0.ffn.w2") == "dense w2"
