"""``workbench.generate.generate``, the one backend x mode dispatch: reference AR and DDTree reproduce the
golden, the engine agrees with them on a short run (sampled too), and bad backend / mode / budget is an
InputError."""

import numpy as np
import pytest

from workbench.ddtree.config import DrafterConfig, SamplingParams
from workbench.errors import InputError
from workbench.generate import generate
from workbench.refs import golden_bundle


def test_reference_ar_and_ddtree_reproduce_the_golden():
    b = golden_bundle("tiny")
    w, dcfg = b.weights(), DrafterConfig.from_dict(b.meta["drafter"])
    ar = generate(b.config, w, b.prompt, 8)
    dd = generate(b.config, w, b.prompt, 8, mode="ddtree", drafter="oracle", budget=4, drafter_config=dcfg)
    np.testing.assert_array_equal(ar.tokens, b.golden[:8])
    np.testing.assert_array_equal(dd.tokens, b.golden[:8])
    assert ar.rounds == [] and ar.mean_accepted == 1.0 and ar.seconds > 0
    assert dd.rounds and dd.mean_accepted == np.mean([r.accepted_len for r in dd.rounds]) > 1


@pytest.mark.slow
def test_engine_backend_equals_the_reference_greedy_and_sampled():
    b = golden_bundle("tiny")
    w, dcfg = b.weights(), DrafterConfig.from_dict(b.meta["drafter"])
    prompt = b.prompt[:3]
    for kw in ({}, {"mode": "ddtree", "drafter": "oracle", "budget": 2, "drafter_config": dcfg,
                    "oracle_p": 0.7}):
        for sp in (SamplingParams(), SamplingParams(temperature=1.0, seed=3)):
            ref = generate(b.config, w, prompt, 3, sampling=sp, **kw)
            eng = generate(b.config, w, prompt, 3, backend="numba", sampling=sp, **kw)
            np.testing.assert_array_equal(eng.tokens, ref.tokens)
            assert [(r.tree_size, r.accepted_len) for r in eng.rounds] == \
                [(r.tree_size, r.accepted_len) for r in ref.rounds]


@pytest.mark.parametrize("kw,match", [({"backend": "cuda"}, "backend"), ({"mode": "beam"}, "mode"),
                                      ({"backend": "numba", "mode": "ddtree", "budget": 0}, "budget"),
                                      ({"mode": "ddtree", "budget": "auto"}, "cost curve")])
def test_bad_requests_are_input_errors(kw, match):
    b = golden_bundle("tiny")
    with pytest.raises(InputError, match=match):
        generate(b.config, b.weights(), b.prompt, 8, **kw)
