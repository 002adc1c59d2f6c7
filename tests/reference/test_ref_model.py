import numpy as np
import pytest

from workbench.errors import InputError
from workbench.reference.layers import rmsnorm
from workbench.reference.model import LatentCache, forward
from workbench.weights import random_weights

TOKENS = np.array([5, 17, 3, 88, 41, 0, 63, 9])


def _prefill(cfg, w, tokens, dtype=np.float64, **kw):
    cache = LatentCache.empty(cfg, 32, dtype)
    return forward(cfg, w, tokens, cache, dtype=dtype, **kw), cache


@pytest.mark.parametrize("q_lora", [24, None])
def test_prefill_equals_token_by_token_decode(make_cfg, q_lora):
    cfg = make_cfg(q_lora_rank=q_lora, n_group=2, topk_group=1)
    w = random_weights(cfg, 0)
    for dtype, rtol in ((np.float64, 1e-11), (np.float32, 2e-4)):
        full, _ = _prefill(cfg, w, TOKENS, dtype)
        cache = LatentCache.empty(cfg, 32, dtype)
        steps = np.concatenate([forward(cfg, w, TOKENS[i:i + 1], cache, dtype=dtype).logits
                                for i in range(len(TOKENS))])
        assert full.logits.dtype == dtype and cache.length == len(TOKENS)
        scale = np.abs(full.logits).max()
        np.testing.assert_allclose(steps, full.logits, rtol=0, atol=rtol * scale)


def test_chunked_prefill_and_both_attention_forms_agree(make_cfg):
    cfg = make_cfg()
    w = random_weights(cfg, 1)
    full, _ = _prefill(cfg, w, TOKENS, attn="naive")
    cache = LatentCache.empty(cfg, 32, np.float64)
    a = forward(cfg, w, TOKENS[:3], cache, dtype=np.float64).logits
    b = forward(cfg, w, TOKENS[3:], cache, dtype=np.float64).logits
    np.testing.assert_allclose(np.concatenate([a, b]), full.logits, rtol=1e-11, atol=1e-11)


def _random_tree(rng, n):
    """parents[i] < i (node 0 is the root); returns parents, depths, ancestor-or-self visibility."""
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
    vis = np.eye(n, dtype=bool)
    depth = np.zeros(n, dtype=np.int64)
    for i in range(1, n):
        vis[i] |= vis[parents[i]]
        depth[i] = depth[parents[i]] + 1
    return parents, depth, vis


def _path(parents, i):
    out = []
    while i >= 0:
        out.append(i)
        i = parents[i]
    return out[::-1]


def test_tree_mask_logits_equal_sequential_passes_over_each_path(make_cfg):
    cfg = make_cfg(n_group=2, topk_group=1)
    w = random_weights(cfg, 2)
    rng = np.random.default_rng(3)
    prefix = TOKENS[:5]
    parents, depth, vis = _random_tree(rng, 9)
    nodes = rng.integers(0, cfg.vocab_size, size=9)
    cache = LatentCache.empty(cfg, 32, np.float64)
    forward(cfg, w, prefix, cache, dtype=np.float64)
    tree = forward(cfg, w, nodes, cache, positions=5 + depth, visibility=vis, dtype=np.float64).logits
    assert max(depth) >= 2
    for i in range(9):
        path = _path(parents, i)
        seq, _ = _prefill(cfg, w, np.concatenate([prefix, nodes[path]]))
        np.testing.assert_allclose(tree[i], seq.logits[-1], rtol=1e-10, atol=1e-10)


def test_gather_commit_continues_like_the_accepted_path(make_cfg):
    cfg = make_cfg()
    w = random_weights(cfg, 4)
    rng = np.random.default_rng(5)
    parents, depth, vis = _random_tree(rng, 7)
    nodes = rng.integers(0, cfg.vocab_size, size=7)
    leaf = int(np.argmax(depth))
    acc = _path(parents, leaf)
    cache = LatentCache.empty(cfg, 32, np.float64)
    forward(cfg, w, TOKENS[:4], cache, dtype=np.float64)
    forward(cfg, w, nodes, cache, positions=4 + depth, visibility=vis, dtype=np.float64)
    cache.gather_commit(4, acc)
    assert cache.length == 4 + len(acc)
    nxt = forward(cfg, w, [7], cache, dtype=np.float64).logits[-1]
    seq, ref_cache = _prefill(cfg, w, np.concatenate([TOKENS[:4], nodes[acc], [7]]))
    np.testing.assert_allclose(nxt, seq.logits[-1], rtol=1e-10, atol=1e-10)
    for a, b in zip(cache.layers, ref_cache.layers, strict=True):
        np.testing.assert_allclose(a[:cache.length], b[:cache.length], rtol=1e-12, atol=1e-13)


