"""The config block's JSON dialect: canonical on write, strict on read.

Read: UTF-8 only; size and nesting depth capped *before* parsing; NaN, Infinity, numbers that
overflow to inf, integers longer than MAX_JSON_INT_DIGITS, duplicate keys and lone surrogates are
refused; every parser failure becomes a BundleFormatError. Write: sorted keys, no whitespace,
UTF-8, numpy scalars and arrays turned into plain lists and numbers.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from .format import MAX_CONFIG_BYTES, MAX_JSON_DEPTH, MAX_JSON_INT_DIGITS, BundleFormatError

# a JSON string, or an unterminated one up to the end; possessive so the scan stays linear
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*+"?', re.S)


def json_depth(raw: bytes) -> int:
    """Maximum bracket nesting of ``raw`` with string contents ignored (exact for valid JSON)."""
    code = np.frombuffer(_STRING.sub(b"", raw), dtype=np.uint8)
    step = np.isin(code, (ord("["), ord("{"))).astype(np.int64) - np.isin(code, (ord("]"), ord("}")))
    return int(np.cumsum(step).max()) if step.size else 0


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise BundleFormatError("json_duplicate_key", f"config JSON repeats the key {k!r:.80}")
        out[k] = v
    return out


def _constant(name: str) -> Any:
    raise BundleFormatError("json_nonfinite", f"config JSON contains {name} (not JSON)")


def _float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise BundleFormatError("json_nonfinite", f"config JSON number {text:.40} overflows to inf")
    return v


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_JSON_INT_DIGITS:
        raise BundleFormatError("json_number_too_large",
                                f"config JSON integer has {len(text)} digits (cap {MAX_JSON_INT_DIGITS})")
    return int(text)


def _check_strings(obj: Any) -> None:
    """Refuse lone surrogates (valid JSON escapes, but not text another reader can represent)."""
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, list):
            stack.extend(o)
        elif isinstance(o, str):
            try:
                o.encode("utf-8")
            except UnicodeEncodeError:
                raise BundleFormatError("json_bad_string", "config JSON holds a lone surrogate") from None


def loads_strict(raw: bytes) -> dict[str, Any]:
    """Parse the config block: a JSON object in the strict dialect above."""
    if len(raw) > MAX_CONFIG_BYTES:
        raise BundleFormatError("config_too_large", f"config is {len(raw)} bytes (cap {MAX_CONFIG_BYTES})")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BundleFormatError("config_not_utf8",
                                f"config is not UTF-8 ({e.reason} at byte {e.start})") from None
    depth = json_depth(raw)
    if depth > MAX_JSON_DEPTH:
        raise BundleFormatError("json_too_deep", f"config JSON nests {depth} deep (cap {MAX_JSON_DEPTH})")
    try:
        obj = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant,
                         parse_float=_float, parse_int=_int)
    except BundleFormatError:
        raise
    except (ValueError, RecursionError, OverflowError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise BundleFormatError("bad_json", f"config is not valid JSON: {msg:.120}") from None
    if not isinstance(obj, dict):
        raise BundleFormatError("bad_json", f"config JSON must be an object, got {type(obj).__name__}")
    _check_strings(obj)
    return obj


def _plain(o: Any) -> Any:
    if isinstance(o, (np.ndarray, np.generic)):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


def dumps_canonical(obj: Any) -> bytes:
    """Deterministic UTF-8 JSON (sorted keys, no spaces); tuples become lists. Refuses NaN/inf."""
    try:
        text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False, default=_plain)
        return text.encode("utf-8")
    except (TypeError, ValueError, RecursionError) as e:
        raise BundleFormatError("bad_meta", f"meta/provenance cannot be stored as strict JSON: {e}") from None
