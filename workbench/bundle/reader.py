"""Read a KDTR bundle: validate everything, then hand out read-only views of the data section.

Order (docs/kdtr-format.md §5): fixed header and sizes (caps, exact file size) -> footer and header
CRC -> table -> config -> layout -> padding -> payload rules -> per-tensor CRCs. Nothing is
allocated or mapped from a size that has not been checked against the caps and the file size.
"""

from __future__ import annotations

import dataclasses
import math
import os
import stat
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from numformats.bf16 import BF16Array

from ..config import ConfigError, ModelConfig
from ..errors import InputError
from ..weights import check_weights, is_model_name
from .format import BF16_CODE, DTYPES, FIXED, FOOTER, MARGINS, PROMPT, SECTIONS, BundleFormatError, align_up
from .format import GOLDEN as GOLDEN_NAME
from .header import Entry, Fixed, check_footer, check_layout, parse_config, parse_fixed, parse_table
from .payload import Int4Matrix, check_payload

_E = BundleFormatError


@dataclass(frozen=True)
class Bundle:
    """A validated bundle. Arrays are read-only views of the file (np.memmap, mode "r").

    tensors: name -> ndarray (float32/float16/float64/int32/int64/uint8/int8) or BF16Array, in file
    order; prompt/golden int32 [T]; margins float32 [len(golden)]; meta and provenance are the
    parsed JSON objects; entries is the table (payload sections included); int4 lists the
    validated X.packed / X.scale pairs.
    """

    config: ModelConfig
    tensors: dict[str, np.ndarray | BF16Array]
    prompt: np.ndarray
    golden: np.ndarray
    margins: np.ndarray
    meta: dict[str, Any]
    provenance: dict[str, Any]
    entries: tuple[Entry, ...]
    int4: tuple[Int4Matrix, ...]
    version: tuple[int, int]
    file_bytes: int
    path: str | None = None
    _data: np.ndarray | None = field(default=None, repr=False, compare=False)

    def weights(self) -> dict[str, np.ndarray]:
        """Tensors as ndarrays: bfloat16 widened to (new) float32 arrays, the rest as stored (views)."""
        return {k: v.float32() if isinstance(v, BF16Array) else v for k, v in self.tensors.items()}

    def verify(self) -> None:
        """Recompute every per-tensor CRC32 (done by read_bundle unless verify_checksums=False)."""
        _verify_crcs(self.entries, self._data, self.path)


def _verify_crcs(entries: tuple[Entry, ...], data: np.ndarray | None, path: str | None) -> None:
    for e in entries:
        chunk = data[e.offset:e.offset + e.nbytes] if data is not None and e.nbytes else b""
        if zlib.crc32(chunk) != e.crc32:
            raise _E("tensor_checksum", f"tensor {e.name!r:.80}: CRC32 mismatch (data corrupted)", path)


def _parse(read_at: Callable[[int, int], bytes], size: int) -> tuple[Fixed, list[Entry], dict[str, Any]]:
    fixed = parse_fixed(read_at(0, min(size, FIXED.size)), size)
    header = read_at(0, fixed.header_bytes)
    check_footer(header, read_at(size - FOOTER.size, FOOTER.size))
    entries = parse_table(header, fixed)
    config = parse_config(header, fixed)
    check_layout(entries, fixed.data_nbytes)
    return fixed, entries, config


def model_config_from_dict(d: dict[str, Any]) -> ModelConfig:
    """ModelConfig.from_dict plus the type checks it leaves out (float, bool and token-id fields)."""
    for f in dataclasses.fields(ModelConfig):
        v, default = d.get(f.name, f.default), f.default
        if isinstance(default, bool):
            ok = isinstance(v, bool)
        elif isinstance(default, float):
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        elif f.name in ("bos_token_id", "eos_token_id"):
            ok = v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0)
        else:
            continue
        if not ok:
            raise _E("bad_model_config", f"model config field {f.name} has a bad value {v!r:.40}")
    try:
        return ModelConfig.from_dict(d)
    except (ConfigError, TypeError, ValueError) as e:
        raise _E("bad_model_config", f"model config: {e}") from None


def _view(data: np.ndarray | None, e: Entry) -> np.ndarray | BF16Array:
    dtype = DTYPES[e.code][1]
    if e.nbytes == 0 or data is None:
        arr = np.zeros(e.shape, dtype=dtype)      # empty (a zero dim): nothing to map
        arr.flags.writeable = False
    else:
        arr = data[e.offset:e.offset + e.nbytes].view(dtype).reshape(e.shape)
    return BF16Array(arr) if e.code == BF16_CODE else arr


