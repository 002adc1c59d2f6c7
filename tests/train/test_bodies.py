"""Body prompts: the stream positions where a function body begins, and the windows ending there."""

import numpy as np
import pytest

from workbench.errors import InputError
from workbench.train.bodies import body_starts
from workbench.train.recipes import windows_ending
from workbench.train.tokenizer import encode_documents, load_tokenizer

DOC_A = 'import os\n\ndef f(x, y=(1, 2)):\n    """Add.\n\n    >>> f(1)\n    """\n    return x\n'
DOC_B = "x = 1\ndef g(a) -> int:\n    '''One line.'''\n    return a\n\ndef h():\n    return 0\n"


def test_token_bytes_spell_every_text():
    tok = load_tokenizer()
    table = tok.token_bytes()
    text = 'def f(x):\n    """Doc \u00e9 \u2713"""\n\treturn x\x01\n'
    ids = tok.encode(text)
    assert b"".join(table[i] for i in ids) == text.encode()
    assert table[tok.eos_id] == b"" and table[tok.mask_id] == b""


def test_body_starts_follow_each_docstring():
    tok = load_tokenizer()
    stream = encode_documents(tok, [DOC_A, DOC_B])
    ends = body_starts(stream, tok)
    assert len(ends) == 2                                       # h has no docstring
    for e, closing in zip(ends, ('    """\n', "'''One line.'''\n"), strict=True):
        before = tok.decode(stream[:e].tolist())
        after = tok.decode(stream[e:].tolist())
        assert closing in before[-len(closing) - 4:]            # the closing line (+ the next indent)
        assert after.lstrip(" ").startswith("return")


def test_body_starts_never_cross_documents():
    tok = load_tokenizer()
    stream = encode_documents(tok, ['def f(x):\n    """open docstring\n', 'text"""\n    pass\n'])
    assert body_starts(stream, tok).size == 0


def test_windows_ending_there():
    stream = np.arange(100, dtype=np.uint16)
    w = windows_ending(stream, np.array([5, 40, 70]), 6, 10, np.random.default_rng(0))
    assert w.shape == (6, 10) and set(w[:, -1].tolist()) <= {39, 69}
    with pytest.raises(InputError, match="no function body"):
        windows_ending(stream, np.array([5]), 2, 10, np.random.default_rng(0))
