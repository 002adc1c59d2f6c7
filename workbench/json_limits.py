"""JSON the user hands in (config.json, the safetensors index, ``report -p`` values) read within limits.

Python's json recurses per bracket (100,000 nested brackets raise RecursionError) and refuses
integers past 4300 digits with a ValueError; both would end a command in a traceback. Here size,
nesting depth and integer length are capped, and every failure is one InputError line naming the
file and the field ("config.json: field quantization_config.config_groups: nests deeper than 64").
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any, BinaryIO

from .bundle.strict_json import json_depth
from .errors import InputError

MAX_DEPTH = 64                 # nesting of [ and {; real configs nest 4 deep
MAX_INT_DIGITS = 40            # every size in a model config fits in far fewer
MAX_FILE_BYTES = 256 << 20     # a K2 index (~100k tensors) is a few MB

_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*+"|[\[\]{},:]', re.S)


class _LongInt(str):
    """Marks an integer literal past MAX_INT_DIGITS, found after parsing to name its field."""


def _int(text: str) -> Any:
    return _LongInt(text) if len(text.lstrip("-")) > MAX_INT_DIGITS else int(text)


def _path(parts: list[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _deep_field(text: str) -> str:
    """The field path at which ``text`` first nests deeper than MAX_DEPTH (a linear scan, no recursion)."""
    stack: list[Any] = []
    last_string = None
    for m in _TOKENS.finditer(text):
        tok = m.group()
        if tok in "[{":
            stack.append(0 if tok == "[" else None)
            if len(stack) > MAX_DEPTH:
                return _path([p for p in stack[:-1] if p is not None][:8])
        elif tok in "]}":
            if stack:
                stack.pop()
        elif tok == ":":
            if stack and last_string is not None:
                stack[-1] = last_string
        elif tok == ",":
            if stack and isinstance(stack[-1], int):
                stack[-1] += 1
        else:
            last_string = tok[1:-1][:60]
            continue
        last_string = None
    return "(top level)"


def _find_long_int(obj: Any, parts: list[Any]) -> tuple[list[Any], str] | None:
    todo = [(obj, parts)]
    while todo:
        o, path = todo.pop()
        if isinstance(o, _LongInt):
            return path, o
        if isinstance(o, dict):
            todo.extend((v, [*path, k]) for k, v in o.items())
        elif isinstance(o, list):
            todo.extend((v, [*path, i]) for i, v in enumerate(o))
    return None


def loads(text: str | bytes, where: str) -> Any:
    """Parse JSON ``text``; InputError "<where>: ..." for bad JSON, too deep nesting or a huge integer."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"{where}: not UTF-8 ({e.reason} at byte {e.start})") from None
    if len(text) > MAX_FILE_BYTES:
        raise InputError(f"{where}: {len(text)} characters of JSON (cap {MAX_FILE_BYTES})")
    if json_depth(text.encode("utf-8", "surrogatepass")) > MAX_DEPTH:
        raise InputError(f"{where}: field {_deep_field(text)} nests deeper than {MAX_DEPTH} brackets")
    try:
        obj = json.loads(text, parse_int=_int)
    except RecursionError:
        raise InputError(f"{where}: nests too deep to parse") from None
    except ValueError as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"{where}: not readable JSON ({msg[:120]})") from None
    hit = _find_long_int(obj, [])
    if hit is not None:
        raise InputError(f"{where}: field {_path(hit[0])} is an integer of {len(hit[1].lstrip('-'))} digits "
                         f"(cap {MAX_INT_DIGITS})")
    return obj


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """Open ``path`` for reading only if it is a regular file (a FIFO would block the open or the read;
    O_NONBLOCK keeps the open from waiting for a writer). InputError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(f"{path}: not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def load_file(path: str | os.PathLike, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """Read and parse a JSON file (a regular file of at most ``max_bytes``) with ``loads``' limits."""
    p = Path(path)
    try:
        with open_regular(p) as f:
            size = os.fstat(f.fileno()).st_size
            raw = f.read(min(size, max_bytes) + 1)         # read(n) allocates n bytes up front
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror or e})") from None
    if len(raw) > max_bytes:
        raise InputError(f"{p}: larger than {max_bytes} bytes")
    return loads(raw, str(p))
