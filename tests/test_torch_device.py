"""jaxbridge.torch's device path (CUDA: XLA's device buffers as DLPack tensors, the call
on XLA's stream; csrc/hostcall/device_call.cc, jaxbridge/torch/_device.py).

What runs here on a CPU-only machine: the DLPack capsules the trampoline builds
(exercised with kDLCPU pointers), the stream selection with no stream, and a wrapped
function's whole host side driven through the device protocol. The one GPU test
(`-m gpu`, benchmarks/gpu_session.sh) checks values, that torch sees XLA's own device
buffers (no host copy), and XLA's stream.
"""

import contextlib
import gc

import pytest

torch = pytest.importorskip(
    "torch", reason="jaxbridge.torch needs PyTorch: pip install -e '.[torch]' (Python 3.11)")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import jaxbridge.torch as jt  # noqa: E402
from jaxbridge._foreign.hostcall import HostCallable, _native  # noqa: E402
from jaxbridge.errors import ForeignCallError, KeptViewError, ResultMismatchError  # noqa: E402
from jaxbridge.torch import _device  # noqa: E402

if _native is None:
    pytest.skip("the native extension is not built", allow_module_level=True)

KDLCPU, KDLCUDA = 1, 2


def capsule_of(a: np.ndarray, device_type: int = KDLCPU):
    name = "bfloat16" if a.dtype == ml_dtypes.bfloat16 else a.dtype.name
    return _native._dlpack_capsule_for_testing(a.ctypes.data, list(a.shape), name,
                                               device_type, 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint8,
                                   np.bool_, np.float16, np.complex64, ml_dtypes.bfloat16])
def test_capsules_view_the_buffer_without_copying(dtype):
    a = np.arange(12).reshape(3, 4).astype(dtype)
    alive = _native.dlpack_views_alive()
    t = torch.from_dlpack(capsule_of(a))
    assert t.data_ptr() == a.ctypes.data  # the same memory
    assert tuple(t.shape) == (3, 4) and t.is_contiguous() and t.device.type == "cpu"
    if dtype is ml_dtypes.bfloat16:
        assert t.dtype == torch.bfloat16
        np.testing.assert_array_equal(t.view(torch.int16).numpy(), a.view(np.int16))
    else:
        np.testing.assert_array_equal(t.numpy(), a)
    assert _native.dlpack_views_alive() == alive + 1
    del t  # torch calls the deleter: the view is counted as released
    assert _native.dlpack_views_alive() == alive


def test_capsules_nobody_consumed_release_their_view():
    a = np.ones(3, np.float32)
    alive = _native.dlpack_views_alive()
    c = capsule_of(a)
    assert _native.dlpack_views_alive() == alive + 1
    del c
    assert _native.dlpack_views_alive() == alive


def test_capsules_of_zero_dims_and_empty_buffers():
    s = np.array(2.5)
    assert torch.from_dlpack(capsule_of(s)).item() == 2.5
    e = np.zeros((0, 3), np.float32)
    assert tuple(torch.from_dlpack(capsule_of(e)).shape) == (0, 3)


def test_capsule_with_unknown_dtype_is_refused():
    with pytest.raises(ValueError, match="unsupported dtype"):
        _native._dlpack_capsule_for_testing(0, [1], "float8", KDLCPU, 0)


def test_no_stream_leaves_torch_on_its_current_stream():
    before = torch.cuda.current_stream if torch.cuda.is_available() else None
    for stream in (None, 0):
        with _device.stream_context(stream, 0) as ctx:
            assert ctx is None
    if before is not None:
        assert torch.cuda.current_stream == before


