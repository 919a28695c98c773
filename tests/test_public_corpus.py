"""Metallibs from public macOS wheels, built by many toolchains (tests/corpora/fetch_public.sh
lists 60; .ci/run fetches the subset tests/_public_corpus.py names): every file loads, round-trips byte for byte in
its own group-size convention, and every function reflects."""

import collections
import hashlib

import pytest
import torch

import torch_metallib as tm
from _public_corpus import CONVENTIONS, producer, subset_files


@pytest.fixture(scope="module")
def files():
    return subset_files()


def test_every_file_loads_and_round_trips(files):
    for path in files:
        data = path.read_bytes()
        lib = tm.load(data, verify=True)
        assert lib.group_size_convention == CONVENTIONS[producer(path)], path.name
        assert lib.to_bytes() == data, path.name
        names = lib.function_names
        # A subset keeps the convention and every function's bytes.
        picked = names[::max(1, len(names) // 3)][:3]
        small = tm.load(lib.subset(picked), verify=True)
        assert small.group_size_convention == lib.group_size_convention
        assert small.function_names == tuple(picked)
        for name in picked:
            assert bytes(small[name].module) == bytes(lib[name].module)
        if lib.uuid is None:  # nothing derived from the selection: all functions give the input
            assert lib.subset(names) == data, path.name


@pytest.mark.slow
def test_every_function_reflects(files):
    counts = collections.Counter()
    for path in files:
        lib = tm.load(path)
        for name in lib.function_names:
            function = lib[name]
            reflection = function.reflection
            assert reflection.signature.startswith(f"{function.type} "), (path.name, name)
            for argument in reflection.arguments:
                if argument.kind in ("buffer", "threadgroup"):
                    assert argument.address_space in ("device", "constant", "threadgroup"), (path.name, name)
            counts[function.air_version] += 1
    assert set(counts) >= {(2, 4), (2, 5), (2, 6), (2, 7), (2, 8)}, counts


def test_air_2_4_address_spaces_come_from_the_ir(files):
    """gpt4all's AIR 2.4 leaves 'air.address_space' out; the IR pointer type says it."""
    path = next(p for p in files if p.name.startswith("gpt4all-2.7.0"))
    add = tm.load(path).kernel_add
    assert add.air_version == (2, 4)
    buffers = {a.name: (a.address_space, a.access) for a in add.buffers}
    assert buffers["src0"] == ("device", "read") and buffers["dst"][0] == "device"
    assert all("air.address_space" not in dict(a.extra) for a in add.buffers)


def test_vertex_and_fragment_functions_reflect_and_refuse_calls(files):
    lib = tm.load(next(p for p in files if p.name.startswith("psychmetal")))
    types = collections.Counter(lib[name].type for name in lib.function_names)
    assert types == {"vertex": 6, "fragment": 8}
    vertex = lib.svmain
    assert vertex.signature.startswith("vertex auto svmain(uint vid [[vertex_id]], uint iid [[instance_id]], ")
    assert [b.binding for b in vertex.buffers] == [0, 1, 2]
    assert {a.kind for a in lib.tfmain.arguments} >= {"texture", "sampler", "builtin"}
    with pytest.raises(tm.UnsupportedKernelError, match="svmain: cannot be called: it is a vertex function"):
        vertex(torch.empty(4))


def test_damaged_module_is_refused_before_llvm(files):
    """A flipped module byte breaks the function's HASH: reflection and calls raise
    MetallibFormatError naming the function and the module's bytes; LLVM never sees it."""
    path = next(p for p in files if p.name.startswith("gpt4all-2.7.0"))
    data = bytearray(path.read_bytes())
    lib = tm.load(bytes(data))
    function = lib.kernel_add
    start, size = function._record["module_offset"], function.module_size
    data[start + size // 2] ^= 0x40
    damaged = tm.load(bytes(data))
    assert hashlib.sha256(damaged.kernel_add.module).digest() != bytes.fromhex(damaged.kernel_add.hash)
    with pytest.raises(tm.MetallibFormatError) as caught:
        damaged.kernel_add.reflection
    assert "'kernel_add' HASH" in str(caught.value)
    assert f"module (bytes {start} to {start + size})" in str(caught.value)
    assert damaged.kernel_mul.reflection.function == "kernel_mul"  # the others are fine
