"""Atomic file writes for everything but bundles: a temp file in the same directory, fsync, os.replace.

Readers see either the old file or the whole new one; a failed write (a full disk included) or a
signal leaves the old file as it was and no temp file behind. Temp names are unique per call
(``.<name>.<random>.tmp``), so two processes writing into one folder never share one. New files get
mode 0644 (mkstemp would make them 0600). An existing destination that is not a regular file (a
FIFO, a device node such as /dev/null, a socket) is refused, never replaced. Every OSError leaves
here naming the path it concerns. Bundles have their own writer (workbench/bundle/writer.py)
because they stream large tensors and keep the old file's mode.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def check_destination(path: str | os.PathLike, folder: bool = False) -> None:
    """OSError naming ``path`` when it exists and is neither a regular file nor (``folder``) a directory.

    Replacing a FIFO or a device node by a regular file would change what the name means to the rest
    of the system (``/dev/null`` as root), so such destinations are refused.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise with_path(e, path) from None
    if stat.S_ISREG(st.st_mode) or (folder and stat.S_ISDIR(st.st_mode)):
        return
    what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
    raise OSError(errno.EEXIST, f"exists and is {what}; refusing to replace it", os.fspath(path))


def with_path(e: OSError, path: str | os.PathLike) -> OSError:
    """``e`` itself if it names a path, else the same error naming ``path`` (write() ENOSPC names none)."""
    if e.filename is not None:
        return e
    if e.errno:
        return type(e)(e.errno, e.strerror or str(e), os.fspath(path))
    return OSError(errno.EIO, str(e) or type(e).__name__, os.fspath(path))


def temp_name(path: str | os.PathLike) -> Path:
    """A fresh temp path next to ``path``: ``.<name>.<12 hex>.tmp`` (unique per call and process)."""
    p = Path(path)
    return p.with_name(f".{p.name[:200]}.{secrets.token_hex(6)}.tmp")


def fsync_dir(folder: Path) -> None:
    """fsync a folder so a rename in it is durable (a no-op where the file system cannot)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:                  # some file systems cannot fsync a directory
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def _remove(p: Path) -> None:
    with contextlib.suppress(OSError):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, folder: bool = False) -> Iterator[Path]:
    """Yield a unique temp path next to ``path``; the caller writes it (a file, or a folder when
    ``folder``); on a normal exit it is fsynced and renamed onto ``path``. On any exception
    (KeyboardInterrupt and the CLI's SIGTERM included) the temp is removed and ``path`` is untouched.

    For writers that want a path rather than bytes (torch.save, np.savez, safetensors).
    """
    path = Path(path)
    check_destination(path, folder=folder)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise with_path(e, path.parent) from None
    tmp = temp_name(path)
    try:
        try:
            yield tmp
            if not folder:
                fd = os.open(tmp, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            os.replace(tmp, path)
            fsync_dir(path.parent)
        except OSError as e:
            raise with_path(e, path) from None
    except BaseException:
        _remove(tmp)
        raise


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` so readers see either the old file or the whole new one."""
    path = Path(path)
    check_destination(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:200]}.", suffix=".tmp")
    except OSError as e:
        raise with_path(e, path) from None
    try:
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are meant to be read by others
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise with_path(e, path) from None
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