def test_a_stream_puts_torch_on_xlas_stream_made_once_per_stream_and_device(monkeypatch):
    """On CUDA, torch's work goes on XLA's stream: a `torch.cuda.ExternalStream` of its
    address on its device, made once and reused (XLA keeps its streams for the life of
    the client). Faked here: CPU-only torch cannot make CUDA streams."""
    made, entered = [], []

    class FakeExternalStream:
        def __init__(self, address, device):
            made.append((address, device))

    def fake_stream(external):
        entered.append(external)
        return contextlib.nullcontext("on XLA's stream")

    monkeypatch.setattr(_device.torch.cuda, "ExternalStream", FakeExternalStream)
    monkeypatch.setattr(_device.torch.cuda, "stream", fake_stream)
    monkeypatch.setattr(_device, "_streams", {})
    for stream, device in [(0x7F00, 0), (0x7F00, 0), (0x7F00, 1), (0x8F00, 0)]:
        with _device.stream_context(stream, device) as ctx:
            assert ctx == "on XLA's stream"
    assert made == [(0x7F00, torch.device("cuda", 0)), (0x7F00, torch.device("cuda", 1)),
                    (0x8F00, torch.device("cuda", 0))]
    assert all(isinstance(e, FakeExternalStream) for e in entered) and len(entered) == 4
    assert entered[0] is entered[1] and len({id(e) for e in entered}) == 3


def test_zero_runs_go_to_cuda_only_where_jax_computes_on_the_gpu_and_torch_has_cuda(
        monkeypatch):
    # The platform name is built at run time, as JAX's is (not the interned literal).
    for backend in ("cpu", "gpu", "tpu"):
        monkeypatch.setattr(_device.jax, "default_backend",
                            lambda b=backend: "".join(list(b)))
        for cuda_torch in (False, True):
            monkeypatch.setattr(_device, "_has_cuda", [cuda_torch])
            want = "cuda" if (backend, cuda_torch) == ("gpu", True) else "cpu"
            assert _device.zeros_device() == want, (backend, cuda_torch)


def test_device_fill_hands_fill_tensors_of_the_buffers():
    x, out = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    seen = []

    def fill(ins, outs):
        seen.append((ins[0].data_ptr(), outs[0].data_ptr()))
        outs[0].copy_(ins[0] * 2)

    _device.make_device_fill(fill)((capsule_of(x),), (capsule_of(out),), None, 0)
    assert seen == [(x.ctypes.data, out.ctypes.data)]
    np.testing.assert_array_equal(out, 2 * x)


def test_device_fill_is_offered_only_where_torch_has_cuda(monkeypatch):
    assert (_device.device_filler(lambda i, o: None) is None) == (not torch.cuda.is_available())
    monkeypatch.setattr(_device, "_has_cuda", [True])
    assert callable(_device.device_filler(lambda i, o: None))


def lowered_host_callables(fn, *args, cuda_torch, monkeypatch):
    """The HostCallables made by lowering `fn` for CUDA, with torch's CUDA faked."""
    monkeypatch.setattr(_device, "_has_cuda", [cuda_torch])
    before = {id(o) for o in gc.get_objects() if type(o) is HostCallable}
    lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    found = [o for o in gc.get_objects()
             if type(o) is HostCallable and id(o) not in before]
    return lowered, found


def test_wrapped_forward_runs_through_the_device_protocol(monkeypatch):
    """The whole host side of a wrapped function (pytrees, a static argument, two
    outputs, one of them integer) driven as the CUDA handler drives it, on kDLCPU capsules."""
    def model(p, *, k):
        return {"y": torch.tanh(p["a"]) @ p["b"] * k, "n": (p["a"] > 0).sum()}

    f = jt.wrap(model)
    a = np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)
    b = np.array([0.5, -2.0], np.float32)
    _, found = lowered_host_callables(lambda p: f(p, k=3.0), {"a": a, "b": b},
                                      cuda_torch=True, monkeypatch=monkeypatch)
    (target,) = found
    assert target.device_fill is not None
    outs = [np.zeros(a.shape, a.dtype) for a in target.out_avals]  # leaves "n", "y"
    ins = (capsule_of(a), capsule_of(b))
    target.device_fill(ins, tuple(capsule_of(o) for o in outs), None, 0)
    expect = np.tanh(a) @ b * 3.0
    got = {o.shape: o for o in outs}
    np.testing.assert_allclose(got[(3,)], expect, rtol=1e-6)
    assert got[()] == 3


