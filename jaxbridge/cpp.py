"""Compile C++/CUDA XLA FFI kernels at run time (`jaxbridge.cpp.load`).

    lib = jaxbridge.cpp.load("mykernels", source=CPP_TEXT)        # or sources=[paths]
    scale = lib.kernel(forward="ScaleFwd", adjoint="ScaleAdj", result=lambda x, **_: x)
    jax.grad(lambda x: scale(x, factor=2.0).sum())(x)

The sources are compiled into a shared library with the XLA FFI headers
(`jax.ffi.include_dir()`) and jaxbridge's kernel-author headers
(`jaxbridge.get_include()`) on the include path. Every function defined with
`XLA_FFI_DEFINE_HANDLER_SYMBOL(Name, ...)` becomes a handler capsule in
`lib.handlers`.

Caching: the library is keyed by a SHA-256 over the sources, flags, compiler
identity, JAX version and jaxbridge headers, and stored under
``$JAXBRIDGE_CACHE_DIR`` (default ``~/.cache/jaxbridge``), a directory created with
0700 permissions. Builds happen in a private temporary directory and are moved in
with an atomic rename, next to a checksum file; an entry whose checksum does not
match, or which fails to load, is rebuilt, never loaded.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax

from ._kernel import Kernel, KernelError, get_include, kernel

__all__ = ["CompileError", "Library", "load", "cache_dir"]

_SYMBOL_RE = re.compile(r"XLA_FFI_DEFINE_HANDLER_SYMBOL\s*\(\s*([A-Za-z_][A-Za-z0-9_]*)")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_lock = threading.Lock()
_loaded: dict[str, Library] = {}


from .errors import CompileError  # noqa: E402


def cache_dir() -> Path:
    """The per-user build cache (created 0700 if missing; refused if not ours)."""
    root = Path(os.environ.get("JAXBRIDGE_CACHE_DIR") or Path.home() / ".cache" / "jaxbridge")
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = root.stat()
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise PermissionError(f"jaxbridge.cpp: cache directory {root} is owned by another "
                              "user; set JAXBRIDGE_CACHE_DIR to a private directory")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(root, 0o700)
    return root


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


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _headers_digest() -> str:
    h = hashlib.sha256()
    inc = Path(get_include()) / "jaxbridge"
    for p in sorted(inc.glob("*.h")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


class Library:
    """A loaded shared library of FFI handlers (see `load`)."""

    def __init__(self, name: str, path: Path, handlers: dict[str, Any], cdll: Any):
        self.name, self.path, self.handlers, self._cdll = name, path, handlers, cdll

    def __repr__(self) -> str:
        return f"Library({self.name!r}, handlers={sorted(self.handlers)}, path='{self.path}')"

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

    def kernel(self, forward: Any, adjoint: Any = None, tangent: Any = None, *,
               name: str | None = None, **kwargs: Any) -> Kernel:
        """`jaxbridge.kernel` over this library's handlers, given by symbol name.

        Targets are registered with XLA under ``cpp.<library>.<name>_<role>``.
        """
        if name is None:
            first = forward if isinstance(forward, str) else next(iter(forward.values()))
            name = re.sub(r"(_?(fwd|forward|Fwd|Forward))$", "", first) or first
        return kernel(self._capsules(forward, "forward"), self._capsules(adjoint, "adjoint"),
                      self._capsules(tangent, "tangent"), name=name,
                      namespace=f"cpp.{self.name}", **kwargs)


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
      extra_cflags / extra_cuda_cflags / extra_ldflags / extra_include_dirs: passed on.
      functions: handler symbols to export in addition to the ones found by scanning
        the sources for ``XLA_FFI_DEFINE_HANDLER_SYMBOL``.
      rebuild: ignore the cache.

    Raises:
      CompileError: with the compiler's output.
    """
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
        root = cache_dir()
        entry = root / f"{name}-{key[:20]}"
        entry.mkdir(exist_ok=True, mode=0o700)
        so_path = entry / f"lib{name}.so"
        sum_path = entry / f"lib{name}.so.sha256"
        lib = None
        if not rebuild and so_path.is_file() and sum_path.is_file():
            try:
                ok = sum_path.read_text().strip() == _file_sha(so_path)
            except OSError:
                ok = False
            if ok:
                lib = _try_load(name, so_path, symbols)
        if lib is None:
            _build(name, srcs, cmd, flags, includes, list(extra_ldflags), entry, so_path,
                   sum_path, verbose)
            lib = _try_load(name, so_path, symbols)
            if lib is None:
                raise CompileError(f"jaxbridge.cpp.load: built {so_path} but could not load it "
                                   f"or find its handlers {symbols}")
        _loaded[key] = lib
        return lib


def _try_load(name: str, path: Path, symbols: list[str]) -> Library | None:
    try:
        cdll = ctypes.CDLL(str(path), mode=getattr(os, "RTLD_LOCAL", 0))
        handlers = {s: jax.ffi.pycapsule(getattr(cdll, s)) for s in symbols}
    except (OSError, AttributeError):
        return None
    return Library(name, path, handlers, cdll)


def _build(name: str, srcs: list, cmd: list, flags: list, includes: list, ldflags: list,
           entry: Path, so_path: Path, sum_path: Path, verbose: bool) -> None:
    with tempfile.TemporaryDirectory(prefix=f".build-{name}-", dir=entry) as tmp:
        tmpd = Path(tmp)
        files = []
        for fname, data in srcs:
            p = tmpd / fname
            p.write_bytes(data)
            files.append(str(p))
        out = tmpd / so_path.name
        argv = [*cmd, *flags, *(f"-I{d}" for d in includes), *files, "-o", str(out), *ldflags]
        if verbose:
            print("jaxbridge.cpp:", shlex.join(argv), file=sys.stderr)
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, cwd=tmp)
        except OSError as e:
            raise CompileError(f"jaxbridge.cpp.load({name!r}): cannot run {cmd[0]!r}: {e}") from e
        if proc.returncode != 0:
            raise CompileError(f"jaxbridge.cpp.load({name!r}): compilation failed "
                               f"(exit {proc.returncode}):\n$ {shlex.join(argv)}\n"
                               f"{proc.stdout}{proc.stderr}")
        digest = _file_sha(out)
        tmp_sum = tmpd / "sum"
        tmp_sum.write_text(digest + "\n")
        os.replace(out, so_path)  # atomic on POSIX
        os.replace(tmp_sum, sum_path)
