"""Compile C++/CUDA XLA FFI kernels at run time (`jaxbridge.cpp.load`).

    lib = jaxbridge.cpp.load("mykernels", source=CPP_TEXT)        # or sources=[paths]
    scale = lib.kernel(forward="ScaleFwd", vjp="ScaleVjp", result=lambda x, **_: x)
    jax.grad(lambda x: scale(x, factor=2.0).sum())(x)

The sources are compiled into a shared library with the XLA FFI headers
(`jax.ffi.include_dir()`) and jaxbridge's kernel-author headers
(`jaxbridge.get_include()`) on the include path. Every function defined with
`XLA_FFI_DEFINE_HANDLER_SYMBOL(Name, ...)` becomes a handler capsule in
`lib.handlers`.

Caching: the library is keyed by a SHA-256 over the sources, flags, compiler
identity, JAX version and jaxbridge headers, and stored under
``$JAXBRIDGE_CACHE_DIR`` (default ``~/.cache/jaxbridge``) as
``<name>-<key>/lib<name>.so`` next to ``lib<name>.so.sha256``. Loading a library
runs its code, so the cache is trusted only as far as nobody else can write it:

* The cache directory, each entry directory and each file in it must be owned by
  the current (effective) user or by root, and must not be writable by group or
  others; otherwise `load` raises `jaxbridge.errors.UnsafeCacheError` naming the path
  and the fix, and loads nothing. Root counts as trusted so that a read-only cache
  built into a container image (as root, then ``chmod -R a+rX``) serves every user.
  jaxbridge creates a missing cache directory with mode 0700 (files 0644) and never
  changes the mode of an existing one.
* Symbolic links are never followed: not at the cache path itself (set
  ``JAXBRIDGE_CACHE_DIR`` to the real directory instead) nor inside the cache.
  Everything after the cache directory is opened relative to its open descriptor,
  so the directories above it need no checks: whoever can rename them can only make
  jaxbridge open another directory, which must pass the same rules.
* A library is opened once, without following links; its owner and mode are
  checked on the open file, its bytes are hashed and compared with the checksum
  file, and that same open file is what the dynamic loader maps (through
  ``/proc/<pid>/fd``; elsewhere a private copy of the verified bytes). The checksum
  catches corruption; ownership is what keeps out other users' code.
* Builds happen in a private temporary directory; a library is published only after
  it has loaded, as a complete entry moved in with one atomic rename. A missing,
  corrupted or unloadable entry is rebuilt, never loaded. A cache that cannot be
  written (read-only, or root's) still serves what it holds; a miss there is built
  in a temporary directory and loaded uncached, with a `RuntimeWarning`.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax

from ._build_cache import (
    FILE_FLAGS,
    cache_dir,
    cache_path,
    open_root,
    open_verified,
    publish,
    read_fd,
    sha256,
)
from ._core.renamed import renamed_keyword
from ._kernel import Kernel, get_include, kernel
from ._kernel.api import vmap_choice
from ._kernel.bindings import bound_attributes, typed_attrs
from .errors import CompileError, KernelError, UnsafeCacheError

__all__ = ["CompileError", "UnsafeCacheError", "Library", "load", "cache_dir"]

_SYMBOL_RE = re.compile(r"XLA_FFI_DEFINE_HANDLER_SYMBOL\s*\(\s*([A-Za-z_][A-Za-z0-9_]*)")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_lock = threading.Lock()
_loaded: dict[str, Library] = {}
# Descriptors of dlopen-ed "/proc/<pid>/fd/N" paths, open for the life of the process:
# the loader remembers a library by that name, so the number must never be reused.
_pinned_fds: list[int] = []



def _load_cached(root: Path, root_fd: int, entry: str, so_name: str, name: str,
                 symbols: list[str], rebuild: bool) -> Library | None:
    """The cached library, verified and loaded, or None where there is none, it is stale,
    or the loader rejects it (e.g. a library it links against has changed: rebuild it)."""
    found = open_verified(root, root_fd, entry, so_name, use=not rebuild)
    if found is None:
        return None
    fd, data, path = found
    try:
        return _dlopen(name, fd, data, str(path), symbols, path)
    except CompileError:
        return None


def _dlopen(name: str, fd: int, data: bytes, shown: str, symbols: list[str],
            path: Path | None) -> Library:
    """Load the file open as `fd`, whose bytes `data` the caller has verified; takes `fd`.

    The loader maps that very file (``/proc/<pid>/fd/N``), so nothing can be swapped in
    between the check and the load; without /proc it maps a private copy of `data`.
    """
    proc = _fd_path(fd)
    if proc is not None:
        return _ctypes_load(name, proc, fd, shown, symbols, path)
    os.close(fd)
    with tempfile.TemporaryDirectory(prefix="jaxbridge-load-") as tmp:  # mode 0700
        copy = os.path.join(tmp, os.path.basename(shown))
        with open(copy, "wb") as f:
            f.write(data)
        return _ctypes_load(name, copy, None, shown, symbols, path)


def _fd_path(fd: int) -> str | None:
    """A path that opens the file behind `fd` (Linux), or None where there is none.

    With the pid rather than ``self``, a debugger attached to this process finds it too."""
    path = f"/proc/{os.getpid()}/fd/{fd}"
    return path if os.path.exists(path) else None


def _ctypes_load(name: str, where: str, fd: int | None, shown: str, symbols: list[str],
                 path: Path | None) -> Library:
    try:
        cdll = ctypes.CDLL(where, mode=getattr(os, "RTLD_LOCAL", 0))
    except OSError as e:
        if fd is not None:
            os.close(fd)
        msg = _loader_message(e, where, shown)
        hint = ""
        if "undefined symbol" in msg or "symbol not found" in msg:
            hint = ("\nAn undefined symbol is a function or variable that is declared but not "
                    "defined in the sources, or one from a library missing from "
                    "extra_ldflags (e.g. extra_ldflags=['-lfoo']).")
        raise CompileError(f"jaxbridge.cpp.load({name!r}): the dynamic loader rejected "
                           f"{shown}: {msg}{hint}") from e
    if fd is not None:
        _pinned_fds.append(fd)
    handlers = {}
    for sym in symbols:
        try:
            handlers[sym] = jax.ffi.pycapsule(getattr(cdll, sym))
        except AttributeError as e:
            raise CompileError(
                f"jaxbridge.cpp.load({name!r}): {shown} does not export the handler symbol "
                f"{sym!r} (the loader says: {_loader_message(e, where, shown)}). Handler names "
                "come from XLA_FFI_DEFINE_HANDLER_SYMBOL(Name, ...) in the sources and from "
                "functions=; check the spelling and that the definition is not excluded by "
                "#if or written with C++ (rather than extern \"C\") linkage") from e
    return Library(name, path, handlers, cdll)


def _loader_message(err: BaseException, where: str, shown: str) -> str:
    """The dynamic loader's own message, without the path it was given (we name `shown`)."""
    msg = str(err)
    return msg[len(where) + 2:] if msg.startswith(where + ": ") else msg.replace(where, shown)