def check_model(config: ModelConfig, tensors: dict[str, np.ndarray | BF16Array]) -> None:
    """The table's tensors against the shapes ``config`` implies (dtypes and shapes only, no data read):
    every model tensor present once (FP or INT4), none extra but ``drafter.*``. A config declaring
    more tensors than the table holds fails before any list of names is built."""
    try:
        check_weights(config, tensors, values=False)
    except InputError as e:
        raise _E("model_mismatch", f"tensors disagree with the model config: {e}") from None


def _build(fixed: Fixed, entries: list[Entry], cfg: dict[str, Any], data: np.ndarray | None,
           verify: bool, path: str | None, model: bool | None = None) -> Bundle:
    config = model_config_from_dict(cfg["model"])
    for e in entries:
        end = e.offset + e.nbytes
        stop = align_up(end)
        if data is not None and stop > end and data[end:stop].any():
            raise _E("bad_padding", f"padding after tensor {e.name!r:.80} is not zero")
    views = {e.name: _view(data, e) for e in entries}
    missing = [s for s in SECTIONS if s not in views]
    if missing:
        raise _E("missing_section", f"the table lacks {', '.join(missing)}")
    for s, code in SECTIONS.items():
        e = next(x for x in entries if x.name == s)
        if e.code != code or len(e.shape) != 1:
            raise _E("bad_section", f"{s} must be {DTYPES[code][0]} [T], got {e.dtype_name} {list(e.shape)}")
    tensors = {k: v for k, v in views.items() if k not in SECTIONS}
    prompt, golden, margins = views[PROMPT], views[GOLDEN_NAME], views[MARGINS]
    if len(tensors) + len(SECTIONS) != fixed.tensor_count:
        raise _E("tensor_count_mismatch",
                 f"read {len(tensors) + len(SECTIONS)} of {fixed.tensor_count} entries")
    if verify:                          # corrupted data reads as corruption, not as a payload rule
        _verify_crcs(tuple(entries), data, path)
    int4 = check_payload(config.vocab_size, tensors, prompt, golden, margins)
    if model or (model is None and any(is_model_name(k) for k in tensors)):
        check_model(config, tensors)
    return Bundle(config, tensors, prompt, golden, margins, cfg["meta"], cfg["provenance"], tuple(entries),
                  tuple(int4), fixed.version, fixed.file_bytes, path, data)


def read_bundle(path: str | os.PathLike[str], verify_checksums: bool = True,
                model: bool | None = None) -> Bundle:
    """Open, validate and memory-map a bundle. Any problem raises BundleFormatError (reason io_error
    for an unreadable path, not_a_file for a directory, FIFO or device). With verify_checksums=False
    the per-tensor CRCs are skipped (call Bundle.verify() later); the header CRC is always checked.
    ``model``: check the tensors against the config's shapes (reason model_mismatch); None (default)
    checks whenever the bundle holds any model weight name, True always (commands that run the model),
    False never (bundles used as plain tensor containers).
    """
    where = os.fspath(path)
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise _E("io_error", f"cannot open: {e.strerror or e}", where) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _E("not_a_file", "not a regular file")
        fixed, entries, cfg = _parse(lambda off, n: _pread(fd, n, off), st.st_size)
        data = _map(fd, fixed) if fixed.data_nbytes else None
        return _build(fixed, entries, cfg, data, verify_checksums, where, model)
    except BundleFormatError as e:
        raise (e if e.path else e.with_path(where)) from None
    finally:
        os.close(fd)


def _pread(fd: int, n: int, off: int) -> bytes:
    try:
        raw = os.pread(fd, n, off)
    except OSError as e:
        raise _E("io_error", f"cannot read: {e.strerror or e}") from None
    if len(raw) != n:
        raise _E("truncated", "file shrank while being read")
    return raw


def _map(fd: int, fixed: Fixed) -> np.ndarray:
    """The data section as a read-only uint8 memmap (mode "r" never extends or writes the file)."""
    try:
        with open(fd, "rb", closefd=False) as f:
            return np.memmap(f, dtype=np.uint8, mode="r", offset=fixed.header_bytes,
                             shape=(fixed.data_nbytes,))
    except (OSError, ValueError) as e:          # e.g. the file shrank after validation
        raise _E("io_error", f"cannot map the data section: {e}") from None


def read_bundle_bytes(data: bytes | bytearray | memoryview, verify_checksums: bool = True,
                      model: bool | None = None) -> Bundle:
    """Validate and load a bundle held in memory (same rules as read_bundle; arrays are read-only
    views of ``data``, which must stay unchanged). Used by the tests and fuzzers."""
    buf = memoryview(data).cast("B")
    size = len(buf)
    fixed, entries, cfg = _parse(lambda off, n: bytes(buf[off:off + n]), size)
    arr = None
    if fixed.data_nbytes:
        arr = np.frombuffer(buf, dtype=np.uint8, count=fixed.data_nbytes, offset=fixed.header_bytes)
        arr.flags.writeable = False
    return _build(fixed, entries, cfg, arr, verify_checksums, None, model)
