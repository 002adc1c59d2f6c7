"""The DFlash chain on the engine (engine.chain) equals the reference chain (tokens and rounds) and
greedy AR: with the golden bundle's drafter on the device, the oracle, and the public-layout drafter;
through ``generate(backend="numba", mode="chain")`` too. Under the simulator: two rounds from a short
prompt (the second verify compacts the first round's accepted rows); on the GPU tier every golden token."""

import numpy as np
import pytest

from tests.engine.common import GPU, bundle, engine, reference_greedy
from tests.engine.test_dflash import public_model
from workbench.ddtree.chain import chain_generate
from workbench.engine.chain import engine_chain_generate
from workbench.errors import InputError
from workbench.generate import generate

SIM_PROMPT = 3


def _case(name, drafter):
    b, w, dcfg = public_model(name) if drafter == "public" else bundle(name)
    p = len(b.prompt) if GPU else SIM_PROMPT
    prompt = np.asarray(b.prompt[:p], np.int64)
    kw = dict(drafter_config=dcfg, oracle_p=0.7, oracle_seed=2,
              continuation=reference_greedy(name, 64, p).tokens)
    kind = "oracle" if drafter == "oracle" else "dflash"
    if GPU:
        n = len(b.golden)
    else:                                                   # exactly two rounds
        first = chain_generate(b.config, w, prompt, 2 * dcfg.block_size + 1, kind, **kw).rounds[0]
        n = 1 + first.accepted_len + 1
    return b, w, prompt, n, kind, kw


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["dflash", "oracle", "public"])
def test_engine_chain_equals_reference_and_greedy_ar(drafter):
    name = "tiny"
    b, w, prompt, n, kind, kw = _case(name, drafter)
    got = engine_chain_generate(engine(name), w, prompt, n, kind, **kw)
    want = chain_generate(b.config, w, prompt, n, kind, **kw)
    np.testing.assert_array_equal(got.tokens, reference_greedy(name, n, len(prompt)).tokens)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    assert [(r.tree_size, r.accepted_len, r.depth) for r in got.rounds] == \
        [(r.tree_size, r.accepted_len, r.depth) for r in want.rounds]
    assert GPU or len(got.rounds) == 2


@pytest.mark.slow
def test_generate_numba_chain_and_bad_requests():
    name = "tiny"
    b, w, dcfg = bundle(name)
    prompt = np.asarray(b.prompt[:SIM_PROMPT], np.int64)
    g = generate(b.config, w, prompt, 3, backend="numba", mode="chain", drafter_config=dcfg)
    np.testing.assert_array_equal(g.tokens, reference_greedy(name, 3, SIM_PROMPT).tokens)
    assert g.rounds and all(r.tree_size == dcfg.n_drafted for r in g.rounds)
    with pytest.raises(InputError, match="too small"):
        engine_chain_generate(engine(name), w, prompt, engine(name).buf.max_len, "dflash",
                              drafter_config=dcfg)
