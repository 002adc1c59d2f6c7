"""The committed byte-level BPE: specials at ids 0 / 1, exact round trips, deterministic training,
the bundle meta form, one-line errors."""

import pytest

from workbench.errors import InputError
from workbench.train.humaneval import load_problems
from workbench.train.tokenizer import (
    EOS,
    MASK,
    TextTokenizer,
    encode_documents,
    load_tokenizer,
    tokenizer_from_meta,
    train_tokenizer,
)


def test_committed_tokenizer_round_trips_humaneval_and_odd_text():
    tok = load_tokenizer()
    assert tok.vocab_size == 2048 and (tok.eos_id, tok.mask_id) == (0, 1)
    for p in load_problems()[:40]:
        assert tok.decode(tok.encode(p.prompt)) == p.prompt
    odd = "\t\x00 é ∑ 🐍\r\n    x = '''\\u1234'''\n"
    assert tok.decode(tok.encode(odd)) == odd
    assert tok.decode([0, 1]) == EOS + MASK
    ids = tok.encode("def f(x):\n    return x\n")
    assert 1 not in ids and 0 not in ids


def test_training_is_deterministic_and_streams_end_documents_with_eos():
    texts = ["def add(a, b):\n    return a + b\n" * 30, "class A:\n    pass\n" * 30, "x = [1, 2, 3]\n" * 30]
    a, b = train_tokenizer(texts, 300), train_tokenizer(list(texts), 300)
    assert a.json == b.json and 258 < a.vocab_size <= 300         # merges run out before 300
    s = encode_documents(a, texts[:2])
    assert s.dtype.name == "uint16" and s[-1] == 0 and (s == 0).sum() == 2


def test_bundle_meta_round_trip_and_damage():
    tok = load_tokenizer()
    assert tokenizer_from_meta({"tokenizer": tok.meta()}).json == tok.json
    assert tokenizer_from_meta({}) is None
    with pytest.raises(InputError, match="sha256 does not match"):
        tokenizer_from_meta({"tokenizer": {**tok.meta(), "sha256": "0" * 64}})
    with pytest.raises(InputError, match="must be an object"):
        tokenizer_from_meta({"tokenizer": "x"})
    with pytest.raises(InputError, match="bad tokenizer JSON"):
        TextTokenizer("{")
    with pytest.raises(InputError, match="outside the tokenizer's vocabulary"):
        tok.decode([5, 2048])
    with pytest.raises(InputError, match="at least 258"):
        train_tokenizer(["x"], 100)
