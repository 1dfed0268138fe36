"""jaxbridge.cpp.load (run-time compilation, cache) and the examples/cpp_extension project."""

import ctypes
import hashlib
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbridge.cpp as cpp
from jaxbridge import _build_cache
from jaxbridge.errors import UnsafeCacheError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "cpp_extension"
CUBE = EXAMPLE / "src" / "cube.cc"

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None,
                                reason="no C++ compiler")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    d = tmp_path_factory.mktemp("jbcache") / "cache"
    old = os.environ.get("JAXBRIDGE_CACHE_DIR")
    os.environ["JAXBRIDGE_CACHE_DIR"] = str(d)
    yield d
    if old is None:
        os.environ.pop("JAXBRIDGE_CACHE_DIR", None)
    else:
        os.environ["JAXBRIDGE_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def cube_lib(cache):
    return cpp.load("cube", sources=[CUBE])


@pytest.mark.cpu  # a kernel compiled for the CPU only
def test_load_and_differentiate(cube_lib, cache):
    assert sorted(cube_lib.handlers) == ["CubeForward", "CubeJvp", "CubeVjp"]
    cube = cube_lib.kernel(forward="CubeForward", vjp="CubeVjp", jvp="CubeJvp",
                           result=lambda x, **_: x, attrs={"factor": 1.0}, vmap="vectorized")
    assert all(t.startswith("cpp.cube.Cube") for t in cube.targets())
    x = jnp.linspace(-2.0, 2.0, 5)
    np.testing.assert_allclose(cube(x, factor=2.0), 2 * x**3, rtol=1e-12)
    np.testing.assert_allclose(jax.jit(jax.grad(lambda x: cube(x, factor=2.0).sum()))(x),
                               6 * x**2, rtol=1e-12)
    np.testing.assert_allclose(jax.jacfwd(cube)(x), np.diag(3 * x**2), rtol=1e-12)
    np.testing.assert_allclose(jax.vmap(cube)(jnp.stack([x, x])), jnp.stack([x**3] * 2))


@pytest.mark.cpu  # a kernel compiled for the CPU only
def test_library_kernel_vmap_batch_is_deprecated(cube_lib):
    with pytest.warns(DeprecationWarning, match="vmap='batch' is deprecated") as record:
        cube = cube_lib.kernel(forward="CubeForward", name="cube_old_vmap",
                               result=lambda x, **_: x, attrs={"factor": 1.0}, vmap="batch")
    assert record[0].filename == __file__
    x = jnp.linspace(-2.0, 2.0, 5)
    np.testing.assert_allclose(jax.vmap(cube)(jnp.stack([x, -x])), jnp.stack([x**3, -x**3]))


@pytest.mark.cpu  # a kernel compiled for the CPU only
def test_library_kernel_old_role_keywords_warn_and_still_work(cube_lib):
    """lib.kernel(adjoint=..., tangent=...) (before vjp=/jvp=) still works for one
    release, warned at the caller's line."""
    with pytest.warns(DeprecationWarning, match=r"(adjoint|tangent)= is deprecated") as rec:
        cube = cube_lib.kernel(forward="CubeForward", adjoint="CubeVjp",
                               tangent="CubeJvp", name="cube_old_roles",
                               result=lambda x, **_: x, attrs={"factor": 1.0})
    assert [str(w.message).split(": ")[1][:8] for w in rec] == ["adjoint=", "tangent="]
    assert {w.filename for w in rec} == {__file__}
    x = jnp.linspace(-2.0, 2.0, 5)
    np.testing.assert_allclose(jax.grad(lambda x: cube(x).sum())(x), 3 * x**2, rtol=1e-12)
    np.testing.assert_allclose(jax.jvp(cube, (x,), (jnp.ones_like(x),))[1], 3 * x**2,
                               rtol=1e-12)


SQUARE_IN_PLACE = """
#include "jaxbridge/ffi_helpers.h"
namespace ffi = xla::ffi;
// y = x^2; its derivative needs only x and may overwrite v: out[i] = 2 x[i] v[i].
ffi::Error Fwd(ffi::Buffer<ffi::F64> x, ffi::ResultBuffer<ffi::F64> y) {
  JAXBRIDGE_RETURN_IF_ERROR(jaxbridge::CheckSameShape(x, *y, "square", "x", "result"));
  for (size_t i = 0; i < x.element_count(); ++i)
    y->typed_data()[i] = x.typed_data()[i] * x.typed_data()[i];
  return ffi::Error::Success();
}
ffi::Error Deriv(ffi::Buffer<ffi::F64> x, ffi::Buffer<ffi::F64> v,
                 ffi::ResultBuffer<ffi::F64> out) {
  JAXBRIDGE_RETURN_IF_ERROR(jaxbridge::CheckSameShape(x, v, "square_deriv", "x", "v"));
  JAXBRIDGE_RETURN_IF_ERROR(jaxbridge::CheckSameShape(x, *out, "square_deriv", "x", "result"));
  for (size_t i = 0; i < x.element_count(); ++i)
    out->typed_data()[i] = 2 * x.typed_data()[i] * v.typed_data()[i];
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(SquareForward, Fwd, ffi::Ffi::Bind()
    .Arg<ffi::Buffer<ffi::F64>>().Ret<ffi::Buffer<ffi::F64>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(SquareDerivative, Deriv, ffi::Ffi::Bind()
    .Arg<ffi::Buffer<ffi::F64>>().Arg<ffi::Buffer<ffi::F64>>().Ret<ffi::Buffer<ffi::F64>>());
"""


@pytest.mark.cpu  # a kernel compiled for the CPU only
def test_user_kernel_without_outputs_in_place(cache):
    lib = cpp.load("square_in_place", source=SQUARE_IN_PLACE)
    square = lib.kernel(forward="SquareForward", vjp="SquareDerivative",
                        jvp="SquareDerivative", result=lambda x: x, dtypes=["float64"],
                        vmap="vectorized", pass_outputs=False,
                        aliases={"vjp": {1: 0}, "jvp": {1: 0}})
    x = jnp.linspace(-2.0, 2.0, 5)
    ct = jnp.arange(5.0)
    np.testing.assert_allclose(square(x), x**2)
    grad = jax.jit(jax.grad(lambda x: (square(x) * ct).sum()))
    np.testing.assert_allclose(grad(x), 2 * x * ct)
    hlo = grad.lower(x).compile().as_text()
    assert square.target("vjp", "cpu") in hlo
    assert square.target("forward", "cpu") not in hlo  # no outputs needed: XLA dropped it
    # `aliases` reaches XLA: the call writes its result into operand 1 (the cotangent /
    # tangent), in the lowered StableHLO and in the compiled HLO alike.
    in_place = "output_operand_alias<output_tuple_indices = [], operand_index = 1,"
    for role, f, args in (("vjp", grad, (x,)),
                          ("jvp", jax.jit(lambda x, t: jax.jvp(square, (x,), (t,))[1]),
                           (x, ct))):
        calls = [line for line in f.lower(*args).as_text().splitlines()
                 if f"custom_call @{square.target(role, 'cpu')}(" in line]
        assert len(calls) == 1 and in_place in calls[0], (role, calls)
        compiled = [line for line in f.lower(*args).compile().as_text().splitlines()
                    if square.target(role, "cpu") in line and "custom-call(" in line]
        assert len(compiled) == 1 and "output_to_operand_aliasing={{}: (1, {})}" in compiled[0], \
            (role, compiled)
    np.testing.assert_allclose(jax.jacfwd(square)(x), np.diag(2 * x))
    np.testing.assert_allclose(jax.jacrev(square)(x), np.diag(2 * x))
    np.testing.assert_allclose(jax.vmap(jax.grad(lambda x: square(x).sum()))(jnp.stack([x, -x])),
                               jnp.stack([2 * x, -2 * x]))
    gx, back = jax.jit(lambda x, c: (jax.vjp(square, x)[1](c)[0], c))(x, ct)
    np.testing.assert_allclose(gx, 2 * x * ct)
    np.testing.assert_array_equal(back, np.arange(5.0))


def test_cache_dir_is_private_and_reused(cube_lib, cache):
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert cube_lib.path.parent.parent == cache
    assert (cube_lib.path.parent / (cube_lib.path.name + ".sha256")).is_file()
    cpp._loaded.clear()
    again = cpp.load("cube", sources=[CUBE])
    assert again.path == cube_lib.path


@pytest.mark.slow  # two compilations (10-30 s)
def test_source_text_and_compile_error(cache):
    src = CUBE.read_text()
    lib = cpp.load("cube_text", source=src)
    assert "CubeForward" in lib.handlers
    with pytest.raises(cpp.CompileError, match=r"(?s)compilation failed.*not_a_type"):
        cpp.load("broken", source=src + "\nnot_a_type x = 1;\n")
    assert not list(cache.glob("broken*")) and not list(cache.glob(".tmp-*"))


# ----------------------------------------------------------------- the cache's trust rules
# A tiny library (no XLA headers: compiles in milliseconds) stands in for a kernel
# library, and a "planted" one with the same exported symbol and a constructor that
# leaves a marker file plays the attacker's: if the marker appears, its code ran.
TINY = 'extern "C" int Tiny() { return 7; }\n'
PLANTED = r"""
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void planted() {
  const char* p = getenv("JB_PLANTED_MARKER");
  if (p) { int fd = open(p, O_CREAT | O_WRONLY, 0644); if (fd >= 0) close(fd); }
}
extern "C" int Tiny() { return 666; }
"""
OTHER_UID = 65534  # "nobody": stands for another user
needs_root = pytest.mark.skipif(os.geteuid() != 0,
                                reason="simulating another user's files needs os.chown (root)")


def refusing(what, path, expected):
    """The start of an UnsafeCacheError's message."""
    return rf"(?s)jaxbridge.cpp.load: refusing {what} {re.escape(str(path))}: expected {expected}"


def load_tiny(**kwargs):
    return cpp.load("tiny", source=TINY, functions=["Tiny"], **kwargs)


@pytest.fixture(scope="module")
def tiny_entry(cache):
    """(entry directory name, library file name) of TINY: the same in every cache."""
    path = load_tiny().path
    return path.parent.name, path.name


@pytest.fixture(scope="module")
def planted_so(tmp_path_factory):
    d = tmp_path_factory.mktemp("planted")
    (d / "planted.cc").write_text(PLANTED)
    subprocess.run([*shlex.split(os.environ.get("CXX") or "c++"), "-shared", "-fPIC",
                    str(d / "planted.cc"), "-o", str(d / "planted.so")], check=True)
    # The detector works: loading the planted library does leave the marker.
    marker = d / "ran"
    os.environ["JB_PLANTED_MARKER"] = str(marker)
    try:
        ctypes.CDLL(str(d / "planted.so"))
    finally:
        del os.environ["JB_PLANTED_MARKER"]
    assert marker.exists()
    return (d / "planted.so").read_bytes()


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty cache path (not yet created) for this test, and the planted code's marker."""
    monkeypatch.setenv("JAXBRIDGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("JB_PLANTED_MARKER", str(tmp_path / "planted_code_ran"))
    cpp._loaded.clear()
    yield tmp_path / "cache"
    cpp._loaded.clear()


def planted_ran(tmp_path):
    return (tmp_path / "planted_code_ran").exists()


def plant(root, tiny_entry, data, *, mode=0o700, uid=None):
    """Put `data` in `root` where TINY's library belongs, with a matching checksum."""
    entry = root / tiny_entry[0]
    entry.mkdir(parents=True, mode=mode)
    so = entry / tiny_entry[1]
    so.write_bytes(data)
    Path(f"{so}.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")
    if uid is not None:
        for p in (entry, so, Path(f"{so}.sha256")):
            os.chown(p, uid, uid)
    return so


def tree(root):
    """{relative path: (mode, uid, size)} of everything under root, links not followed."""
    out = {}
    for p in [root, *root.rglob("*")]:
        st = p.lstat()
        out[str(p.relative_to(root))] = (st.st_mode, st.st_uid, st.st_size)
    return out


def assert_private_entry(lib, root):
    """`lib` came from (and was published to) `root`, complete and checksummed."""
    assert lib.path.parent.parent == root and lib._cdll.Tiny() == 7
    assert not lib.path.is_symlink() and not lib.path.parent.is_symlink()
    digest = hashlib.sha256(lib.path.read_bytes()).hexdigest()
    assert Path(f"{lib.path}.sha256").read_text().strip() == digest
    assert not [p for p in root.iterdir() if p.name.startswith((".tmp-", ".trash-"))]


@pytest.mark.parametrize("mode", [0o700, 0o755, 0o750])
def test_existing_private_cache_dir_is_used_as_it_is(fresh, mode):
    fresh.mkdir(mode=mode)
    os.chmod(fresh, mode)  # exactly, whatever the umask
    assert_private_entry(load_tiny(), fresh)
    assert stat.S_IMODE(fresh.stat().st_mode) == mode  # never chmod-ed


@pytest.mark.parametrize("mode", [0o770, 0o777, 0o1777])  # group-writable, open, like /tmp
def test_cache_dir_writable_by_others_is_refused_not_chmodded(fresh, tiny_entry, planted_so,
                                                              mode):
    # The issue: a library planted in a world-writable cache, with a matching checksum,
    # was loaded (its constructor ran), and the directory was chmod-ed to 0700 (for
    # JAXBRIDGE_CACHE_DIR=/tmp that would lock everyone else out of /tmp).
    fresh.mkdir()
    os.chmod(fresh, mode)
    plant(fresh, tiny_entry, planted_so)
    found = stat.filemode(stat.S_IFDIR | mode)
    with pytest.raises(UnsafeCacheError, match=refusing(
            "cache directory", fresh, "no write permission for group or others, found mode "
            f"{found} .*JAXBRIDGE_CACHE_DIR")) as excinfo:
        load_tiny()
    assert stat.S_IMODE(fresh.stat().st_mode) == mode
    assert not planted_ran(fresh.parent)
    advice = str(excinfo.value)  # never "chmod" a shared (sticky) directory like /tmp
    assert ("chmod go-w" in advice) == (not mode & stat.S_ISVTX)
    with pytest.raises(PermissionError):  # UnsafeCacheError is one; cache_dir() says so too
        cpp.cache_dir()


@needs_root
def test_cache_dir_owned_by_another_user_is_refused(fresh, tiny_entry, planted_so):
    fresh.mkdir(mode=0o755)
    plant(fresh, tiny_entry, planted_so, uid=OTHER_UID)
    os.chown(fresh, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafeCacheError, match=refusing(
            "cache directory", fresh, rf"it to be owned by you \(uid {os.geteuid()}\) or root, "
            f"found uid {OTHER_UID}")):
        load_tiny()
    assert not planted_ran(fresh.parent)
    assert fresh.stat().st_uid == OTHER_UID and stat.S_IMODE(fresh.stat().st_mode) == 0o755


@needs_root
@pytest.mark.parametrize("whose", ["entry", "library", "checksum"])
def test_entry_owned_by_another_user_is_refused(fresh, tiny_entry, planted_so, whose):
    # The cache directory is ours and private: only the entry's owner is wrong.
    fresh.mkdir(mode=0o700)
    so = plant(fresh, tiny_entry, planted_so)
    victim = {"entry": so.parent, "library": so, "checksum": Path(f"{so}.sha256")}[whose]
    os.chown(victim, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafeCacheError, match=refusing(
            ".*", victim, f"it to be owned by you .* found uid {OTHER_UID}")):
        load_tiny()
    assert not planted_ran(fresh.parent)
    with pytest.raises(UnsafeCacheError):  # rebuild=True does not delete someone else's file
        load_tiny(rebuild=True)
    assert victim.stat().st_uid == OTHER_UID


@pytest.mark.parametrize("whose", ["entry", "library", "checksum"])
def test_entry_writable_by_others_is_refused(fresh, tiny_entry, planted_so, whose):
    fresh.mkdir(mode=0o700)
    so = plant(fresh, tiny_entry, planted_so)
    victim = {"entry": so.parent, "library": so, "checksum": Path(f"{so}.sha256")}[whose]
    os.chmod(victim, 0o777 if whose == "entry" else 0o666)
    with pytest.raises(UnsafeCacheError, match=refusing(
            ".*", victim, "no write permission for group or others")):
        load_tiny()
    assert not planted_ran(fresh.parent)


def test_symlink_at_cache_path_is_refused(fresh, tmp_path):
    # Planted where the cache should be; the old code followed it and chmod-ed the target.
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    os.chmod(target, 0o755)
    fresh.symlink_to(target)
    with pytest.raises(UnsafeCacheError, match=refusing(
            "cache directory", fresh, "a directory, found a symbolic link .*"
            "set JAXBRIDGE_CACHE_DIR to its target")):
        load_tiny()
    assert stat.S_IMODE(target.stat().st_mode) == 0o755 and not list(target.iterdir())


@pytest.mark.parametrize("link", ["entry", "library", "checksum"])
def test_symlinks_inside_cache_are_not_followed(fresh, tiny_entry, planted_so, tmp_path, link):
    # A link to the planted library, with a matching checksum, wherever it is: the
    # link is not followed, the entry is rebuilt, and the link's target is left alone.
    fresh.mkdir(mode=0o700)
    decoy = tmp_path / "decoy"
    planted = plant(decoy, tiny_entry, planted_so)
    real = fresh / tiny_entry[0] / tiny_entry[1]
    if link == "entry":
        (fresh / tiny_entry[0]).symlink_to(planted.parent)
    else:
        plant(fresh, tiny_entry, planted_so)  # then the one file becomes a link
        victim = real if link == "library" else Path(f"{real}.sha256")
        victim.unlink()
        victim.symlink_to(planted if link == "library" else Path(f"{planted}.sha256"))
    before = tree(decoy)
    lib = load_tiny()
    assert not planted_ran(tmp_path)
    assert_private_entry(lib, fresh)
    assert tree(decoy) == before


def rewrite(path, data):
    # A new inode: writing in place would corrupt a copy this process may have mapped.
    tmp = path.with_name("rewrite")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def corrupt(so):
    data = bytearray(so.read_bytes())
    data[100:200] = b"\0" * 100
    rewrite(so, bytes(data))


BROKEN = {  # how an entry can be damaged -> what to do to the (library path)
    "corrupted library": corrupt,
    "empty library": lambda so: rewrite(so, b""),
    "missing checksum": lambda so: Path(f"{so}.sha256").unlink(),
    "non-UTF-8 checksum": lambda so: rewrite(Path(f"{so}.sha256"), b"\xff\xfe\x80 bad\n"),
    "wrong checksum": lambda so: rewrite(Path(f"{so}.sha256"), b"0" * 64 + b"\n"),
    "library replaced by a directory": lambda so: (so.unlink(), so.mkdir(mode=0o700)),
    "library replaced by a FIFO": lambda so: (so.unlink(), os.mkfifo(so, 0o600)),
    "empty entry (a failed build)": lambda so: shutil.rmtree(so.parent) or so.parent.mkdir(0o700),
    "entry is a file": lambda so: shutil.rmtree(so.parent) or so.parent.write_bytes(b"x"),
}


@pytest.mark.parametrize("damage", list(BROKEN))
def test_broken_entry_is_rebuilt(fresh, damage):
    so = load_tiny().path
    BROKEN[damage](so)
    cpp._loaded.clear()
    assert_private_entry(load_tiny(), fresh)


def test_checksum_is_checked_on_the_bytes_loaded(fresh, tiny_entry, planted_so, monkeypatch):
    # Between the check and the load, the library is swapped for the planted one: what
    # is loaded must still be what was hashed (the same open file), not what the path
    # names by then.
    so = load_tiny().path
    cpp._loaded.clear()
    read = _build_cache.read_fd

    def read_then_swap(fd):
        data = read(fd)
        swap = so.with_name("swap")
        swap.write_bytes(planted_so)
        os.replace(swap, so)
        return data

    monkeypatch.setattr(_build_cache, "read_fd", read_then_swap)
    lib = load_tiny()
    assert lib._cdll.Tiny() == 7 and not planted_ran(fresh.parent)


def test_loads_a_verified_copy_without_proc(fresh, monkeypatch):
    load_tiny()
    cpp._loaded.clear()
    monkeypatch.setattr(cpp, "_fd_path", lambda fd: None)
    monkeypatch.setattr(cpp, "_build_and_load", None)  # must come from the cache
    lib = load_tiny()
    assert lib._cdll.Tiny() == 7 and lib.path.parent.parent == fresh


@needs_root
def test_root_owned_cache_serves_other_users(fresh, monkeypatch):
    # A cache pre-built by root (a container image) is trusted by everyone; it is
    # neither rebuilt nor written.
    load_tiny()
    cpp._loaded.clear()
    before = tree(fresh)
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    monkeypatch.setattr(cpp, "_build_and_load", None)
    lib = load_tiny()
    assert lib._cdll.Tiny() == 7 and lib.path.parent.parent == fresh
    assert tree(fresh) == before


READ_ONLY_SCRIPT = """
import sys, warnings
import jaxbridge.cpp as cpp
from jaxbridge.errors import UnsafeCacheError
root = sys.argv[1]
lib = cpp.load("tiny", source=sys.argv[2], functions=["Tiny"])
assert str(lib.path).startswith(root) and lib._cdll.Tiny() == 7, lib
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    other = cpp.load("other", source='extern "C" int Other() { return 8; }', functions=["Other"])
assert other.path is None and other._cdll.Other() == 8, other
assert "could not write the cache" in str(caught[0].message), caught
print("ok")
"""


@needs_root
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
def test_read_only_cache_still_loads(fresh):
    # A real read-only file system (a bind mount in a private mount namespace): a hit
    # loads; a miss is built and loaded uncached, with a warning.
    load_tiny()
    before = tree(fresh)
    mount = 'mount --bind -o ro "$0" "$0" || exit 77; exec "$1" -c "$2" "$0" "$3"'
    proc = subprocess.run(["unshare", "-m", "sh", "-c", mount, str(fresh), sys.executable,
                           READ_ONLY_SCRIPT, TINY], capture_output=True, text=True, timeout=300,
                          cwd=fresh.parent)
    if proc.returncode == 77 or "unshare failed" in proc.stderr:
        pytest.skip(f"no private read-only bind mount here: {proc.stderr.strip()}")
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr
    assert tree(fresh) == before


def test_cache_that_cannot_be_created_builds_uncached(fresh, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("JAXBRIDGE_CACHE_DIR", str(blocker / "cache"))  # under a file
    with pytest.warns(RuntimeWarning, match=r"cannot use the cache .*building uncached"):
        lib = load_tiny()
    assert lib.path is None and lib._cdll.Tiny() == 7


# ----------------------------------------------------------------- loader errors
def test_link_error_keeps_the_loaders_message(fresh):
    src = 'void not_defined_anywhere();\nextern "C" void Tiny() { not_defined_anywhere(); }'
    with pytest.raises(cpp.CompileError,
                       match=r"(?s)load\('undef'\): the dynamic loader rejected libundef.so .*"
                             r"undefined symbol: _Z20not_defined_anywherev.*extra_ldflags"):
        cpp.load("undef", source=src, functions=["Tiny"])
    assert not list(fresh.iterdir())  # a library that does not load is not cached


def test_missing_handler_symbol_is_named(fresh):
    with pytest.raises(cpp.CompileError,
                       match=r"(?s)load\('tiny'\): libtiny.so .* does not export the handler "
                             r"symbol 'Nope' \(the loader says: undefined symbol: Nope\)"):
        cpp.load("tiny", source=TINY, functions=["Tiny", "Nope"])


def test_no_handler_is_an_error(cache):
    with pytest.raises(ValueError, match="no handler found"):
        cpp.load("empty", source="int f() { return 1; }\n")


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_cuda_compile(cache):
    # Compile-only where there is no GPU; loading needs the CUDA runtime.
    src = """
    #include "jaxbridge/cuda.h"
    namespace ffi = xla::ffi;
    __global__ void Twice(const float* x, float* y, int64_t n) {
      int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
      if (i < n) y[i] = 2 * x[i];
    }
    ffi::Error Impl(cudaStream_t s, ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y) {
      int64_t n = x.element_count();
      if (n == 0) return ffi::Error::Success();
      Twice<<<jaxbridge::Blocks(n, 256), 256, 0, s>>>(x.typed_data(), y->typed_data(), n);
      JAXBRIDGE_CUDA_CHECK_LAUNCH("Twice");
      return ffi::Error::Success();
    }
    XLA_FFI_DEFINE_HANDLER_SYMBOL(TwiceCuda, Impl, ffi::Ffi::Bind()
        .Ctx<jaxbridge::CudaStream>().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>());
    """
    lib = cpp.load("twice_cuda", source=src, cuda=True, extra_cuda_cflags=["-arch=sm_80"])
    assert "TwiceCuda" in lib.handlers


@pytest.mark.slow  # a whole CMake project
def test_example_extension_builds_with_cmake(tmp_path):
    if shutil.which("cmake") is None:
        pytest.skip("needs cmake")
    pybind11 = pytest.importorskip("pybind11")
    build = tmp_path / "build"
    env = dict(os.environ)  # jaxbridge as installed (the source tree lacks the built extensions)
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", str(EXAMPLE), "-B", str(build), *gen,
                    f"-DPython_EXECUTABLE={sys.executable}",
                    f"-Dpybind11_DIR={pybind11.get_cmake_dir()}", "-DCMAKE_BUILD_TYPE=Release"],
                   check=True, capture_output=True, env=env, timeout=120)
    proc = subprocess.run(["cmake", "--build", str(build), "-j2"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    so = next(build.glob("_cube*.so"))
    pkg = tmp_path / "site" / "jb_cube"
    shutil.copytree(EXAMPLE / "jb_cube", pkg)
    shutil.copy(so, pkg)
    code = ("import jax, jax.numpy as jnp, jb_cube;"
            "g = jax.grad(lambda x: jb_cube.cube(x, factor=2.0).sum())(jnp.arange(3.0));"
            "print(g.tolist())")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(tmp_path / "site"), env.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0.0, 6.0, 24.0]"
