"""The reference scenarios the engine is checked against: prefill + greedy decode, one tree verify."""

import numpy as np
import pytest

from workbench.config import preset
from workbench.ddtree.scenarios import (
    ancestor_inputs,
    decode_reference,
    random_prompt,
    random_tree,
    tree_from_parents,
    tree_verify_reference,
)
from workbench.errors import InputError
from workbench.reference.generate import greedy_generate
from workbench.reference.model import LatentCache, forward
from workbench.seeded import SeededWeights

CFG = preset("tiny")


def test_decode_reference_is_greedy_generation_with_its_cache():
    w = SeededWeights(CFG, 1, "experts")
    prompt = random_prompt(CFG, 6, 1)
    ref = decode_reference(CFG, w, prompt, 5)
    g = greedy_generate(CFG, w, prompt, 6)
    np.testing.assert_array_equal(ref.tokens, g.tokens)
    assert ref.logits.shape == (6, CFG.vocab_size) and ref.cache.length == 6 + 5
    assert np.all(ref.margins >= 0)


def test_every_node_of_a_verify_sees_exactly_its_path():
    w = SeededWeights(CFG, 2, "fp32")                       # float64 runs: no float16 activation rounding
    prompt = random_prompt(CFG, 5, 2)
    parents, tokens = random_tree(CFG, 16, 2)
    ref = tree_verify_reference(CFG, w, prompt, parents, tokens, dtype=np.float64)
    assert ref.logits.shape == (17, CFG.vocab_size) and ref.latents.shape == (4, 17, CFG.kv_cache_dim)
    assert ref.input_ids[0] == int(np.argmax(ref.prefill_logits))
    assert ref.routes.keys() == {1, 2, 3} and ref.routes[1].shape == (17, CFG.num_experts_per_tok)
    for i in range(17):
        path = [i]
        while parents[path[-1]] > 0:
            path.append(int(parents[path[-1]]))
        seq = [int(ref.input_ids[0])] + [int(tokens[j - 1]) for j in reversed(path) if j > 0]
        assert ref.positions[i] == 5 + len(seq) - 1
        cache = LatentCache.empty(CFG, 5 + len(seq), np.float64)
        out = forward(CFG, w, np.concatenate([prompt, seq]), cache, dtype=np.float64)
        np.testing.assert_allclose(ref.logits[i], out.logits[-1], rtol=0, atol=1e-9)
        last = np.stack([buf[cache.length - 1] for buf in cache.layers])      # the path's own latent row
        np.testing.assert_allclose(ref.latents[:, i], last, rtol=0, atol=1e-10)


def test_random_inputs_are_deterministic_and_valid():
    parents, tokens = random_tree(CFG, 32, 7)
    p2, t2 = random_tree(CFG, 32, 7)
    np.testing.assert_array_equal(parents, p2)
    np.testing.assert_array_equal(tokens, t2)
    tree = tree_from_parents(parents, tokens)                                # checks distinct sibling tokens
    assert tree.depth >= 4 and max(len(c) for c in tree.child_maps) >= 2     # chains and branches
    assert not np.array_equal(random_tree(CFG, 32, 8)[1], tokens)
    prompt = random_prompt(CFG, 100, 3)
    np.testing.assert_array_equal(prompt, random_prompt(CFG, 100, 3))
    assert prompt.min() >= 0 and prompt.max() < CFG.vocab_size and np.unique(prompt).size > 50


@pytest.mark.parametrize("parents, tokens, match", [
    ([0, 0], [3], "start with -1"),
    ([-1, 0, 2], [3, 4], "parents"),
    ([-1, 0, 0], [3, 3], "siblings with the same token 3"),
    ([-1, 0], [1, 2], "tokens must be 1 ints"),
])
def test_bad_trees_raise_input_errors(parents, tokens, match):
    with pytest.raises(InputError, match=match):
        tree_from_parents(parents, tokens)


def test_bad_verify_inputs_raise_input_errors():
    w = SeededWeights(CFG, 0)
    with pytest.raises(InputError, match="tree tokens"):
        tree_verify_reference(CFG, w, [1, 2], [-1, 0], [CFG.vocab_size])
    with pytest.raises(InputError, match="root"):
        tree_verify_reference(CFG, w, [1, 2], [-1, 0], [3], root=-1)
    with pytest.raises(InputError, match="n_decode"):
        decode_reference(CFG, w, [1, 2], -1)


def test_ancestor_inputs():
    vis, pos = ancestor_inputs([-1, 0, 0, 1, 2], 10)
    assert pos.tolist() == [10, 11, 11, 12, 12]
    assert vis.tolist()[3] == [True, True, False, True, False]
    assert vis.tolist()[4] == [True, False, True, False, True]
