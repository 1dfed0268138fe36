"""The device path: on CUDA, a wrapped torch function runs on XLA's own device buffers.

Where JAX and torch share a GPU, the host-call trampoline (csrc/hostcall/device_call.cc)
does not stage the call through host memory for a wrapped torch function. It calls the
`device_fill` made here with DLPack capsules (kDLCUDA) of XLA's input and output device
buffers and the address of XLA's CUDA stream for this call. The capsules become torch
CUDA tensors without a copy (`torch.from_dlpack`), and the function runs under
``torch.cuda.stream(torch.cuda.ExternalStream(stream))``: every kernel it launches, and
the final copy of its results into XLA's output buffers, is enqueued on XLA's stream,
ordered after the operations that produced the inputs and before those that consume the
outputs, with no synchronization.

Status: lowered for CUDA in CI; run on an H200 (2026-11-26, benchmarks/gpu_session.sh
torch-gpu torch-tests: tests/test_torch_device.py -m gpu and tests/test_torch.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import jax
import torch

__all__ = ["device_filler", "make_device_fill", "stream_context", "torch_has_cuda",
           "zeros_device"]

_has_cuda: list[bool] = []
# torch.cuda.ExternalStream objects by (stream address, device): XLA keeps a few
# streams per device for the life of the client, so this stays small.
_streams: dict[tuple[int, int], Any] = {}


def torch_has_cuda() -> bool:
    """Whether this torch can run CUDA work (a CPU-only build cannot: the device path is
    then not offered, and the trampoline stages the call through host memory)."""
    if not _has_cuda:
        _has_cuda.append(bool(torch.cuda.is_available()))
    return _has_cuda[0]


def zeros_device() -> str:
    """Where the one run on zero-filled tensors that finds a function's result shapes
    happens: on the GPU where JAX computes there by default and torch can follow (the
    call itself will get CUDA tensors, and code written for them, `torch.cuda.*` or
    `torch.ones(n, device="cuda") + x`, fails on the CPU), else on the CPU."""
    return "cuda" if jax.default_backend() == "gpu" and torch_has_cuda() else "cpu"


def stream_context(stream: int | None, device: int) -> contextlib.AbstractContextManager:
    """The context that puts torch's work on XLA's CUDA stream `stream` (a cudaStream_t
    address) of `device`. No stream (None or 0: capsules of host memory, as in the CPU
    tests) leaves torch's current stream alone."""
    if not stream:
        return contextlib.nullcontext()
    key = (int(stream), int(device))
    external = _streams.get(key)
    if external is None:
        external = _streams[key] = torch.cuda.ExternalStream(
            int(stream), device=torch.device("cuda", int(device)))
    return torch.cuda.stream(external)


def make_device_fill(fill: Callable[[tuple, tuple], Any]) -> Callable[..., None]:
    """`fill(inputs, outputs)` (the host call's protocol, here with torch tensors) as
    the trampoline's device protocol, `device_fill(inputs, outputs, stream, device)`,
    whose inputs and outputs are DLPack capsules of XLA's buffers."""
    def device_fill(ins: tuple, outs: tuple, stream: int | None, device: int) -> None:
        with stream_context(stream, device):
            fill(tuple(torch.from_dlpack(c) for c in ins),
                 tuple(torch.from_dlpack(c) for c in outs))

    return device_fill


def device_filler(fill: Callable[[tuple, tuple], Any]) -> Callable[..., None] | None:
    """What a wrapped function offers the host-call runtime for the CUDA platform
    (`HostCallable(device_fill=...)`): `make_device_fill(fill)`, or None where torch
    has no CUDA (the call is then staged through host memory)."""
    return make_device_fill(fill) if torch_has_cuda() else None
