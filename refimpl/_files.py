"""Opening input files and writing output files safely.

Inputs: only regular files are read as models, configs or tokenizers. A FIFO, a device or a
socket given as a path is refused at once (opening a FIFO for reading would wait for a writer
forever); a symlink to a regular file is followed, as any program would.

Outputs: a file is written to a temporary name in its target folder and renamed over the target
(`os.replace`), so a reader sees the old file or the new one, never half of one, and a symlink
planted at the target is replaced as a link, never followed to write somewhere else.
`write_files_together` does this for files read as a set, in an order that never shows a new
file next to an old one.

Folders: `replace_folder` writes a whole folder (a model) beside its target and swaps it in, so
files of the old folder cannot survive next to the new ones, and a failed or killed write
leaves the old folder or the new one, each whole.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

__all__ = ["NotARegularFileError", "check_regular_file", "open_regular", "read_regular_bytes",
           "read_regular_text", "write_bytes_atomic", "write_text_atomic", "open_atomic",
           "write_files_together",
           "exchange_paths", "fsync_dir", "replace_folder", "check_replaceable_folder",
           "FolderNotReplaceableError", "check_output_file", "write_output"]


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
    with open_atomic(path, mode=mode, fsync=fsync) as f:
        f.write(data)
    return path


def check_output_file(path, what: str = "output file", suffixes: tuple[str, ...] | None = None) -> Path:
    """`path` as a Path a command may write a file to, checked before any work: a ValueError naming `what` and
    the path if it is empty, a folder, not a regular file, has a suffix outside `suffixes` (lower-case, with the
    dot), or its folder is missing or refuses a new file (a temporary one is made and removed to find out)."""
    p = Path(path)
    if str(path) == "" or p.name in ("", ".", ".."):
        raise ValueError(f"{what} {str(path)!r}: expected a file name")
    if suffixes is not None and p.suffix.lower() not in suffixes:
        raise ValueError(f"{what} {p}: expected a file name ending in {' or '.join(suffixes)}; "
                         f"got {p.suffix or 'no suffix'!r}")
    try:
        st = os.stat(p)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise ValueError(f"{what} {p}: {e.strerror or e}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{what} {p} is {_kind(st.st_mode)}; expected a file to write")
    parent = p.parent
    if not parent.is_dir():
        raise ValueError(f"{what} {p}: the folder {parent} does not exist")
    try:  # a real probe: permissions alone do not tell (root, read-only mounts, /proc)
        fd, probe = tempfile.mkstemp(prefix="." + p.name + ".", suffix=".tmp", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ValueError(f"{what} {p}: cannot write in the folder {parent} ({e.strerror or e})") from None
    return p


def write_output(path, data: bytes, what: str = "output file", suffixes: tuple[str, ...] | None = None) -> Path:
    """check_output_file, then write_bytes_atomic; a failed write (a full disk, /proc) is a ValueError naming `what`."""
    p = check_output_file(path, what, suffixes)
    try:
        return write_bytes_atomic(p, data)
    except OSError as e:
        raise ValueError(f"{what} {p}: cannot write it ({e.strerror or e})") from None


def write_text_atomic(path, text: str, *, encoding: str = "utf-8", **kw) -> Path:
    """`write_bytes_atomic` for text (UTF-8 by default)."""
    return write_bytes_atomic(path, text.encode(encoding), **kw)


@contextmanager
def open_atomic(path, *, mode: int = 0o644, fsync: bool = True):
    """`write_bytes_atomic` for data written in pieces: yields a binary file (a new temporary file
    beside `path`) that is fsynced and renamed over `path` when the block ends without an exception,
    and deleted otherwise, so a reader sees the old file or the new one, never half of one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP back while a few renames run, so Ctrl-C cannot land
    between them (the signal arrives right after). Main thread only; elsewhere a no-op."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def write_files_together(directory, files: dict[str, bytes], *, mode: int = 0o644) -> list[Path]:
    """Write several files of one folder that are read as a set (vocab.json + merges.txt).

    Every new file is first written whole to a temporary name in `directory` and fsynced (a full
    disk or an interruption then leaves the old files untouched). Then, the first name being
    the one a reader looks for: the old files but the first are removed, the first is renamed
    into place (replacing the old one), then the others. A reader at any moment sees the old
    set, the first file alone (old, then new), or the new set: never a new file next to an old
    one. Planted symlinks are replaced as links, never followed. Returns the paths, in order.
    """
    d = Path(directory)
    names = list(files)
    temps: dict[str, str] = {}
    try:
        for name in names:
            fd, tmp = tempfile.mkstemp(prefix="." + name + ".", suffix=".tmp", dir=d)
            temps[name] = tmp
            with os.fdopen(fd, "wb") as f:
                f.write(files[name])
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, mode)
        with _signals_deferred():
            for name in names[1:]:
                if os.path.lexists(d / name):
                    os.unlink(d / name)
            for name in names:
                os.replace(temps[name], d / name)
        fsync_dir(d)
    finally:
        for tmp in temps.values():
            if os.path.lexists(tmp):
                os.unlink(tmp)
    return [d / n for n in names]