def test_device_protocol_catches_writes_into_inputs(monkeypatch):
    def bad(x):
        x.add_(1)
        return x * 2

    f = jt.wrap(bad)
    x = np.ones(3, np.float32)
    _, (target,) = lowered_host_callables(f, x, cuda_torch=True, monkeypatch=monkeypatch)
    with pytest.raises(ForeignCallError, match="modified input leaf 0 in place"):
        target.device_fill((capsule_of(x),), (capsule_of(np.zeros(3, np.float32)),), None, 0)


def test_device_protocol_checks_result_shape_and_dtype(monkeypatch):
    x = np.ones(3, np.float32)
    f = jt.wrap(lambda x: x * 2, result=jax.ShapeDtypeStruct((3,), jnp.int32))
    _, (target,) = lowered_host_callables(f, x, cuda_torch=True, monkeypatch=monkeypatch)
    with pytest.raises(ResultMismatchError, match="has dtype torch.float32, but int32"):
        target.device_fill((capsule_of(x),), (capsule_of(np.zeros(3, np.int32)),), None, 0)


def test_without_cuda_torch_the_call_is_staged(monkeypatch):
    f = jt.wrap(torch.sin)
    _, (target,) = lowered_host_callables(f, np.ones(2, np.float32), cuda_torch=False,
                                          monkeypatch=monkeypatch)
    assert target.device_fill is None


# ---- the handler's own logic (csrc/hostcall/device_call.cc), minus CUDA: host arrays
# as kDLCPU buffers through _native._invoke_device_fill_for_testing
def device_target(f, *args, monkeypatch):
    _, (target,) = lowered_host_callables(f, *args, cuda_torch=True, monkeypatch=monkeypatch)
    return target


def test_handler_runs_a_wrapped_function_on_the_buffers(monkeypatch):
    f = jt.wrap(lambda x, y: torch.sin(x) * y)
    x, y = np.linspace(0, 1, 5, dtype=np.float32), np.full(5, 2.0, np.float32)
    target = device_target(f, x, y, monkeypatch=monkeypatch)
    out = np.zeros(5, np.float32)
    alive = _native.dlpack_views_alive()
    assert _native._invoke_device_fill_for_testing(target.id, (x, y), (out,)) is None
    np.testing.assert_allclose(out, np.sin(x) * y, rtol=1e-6)
    assert _native.dlpack_views_alive() == alive  # every view released


def test_handler_delivers_the_exception_itself_and_fills_nan(monkeypatch):
    class Boom(Exception):
        pass

    def explode(x):
        if x.device.type != "meta":  # traced as a function that draws no random numbers
            raise Boom("in torch")
        return x

    f = jt.wrap(explode, result=jax.ShapeDtypeStruct((3,), jnp.float32))
    x = np.ones(3, np.float32)
    target = device_target(f, x, monkeypatch=monkeypatch)
    out = np.zeros(3, np.float32)
    with pytest.raises(Boom, match="in torch"):  # delivered to this thread on return
        _native._invoke_device_fill_for_testing(target.id, (x,), (out,))
        for _ in range(10):  # the pending call runs between bytecodes
            pass
    assert np.isnan(out).all()


def test_handler_catches_tensors_kept_past_the_call(monkeypatch):
    kept = []

    def keeps(x):
        kept.append(x[1:])  # a view: cannot be moved off XLA's memory
        return x * 2

    f = jt.wrap(keeps)
    x = np.ones(3, np.float32)
    target = device_target(f, x, monkeypatch=monkeypatch)
    out = np.zeros(3, np.float32)
    with pytest.raises(KeptViewError, match="kept input tensor"):
        _native._invoke_device_fill_for_testing(target.id, (x,), (out,))
        for _ in range(10):
            pass
    kept.clear()


