"""Atomic file writes for everything but bundles: a temp file in the same directory, fsync, os.replace.

Readers see either the old file or the whole new one; a failed write leaves no temp file behind.
New files get mode 0644 (mkstemp would make them 0600). Bundles have their own writer
(workbench/bundle/writer.py) because they stream large tensors and keep the old file's mode.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` so readers see either the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are meant to be read by others
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike, obj: Any, indent: int = 1) -> Path:
    return write_text_atomic(path, json.dumps(obj, indent=indent, sort_keys=True, allow_nan=True) + "\n")


def save_figure_atomic(fig: Any, path: str | os.PathLike, **savefig_kw: Any) -> Path:
    """Render a matplotlib figure to memory, then write it atomically (format from the suffix)."""
    buf = io.BytesIO()
    fig.savefig(buf, format=Path(path).suffix.lstrip(".") or "png", **savefig_kw)
    return write_bytes_atomic(path, buf.getvalue())