# ---- replacing a folder as a whole --------------------------------------------------------------

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_renameat2 = None  # the libc function, looked up on first use; False where it does not exist


def exchange_paths(a, b) -> bool:
    """Swap the directory entries `a` and `b` in one step (Linux renameat2 with RENAME_EXCHANGE).

    Both must exist on the same filesystem. Returns True when swapped; False where the C library,
    the kernel or the filesystem does not offer the exchange (the caller then falls back to two
    renames). Any other failure is an OSError.
    """
    global _renameat2
    if _renameat2 is None:
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            f = libc.renameat2
            f.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            f.restype = ctypes.c_int
            _renameat2 = f
        except (OSError, AttributeError, ImportError):  # not glibc >= 2.28 / not Linux
            _renameat2 = False
    if _renameat2 is False:
        return False
    import ctypes
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):  # no exchange here
        return False
    raise OSError(err, f"cannot exchange {a} and {b}: {os.strerror(err)}")


def fsync_dir(path) -> None:
    """fsync the folder `path` itself, so the names created or renamed in it are on disk."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    """fsync every regular file directly in `folder` (and in its sub-folders), then the folders."""
    for entry in os.scandir(folder):
        if entry.is_dir(follow_symlinks=False):
            _fsync_tree(Path(entry.path))
        elif entry.is_file(follow_symlinks=False):
            fd = os.open(entry.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fsync_dir(folder)


def _new_dir(parent: Path, prefix: str) -> Path:
    """A new empty folder `parent/<prefix><random>.tmp`, made with os.mkdir (the umask applies)."""
    for _ in range(100):
        p = parent / f"{prefix}{secrets.token_hex(4)}.tmp"
        try:
            os.mkdir(p, 0o777)
            return p
        except FileExistsError:
            continue
    raise FileExistsError(f"cannot make a temporary folder in {parent}")


def _unused_name(parent: Path, prefix: str) -> Path:
    for _ in range(100):
        p = parent / f"{prefix}{secrets.token_hex(4)}.tmp"
        if not os.path.lexists(p):
            return p
    raise FileExistsError(f"cannot find an unused temporary name in {parent}")


def _empty_folder(folder: Path, removable: Callable[[Path], list[str]]) -> None:
    """Delete the entries of `folder` (a replaced model folder, now at a temporary name) and the
    folder itself. Only what `removable` reports as replaceable is deleted (links as links, never
    their targets; sub-folders of `keep` that were moved away are gone already); if anything else
    is left, the folder stays and a warning names it."""
    import warnings
    try:
        others = removable(folder)
        for entry in os.scandir(folder):
            if entry.name not in others and not entry.is_dir(follow_symlinks=False):
                os.unlink(entry.path)
        os.rmdir(folder)
    except OSError as e:  # the new folder is in place already: say what is left, do not fail
        warnings.warn(f"could not delete the replaced folder {folder} ({e}); it is left in place", stacklevel=3)


_STAGING = re.compile(r"\.(?P<name>.+)\.(?P<pid>[0-9]+)\.(new|old)\.[0-9a-f]{8}\.tmp")


def _remove_abandoned(parent: Path, name: str, unrelated: Callable[[Path], list[str]]) -> None:
    """Remove `.NAME.PID.new|old.XXXXXXXX.tmp` folders beside the target that a process which no longer
    runs left behind (killed while writing), when they hold only replaceable files."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    for entry in entries:
        m = _STAGING.fullmatch(entry.name)
        if not m or m["name"] != name or not entry.is_dir(follow_symlinks=False):
            continue
        pid = int(m["pid"])
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
            continue  # still running (or not ours to signal): its folder is in use
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError):
            continue
        folder = Path(entry.path)

        def unrelated_here(f: Path, new: bool = m[3] == "new") -> list[str]:
            # A half-written new folder also holds the writers' own temporary files (*.tmp).
            return [n for n in unrelated(f) if not (new and n.endswith(".tmp"))]
        try:
            if not unrelated_here(folder) and not any(e.is_dir(follow_symlinks=False) for e in os.scandir(folder)):
                _empty_folder(folder, unrelated_here)
        except OSError:
            continue


class FolderNotReplaceableError(ValueError):
    """A folder to be replaced as a whole holds files the writer does not own (named in the message)."""