def test_handler_counts_views_kept_by_any_consumer():
    """The capsules' deleters count views still alive after the call, whoever keeps
    them (here a device fill that bypasses jaxbridge.torch's own checks)."""
    stash = []

    def device_fill(ins, outs, stream, device):
        stash.append(torch.from_dlpack(ins[0]))

    target = HostCallable(lambda ins, outs: None, [jax.ShapeDtypeStruct((2,), np.float32)],
                          "stasher", "forward", device_fill=device_fill)
    x, out = np.ones(2, np.float32), np.zeros(2, np.float32)
    with pytest.raises(KeptViewError, match=r"'stasher' kept 1 view\(s\)"):
        _native._invoke_device_fill_for_testing(target.id, (x,), (out,))
        for _ in range(10):
            pass
    alive = _native.dlpack_views_alive()
    stash.clear()
    assert _native.dlpack_views_alive() == alive - 1


def test_handler_refuses_unregistered_callbacks():
    text = _native._invoke_device_fill_for_testing(10**12, (), ())
    assert "no longer registered" in text


@pytest.mark.gpu
def test_gpu_calls_run_on_xlas_device_buffers_and_stream(gpu):
    """On a GPU: values, no host copy (torch sees XLA's own buffer), XLA's stream."""
    if not torch.cuda.is_available():
        pytest.skip("this torch has no CUDA (a CPU build): the device path needs a CUDA "
                    "torch sharing the GPU with JAX")
    seen = {}

    def fn(x):
        seen["ptr"], seen["device"] = x.data_ptr(), x.device
        seen["stream"] = torch.cuda.current_stream(x.device).cuda_stream
        return torch.sin(x) * x

    f = jt.wrap(fn)
    x = jax.device_put(jnp.linspace(0.0, 3.0, 4096, dtype=jnp.float32), gpu)
    y = jax.jit(f)(x)
    xs = np.asarray(x)
    np.testing.assert_allclose(np.asarray(y), np.sin(xs) * xs, rtol=1e-5, atol=1e-6)
    assert seen["device"].type == "cuda"
    assert seen["ptr"] == x.unsafe_buffer_pointer()  # XLA's buffer, no staging copy
    assert seen["stream"] not in (0, torch.cuda.default_stream(seen["device"]).cuda_stream)
    g = jax.jit(jax.grad(lambda v: f(v).sum()))(x)
    np.testing.assert_allclose(np.asarray(g), np.cos(xs) * xs + np.sin(xs),
                               rtol=1e-4, atol=1e-5)
    v = jax.jit(jax.vmap(f))(x.reshape(64, 64))
    np.testing.assert_allclose(np.asarray(v).ravel(), np.sin(xs) * xs, rtol=1e-5, atol=1e-6)

    class Boom(Exception):
        pass

    def raises(x):
        raise Boom("from torch on the GPU")

    with pytest.raises(Exception) as info:  # itself, or an XLA error describing it
        jax.block_until_ready(jax.jit(jt.wrap(raises, result=jax.ShapeDtypeStruct(
            (4096,), jnp.float32)))(x))
    assert isinstance(info.value, Boom) or "Boom" in str(info.value)
    assert "from torch on the GPU" in str(info.value)
    np.testing.assert_allclose(np.asarray(jax.jit(f)(x)), np.sin(xs) * xs, rtol=1e-5,
                               atol=1e-6)  # the device and the bridge still work

    kept = []

    def keeps(x):
        kept.append(x[1:])  # a view of XLA's device buffer, past the call
        return x * 2

    with pytest.raises(Exception, match="kept"):
        jax.block_until_ready(jax.jit(jt.wrap(keeps))(x))


def test_out_true_function_through_the_device_protocol(monkeypatch):
    @jt.wrap(result=jax.ShapeDtypeStruct((3,), jnp.float32), out=True)
    def f(x, out):
        torch.add(x, 1, out=out)

    x = np.arange(3, dtype=np.float32)
    _, (target,) = lowered_host_callables(f, x, cuda_torch=True, monkeypatch=monkeypatch)
    out = np.zeros(3, np.float32)
    target.device_fill((capsule_of(x),), (capsule_of(out),), None, 0)
    np.testing.assert_array_equal(out, x + 1)
