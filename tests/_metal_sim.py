"""The simulated Metal in tests: the Metal backend's own Objective-C++ (csrc/mps),
built with clang against fake Metal headers (tests/metal_sim), encodes each call; what the
encoder was told is replayed on the CPU backend (_C.replayed_plan), and the bytes of every
buffer the call bound must equal those a direct CPU run leaves, bit for bit.

``with simulated_metal() as metal:`` puts this in place of the CPU backend, so any test
calling kernels on cpu tensors runs through the Metal backend instead. The replay runs
unchecked: checked execution refuses reads before a tensor's bound address (negative
strides, which Metal allows within the buffer) and trapped on MLX's int32 DivMod, so an
encoding that sends a kernel outside its memory can crash the run rather than fail a test.
"""

import contextlib
import ctypes
import importlib.util
import os
import struct
import threading

import pytest
import torch

from torch_metallib import _C
from torch_metallib.backends.mps_backend import MpsBackend
from torch_metallib.dispatch import backend as seam
from torch_metallib.dispatch.backend import Backend
from metal_sim.build import build

# MTLDataType -> struct format of a function constant's bytes (bfloat apart).
_FORMATS = {53: "?", 45: "b", 49: "B", 37: "h", 41: "H", 29: "i", 33: "I", 81: "q", 85: "Q", 3: "f", 16: "e"}
_BFLOAT = 121
_native = None


def native():
    """The simulated Metal module, built (or reused) once per session."""
    global _native
    if _native is None:
        try:
            path = build()
        except (OSError, RuntimeError) as error:  # no clang-14 / libobjc: .ci/setup installs them
            pytest.fail(f"the simulated Metal could not be built: {error}")
        spec = importlib.util.spec_from_file_location("metal_sim_native", path)
        _native = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_native)
    return _native


def constant_value(data_type: int, data: bytes):
    if data_type == _BFLOAT:
        return struct.unpack("<f", b"\0\0" + data)[0]
    value = struct.unpack("<" + _FORMATS[data_type], data)[0]
    return int(value) if isinstance(value, bool) else value


def encoded(recording):
    """The recording as {function, constants, buffers, bytes, threadgroup, dispatches}."""
    out = {"function": None, "constants": (), "buffers": {}, "bytes": {}, "threadgroup": {}, "resources": [],
           "dispatches": []}
    for what, text, numbers, address, constants in recording:
        if what == "pipeline":
            out["function"] = text
            out["constants"] = tuple((index, constant_value(kind, data)) for index, kind, data in constants)
        elif what == "buffer":
            index, offset, length, buffer_id = numbers
            out["buffers"][index] = (address, offset, length, buffer_id)
        elif what == "bytes":
            out["bytes"][numbers[0]] = text
        elif what == "threadgroup":
            out["threadgroup"][numbers[0]] = numbers[1]
        elif what == "resource":
            buffer_id, length, usage = numbers
            out["resources"].append((address, length, usage, buffer_id))
        elif what == "dispatch":
            out["dispatches"].append((tuple(numbers[:3]), tuple(numbers[3:])))
    return out


def _host_argument_buffers(plan, record, function):
    """Argument buffers as encoded hold GPU addresses: each must fall in a buffer made
    resident with the usage its slot needs. The setBytes values the replay takes, with
    host addresses back in place (a struct past 4 KB is rewritten in its buffer)."""
    values = dict(record["bytes"])
    for binding, _, slots in plan.argument_buffers:
        if binding in record["bytes"]:
            data = bytearray(record["bytes"][binding])
        else:  # encoded into a buffer of its own (past setBytes' 4 KB)
            address, offset, length, _ = record["buffers"][binding]
            data = bytearray(ctypes.string_at(address + offset, length))
        for offset, tensor, writable in slots:
            host = struct.unpack_from("<Q", data, offset)[0] ^ native().GPU_ADDRESS_TAG
            usage = 3 if writable else 1
            assert any(start <= host < start + length and used & usage == usage
                       for start, length, used, _ in record["resources"]), \
                f"{function}: buffer({binding}) byte {offset} holds no GPU address of a resident buffer"
            assert host == tensor.data_ptr(), f"{function}: buffer({binding}) byte {offset} points elsewhere"
            struct.pack_into("<Q", data, offset, host)
        if binding in values:
            values[binding] = bytes(data)
        else:
            ctypes.memmove(address + offset, bytes(data), length)
    return values


