"""Byte-level BPE tokenizer (HF ``tokenizers``), trained offline on the corpus' train split.

Special tokens come first: id 0 ``<|endoftext|>`` separates documents (the config's eos), id 1
``<|mask|>`` is the DFlash drafter's MASK row (never seen by the target in training). Any byte
string round-trips (byte-level alphabet, no normaliser, no prefix space).

A bundle carries its tokenizer in ``meta["tokenizer"]`` = {"sha256", "vocab_size", "json"} so that
text prompts work from the bundle alone; the committed ``models/tokenizer.json`` is the same JSON.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..fileio import write_text_atomic

EOS, MASK = "<|endoftext|>", "<|mask|>"
SPECIALS = (EOS, MASK)
TOKENIZER = Path(__file__).resolve().parents[2] / "models" / "tokenizer.json"


class TextTokenizer:
    """A thin wrapper: encode text to int64 ids, decode ids to text, the JSON it came from."""

    def __init__(self, json_text: str) -> None:
        from tokenizers import Tokenizer
        try:
            self._tok = Tokenizer.from_str(json_text)
        except Exception as e:   # the library raises its own exception types for a malformed file
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise InputError(f"bad tokenizer JSON: {first}") from None
        self.json = json_text
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        ids = [self._tok.token_to_id(s) for s in SPECIALS]
        if ids != [0, 1]:
            raise InputError(f"tokenizer special tokens {SPECIALS} must have ids 0 and 1, got {ids}")
        self.eos_id, self.mask_id = 0, 1

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.json.encode("utf-8")).hexdigest()

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.int64)
                for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Any) -> str:
        bad = [int(t) for t in ids if not 0 <= int(t) < self.vocab_size]
        if bad:
            raise InputError(f"token {bad[0]} is outside the tokenizer's vocabulary [0, {self.vocab_size})")
        return self._tok.decode([int(t) for t in ids], skip_special_tokens=False)

    def token_bytes(self) -> list[bytes]:
        """The bytes each id stands for (b"" for the specials), from the byte-level alphabet."""
        to_byte = {c: b for b, c in _byte_alphabet().items()}
        out = []
        for i in range(self.vocab_size):
            s = self._tok.id_to_token(i)
            out.append(b"" if s in SPECIALS else bytes(to_byte[c] for c in s))
        return out

    def meta(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "vocab_size": self.vocab_size, "json": self.json}


def _byte_alphabet() -> dict[int, str]:
    """Byte-level BPE's printable stand-in for each byte: printable Latin-1 bytes stand for
    themselves, the other 68 take the code points from 256 on, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = (b for b in range(256) if b not in keep)
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + n) for n, b in enumerate(extra)}}


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> TextTokenizer:
    """Train a byte-level BPE of ``vocab_size`` tokens (specials included) on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    if vocab_size < 256 + len(SPECIALS):
        raise InputError(f"vocab_size must be at least {256 + len(SPECIALS)} (bytes + specials), "
                         f"got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return TextTokenizer(tok.to_str())


def save_tokenizer(tok: TextTokenizer, path: str | Path = TOKENIZER) -> Path:
    return write_text_atomic(path, tok.json)


def load_tokenizer(path: str | Path = TOKENIZER) -> TextTokenizer:
    try:
        return TextTokenizer(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise InputError(f"tokenizer {path}: {e.strerror}") from None


def tokenizer_from_meta(meta: Any) -> Any:
    """The tokenizer a bundle carries in ``meta["tokenizer"]`` (a ``TextTokenizer``, or a Kimi
    ``workbench.tokenizers.KimiTokenizer``), or None; InputError if it is damaged."""
    t = meta.get("tokenizer") if isinstance(meta, dict) else None
    if t is None:
        return None
    if isinstance(t, dict) and t.get("kind") == "tiktoken":      # a Kimi checkpoint's (workbench.tokenizers)
        from ..tokenizers import KimiTokenizer
        return KimiTokenizer.from_meta(t)
    if not isinstance(t, dict) or not isinstance(t.get("json"), str):
        raise InputError("bundle meta.tokenizer must be an object with a 'json' string")
    tok = TextTokenizer(t["json"])
    if t.get("sha256") not in (None, tok.sha256):
        raise InputError("bundle meta.tokenizer: sha256 does not match its JSON")
    return tok


def encode_documents(tok: TextTokenizer, texts: list[str]) -> np.ndarray:
    """One uint16 stream: each document's ids followed by EOS (vocab must fit 16 bits)."""
    if tok.vocab_size > 65536:
        raise InputError(f"vocab of {tok.vocab_size} does not fit uint16")
    parts = []
    for ids in tok.encode_batch(texts):
        parts.append(ids)
        parts.append(np.asarray([tok.eos_id]))
    return np.concatenate(parts).astype(np.uint16) if parts else np.zeros(0, np.uint16)