def check_replaceable_folder(target, *, unrelated: Callable[[Path], list[str]], what: str = "folder",
                             keep: tuple[str, ...] = ()) -> None:
    """Raise FolderNotReplaceableError unless `replace_folder` may replace `target`: nothing
    there, or a folder (not a symlink) whose entries `unrelated` does not object to."""
    target = Path(os.path.abspath(os.fspath(target)))
    if os.path.islink(target):
        raise FolderNotReplaceableError(
            f"{what} {target} is a symlink (to {os.path.realpath(target)}); it is replaced as a whole, so "
            "pass the folder itself, not a link to it")
    if not os.path.lexists(target):
        above = target.parent
        while not os.path.lexists(above) and above != above.parent:
            above = above.parent
        if not above.is_dir():  # the folder could not be made under it
            raise NotADirectoryError(errno.ENOTDIR, f"{os.strerror(errno.ENOTDIR)} (so {what} {target} "
                                     "cannot be made)", str(above))
        return
    if not target.is_dir():
        raise FolderNotReplaceableError(f"{what} {target} is a file; expected a folder (or nothing there)")
    bad = [n for n in unrelated(target) if n.rstrip("/") not in keep]
    if bad:
        more = f" (and {len(bad) - 10} more)" if len(bad) > 10 else ""
        raise FolderNotReplaceableError(
            f"{what} {target} is replaced as a whole, but it holds {', '.join(sorted(bad)[:10])}{more} "
            "(not a model's files); nothing was written. Move those away or choose another folder")


@contextmanager
def replace_folder(target, *, unrelated: Callable[[Path], list[str]], what: str = "folder",
                   keep: tuple[str, ...] = ()) -> Iterator[Path]:
    """Write a folder as a whole: yields a new empty folder beside `target`; when the block ends
    without an exception, the new folder takes `target`'s place and the old one is deleted.

    The new folder is `.NAME.PID.new.XXXXXXXX.tmp` in `target`'s parent (hidden; the same
    filesystem, so renames are atomic). At the end its files are fsynced, then it is swapped in:

    * on Linux (renameat2 with RENAME_EXCHANGE) in one step: a reader sees the old folder or the
      new one at `target`, at every moment;
    * elsewhere, or on a filesystem without the exchange: `target` is renamed to
      `.NAME.PID.old.XXXXXXXX.tmp`, then the new folder to `target`. Between the two renames
      (microseconds) `target` does not exist; a crash there leaves both folders under their
      hidden names, each whole.

    Then the old folder (now at the hidden name) is deleted. A killed writer leaves at most a
    hidden folder beside `target`, never a mixed `target`; the next write removes such leftovers
    of processes that no longer run.

    unrelated(folder) -> names in `folder` that must not be deleted (a user's files). If the
    existing `target` has any, FolderNotReplaceableError names them, before anything is written
    and again just before the swap. `keep`: names of entries (files or folders) of the old
    folder moved into the new one just before the swap, untouched.
    `target` must not be a symlink (refused, naming the folder it points to): replacing the link
    would leave the folder it points to stale, and writing there would be writing somewhere
    other than the path given. A file at `target` is refused too.
    """
    target = Path(os.path.abspath(os.fspath(target)))

    def check() -> None:
        check_replaceable_folder(target, unrelated=unrelated, what=what, keep=keep)

    check()
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(parent, target.name, unrelated)
    prefix = f".{target.name}.{os.getpid()}."
    new = _new_dir(parent, prefix + "new.")
    old = None
    swapped = False
    try:
        yield new
        if target.is_dir():
            os.chmod(new, os.stat(target).st_mode & 0o7777)
        _fsync_tree(new)
        check()
        moved = []
        with _signals_deferred():
            try:
                for name in keep:
                    if os.path.lexists(target / name):
                        os.rename(target / name, new / name)
                        moved.append(name)
                if not target.is_dir():
                    os.rename(new, target)
                elif exchange_paths(new, target):
                    old = new
                else:
                    old = _unused_name(parent, prefix + "old.")
                    os.rename(target, old)
                    try:
                        os.rename(new, target)
                    except BaseException:
                        os.rename(old, target)
                        raise
                swapped = True
            except BaseException:
                if not swapped:  # the old folder is still at target: give back what was moved
                    for name in moved:
                        if os.path.lexists(new / name):
                            os.rename(new / name, target / name)
                raise
    except BaseException:
        if not swapped and os.path.isdir(new):
            shutil.rmtree(new, ignore_errors=True)
        raise
    finally:
        if swapped:
            try:
                fsync_dir(parent)
            finally:
                if old is not None:
                    _empty_folder(old, unrelated)
