"""Sampling: the per-row sampler, AR sampling, and lossless DDTree sampling at T > 0 (statistical)."""

import functools

import numpy as np
import pytest

from tests.ddtree.common import PROMPT, greedy, model
from tests.ddtree.stats import gof_pvalue, two_sample_pvalue
from workbench.config import preset
from workbench.ddtree import DrafterConfig, SamplingParams, ar_generate, ddtree_generate
from workbench.ddtree.sampling import sample_tokens, softmax_t
from workbench.reference.generate import greedy_generate
from workbench.reference.model import LatentCache, forward
from workbench.weights import random_weights

# A small random target (V = 12) so the joint law of two tokens has few cells; T = 3 spreads it out
# (random-weight logits have std ~3). Each statistical test uses alpha = 1e-3 with fixed seeds.
SMALL = preset("tiny").replace(vocab_size=12, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                               num_hidden_layers=2, num_attention_heads=2, q_lora_rank=16, kv_lora_rank=16,
                               qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, n_routed_experts=4,
                               num_experts_per_tok=2)
T = 3.0
ALPHA = 1e-3
N_RUNS = 2000
SMALL_PROMPT = [1, 2, 3]
DCFG = DrafterConfig(block_size=4, target_layer_ids=(0,), mask_token_id=11)    # oracle: L = 3 positions


@functools.cache
def small_weights():
    return random_weights(SMALL, 0)


@functools.cache
def exact_law():
    """Exact P(t1, t2, t3) [V, V, V] of the first three sampled tokens, from float64 forwards."""
    w, v = small_weights(), SMALL.vocab_size
    def next_probs(prefix):
        cache = LatentCache.empty(SMALL, len(prefix), np.float64)
        return softmax_t(forward(SMALL, w, prefix, cache, dtype=np.float64).logits[-1:], T)[0]   # [V]
    law = np.zeros((v, v, v))
    p1 = next_probs(SMALL_PROMPT)
    for a in range(v):
        p2 = next_probs(SMALL_PROMPT + [a])
        for b in range(v):
            law[a, b] = p1[a] * p2[b] * next_probs(SMALL_PROMPT + [a, b])
    return law


def _counts(generate, first_seed):
    """Counts [V, V, V] of the first three tokens over N_RUNS seeds from first_seed on. AR and DDTree
    draw their first uniforms in the same order, so they get disjoint seed ranges (independent samples)."""
    v = SMALL.vocab_size
    c = np.zeros((v, v, v))
    for seed in range(first_seed, first_seed + N_RUNS):
        t = generate(SamplingParams(T, seed))
        c[t[0], t[1], t[2]] += 1
    return c


def _ddtree_counts():
    cont = greedy_generate(SMALL, small_weights(), SMALL_PROMPT, 6).tokens
    return _counts(lambda s: ddtree_generate(SMALL, small_weights(), SMALL_PROMPT, 3, "oracle", 6, s,
                                             drafter_config=DCFG, oracle_p=0.8, continuation=cont).tokens, 0)


def _pvalues(counts):
    law = exact_law()
    return gof_pvalue(counts.sum(axis=2), law.sum(axis=2)), gof_pvalue(counts.sum(axis=0), law.sum(axis=0))


def test_sample_tokens_rows_and_greedy():
    logits = np.log(np.array([[0.1, 0.2, 0.3, 0.4], [0.7, 0.1, 0.1, 0.1]]))
    assert sample_tokens(np.array([[1.0, 3.0, 3.0]]), SamplingParams(), None).tolist() == [1]
    rng = np.random.default_rng(0)
    draws = np.stack([sample_tokens(logits, SamplingParams(1.0), rng) for _ in range(4000)])   # [4000, 2]
    for row in range(2):
        counts = np.bincount(draws[:, row], minlength=4)
        assert gof_pvalue(counts, np.exp(logits[row])) > ALPHA
    hot = np.stack([sample_tokens(logits[:1], SamplingParams(0.25), rng) for _ in range(2000)])[:, 0]
    assert gof_pvalue(np.bincount(hot, minlength=4), softmax_t(logits[:1], 0.25)[0]) > ALPHA


def test_ar_greedy_equals_greedy_generate():
    cfg, weights, _ = model("tiny")
    np.testing.assert_array_equal(ar_generate(cfg, weights, PROMPT, 10).tokens, greedy("tiny", 10).tokens)


def test_ddtree_sampling_is_lossless():
    # DDTree's first three tokens follow the exact law of the target (joints (t1, t2) and (t2, t3)),
    # and match AR sampling in a two-sample test
    dd = _ddtree_counts()
    ar = _counts(lambda s: ar_generate(SMALL, small_weights(), SMALL_PROMPT, 3, s).tokens, 10**6)
    p12, p23 = _pvalues(dd)
    assert p12 > ALPHA and p23 > ALPHA, (p12, p23)
    a12, a23 = _pvalues(ar)
    assert a12 > ALPHA and a23 > ALPHA, (a12, a23)
    assert two_sample_pvalue(dd.sum(axis=2), ar.sum(axis=2)) > ALPHA
    assert two_sample_pvalue(dd.sum(axis=0), ar.sum(axis=0)) > ALPHA


def test_lossless_check_catches_a_lossy_walk(monkeypatch):
    # the same check with a lossy walk (a draft child is also accepted when it is the target's argmax,
    # not only when it equals the sample) must reject
    import workbench.ddtree.speculative as spec

    seen = {}
    real_sample = spec.sample_tokens

    def remembering_sample(logits, sampling, rng):
        seen["argmax"] = np.argmax(logits, axis=-1)
        return real_sample(logits, sampling, rng)

    def lossy_walk(tree, post):
        acc, cur, nxt = [0], 0, int(post[0])
        while True:
            kids = tree.child_maps[cur]
            child = kids.get(nxt, kids.get(int(seen["argmax"][cur])))
            if child is None:
                return acc, nxt
            cur = child
            acc.append(cur)
            nxt = int(post[cur])

    monkeypatch.setattr(spec, "sample_tokens", remembering_sample)
    monkeypatch.setattr(spec, "walk", lossy_walk)
    p12, p23 = _pvalues(_ddtree_counts())
    assert min(p12, p23) < ALPHA, (p12, p23)


@pytest.mark.parametrize("temperature", [-1.0, float("nan")])
def test_bad_temperature(temperature):
    from workbench.config import ConfigError
    with pytest.raises(ConfigError):
        SamplingParams(temperature)


@pytest.mark.parametrize("temperature", [1e-320, 5e-324, 1e-300])
def test_a_subnormal_temperature_samples_the_argmax_not_id_0(temperature):
    """logits / T would overflow to inf (inf - inf = NaN); subtracting the max first keeps it exact."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((6, 50)) * 3 + 10                  # all positive: id 0 is never the max
    logits[:, 0] = logits.min() - 1
    probs = softmax_t(logits, temperature)
    assert np.isfinite(probs).all()
    np.testing.assert_array_equal(probs.argmax(-1), logits.argmax(-1))
    toks = sample_tokens(logits, SamplingParams(temperature=temperature), np.random.default_rng(1))
    np.testing.assert_array_equal(toks, logits.argmax(-1))


def test_non_finite_logits_are_refused_not_sampled_as_id_0():
    from workbench.errors import InputError
    logits = np.array([[1.0, np.nan, 2.0]])
    with pytest.raises(InputError, match="NaN or inf"):
        sample_tokens(logits, SamplingParams(temperature=1.0), np.random.default_rng(0))