def test_gather_commit_moves_rows_in_every_layer_and_checks_its_input(make_cfg):
    cfg = make_cfg()
    cache = LatentCache.empty(cfg, 10)
    for k, buf in enumerate(cache.layers):
        buf[:] = np.arange(10)[:, None] + 100 * k
    cache.length = 8
    cache.gather_commit(3, [0, 2, 4])
    assert cache.length == 6
    for k, buf in enumerate(cache.layers):
        np.testing.assert_array_equal(buf[:6, 0], np.array([0, 1, 2, 3, 5, 7]) + 100 * k)
    for bad_start, bad_rows in ((2, [5]), (7, [0]), (3, [-1]), (3, [[0]]), (3, [0.5])):
        with pytest.raises(InputError):
            cache.gather_commit(bad_start, bad_rows)
    cache.gather_commit(6, [])
    assert cache.length == 6
    cache.crop(2)
    assert cache.length == 2
    with pytest.raises(InputError):
        cache.crop(3)


def test_crop_then_recompute_gives_the_same_logits(make_cfg):
    cfg = make_cfg()
    w = random_weights(cfg, 6)
    cache = LatentCache.empty(cfg, 16, np.float64)
    forward(cfg, w, TOKENS[:4], cache, dtype=np.float64)
    first = forward(cfg, w, TOKENS[4:6], cache, dtype=np.float64).logits
    cache.crop(4)
    again = forward(cfg, w, TOKENS[4:6], cache, dtype=np.float64).logits
    np.testing.assert_array_equal(first, again)


def test_captured_hidden_states_are_the_block_outputs(make_cfg):
    cfg = make_cfg()
    w = random_weights(cfg, 7, np.float64)
    out, _ = _prefill(cfg, w, TOKENS, capture=(0, 2))
    assert sorted(out.hidden) == [0, 2] and out.hidden[0].shape == (len(TOKENS), cfg.hidden_size)
    # the last block's output through the final norm and lm_head is the logits
    np.testing.assert_allclose(rmsnorm(out.hidden[2], w["norm"], cfg.rms_norm_eps) @ w["head"].T, out.logits,
                               rtol=1e-13)
    # layer 0's output is what a 1-layer model with the same weights ends with
    one = cfg.replace(num_hidden_layers=1)
    w1 = {k: v for k, v in w.items() if not k.startswith(("layers.1.", "layers.2."))}
    short, _ = _prefill(one, w1, TOKENS, capture=(0,))
    np.testing.assert_array_equal(short.hidden[0], out.hidden[0])


def test_read_only_float16_weights_are_cast_on_use(make_cfg):
    cfg = make_cfg()
    w16 = random_weights(cfg, 8, np.float16)
    for a in w16.values():
        a.flags.writeable = False
    w32 = {k: v.astype(np.float32) for k, v in w16.items()}
    a, _ = _prefill(cfg, w16, TOKENS, np.float32)
    b, _ = _prefill(cfg, w32, TOKENS, np.float32)
    np.testing.assert_array_equal(a.logits, b.logits)


def test_default_positions_continue_the_cache(make_cfg):
    cfg = make_cfg()
    w = random_weights(cfg, 9)
    c1, c2 = LatentCache.empty(cfg, 16), LatentCache.empty(cfg, 16)
    forward(cfg, w, TOKENS[:3], c1)
    forward(cfg, w, TOKENS[:3], c2)
    a = forward(cfg, w, TOKENS[3:5], c1).logits
    b = forward(cfg, w, TOKENS[3:5], c2, positions=np.array([3, 4])).logits
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kw, match", [
    ({"tokens": [1, 96]}, r"\[0, 96\)"), ({"tokens": [-1]}, "lie in"), ({"tokens": []}, "non-empty"),
    ({"tokens": [1.0, 2.0]}, "ints"), ({"dtype": np.float16}, "float32 or float64"),
    ({"attn": "flash"}, "attn"), ({"positions": [0]}, "positions"), ({"capture": (3,)}, "capture"),
])
def test_bad_forward_inputs_are_input_errors(make_cfg, kw, match):
    cfg = make_cfg()
    w = random_weights(cfg, 0)
    args = {"tokens": [1, 2], **kw}
    tokens = args.pop("tokens")
    cache = LatentCache.empty(cfg, 8)
    with pytest.raises(InputError, match=match):
        forward(cfg, w, tokens, cache, **args)
    assert cache.length == 0


def test_missing_weight_is_an_input_error_naming_it(make_cfg):
    cfg = make_cfg()
    w = random_weights(cfg, 0)
    del w["layers.1.ffn_norm"]
    with pytest.raises(InputError, match=r"layers\.1\.ffn_norm"):
        forward(cfg, w, [1], LatentCache.empty(cfg, 4))
