"""The trusted build cache of `jaxbridge.cpp.load`: where libraries are kept, who may
have written them, and how they are read back and published.

The rules (owner and mode checks, no symbolic links, descriptors relative to the cache
directory, checksums, atomic publishing) are described in `jaxbridge.cpp`'s module
docstring. Nothing here compiles or loads code.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import shlex
import shutil
import stat
import warnings
from pathlib import Path

from .errors import UnsafeCacheError

__all__ = ["FILE_FLAGS", "cache_path", "open_root", "cache_dir", "open_verified", "publish",
           "read_fd", "sha256"]

_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
# getattr: this module is imported on every platform; load() refuses non-POSIX ones.
# (os.open's descriptors are close-on-exec already: PEP 446.)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW
FILE_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | _NOFOLLOW  # a FIFO cannot block us
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW
_FIX = ("or set JAXBRIDGE_CACHE_DIR to a directory of your own (jaxbridge creates a "
        "missing one with mode 0700)")


def cache_path() -> Path:
    return Path(os.environ.get("JAXBRIDGE_CACHE_DIR") or Path.home() / ".cache" / "jaxbridge")


def _check_owner(st: os.stat_result, path: Path | str, what: str) -> None:
    me = os.geteuid()  # the owner of what this process creates
    if st.st_uid not in (me, 0):
        raise UnsafeCacheError(
            f"jaxbridge.cpp.load: refusing {what} {path}: expected it to be owned by you "
            f"(uid {me}) or root, found uid {st.st_uid}, who could have put code there. "
            f"Remove it if you do not trust it, {_FIX}")


def _check_trusted(st: os.stat_result, path: Path | str, what: str) -> None:
    """Raise UnsafeCacheError unless `st` is owned by us or root and not group/other-writable."""
    _check_owner(st, path, what)
    if st.st_mode & 0o022:
        if st.st_mode & stat.S_ISVTX:  # shared, like /tmp: chmod-ing it would lock others out
            fix = "Do not chmod a shared directory; set JAXBRIDGE_CACHE_DIR to one of your own"
        else:
            fix = (f"If you trust its contents run `chmod go-w {shlex.quote(str(path))}`; "
                   f"otherwise remove it, {_FIX}")
        raise UnsafeCacheError(
            f"jaxbridge.cpp.load: refusing {what} {path}: expected no write permission for "
            f"group or others, found mode {stat.filemode(st.st_mode)} "
            f"({stat.S_IMODE(st.st_mode):04o}). {fix}")


def open_root() -> tuple[Path, int]:
    """Create (0700) or open the cache directory without following a link; check it."""
    root = cache_path()
    try:
        os.mkdir(root, 0o700)
    except FileNotFoundError:
        root.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(root, 0o700)
        except FileExistsError:
            pass
    except FileExistsError:
        pass
    try:
        fd = os.open(root, _DIR_FLAGS)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            raise
        st = os.lstat(root)
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeCacheError(
                f"jaxbridge.cpp.load: refusing cache directory {root}: expected a directory, "
                f"found a symbolic link (to {os.path.realpath(root)}), which jaxbridge does "
                "not follow since anyone who can write its parent could have planted it. "
                "If you made the link, set JAXBRIDGE_CACHE_DIR to its target") from None
        raise UnsafeCacheError(
            f"jaxbridge.cpp.load: refusing cache directory {root}: expected a directory, "
            f"found a non-directory ({stat.filemode(st.st_mode)}). Remove it, {_FIX}") from None
    try:
        _check_trusted(os.fstat(fd), root, "cache directory")
    except BaseException:
        os.close(fd)
        raise
    return root, fd


def cache_dir() -> Path:
    """The build cache of `load`: ``$JAXBRIDGE_CACHE_DIR``, default ``~/.cache/jaxbridge``.

    A missing directory is created with mode 0700; an existing one is used as it is,
    never chmod-ed, and only if it is owned by the current user or root and not
    writable by group or others, and is not a symbolic link.

    Raises:
      UnsafeCacheError: the directory fails those rules; the message says how to fix it.

    Example:
        >>> import jaxbridge.cpp
        >>> jaxbridge.cpp.cache_dir()  # doctest: +SKIP
        PosixPath('/home/me/.cache/jaxbridge')
    """
    root, fd = open_root()
    os.close(fd)
    return root


def _open_entry(dir_fd: int, name: str, path: Path, what: str, is_dir: bool) -> int | None:
    """Open ``dir_fd/name`` without following a link, or None where it is missing or is
    not the kind expected (a stale entry, to rebuild). Raises UnsafeCacheError where it
    is not trusted: owned by someone else, or writable by group/others."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    _check_owner(st, path, what)  # a link's owner too; its mode means nothing
    if not (stat.S_ISDIR if is_dir else stat.S_ISREG)(st.st_mode):
        return None
    try:
        fd = os.open(name, _DIR_FLAGS if is_dir else FILE_FLAGS, dir_fd=dir_fd)
    except OSError:  # replaced since the stat
        return None
    try:
        st = os.fstat(fd)  # what was opened is what is checked (and read)
        _check_trusted(st, path, what)
        if (stat.S_ISDIR if is_dir else stat.S_ISREG)(st.st_mode):
            return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