def _compiler(cuda: bool) -> list[str]:
    if cuda:
        nvcc = os.environ.get("NVCC") or shutil.which("nvcc")
        if not nvcc:
            home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
            cand = Path(home) / "bin" / "nvcc"
            nvcc = str(cand) if cand.exists() else None
        if not nvcc:
            raise CompileError("jaxbridge.cpp.load(cuda=True): no CUDA compiler (nvcc) found; "
                               "set NVCC or CUDA_HOME, or build without cuda=True")
        return [nvcc]
    return shlex.split(os.environ.get("CXX") or "c++")


def _compiler_id(cmd: list[str]) -> str:
    try:
        out = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=60)
        return out.stdout + out.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CompileError(f"jaxbridge.cpp: cannot run compiler {cmd!r}: {e}") from e


def _headers_digest() -> str:
    h = hashlib.sha256()
    inc = Path(get_include()) / "jaxbridge"
    for p in sorted(inc.glob("*.h")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


class Library:
    """A loaded shared library of FFI handlers (see `load`).

    Attributes:
      name: the library name given to `load`.
      path: the cache file it was loaded from (or published to, when it was just
        built); None when the cache could not be written and it was loaded uncached.
      handlers: ``{symbol: PyCapsule}`` for every handler symbol.
      bindings: ``{symbol: {attribute: type}}``, the attributes each handler binds as
        read from its C++ source (None where its binding could not be read; see
        `kernel`).

    Example (compiles C++, so not run as a doctest; docs/getting-started.md runs a
    complete one):
        >>> lib = jaxbridge.cpp.load("cube", sources=["cube.cc"])  # doctest: +SKIP
        >>> sorted(lib.handlers)  # doctest: +SKIP
        ['CubeForward', 'CubeJvp', 'CubeVjp']
    """

    def __init__(self, name: str, path: Path | None, handlers: dict[str, Any], cdll: Any):
        self.name, self.path, self.handlers, self._cdll = name, path, handlers, cdll
        # {symbol: {attribute: type} or None}, read from the sources by `load`
        self.bindings: dict[str, dict[str, Any] | None] = {}

    def __repr__(self) -> str:
        path = None if self.path is None else str(self.path)
        return f"Library({self.name!r}, handlers={sorted(self.handlers)}, path={path!r})"

    def _capsules(self, spec: Any, role: str) -> Any:
        if spec is None:
            return None
        if isinstance(spec, str):
            spec = {"cpu": spec}
        if not isinstance(spec, Mapping):
            raise KernelError(f"jaxbridge.cpp: {role} must be a handler symbol name or a "
                              f"{{platform: symbol}} dict; got {type(spec).__name__}")
        out = {}
        for plat, sym in spec.items():
            if sym not in self.handlers:
                raise KernelError(f"jaxbridge.cpp: library {self.name!r} has no handler "
                                  f"{sym!r} (has: {sorted(self.handlers)})")
            out[plat] = self.handlers[sym]
        return out

    def kernel(self, forward: Any, vjp: Any = None, jvp: Any = None, *,
               transpose: Any = None, forward_with_residuals: Any = None,
               name: str | None = None, adjoint: Any = None, tangent: Any = None,
               **kwargs: Any) -> Kernel:
        """`jaxbridge.kernel` over this library's handlers, given by symbol name
        (``forward``, ``vjp``, ``jvp``, ``forward_with_residuals`` and, for
        ``linear=True``, ``transpose``; ``adjoint``/``tangent`` are the deprecated
        spellings of ``vjp``/``jvp``).

        Targets are registered with XLA under ``cpp.<library>.<name>_<role>``. The
        attributes' types come from the handlers' C++ bindings (``.Attr<float>("eps")``
        makes ``eps`` a float32 attribute), read from the sources by `load`: ``attrs=``
        then only gives defaults (converted to those types), and a keyword argument of
        another type, or a declaration that differs from the C++, is a `KernelError`
        naming the kernel and the attribute. Where a binding cannot be read (it is not
        written inside ``XLA_FFI_DEFINE_HANDLER_SYMBOL``), ``attrs=`` declares the types.

        Example:
            >>> lib = jaxbridge.cpp.load("rms", sources=["rms_norm.cc"])  # doctest: +SKIP
            >>> rms_norm = lib.kernel("RmsNorm", vjp="RmsNormVjp",
            ...                       forward_with_residuals="RmsNormForwardWithResiduals",
            ...                       result=lambda x, **_: x, attrs={"eps": 1e-5},
            ...                       residuals=lambda x, **_: jax.ShapeDtypeStruct(
            ...                           x.shape[:-1], x.dtype))  # doctest: +SKIP
        """
        where = "jaxbridge.cpp.Library.kernel"
        vjp = renamed_keyword(where, "vjp", vjp, "adjoint", adjoint, 1)
        jvp = renamed_keyword(where, "jvp", jvp, "tangent", tangent, 1)
        if "vmap" in kwargs:
            kwargs["vmap"] = vmap_choice(kwargs["vmap"])
        if name is None:
            first = forward if isinstance(forward, str) else next(iter(forward.values()))
            name = re.sub(r"(_?(fwd|forward|Fwd|Forward))$", "", first) or first
        roles = {"forward": forward, "vjp": vjp, "jvp": jvp,
                 "transpose": transpose, "forward_with_residuals": forward_with_residuals}
        capsules = {role: self._capsules(spec, role) for role, spec in roles.items()}
        symbols = {f"{role} ({plat})" if isinstance(spec, Mapping) else role: sym
                   for role, spec in roles.items() if spec is not None
                   for plat, sym in (spec.items() if isinstance(spec, Mapping)
                                     else [("cpu", spec)])}
        kwargs["attrs"] = typed_attrs(name, symbols, self.bindings, kwargs.get("attrs"))
        return kernel(capsules.pop("forward"), capsules.pop("vjp"),
                      capsules.pop("jvp"), name=name, namespace=f"cpp.{self.name}",
                      **capsules, **kwargs)


def _collect_sources(name: str, sources: Any, source: str | None, cuda: bool
                     ) -> list[tuple[str, bytes]]:
    items: list[tuple[str, bytes]] = []
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    for s in sources or ():
        if isinstance(s, str) and ("\n" in s or "{" in s):
            items.append((f"{name}_{len(items)}{'.cu' if cuda else '.cc'}", s.encode()))
            continue
        p = Path(s)
        if not p.is_file():
            raise FileNotFoundError(f"jaxbridge.cpp.load: source file {str(p)!r} not found")
        items.append((p.name, p.read_bytes()))
    if source is not None:
        items.append((f"{name}_src{'.cu' if cuda else '.cc'}", source.encode()))
    if not items:
        raise ValueError("jaxbridge.cpp.load: give sources=[paths] and/or source=<C++ text>")
    return items




def load(name: str, sources: Any = None, *, source: str | None = None, cuda: bool = False,
         extra_cflags: Sequence[str] = (), extra_cuda_cflags: Sequence[str] = (),
         extra_ldflags: Sequence[str] = (), extra_include_dirs: Sequence[str] = (),
         functions: Sequence[str] = (), rebuild: bool = False, verbose: bool = False
         ) -> Library:
    """Compile (or fetch from the cache) and load a library of XLA FFI handlers.

    Args:
      name: library name (letters, digits, underscores); also the target namespace.
      sources: source file paths (``.cc``/``.cpp``; ``.cu`` with ``cuda=True``), or
        C++ source text.
      source: C++ (or, with ``cuda=True``, CUDA) source text.
      cuda: compile with nvcc (CUDA sources, linked with the CUDA runtime).
      extra_cflags: more flags for the C++ compiler (e.g. ``["-O3"]``).
      extra_cuda_cflags: more flags for nvcc (with ``cuda=True``).
      extra_ldflags: more flags for the linker (e.g. ``["-lfoo"]``).
      extra_include_dirs: more directories to search for headers.
      functions: handler symbols to export in addition to the ones found by scanning
        the sources for ``XLA_FFI_DEFINE_HANDLER_SYMBOL``.
      rebuild: compile again even if the cache holds the library.
      verbose: print the compiler command line to stderr.

    The cache (see `cache_dir`) is used only if it, and every entry read from it, is
    owned by the current user or root and not writable by group or others; links in
    it are never followed, and a library is loaded only if its bytes match its
    checksum (details in the module docstring).

    Returns:
      The loaded `Library`: its ``handlers`` by symbol, and ``kernel(...)`` to declare
      a differentiable kernel over them.

    Raises:
      CompileError: the compiler failed (with its output), or the dynamic loader
        rejected the library or found no handler symbol (with the loader's message).
      UnsafeCacheError: the cache directory or an entry in it could have been written
        by someone else (the message names the path and the fix).

    Example:
        >>> lib = jaxbridge.cpp.load("cube", sources=["cube.cc"])  # doctest: +SKIP
        >>> cube = lib.kernel(forward="CubeForward", vjp="CubeVjp",
        ...                   result=lambda x, **_: x)  # doctest: +SKIP
    """
    # Over 80 lines: the docstring documents every option of this public front end.
    if os.name != "posix":
        raise CompileError("jaxbridge.cpp.load: run-time compilation needs a POSIX system "
                           f"(Linux, macOS); this is {sys.platform!r}")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"jaxbridge.cpp.load: invalid library name {name!r}")
    srcs = _collect_sources(name, sources, source, cuda)
    cmd = _compiler(cuda)
    includes = [jax.ffi.include_dir(), get_include(), *map(str, extra_include_dirs)]
    if cuda:
        flags = ["-O2", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
                 "--expt-relaxed-constexpr", *extra_cflags, *extra_cuda_cflags]
    else:
        flags = ["-O2", "-std=c++17", "-shared", "-fPIC", *extra_cflags]
    key_parts = [name, repr(cmd), _compiler_id(cmd), repr(flags), repr(list(extra_ldflags)),
                 repr(includes[2:]), jax.__version__, _headers_digest(), sys.platform,
                 repr(sorted(functions))]
    h = hashlib.sha256()
    for part in key_parts:
        h.update(part.encode())
        h.update(b"\0")
    for fname, data in srcs:
        h.update(fname.encode())
        h.update(b"\0")
        h.update(data)
        h.update(b"\0")
    key = h.hexdigest()
    symbols = sorted({*functions, *(m for _, d in srcs
                                    for m in _SYMBOL_RE.findall(d.decode(errors="replace")))})
    if not symbols:
        raise ValueError("jaxbridge.cpp.load: no handler found; define handlers with "
                         "XLA_FFI_DEFINE_HANDLER_SYMBOL(Name, ...) or list them in functions=")

    with _lock:
        if not rebuild and key in _loaded:
            return _loaded[key]
        entry, so_name = f"{name}-{key[:20]}", f"lib{name}.so"
        try:
            root, root_fd = open_root()
        except UnsafeCacheError:
            raise
        except OSError as e:  # e.g. a read-only home directory: still build, uncached
            warnings.warn(f"jaxbridge.cpp.load({name!r}): cannot use the cache {cache_path()} "
                          f"({e.strerror or e}); building uncached. Set JAXBRIDGE_CACHE_DIR to "
                          "a writable directory to cache builds.", RuntimeWarning, stacklevel=2)
            root, root_fd = None, None
        try:
            lib = None
            if root is not None and root_fd is not None:
                lib = _load_cached(root, root_fd, entry, so_name, name, symbols, rebuild)
            if lib is None:
                build = _Build(name, srcs, cmd, flags, includes, list(extra_ldflags), so_name,
                               symbols, verbose)
                lib = _build_and_load(build, root, root_fd, entry)
        finally:
            if root_fd is not None:
                os.close(root_fd)
        for _, data in srcs:
            lib.bindings.update(bound_attributes(data.decode(errors="replace")))
        _loaded[key] = lib
        return lib


