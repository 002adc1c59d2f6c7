"""Kimi's tiktoken tokenizer on a small tiktoken.model built here: byte-level round trips, Kimi's
pre-tokenizer (Han runs apart from other letters), special tokens from tokenizer_config.json, the
bundle meta it travels in, and one-line errors for damaged files."""

import json

import numpy as np
import pytest

from tests.checkpoint.common import HAN, SPECIALS, tiktoken_files
from workbench.errors import InputError
from workbench.tokenizers import N_SPECIAL, KimiTokenizer, checkpoint_tokenizer
from workbench.train.tokenizer import tokenizer_from_meta


@pytest.fixture()
def tok(tmp_path):
    n = tiktoken_files(tmp_path)
    t = checkpoint_tokenizer(tmp_path)
    assert t.vocab_size == n + N_SPECIAL
    return t


def test_any_text_round_trips(tok):
    rng = np.random.default_rng(0)
    alphabet = list("abcdefghij XYZ_()[]:=\n\t012345'\"") + ["中", "文", "é", "🙂", "ß"]
    for _ in range(50):
        text = "".join(rng.choice(alphabet, size=int(rng.integers(1, 40))))
        ids = tok.encode(text)
        assert ids.dtype == np.int64 and tok.decode(ids) == text


def test_merges_apply_inside_a_pre_token_only(tok):
    """"def" is one token; "e" + the first byte of "中" is a rank, yet "e中" never uses it: Kimi's regex
    puts a Han run in its own pre-token, so BPE never sees the pair."""
    ranks = {t: i for i, t in enumerate([bytes([b]) for b in range(256)])}
    assert list(tok.encode("def")) == [257]                       # b"def" is the 258th rank
    e_han = list(tok.encode("e中"))
    assert e_han == [ranks[b"e"]] + list(HAN)                     # not the merged b"e\xe4"
    assert tok.decode(e_han) == "e中"
    assert list(tok.encode("ab中文cd")) == list(tok.encode("ab")) + list(tok.encode("中文")) + \
        list(tok.encode("cd"))


def test_special_tokens_encode_as_their_ids_and_fill_the_reserved_block(tok):
    n = tok.vocab_size - N_SPECIAL
    assert list(tok.encode("x<|im_end|>")) == [ord("x"), n + 2]
    assert tok.bos_id == n and tok.eos_id == n + 1
    assert tok.decode([n + 5, n + 7]) == SPECIALS[5] + f"<|reserved_token_{n + 7}|>"
    with pytest.raises(InputError, match="outside the tokenizer's vocabulary"):
        tok.decode([tok.vocab_size])


def test_the_bundle_meta_gives_the_same_tokenizer(tok):
    meta = {"tokenizer": json.loads(json.dumps(tok.meta()))}    # through JSON, as a bundle stores it
    again = tokenizer_from_meta(meta)
    text = "def f(x):\n    return x  # 中文 <|im_user|>"
    assert isinstance(again, KimiTokenizer) and list(again.encode(text)) == list(tok.encode(text))
    meta["tokenizer"]["sha256"] = "0" * 64
    with pytest.raises(InputError, match="sha256 does not match"):
        tokenizer_from_meta(meta)


@pytest.mark.parametrize("model, added, match", [
    ("not base64 0\n", {}, "not 'base64-token rank'"),
    ("YQ== 0\nYg== 2\n", {}, "ranks are not 0..1"),
    (None, {"9999": {"content": "x"}}, "is not an id in"),
    (None, {"256": {"content": "a"}, "257": {"content": "a"}}, "share a name"),
])
def test_damaged_tokenizer_files_are_one_line_errors(tmp_path, model, added, match):
    tiktoken_files(tmp_path, merges=[])
    if model is not None:
        (tmp_path / "tiktoken.model").write_text(model)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": added}))
    with pytest.raises(InputError, match=match) as e:
        checkpoint_tokenizer(tmp_path)
    assert "\n" not in str(e.value)


def test_a_folder_without_tiktoken_model_has_no_kimi_tokenizer(tmp_path):
    assert checkpoint_tokenizer(tmp_path) is None
