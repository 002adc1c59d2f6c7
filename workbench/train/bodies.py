"""Where function bodies begin in a token stream: prompts shaped like HumanEval's.

A HumanEval prompt ends where a function's body begins: after its ``def`` line and docstring. The
drafter's training text includes the target's continuations of corpus windows that end at such a point
(``DrafterRecipe.body_fraction``), so it learns the target writing bodies, not only the target
continuing arbitrary text. The points come from the training corpus' own token stream, never from
HumanEval.
"""

from __future__ import annotations

import re

import numpy as np

from .tokenizer import TextTokenizer

# a def line (one level of nested parentheses in the signature), then a docstring on the next lines;
# NUL stands for the document separator and is never crossed
BODY_START = re.compile(
    rb'(?m)^[ \t]*(?:async[ \t]+)?def[ \t]+\w+[ \t]*\((?:[^()\x00]|\([^()\x00]*\))*\)[^:\n\x00]*:[ \t]*\n'
    rb'[ \t]+[rRuU]?("""|\'\'\')(?:(?!\1)[^\x00])*\1[ \t]*\n')


def body_starts(stream: np.ndarray, tok: TextTokenizer) -> np.ndarray:
    """Token indices e of ``stream`` such that stream[:e] ends with a def line and its docstring
    (the token holding the docstring's closing newline is the last one before e), ascending."""
    table = [b or b"\x00" for b in tok.token_bytes()]
    text = b"".join(table[t] for t in stream.tolist())
    ends = np.cumsum(np.fromiter((len(b) for b in table), np.int64, len(table))[stream])
    offsets = np.fromiter((m.end() for m in BODY_START.finditer(text)), np.int64)
    return np.searchsorted(ends, offsets, side="left") + 1