@dataclasses.dataclass(frozen=True)
class _Build:
    """One compilation: the library's sources, the compiler command line's parts, the
    shared object's name and the symbols it must export."""

    name: str
    srcs: list           # [(file name, bytes)]
    cmd: list            # the compiler and its fixed arguments
    flags: list
    includes: list
    ldflags: list
    so_name: str
    symbols: list[str]
    verbose: bool


def _build_and_load(build: _Build, root: Path | None, root_fd: int | None,
                    entry: str) -> Library:
    """Compile in a private temporary directory, load, then publish to the cache."""
    name, srcs, cmd, so_name = build.name, build.srcs, build.cmd, build.so_name
    with tempfile.TemporaryDirectory(prefix=f"jaxbridge-build-{name}-") as tmp:  # mode 0700
        files = []
        for fname, data in srcs:
            p = os.path.join(tmp, fname)
            with open(p, "wb") as f:
                f.write(data)
            files.append(p)
        out = os.path.join(tmp, so_name)
        argv = [*cmd, *build.flags, *(f"-I{d}" for d in build.includes), *files, "-o", out,
                *build.ldflags]
        if build.verbose:
            print("jaxbridge.cpp:", shlex.join(argv), file=sys.stderr)
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, cwd=tmp)
        except OSError as e:
            raise CompileError(f"jaxbridge.cpp.load({name!r}): cannot run {cmd[0]!r}: {e}") from e
        if proc.returncode != 0:
            raise CompileError(f"jaxbridge.cpp.load({name!r}): compilation failed "
                               f"(exit {proc.returncode}):\n$ {shlex.join(argv)}\n"
                               f"{proc.stdout}{proc.stderr}")
        fd = os.open(out, FILE_FLAGS)
        data = read_fd(fd)
        # Loaded before it is published: a library the loader rejects is never cached.
        lib = _dlopen(name, fd, data, f"{so_name} (just built from your sources)",
                      build.symbols, None)
        if root is not None and root_fd is not None and publish(root, root_fd, entry, {
                so_name: data, f"{so_name}.sha256": f"{sha256(data)}\n".encode()}, name):
            lib.path = root / entry / so_name
        return lib
