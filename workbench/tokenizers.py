"""Kimi's tokenizer: a tiktoken byte-level BPE (``tiktoken.model``) with 256 special-token slots.

Kimi-K2 / K2-Thinking / K2.5 / K2.6 folders ship ``tiktoken.model`` (one ``base64(token bytes) rank``
per line: the mergeable ranks, ids 0..n-1) and ``tokenizer_config.json``, whose
``added_tokens_decoder`` names the special tokens. The facts this module builds on:

- the 256 ids right after the ranks (n .. n+255) are special tokens (163584..163839 for Kimi:
  ``[BOS]`` 163584, ``[EOS]`` 163585, ``<|im_end|>`` 163586, ...); those the config does not name
  are ``<|reserved_token_{id}|>``;
- text is split before BPE by Kimi's pre-tokenizer regex (``PAT_STR``): runs of Han characters on
  their own, words (Han excluded from the letter classes) with an optional leading non-letter and
  English contractions, numbers of at most 3 digits, punctuation runs, newlines, spaces.

``encode`` reads special-token strings in the text as their ids (a chat template's markers);
``decode`` turns every id into its bytes (special tokens into their names), invalid UTF-8 replaced.
A bundle carries this tokenizer in ``meta["tokenizer"]`` = {"kind": "tiktoken", "sha256",
"vocab_size", "model": the tiktoken.model text, "specials": {id: name}}.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InputError

PAT_STR = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])
N_SPECIAL = 256            # special-token ids reserved after the mergeable ranks
MODEL_FILE, CONFIG_FILE = "tiktoken.model", "tokenizer_config.json"


def _ranks(model_text: str) -> dict[bytes, int]:
    """tiktoken.model's ``base64 rank`` lines -> {token bytes: rank}; ranks must be 0..n-1."""
    out: dict[bytes, int] = {}
    for i, line in enumerate(model_text.splitlines()):
        if not line.strip():
            continue
        try:
            tok, rank = line.split()
            out[base64.b64decode(tok, validate=True)] = int(rank)
        except ValueError:
            raise InputError(f"{MODEL_FILE} line {i + 1}: not 'base64-token rank'") from None
    if sorted(out.values()) != list(range(len(out))):
        raise InputError(f"{MODEL_FILE}: ranks are not 0..{len(out) - 1}, each once")
    return out


def _specials(added: Any, n_base: int) -> dict[int, str]:
    """{id: name} for ids n_base .. n_base+255 from tokenizer_config.json's added_tokens_decoder."""
    if added is None:
        added = {}
    if not isinstance(added, dict):
        raise InputError(f"{CONFIG_FILE}: added_tokens_decoder must be an object")
    out = {i: f"<|reserved_token_{i}|>" for i in range(n_base, n_base + N_SPECIAL)}
    for k, v in added.items():
        content = v.get("content") if isinstance(v, dict) else None
        if not str(k).isdigit() or not isinstance(content, str) or int(k) not in out:
            raise InputError(f"{CONFIG_FILE}: added token {k!r} is not an id in [{n_base}, "
                             f"{n_base + N_SPECIAL}) with a content string")
        out[int(k)] = content
    if len(set(out.values())) != len(out):
        raise InputError(f"{CONFIG_FILE}: two special tokens share a name")
    return out


class KimiTokenizer:
    """encode text -> int64 ids, decode ids -> text, with Kimi's regex and special tokens."""

    kind = "tiktoken"

    def __init__(self, model_text: str, specials: dict[int, str] | None = None,
                 added_tokens_decoder: Any = None) -> None:
        import tiktoken
        ranks = _ranks(model_text)
        n = len(ranks)
        self.specials = specials if specials is not None else _specials(added_tokens_decoder, n)
        if sorted(self.specials) != list(range(n, n + N_SPECIAL)):
            raise InputError(f"tokenizer specials must be ids {n}..{n + N_SPECIAL - 1}")
        self.model_text = model_text
        self.vocab_size = n + N_SPECIAL
        self._enc = tiktoken.Encoding(name="kimi", pat_str=PAT_STR, mergeable_ranks=ranks,
                                      special_tokens={v: k for k, v in self.specials.items()})
        by_name = {v: k for k, v in self.specials.items()}
        self.bos_id, self.eos_id = by_name.get("[BOS]"), by_name.get("[EOS]")

    @classmethod
    def from_folder(cls, d: str | Path) -> KimiTokenizer:
        d = Path(d)
        try:
            text = (d / MODEL_FILE).read_text(encoding="utf-8")
            cf = d / CONFIG_FILE
            conf = json.loads(cf.read_text(encoding="utf-8")) if cf.is_file() else {}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InputError(f"{d}: tokenizer files not readable ({e})") from None
        if not isinstance(conf, dict):
            raise InputError(f"{d / CONFIG_FILE}: not a JSON object")
        return cls(text, added_tokens_decoder=conf.get("added_tokens_decoder"))

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.model_text.encode("utf-8")).hexdigest()

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._enc.encode(text, allowed_special="all"), dtype=np.int64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Any) -> str:
        ids = [int(t) for t in ids]
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InputError(f"token {bad[0]} is outside the tokenizer's vocabulary [0, {self.vocab_size})")
        return self._enc.decode(ids)

    def meta(self) -> dict[str, Any]:
        return {"kind": self.kind, "sha256": self.sha256, "vocab_size": self.vocab_size,
                "model": self.model_text, "specials": {str(k): v for k, v in sorted(self.specials.items())}}

    @classmethod
    def from_meta(cls, t: dict[str, Any]) -> KimiTokenizer:
        model, specials = t.get("model"), t.get("specials")
        if not isinstance(model, str) or not isinstance(specials, dict):
            raise InputError("bundle meta.tokenizer (tiktoken) must carry 'model' text and 'specials'")
        try:
            tok = cls(model, {int(k): str(v) for k, v in specials.items()})
        except ValueError:
            raise InputError("bundle meta.tokenizer: special-token ids must be integers") from None
        if t.get("sha256") not in (None, tok.sha256):
            raise InputError("bundle meta.tokenizer: sha256 does not match its model text")
        return tok


def checkpoint_tokenizer(d: str | Path) -> KimiTokenizer | None:
    """The Kimi tokenizer of checkpoint folder ``d`` (when it has tiktoken.model), else None."""
    return KimiTokenizer.from_folder(d) if (Path(d) / MODEL_FILE).is_file() else None
