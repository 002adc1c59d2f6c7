"""Write a KDTR bundle atomically and deterministically.

Determinism: tensors are stored in name order after the three payload sections, the config block
is canonical JSON, provenance holds no time or host; the same inputs give the same bytes.
Atomicity (docs/kdtr-format.md §10, §13): temp file in the destination directory -> write -> flush ->
fsync -> os.replace -> fsync of the directory. On any exception (KeyboardInterrupt included) the
temp file is removed and the exception re-raised; the destination is never opened for writing, so
an existing file (even one memory-mapped by a live Bundle) stays intact until the rename. An
existing file's permission bits carry over; a new file gets 0o666 minus the umask.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from numformats.bf16 import BF16Array

from .. import __version__
from ..config import ModelConfig
from ..fileio import check_destination, fsync_dir, with_path
from .format import (
    BF16_CODE,
    CODE_BY_NAME,
    DTYPES,
    ENTRY,
    FIXED,
    MARGINS,
    MAX_DIM,
    MAX_RANK,
    PROMPT,
    RESERVED_PREFIX,
    VERSION,
    BundleFormatError,
    align_up,
    check_name,
    tensor_nbytes,
)
from .format import GOLDEN as GOLDEN_NAME
from .header import (
    Entry,
    Fixed,
    check_footer,
    check_layout,
    encode_footer,
    encode_header,
    parse_config,
    parse_fixed,
    parse_table,
)
from .payload import check_payload
from .reader import model_config_from_dict
from .strict_json import dumps_canonical

_E = BundleFormatError
_KINDS = {("f", 4): "float32", ("f", 2): "float16", ("f", 8): "float64", ("i", 4): "int32",
          ("i", 8): "int64", ("u", 1): "uint8", ("i", 1): "int8"}


def _storage(name: str, a: Any) -> tuple[int, np.ndarray]:
    """(dtype code, little-endian C-contiguous array) for one input tensor."""
    if isinstance(a, BF16Array):
        return BF16_CODE, a.bits.astype("<u2", order="C", copy=False)
    if not isinstance(a, np.ndarray):
        raise _E("bad_tensor", f"tensor {name!r:.80} is a {type(a).__name__}, not an ndarray or BF16Array")
    kind = _KINDS.get((a.dtype.kind, a.dtype.itemsize))
    if kind is None or a.dtype.fields is not None:
        raise _E("unsupported_dtype", f"tensor {name!r:.80} has dtype {a.dtype} "
                 f"(supported: {', '.join(CODE_BY_NAME)})")
    code = CODE_BY_NAME[kind]
    return code, a.astype(DTYPES[code][1], order="C", copy=False)


def _ids(what: str, x: Any) -> np.ndarray:
    a = np.asarray([] if x is None else x)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise _E("bad_section", f"{what} must be a 1-D sequence of ints, got {a.dtype} {a.shape}")
    if a.size and (int(a.min()) < -2**31 or int(a.max()) >= 2**31):
        raise _E("token_out_of_range", f"{what} holds ids outside int32")
    return a.astype(np.int32)


def _margins(x: Any) -> np.ndarray:
    a = np.asarray([] if x is None else x)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "fiu"):
        raise _E("bad_section", f"margins must be a 1-D sequence of floats, got {a.dtype} {a.shape}")
    return a.astype(np.float32)


def _provenance(meta: Mapping[str, Any], extra: Mapping[str, Any] | None) -> dict[str, Any]:
    prov = {"format": "KDTR", "format_version": f"{VERSION[0]}.{VERSION[1]}", "generator": "kdtree-workbench",
            "workbench_version": __version__, "numpy_version": np.__version__, "seed": meta.get("seed")}
    prov.update(extra or {})
    return prov


def write_bundle(path: str | os.PathLike[str], *, config: ModelConfig,
                 tensors: Mapping[str, np.ndarray | BF16Array], prompt: Any = None, golden: Any = None,
                 margins: Any = None, meta: Mapping[str, Any] | None = None,
                 provenance: Mapping[str, Any] | None = None) -> None:
    """Validate and atomically write a bundle to ``path``.

    tensors: name -> ndarray (float32, float16, float64, int32, int64, uint8, int8; any byte order
    or strides; stored little-endian C order) or BF16Array. Names: non-empty UTF-8 <= 160 bytes,
    no control characters, not starting with ``__``. prompt/golden: int sequences of ids in
    [0, vocab_size); margins: float sequence, finite, >= 0, one per golden token (both or neither
    of golden and margins). meta: JSON-able dict (numpy values allowed; meta["seed"] is copied
    into provenance); provenance: extra provenance fields. Raises BundleFormatError before
    touching the file system when anything would make an invalid bundle.
    """
    if not isinstance(config, ModelConfig):
        raise _E("bad_model_config", f"config must be a ModelConfig, got {type(config).__name__}")
    if (golden is None) != (margins is None):
        raise _E("bad_margins", "golden and margins go together (give both or neither)")
    meta = dict(meta or {})
    sections = {PROMPT: _ids("prompt", prompt), GOLDEN_NAME: _ids("golden", golden),
                MARGINS: _margins(margins)}
    stored: dict[str, tuple[int, np.ndarray]] = {k: _storage(k, v) for k, v in sections.items()}
    for name in tensors:
        check_name(name)
    for name in sorted(tensors):
        if name.startswith(RESERVED_PREFIX):
            raise _E("reserved_name", f"tensor name {name!r:.80} uses the reserved prefix {RESERVED_PREFIX}")
        stored[name] = _storage(name, tensors[name])
    views = {k: BF16Array(a) if code == BF16_CODE else a
             for k, (code, a) in stored.items() if k not in sections}
    check_payload(config.vocab_size, views, *(stored[k][1] for k in sections))
    entries, end = [], 0
    for name, (code, a) in stored.items():
        if a.ndim > MAX_RANK or any(d > MAX_DIM for d in a.shape):
            raise _E("bad_rank" if a.ndim > MAX_RANK else "dim_too_large",
                     f"tensor {name!r:.80} shape {a.shape} (rank <= {MAX_RANK}, dims <= {MAX_DIM})")
        off = align_up(end)
        entries.append(Entry(name, code, a.shape, off, tensor_nbytes(code, a.shape), zlib.crc32(_bytes(a))))
        end = off + entries[-1].nbytes
    model_config_from_dict(config.to_dict())       # fields ModelConfig itself leaves unchecked
    prov = _provenance(meta, provenance)
    cfg = dumps_canonical({"model": config.to_dict(), "meta": meta, "provenance": prov})
    header_bytes = align_up(FIXED.size + len(entries) * ENTRY.size + len(cfg))
    fixed = Fixed(VERSION, header_bytes, 0, len(entries), len(cfg), align_up(end))
    header = encode_header(fixed, entries, cfg)
    footer = encode_footer(header)
    _self_check(header, footer, fixed)
    _atomic_write(os.fspath(path), _chunks(header, footer, entries, stored, fixed.data_nbytes))


def _bytes(a: np.ndarray) -> memoryview:
    return memoryview(a.reshape(-1).view(np.uint8))


def _self_check(header: bytes, footer: bytes, fixed: Fixed) -> None:
    """Run the reader's header checks on what is about to be written (writer and reader never disagree)."""
    check = parse_fixed(header[:FIXED.size], fixed.file_bytes)
    check_footer(header, footer)
    check_layout(parse_table(header, check), check.data_nbytes)
    parse_config(header, check)


def _chunks(header: bytes, footer: bytes, entries: list[Entry], stored: dict[str, tuple[int, np.ndarray]],
            data_nbytes: int) -> Iterable[bytes | memoryview]:
    yield header
    pos = 0
    for e in entries:
        yield b"\0" * (e.offset - pos)
        yield _bytes(stored[e.name][1])
        pos = e.offset + e.nbytes
    yield b"\0" * (data_nbytes - pos)
    yield footer


def _write_chunks(f: Any, chunks: Iterable[bytes | memoryview]) -> None:
    for chunk in chunks:
        f.write(chunk)


def _atomic_write(path: str, chunks: Iterable[bytes | memoryview]) -> None:
    """Temp file -> fsync -> rename; a destination that exists but is not a regular file (a FIFO,
    /dev/null) is refused, and every OSError (a full disk's ENOSPC from write() too) names ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    check_destination(path)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = None
    tmp = os.path.join(folder, f".{os.path.basename(path)[:200]}.{secrets.token_hex(6)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as e:
        raise with_path(e, path) from None
    try:
        with open(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            _write_chunks(f, chunks)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise with_path(e, path) from None
        raise
    fsync_dir(folder)
