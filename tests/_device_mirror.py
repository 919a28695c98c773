"""Runs every kernel call of a test twice: as written (cpu tensors, the CPU backend) and on
another device with the same memory (tests/test_mps.py: ``mps``, the Metal backend), and
compares what each call wrote.

Each distinct storage the call reaches is copied to the device once and every tensor is
rebuilt there as the same view (offset, sizes, strides), so aliasing between arguments is
kept; lists and dicts (argument buffers) are mirrored member by member. After both runs
every tensor argument must match: exactly for integers and booleans, within a tolerance
per float dtype (Metal's math and the CPU backend's agree to within a few ulp, not bit for
bit; a GEMM's sums run in another order).
"""

import contextlib

import torch

import torch_metallib.library.function as function_module

# (rtol, atol) per float dtype: a few ulp, or the order of a sum of hundreds of products.
TOLERANCES = {torch.float32: (1e-4, 1e-5), torch.float16: (1e-2, 1e-3), torch.bfloat16: (2e-2, 1e-2)}


class _Mirror:
    def __init__(self, device):
        self.device = torch.device(device)
        self.storages = {}  # cpu storage address -> its copy on the device

    def tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        copy = self.storages.get(storage.data_ptr())
        if copy is None:
            raw = torch.empty(storage.nbytes(), dtype=torch.uint8)
            raw.untyped_storage().copy_(storage)
            copy = self.storages[storage.data_ptr()] = raw.to(self.device).untyped_storage()
        view = torch.empty(0, dtype=tensor.dtype, device=self.device)
        return view.set_(copy, tensor.storage_offset(), tensor.shape, tensor.stride())

    def value(self, value):
        if isinstance(value, torch.Tensor):
            return self.tensor(value)
        if isinstance(value, dict):
            return {key: self.value(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.value(item) for item in value)
        return value


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def assert_same(name: str, cpu: torch.Tensor, other: torch.Tensor) -> None:
    got = other.cpu()
    if cpu.dtype in TOLERANCES:
        rtol, atol = TOLERANCES[cpu.dtype]
        torch.testing.assert_close(got, cpu, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{name}: {m}")
    else:
        assert torch.equal(got, cpu), f"{name}: {int((got != cpu).sum())} elements differ from the CPU backend's"


@contextlib.contextmanager
def mirrored_calls(device: str):
    """While active, each kernel call also runs on `device`; yields the list of mirrored
    kernel names (a test asserts it is not empty)."""
    kernel_function = function_module.KernelFunction
    original = kernel_function.__call__
    names = []

    def call(function, *args, **kwargs):
        mirror = _Mirror(device)
        other_args, other_kwargs = mirror.value(args), mirror.value(kwargs)
        original(function, *args, **kwargs)
        original(function, *other_args, **other_kwargs)
        for cpu, other in zip(_tensors((args, kwargs)), _tensors((other_args, other_kwargs))):
            assert_same(function.name, cpu, other)
        names.append(function.name)

    kernel_function.__call__ = call
    try:
        yield names
    finally:
        kernel_function.__call__ = original