def _storages(plan):
    seen = {}
    for _, tensor, _, _ in plan.commands["buffers"]:
        storage = tensor.untyped_storage()
        seen.setdefault(storage.data_ptr(), storage)
    return list(seen.values())


def _snapshot(storages):
    copies = []
    for storage in storages:
        copy = torch.empty(storage.nbytes(), dtype=torch.uint8)
        copy.untyped_storage().copy_(storage)
        copies.append(copy)
    return copies


class SimulatedMetal(Backend):
    """Runs cpu-tensor calls through the Metal backend and the simulated Metal."""

    device_type = "cpu"

    def __init__(self, cpu):
        self.cpu = cpu
        self.native = native()
        self.metal = MpsBackend(self.native)
        self.runs = 0
        self.last = None  # encoded() of the last call's recording
        self._lock = threading.Lock()  # one recording at a time: the simulated encoder is shared

    def prepare(self, function, state, constants: tuple, checked: bool = False):
        return state, self.metal.prepare(function, state, constants)

    def run(self, function, prepared, plan) -> None:
        with self._lock:
            self._run(function, prepared, plan)

    def _run(self, function, prepared, plan) -> None:
        state, library = prepared
        storages = _storages(plan)
        before = _snapshot(storages)
        self.cpu.run(function, self.cpu.prepare(function, state, plan.constants), plan)
        expected = _snapshot(storages)
        for storage, copy in zip(storages, before):
            storage.copy_(copy.untyped_storage())
        self.metal.run(function, library, plan)
        record = self.last = encoded(self.native.take_recording())
        assert record["function"] == function.name and len(record["dispatches"]) == 1, record
        values = _host_argument_buffers(plan, record, function.name)
        buffers = {index: address + offset for index, (address, offset, _, _) in record["buffers"].items()}
        (grid, group), = record["dispatches"]
        replayed = _C.replayed_plan(plan, buffers, values, record["threadgroup"], grid, group)
        self.cpu.run(function, self.cpu.prepare(function, state, record["constants"]), replayed)
        self.native.complete_command_buffer()
        for number, (storage, want) in enumerate(zip(storages, expected)):
            got = _snapshot([storage])[0]
            assert torch.equal(got, want), (f"{function.name}: buffer {number} differs from the CPU backend's "
                                            f"at {int((got != want).sum())} bytes")
        self.runs += 1


@contextlib.contextmanager
def simulated_metal(device_type: str = "cpu", archive: bool = False):
    """The simulated Metal as the backend for `device_type`: cpu (calls on cpu tensors) or
    mps (operators dispatched for the MPS key, given cpu tensors). Pipelines are compiled
    each time unless `archive` (the binary archive under the cache folder, as on a Mac)."""
    saved = os.environ.get("TORCH_METALLIB_METAL_ARCHIVE")
    if not archive:
        os.environ["TORCH_METALLIB_METAL_ARCHIVE"] = "0"
    try:
        with _registered(device_type) as metal:
            yield metal
    finally:
        if not archive:
            os.environ.pop("TORCH_METALLIB_METAL_ARCHIVE")
            if saved is not None:
                os.environ["TORCH_METALLIB_METAL_ARCHIVE"] = saved


@contextlib.contextmanager
def _registered(device_type: str):
    cpu = seam.backend_for("cpu", "")
    metal = SimulatedMetal(cpu)
    metal.device_type = device_type
    seam.register_backend(metal)
    try:
        yield metal
    finally:
        if device_type == "cpu":
            seam.register_backend(cpu)
        else:
            seam._backends.pop(device_type)
