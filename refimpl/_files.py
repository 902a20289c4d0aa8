"""Opening input files and writing output files safely.

Inputs: only regular files are read as models, configs or tokenizers. A FIFO, a device or a
socket given as a path is refused at once (opening a FIFO for reading would wait for a writer
forever); a symlink to a regular file is followed, as any program would.

Outputs: a file is written to a temporary name in its target folder and renamed over the target
(`os.replace`), so a reader sees the old file or the new one, never half of one, and a symlink
planted at the target is replaced as a link, never followed to write somewhere else.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

__all__ = ["NotARegularFileError", "check_regular_file", "open_regular", "read_regular_bytes",
           "read_regular_text", "write_bytes_atomic", "write_text_atomic"]


class NotARegularFileError(ValueError):
    """A path that should name a regular file names a FIFO, device, socket or folder."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_regular_file(path, what: str = "file") -> Path:
    """Return `path` as a Path if it names a regular file (symlinks followed); else raise.

    FileNotFoundError if nothing is there; NotARegularFileError (a ValueError) naming the kind
    of thing found otherwise. Never opens the path, so a FIFO cannot block.
    """
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {p}: no such file") from None
    if not stat.S_ISREG(st.st_mode):
        raise NotARegularFileError(f"{what} {p} is {_kind(st.st_mode)}; expected a regular file")
    return p


def open_regular(path, what: str = "file"):
    """Open `path` for binary reading, refusing anything but a regular file.

    The file is opened with O_NONBLOCK and checked with fstat on the open descriptor, so a FIFO
    swapped in after a check cannot block the open either; the descriptor is then made blocking
    and returned as a buffered binary file object.
    """
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {p}: no such file") from None
    except IsADirectoryError:
        raise NotARegularFileError(f"{what} {p} is a directory; expected a regular file") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotARegularFileError(f"{what} {p} is {_kind(mode)}; expected a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular_bytes(path, what: str = "file", *, max_bytes: int | None = None) -> bytes:
    """The bytes of the regular file `path`; a ValueError if it is larger than `max_bytes`."""
    with open_regular(path, what) as f:
        if max_bytes is not None:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise ValueError(f"{what} {path} is {size:,} bytes; at most {max_bytes:,} are read")
        return f.read()


def read_regular_text(path, what: str = "file", *, max_bytes: int | None = None,
                      encoding: str = "utf-8") -> str:
    """The text of the regular file `path` (UTF-8 by default; a ValueError names a bad byte)."""
    data = read_regular_bytes(path, what, max_bytes=max_bytes)
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} {path} is not valid {encoding}: {e}") from None


def write_bytes_atomic(path, data: bytes, *, mode: int = 0o644, fsync: bool = True) -> Path:
    """Write `data` to `path` through a temporary file in the same folder and a rename.

    The temporary file is created with O_EXCL (never an existing file or link), and the rename
    replaces whatever entry `path` was, a symlink included, without following it. The parent
    folder must exist. Returns `path`.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    return path


def write_text_atomic(path, text: str, *, encoding: str = "utf-8", **kw) -> Path:
    """`write_bytes_atomic` for text (UTF-8 by default)."""
    return write_bytes_atomic(path, text.encode(encoding), **kw)
