"""The config block's strict JSON: every dialect difference a second parser could read otherwise."""

import json
import time

import pytest

from workbench.bundle.strict_json import json_depth, loads_strict

from .kdtr_corpus import reason_of


def _with_config(raw, text: bytes) -> bytes:
    raw.config = text
    return raw.encode()


def _replace_model_field(raw, key: str, value_text: str) -> bytes:
    obj = raw.config_obj()
    obj["model"][key] = "@@"
    text = json.dumps(obj, sort_keys=True, separators=(",", ":")).replace('"@@"', value_text)
    return _with_config(raw, text.encode())


@pytest.mark.parametrize("value, reason", [
    ("NaN", "json_nonfinite"),
    ("Infinity", "json_nonfinite"),
    ("-Infinity", "json_nonfinite"),
    ("1e400", "json_nonfinite"),
    ("-1e400", "json_nonfinite"),
    ("1" * 5000, "json_number_too_large"),
    ("1" * 41, "json_number_too_large"),
    ('"\\ud800"', "json_bad_string"),
    ("1.5", "bad_model_config"),           # vocab_size must be an int
    ('"512"', "bad_model_config"),
    ("true", "bad_model_config"),
    ("null", "bad_model_config"),
    ("[" * 33 + "]" * 33, "json_too_deep"),
    ("[" * 600000 + "]" * 600000, "config_too_large"),   # the size cap comes first
])
def test_bad_values_in_the_model_config(raw, value, reason):
    assert reason_of(_replace_model_field(raw, "vocab_size", value)) == reason


@pytest.mark.parametrize("key, value", [("beta_fast", '"fast"'), ("mscale", "true"), ("norm_topk_prob", "1"),
                                        ("bos_token_id", "-1"), ("bos_token_id", "1.0"), ("rope_theta", "0")])
def test_model_fields_modelconfig_leaves_unchecked(raw, key, value):
    assert reason_of(_replace_model_field(raw, key, value)) == "bad_model_config"


def test_unknown_model_field_and_config_keys(raw):
    clean = raw.config_obj()
    obj = json.loads(json.dumps(clean))
    obj["model"]["rope_kind"] = "ntk"
    raw.set_config(obj)
    assert reason_of(raw.encode()) == "bad_model_config"
    for mutate in (lambda o: o.pop("meta"), lambda o: o.update(extra=1), lambda o: o.update(meta=[1])):
        obj = json.loads(json.dumps(clean))
        mutate(obj)
        raw.set_config(obj)
        assert reason_of(raw.encode()) == "bad_config_keys"


@pytest.mark.parametrize("text, reason", [
    (b'{"model":{},"model":{},"meta":{},"provenance":{}}', "json_duplicate_key"),
    (b'{"meta":{"a":1,"a":1},"model":{},"provenance":{}}', "json_duplicate_key"),
    (b"[]", "bad_json"),
    (b'"text"', "bad_json"),
    (b"", "bad_json"),
    (b"{", "bad_json"),
    (b'{"a":1} {"b":2}', "bad_json"),
    (b'\xef\xbb\xbf{"model":{}}', "bad_json"),          # BOM
    (b'{"a":"\xff"}', "config_not_utf8"),
    (b'{"a":"\x01"}', "bad_json"),                       # raw control character in a string
    (b'{"a":' + b"[" * 100000 + b"]" * 100000 + b"}", "json_too_deep"),
    (b'{"a":"' + b"[" * 1000 + b'"}', "bad_config_keys"),  # brackets inside strings do not count
])
def test_config_block_dialect(raw, text, reason):
    t = time.perf_counter()
    assert reason_of(_with_config(raw, text)) == reason
    assert time.perf_counter() - t < 0.5


def test_depth_scan_is_exact_and_linear():
    assert json_depth(b'{"a":[1,{"b":"]]]["}],"c":"\\"["}') == 3
    assert json_depth(b"") == 0
    t = time.perf_counter()
    json_depth(b'"' + b'\\"' * 400000)                   # one long unterminated string of escapes
    json_depth(b'\\"' * 400000)
    assert time.perf_counter() - t < 1.0
    assert loads_strict(b'{"a":[[1]],"b":-12345678901234567890}') == {"a": [[1]], "b": -12345678901234567890}