def read_fd(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _read_digest(fd: int) -> str | None:
    try:
        text = os.read(fd, 256).decode("ascii").strip()
    except UnicodeDecodeError:
        return None
    return text if _DIGEST_RE.match(text) else None


def open_verified(root: Path, root_fd: int, entry: str, so_name: str, *, use: bool
                  ) -> tuple[int, bytes, Path] | None:
    """The cached library ``root/entry/so_name`` as (open descriptor, its bytes, path),
    its bytes checked against the checksum file beside it; None where there is none or
    it is stale. The caller owns the descriptor.

    Untrusted entries raise UnsafeCacheError even with ``use=False`` (a rebuild)."""
    entry_fd = _open_entry(root_fd, entry, root / entry, "cache entry", is_dir=True)
    if entry_fd is None:
        return None
    so_path = root / entry / so_name
    try:
        sum_fd = _open_entry(entry_fd, so_name + ".sha256", Path(f"{so_path}.sha256"),
                             "cache checksum", is_dir=False)
        digest = None
        if sum_fd is not None:
            try:
                digest = _read_digest(sum_fd)
            finally:
                os.close(sum_fd)
        so_fd = _open_entry(entry_fd, so_name, so_path, "cached library", is_dir=False)
    finally:
        os.close(entry_fd)
    if so_fd is None:
        return None
    try:
        data = read_fd(so_fd) if use and digest is not None else b""
    except BaseException:
        os.close(so_fd)
        raise
    if not data or sha256(data) != digest:
        os.close(so_fd)
        return None
    return so_fd, data, so_path


def _remove(dir_fd: int, name: str) -> None:
    """Best-effort removal of ``dir_fd/name`` (a file, link or tree), never following links."""
    try:
        if stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            shutil.rmtree(name, dir_fd=dir_fd, ignore_errors=True)
        else:
            os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def publish(root: Path, root_fd: int, entry: str, files: dict[str, bytes], name: str) -> bool:
    """Write `files` into a private staging directory and rename it to `entry` in one step,
    so that readers see the old entry, no entry, or the complete new one."""
    staging = f".tmp-{entry}-{secrets.token_hex(6)}"
    try:
        os.mkdir(staging, 0o700, dir_fd=root_fd)
        staging_fd = os.open(staging, _DIR_FLAGS, dir_fd=root_fd)
        try:
            for fname, data in files.items():
                with os.fdopen(os.open(fname, _NEW_FILE_FLAGS, 0o644, dir_fd=staging_fd),
                               "wb") as f:
                    f.write(data)
        finally:
            os.close(staging_fd)
        if not _rename(root_fd, staging, entry):
            # An old, stale entry is in the way: move it aside first (readers then find
            # none and build it themselves). Never someone else's: that was refused above.
            trash = f".trash-{entry}-{secrets.token_hex(6)}"
            try:
                _check_owner(os.stat(entry, dir_fd=root_fd, follow_symlinks=False),
                             root / entry, "cache entry")
                os.rename(entry, trash, src_dir_fd=root_fd, dst_dir_fd=root_fd)
            except FileNotFoundError:
                pass
            _rename(root_fd, staging, entry)  # False: another process published it first
            _remove(root_fd, trash)
        return True
    except UnsafeCacheError:
        raise
    except OSError as e:  # a read-only or someone else's (root's) cache, a full disk
        warnings.warn(f"jaxbridge.cpp.load({name!r}): could not write the cache {root} "
                      f"({e.strerror or e}); the library was built and loaded from a temporary "
                      "directory and will be rebuilt next time. Set JAXBRIDGE_CACHE_DIR to a "
                      "writable directory to cache it.", RuntimeWarning, stacklevel=4)
        return False
    finally:
        _remove(root_fd, staging)


def _rename(dir_fd: int, src: str, dst: str) -> bool:
    """Rename, or False where `dst` is in the way (and is not an empty directory)."""
    try:
        os.rename(src, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return True
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            return False
        raise


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


