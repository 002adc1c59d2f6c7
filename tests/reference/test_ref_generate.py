import numpy as np
import pytest

from workbench.errors import InputError
from workbench.reference.generate import greedy_generate
from workbench.reference.model import LatentCache, forward
from workbench.weights import random_weights

PROMPT = [3, 17, 5, 42]


def test_greedy_tokens_margins_and_logits_are_consistent(make_cfg):
    cfg = make_cfg()
    w = random_weights(cfg, 0)
    res = greedy_generate(cfg, w, PROMPT, 6, dtype=np.float64)
    assert res.tokens.shape == (6,) and res.logits.shape == (6, cfg.vocab_size)
    np.testing.assert_array_equal(res.tokens, res.logits.argmax(-1))
    top = np.sort(res.logits, axis=-1)
    np.testing.assert_allclose(res.margins, top[:, -1] - top[:, -2], rtol=1e-12)
    assert (res.margins > 0).all()
    # teacher forcing over prompt + generated tokens gives the same logits
    seq = np.concatenate([PROMPT, res.tokens[:-1]])
    full = forward(cfg, w, seq, LatentCache.empty(cfg, 16, np.float64), dtype=np.float64).logits
    np.testing.assert_allclose(res.logits, full[len(PROMPT) - 1:], rtol=1e-11, atol=1e-11)


def test_greedy_is_deterministic_and_float32_follows_float64(make_cfg):
    cfg = make_cfg()
    w = random_weights(cfg, 1)
    a = greedy_generate(cfg, w, PROMPT, 5)
    b = greedy_generate(cfg, w, np.array(PROMPT), 5)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert a.logits.dtype == np.float32
    c = greedy_generate(cfg, w, PROMPT, 5, dtype=np.float64)
    assert (c.margins > 1e-3).all()                          # far above float32 noise for this seed
    np.testing.assert_array_equal(a.tokens, c.tokens)
    assert greedy_generate(cfg, w, PROMPT, 0).tokens.shape == (0,)


@pytest.mark.parametrize("prompt, match", [
    ([], "empty"), ([1, 96], "outside the vocabulary"), ([-2], "outside"), ([1.0], "ints"), ([True], "ints"),
    (["a"], "ints"), (np.array([[1, 2]]), "1-D"),
])
def test_bad_prompts_are_one_line_input_errors(make_cfg, prompt, match):
    cfg = make_cfg()
    with pytest.raises(InputError, match=match) as e:
        greedy_generate(cfg, random_weights(cfg, 0), prompt, 2)
    assert "\n" not in str(e.value)


def test_bad_token_counts_are_input_errors(make_cfg):
    cfg = make_cfg()
    for n in (-1, 1.5, True):
        with pytest.raises(InputError):
            greedy_generate(cfg, random_weights(cfg, 0), PROMPT, n)
