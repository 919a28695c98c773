"""Bad kernel calls on CPU tensors: one named case per mistake, each refused before
anything runs.

Every case asserts
* the exact exception type (KernelArgumentError / DispatchError / UnsupportedKernelError),
  that it is also the matching builtin (TypeError / ValueError / NotImplementedError) and a
  TorchMetallibError;
* the key fragments of its message: the kernel's name, the argument's index and name
  where there is one, what was expected, what was found and the remedy where it gives one;
* that every tensor passed to the call is untouched: outputs are filled with a sentinel bit
  pattern (a NaN payload for float32) and the *whole storage* of every CPU tensor, inputs
  included, is compared byte for byte with a copy taken before the call.

Kernels: Apple-built `mlx.metallib` (`mlx_lib`) and the project's fixtures
(`fixture_metallib`); signatures are in the comments of the sections below.
"""

import dataclasses
import struct
from typing import Callable, Dict, List, Tuple

import llvmlite.binding as llvm
import numpy
import pytest
import torch

import torch_metallib as tm
from conftest import FIXTURES, fixture_bitcode

KAE = tm.KernelArgumentError
DE = tm.DispatchError
UKE = tm.UnsupportedKernelError
BUILTIN_BASE = {KAE: TypeError, DE: ValueError, UKE: NotImplementedError}

NAN_BITS = 0x7FC0FFEE  # a quiet NaN with a payload: no kernel computes this by accident
FILL_BYTE = 0xA5


# --- tensors -------------------------------------------------------------------------------

def out(n, dtype=torch.float32, pad=8):
    """An output of `n` elements filled with the sentinel, followed in its storage by `pad`
    more sentinel elements (so a write past its end is seen too)."""
    buffer = torch.empty(n + pad, dtype=dtype)
    if dtype == torch.float32:
        buffer.view(torch.int32).fill_(NAN_BITS)
    elif dtype == torch.bool:
        buffer.fill_(True)
    else:
        buffer.view(torch.uint8).fill_(FILL_BYTE)
    return buffer[:n]


def inp(n, dtype=torch.float32):
    return (torch.arange(n) % 7 + 1).to(dtype)


def meta(n, dtype=torch.float32):
    return torch.zeros(n, dtype=dtype, device="meta")


def params(alpha=2.0, n=4) -> bytes:
    """struct Params { float alpha; uint n; } of struct_arg_axpy: 8 bytes."""
    return struct.pack("<fI", alpha, n)


def tensors_in(values) -> List[torch.Tensor]:
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(tensors_in(value))
        elif isinstance(value, dict):
            found.extend(tensors_in(value.values()))
    return found


def storage_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of the whole storage behind `tensor`, as bytes."""
    return torch.empty(0, dtype=torch.uint8).set_(tensor.untyped_storage()).clone()


# --- cases -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    library: str           # "mlx", "fixtures", "vertex" or "unknown_intrinsic"
    kernel: str
    build: Callable[[], Tuple[tuple, dict]]   # -> (positional args, keyword args)
    error: type
    fragments: Tuple[str, ...]


def call(*args, **kwargs):
    return lambda: (args, kwargs)


CASES: List[Case] = []


def case(id, library, kernel, error, fragments, build):
    CASES.append(Case(id, library, kernel, build, error, tuple(fragments)))


# vv_Addfloat32(device const float* a [[buffer(0)]], device const float* b [[buffer(1)]],
#               device float* c [[buffer(2)]], constant uint& size [[buffer(3)]])  -- size unused
ADD = "vv_Addfloat32"

# --- argument count and names
case("too_many_positional", "mlx", ADD, KAE,
     ["expected at most 4 arguments", "(a, b, c, size)", "got 5"],
     lambda: ((inp(4), inp(4), out(4), 4, 5), {}))
case("unknown_keyword", "mlx", ADD, KAE,
     ["no argument named 'd'", "expected one of: a, b, c, size"],
     lambda: ((inp(4), inp(4), out(4)), {"d": out(4)}))
case("input_positional_and_keyword", "mlx", ADD, KAE,
     ["argument 0 'a'", "buffer(0)", "device const float*", "given twice", "by position and by name"],
     lambda: ((inp(4), inp(4), out(4)), {"a": inp(4)}))
case("output_positional_and_keyword", "mlx", ADD, KAE,
     ["argument 2 'c'", "buffer(2)", "device float*", "given twice", "by position and by name"],
     lambda: ((inp(4), inp(4), out(4)), {"c": out(4)}))
case("missing_output", "mlx", ADD, KAE,
     ["missing argument 2 'c'", "buffer(2), device float*", "pass it by position or as c=..."],
     lambda: ((inp(4), inp(4)), {}))
case("missing_first_input_with_keywords", "mlx", ADD, KAE,
     ["missing argument 0 'a'", "device const float*", "as a=..."],
     lambda: ((), {"b": inp(4), "c": out(4)}))
case("none_for_output", "mlx", ADD, KAE,
     ["missing argument 2 'c'", "as c=..."],
     lambda: ((inp(4), inp(4), None), {}))

# --- tensor dtypes
case("float64_for_float_input", "mlx", ADD, KAE,
     ["argument 0 'a'", "device const float*", "expected a tensor of torch.float32", "got torch.float64",
      ".to(torch.float32)"],
     lambda: ((inp(4, torch.float64), inp(4), out(4)), {}))
case("int32_for_float_input", "mlx", ADD, KAE,
     ["argument 1 'b'", "expected a tensor of torch.float32", "got torch.int32", ".to(torch.float32)"],
     lambda: ((inp(4), inp(4, torch.int32), out(4)), {}))
case("float64_for_float_output", "mlx", ADD, KAE,
     ["argument 2 'c'", "device float*", "expected a tensor of torch.float32", "got torch.float64"],
     lambda: ((inp(4), inp(4), out(4, torch.float64)), {}))
# vv_Adduint32(device const uint* a, device const uint* b, device uint* c, constant uint& size):
# uint takes torch.uint32 or torch.int32 (same bits), never int64.
case("int64_for_uint_buffer", "mlx", "vv_Adduint32", KAE,
     ["argument 0 'a'", "device const uint*", "expected a tensor of torch.uint32 or torch.int32",
      "got torch.int64", ".to(torch.uint32)"],
     lambda: ((inp(4, torch.int64), inp(4, torch.int32), out(4, torch.int32)), {}))
case("int64_tensor_for_uint_reference", "mlx", ADD, KAE,
     ["argument 3 'size'", "constant uint&", "torch.uint32 or torch.int32", "got torch.int64"],
     lambda: ((inp(4), inp(4), out(4), torch.tensor([4], dtype=torch.int64)), {}))
# vv_Equalfloat32(device const float* a, device const float* b, device bool* c, constant uint& size)
case("float32_for_bool_output", "mlx", "vv_Equalfloat32", KAE,
     ["argument 2 'c'", "device bool*", "expected a tensor of torch.bool", "got torch.float32", ".to(torch.bool)"],
     lambda: ((inp(4), inp(4), out(4)), {}))
case("uint8_for_bool_output", "mlx", "vv_Equalfloat32", KAE,
     ["argument 2 'c'", "expected a tensor of torch.bool", "got torch.uint8"],
     lambda: ((inp(4), inp(4), out(4, torch.uint8)), {}))

# --- outputs that are not tensors
case("python_float_for_output", "mlx", ADD, KAE,
     ["argument 2 'c'", "the kernel writes to it", "expected a tensor", "got 1.0 (float)"],
     lambda: ((inp(4), inp(4), 1.0), {}))
case("list_for_output", "mlx", ADD, KAE,
     ["argument 2 'c'", "the kernel writes to it", "expected a tensor", "got [1.0, 2.0] (list)"],
     lambda: ((inp(4), inp(4), [1.0, 2.0]), {}))
case("bytearray_for_output", "mlx", ADD, KAE,
     ["argument 2 'c'", "the kernel writes to it", "expected a tensor", "(bytearray)"],
     lambda: ((inp(4), inp(4), bytearray(16)), {}))

# --- Python numbers that do not fit the Metal type
case("uint_2_pow_32", "mlx", ADD, KAE,
     ["argument 3 'size'", "constant uint&", "expected an integer that fits uint", "got 4294967296, out of range"],
     lambda: ((inp(4), inp(4), out(4), 2**32), {}))
case("uint_negative", "mlx", ADD, KAE,
     ["argument 3 'size'", "an integer that fits uint", "got -1, out of range"],
     lambda: ((inp(4), inp(4), out(4)), {"size": -1}))
case("uint_given_float", "mlx", ADD, KAE,
     ["argument 3 'size'", "an integer that fits uint", "got the float 1.5"],
     lambda: ((inp(4), inp(4), out(4), 1.5), {}))
case("uint_given_str", "mlx", ADD, KAE,
     ["argument 3 'size'", "an integer that fits uint", "got a str"],
     lambda: ((inp(4), inp(4), out(4), "4"), {}))
case("uint_0d_tensor_out_of_range", "mlx", ADD, KAE,
     ["argument 3 'size'", "an integer that fits uint", "4294967296, out of range"],
     lambda: ((inp(4), inp(4), out(4), torch.tensor(2**32)), {}))
# sdpa_blocked_causal_mask_bfloat16(device bfloat* scores, constant int& tile_rows, constant int& columns)
case("int_given_float", "mlx", "sdpa_blocked_causal_mask_bfloat16", KAE,
     ["argument 1 'tile_rows'", "constant int&", "expected an integer that fits int", "got the float 2.5"],
     lambda: ((out(4, torch.bfloat16), 2.5, 2), {}))
case("int_2_pow_31", "mlx", "sdpa_blocked_causal_mask_bfloat16", KAE,
     ["argument 2 'columns'", "constant int&", "an integer that fits int", "got 2147483648, out of range"],
     lambda: ((out(4, torch.bfloat16), 1, 2**31), {}))
# rbitsc(device const uint* keys, device char* out, constant bool& odd, constant ulong& bytes_per_key)
case("bool_given_2", "mlx", "rbitsc", KAE,
     ["argument 2 'odd'", "constant bool&", "expected a bool", "got 2"],
     lambda: ((inp(4, torch.int32), out(4, torch.int8), 2, 4), {}))
case("bool_given_float", "mlx", "rbitsc", KAE,
     ["argument 2 'odd'", "constant bool&", "expected a bool", "got the float 0.5"],
     lambda: ((inp(4, torch.int32), out(4, torch.int8), 0.5, 4), {}))
case("ulong_negative", "mlx", "rbitsc", KAE,
     ["argument 3 'bytes_per_key'", "constant ulong&", "an integer that fits ulong", "got -1, out of range"],
     lambda: ((inp(4, torch.int32), out(4, torch.int8), True, -1), {}))
case("ulong_2_pow_64", "mlx", "rbitsc", KAE,
     ["argument 3 'bytes_per_key'", "an integer that fits ulong", "got 18446744073709551616, out of range"],
     lambda: ((inp(4, torch.int32), out(4, torch.int8), True, 2**64), {}))
# arangefloat32(constant float& start, constant float& step, device float* out).
# float(10**400) overflows: the call must be refused like any value that does not fit.
case("float_given_int_beyond_double", "mlx", "arangefloat32", KAE,
     ["argument 0 'start'", "constant float&"],
     lambda: ((10**400, 1.0, out(4)), {}))

# --- sequences and structs
# g2_Addfloat32(a, b, c, constant long (&a_strides)[2] [[buffer(3)]], constant long (&b_strides)[2])
case("array_ref_one_element", "mlx", "g2_Addfloat32", DE,
     ["argument 3 'a_strides'", "expected 16 bytes", "got 8", "from [1]"],
     lambda: ((inp(4), inp(4), out(4), [1], [2, 1]), {"threads": (2, 2)}))
case("array_ref_empty_list", "mlx", "g2_Addfloat32", KAE,
     ["argument 4 'b_strides'", "expected a number or a sequence of numbers", "got []"],
     lambda: ((inp(4), inp(4), out(4), [2, 1], []), {"threads": (2, 2)}))
case("array_ref_float_element", "mlx", "g2_Addfloat32", KAE,
     ["argument 3 'a_strides'", "an integer that fits long", "got the float 1.5"],
     lambda: ((inp(4), inp(4), out(4), [2, 1.5], [2, 1]), {"threads": (2, 2)}))
# struct_arg_axpy(device const float* x, device float* y, constant Params& p), Params = 8 bytes
case("struct_given_float", "fixtures", "struct_arg_axpy", KAE,
     ["argument 2 'p'", "constant Params&", "'Params' is not a scalar or vector type",
      "expected a tensor or bytes of its 8-byte layout", "got 1.0"],
     lambda: ((inp(4), out(4), 1.0), {}))
case("struct_given_list", "fixtures", "struct_arg_axpy", KAE,
     ["argument 2 'p'", "'Params' is not a scalar or vector type", "8-byte layout", "got [2.0, 4]"],
     lambda: ((inp(4), out(4), [2.0, 4]), {}))
case("struct_given_4_bytes", "fixtures", "struct_arg_axpy", DE,
     ["argument 2 'p'", "constant Params&", "expected 8 bytes", "got 4"],
     lambda: ((inp(4), out(4), struct.pack("<f", 2.0)), {}))
case("struct_given_4_byte_tensor", "fixtures", "struct_arg_axpy", DE,
     ["argument 2 'p'", "expected at least 8 bytes", "got a tensor with 4 bytes"],
     lambda: ((inp(4), out(4)), {"p": torch.tensor([2.0])}))
case("empty_tensor_for_uint_reference", "mlx", ADD, DE,
     ["argument 3 'size'", "constant uint&", "expected at least 4 bytes", "got a tensor with 0 bytes"],
     lambda: ((inp(4), inp(4), out(4), torch.empty(0, dtype=torch.int32)), {}))
case("empty_tensor_for_float_reference", "mlx", "arangefloat32", DE,
     ["argument 0 'start'", "constant float&", "expected at least 4 bytes", "got a tensor with 0 bytes"],
     lambda: ((torch.empty(0), 1.0, out(4)), {}))

# --- what the plan can know would go wrong, refused in every mode
case("empty_output_tensor", "mlx", ADD, DE,
     ["argument 2 'c'", "expected a tensor with elements, got an empty one", "its 64 threads",
      "Pass a tensor with elements"],
     lambda: ((inp(64), inp(64), torch.empty(0)), {}))
case("float_scalar_out_of_range", "fixtures", "scale_shift_float", KAE,
     ["argument 2 'scale'", "expected a number within float's range", "got 1e+300, out of range"],
     lambda: ((inp(4), out(4), 1e300, 0.0), {}))
case("leaf_that_requires_grad_written", "mlx", ADD, KAE,
     ["argument 2 'c'", "the kernel writes to it", "leaf tensor that requires grad", "torch.no_grad()"],
     lambda: ((inp(4), inp(4), torch.zeros(4, requires_grad=True)), {}))
case("sparse_tensor", "mlx", ADD, KAE,
     ["argument 0 'a'", "expected a dense (strided) tensor", "layout torch.sparse_coo", "x.to_dense()"],
     lambda: ((inp(4).to_sparse(), inp(4), out(4)), {}))
case("numpy_array", "mlx", ADD, KAE,
     ["argument 1 'b'", "expected a tensor, got a numpy.ndarray", "torch.from_numpy(x)"],
     lambda: ((inp(4), numpy.ones(4, numpy.float32), out(4)), {}))

# --- devices (meta tensors exist on every machine)
case("meta_input_after_cpu", "mlx", ADD, KAE,
     ["argument 1 'b'", "expected a tensor on cpu", "got one on meta", "Move all tensors to one device"],
     lambda: ((inp(4), meta(4), out(4)), {}))
case("cpu_output_after_meta_inputs", "mlx", ADD, KAE,
     ["argument 2 'c'", "on meta", "on cpu", "one device"],
     lambda: ((meta(4), meta(4), out(4)), {}))
case("all_meta_of_wrong_dtype", "mlx", ADD, KAE,
     ["argument 0 'a'", "expected a tensor of torch.float32", "got torch.float64"],
     lambda: ((meta(4).double(), meta(4), meta(4)), {}))
# A 0-d CPU tensor for a value argument is read with .item(); a meta one has no value and
# binds as a buffer, so the call mixes devices and must be refused as such, not fail
# inside torch. (A 0-d tensor of the wrong dtype is refused for its dtype first.)
case("meta_0d_value_then_cpu_output", "mlx", "arangefloat32", KAE,
     ["argument 2 'out'", "expected a tensor on meta", "got one on cpu"],
     lambda: ((torch.tensor(1.0, device="meta"), 0.5, out(4)), {}))
case("meta_0d_value_of_another_dtype", "mlx", "arangefloat32", KAE,
     ["argument 0 'start'", "expected a tensor of torch.float32, got torch.int64"],
     lambda: ((torch.tensor(1, device="meta"), 0.5, out(4)), {}))

# --- threads and group_size
THREADS_EXPECTED = "threads: expected a positive int or 1-3 positive ints below 2**32"
for name, threads, shown in [
    ("threads_0", 0, "got 0"),
    ("threads_negative", -1, "got -1"),
    ("threads_4_dims", (1, 2, 3, 4), "got (1, 2, 3, 4)"),
    ("threads_2_pow_32", 2**32, "got 4294967296"),
    ("threads_str", "8", "got '8'"),
    ("threads_bool", True, "got True"),
    ("threads_float_dim", (2.0,), "got (2.0,)"),
    ("threads_empty_tuple", (), "got ()"),
    ("threads_zero_dim_in_list", [4, 0], "got [4, 0]"),
]:
    case(name, "mlx", ADD, DE, [THREADS_EXPECTED, shown],
         (lambda threads: lambda: ((inp(4), inp(4), out(4)), {"threads": threads}))(threads))
GROUP_EXPECTED = "group_size: expected at most 1024 threads per threadgroup (at most 1024 x 1024 x 64)"
for name, group, shown in [
    ("group_size_2048", 2048, "got 2048 x 1 x 1"),
    ("group_size_1024x2", (1024, 2), "got 1024 x 2 x 1"),
    ("group_size_z_128", (1, 1, 128), "got 1 x 1 x 128"),
]:
    case(name, "mlx", ADD, DE, [GROUP_EXPECTED, shown],
         (lambda group: lambda: ((inp(4), inp(4), out(4)), {"group_size": group}))(group))
case("group_size_0", "mlx", ADD, DE,
     ["group_size: expected a positive int or 1-3 positive ints below 2**32", "got 0"],
     lambda: ((inp(4), inp(4), out(4)), {"group_size": 0}))
case("too_many_threadgroups", "mlx", ADD, DE,
     ["threads / group_size: expected fewer than 2**32 threadgroups", "Use a larger group_size"],
     lambda: ((inp(4), inp(4), out(4)), {"threads": (2**32 - 1, 2**32 - 1), "group_size": 1}))
# Default threads = numel of the first tensor: an empty one gives no thread count. (Every
# mlx/fixture kernel that can run has a tensor output, so "no tensor at all" cannot occur.)
case("default_threads_first_tensor_empty", "mlx", ADD, DE,
     ["threads: no tensor argument to take the thread count from", "(the first tensor is empty)",
      "pass threads=N"],
     lambda: ((torch.empty(0), inp(4), out(4)), {}))
case("default_threads_empty_output_only_tensor", "mlx", "arangefloat32", DE,
     ["threads: no tensor argument", "the first tensor is empty", "pass threads=N"],
     lambda: ((0.0, 1.0, out(0)), {}))

# --- function constants
# function_constant_scale(device const float* in, device float* out,
#     device const float* bias [[function_constant(use_bias)]]),
# constant bool use_bias [[function_constant(0)]], constant float alpha [[function_constant(1)]]
FCS = "function_constant_scale"
case("constant_missing_one", "fixtures", FCS, DE,
     ["missing function constants: alpha (float, index 1)", "Pass them as constants={name: value, ...}"],
     lambda: ((inp(4), out(4)), {"constants": {"use_bias": False}}))
case("constants_not_given", "fixtures", FCS, DE,
     ["missing function constants: use_bias (bool, index 0), alpha (float, index 1)", "constants={"],
     lambda: ((inp(4), out(4)), {}))
case("constant_unknown_name", "fixtures", FCS, DE,
     ["constants: no function constant 'beta'", "expected one of: use_bias (0), alpha (1)"],
     lambda: ((inp(4), out(4)), {"constants": {"use_bias": False, "alpha": 1.0, "beta": 1}}))
case("constant_unknown_index", "fixtures", FCS, DE,
     ["constants: no function constant 5", "expected one of: use_bias (0), alpha (1)"],
     lambda: ((inp(4), out(4)), {"constants": {"use_bias": False, "alpha": 1.0, 5: 1}}))
case("constant_float_for_bool", "fixtures", FCS, DE,
     ["function constant use_bias (bool, index 0)", "expected a bool", "got the float 0.5"],
     lambda: ((inp(4), out(4)), {"constants": {"use_bias": 0.5, "alpha": 1.0}}))
case("constant_2_for_bool", "fixtures", FCS, DE,
     ["function constant use_bias (bool, index 0)", "expected a bool", "got 2"],
     lambda: ((inp(4), out(4)), {"constants": {0: 2, "alpha": 1.0}}))
case("constant_str_for_float", "fixtures", FCS, DE,
     ["function constant alpha (float, index 1)", "expected a number", "got a str"],
     lambda: ((inp(4), out(4)), {"constants": {"use_bias": False, "alpha": "2"}}))
case("constant_int_beyond_double_for_float", "fixtures", FCS, DE,
     ["function constant alpha (float, index 1)"],
     lambda: ((inp(4), out(4)), {"constants": {"use_bias": False, "alpha": 10**400}}))
case("constant_given_twice", "fixtures", FCS, DE,
     ["constants: use_bias is given twice (by name and by index)"],
     lambda: ((inp(4), out(4)), {"constants": {"use_bias": False, "alpha": 1.0, 0: False}}))
case("constants_not_a_dict", "fixtures", FCS, KAE,
     ["constants: expected a dict of name or index -> value", "got [('use_bias', False)]"],
     lambda: ((inp(4), out(4)), {"constants": [("use_bias", False)]}))
case("constants_for_kernel_without_constants", "mlx", ADD, DE,
     ["constants: no function constant 'x'", "none (the kernel declares no function constants)"],
     lambda: ((inp(4), inp(4), out(4)), {"constants": {"x": 1}}))
case("guarded_argument_by_keyword_guard_false", "fixtures", FCS, DE,
     ["argument 2 'bias'", "is left out because function constant use_bias is false",
      "set constants={'use_bias': True} or drop it"],
     lambda: ((inp(4), out(4)), {"bias": inp(4), "constants": {"use_bias": False, "alpha": 2.0}}))
case("guarded_argument_positional_guard_false", "fixtures", FCS, KAE,
     ["expected at most 2 arguments (in, out; bias is left out because function constant "
      "use_bias is false)", "got 3"],
     lambda: ((inp(4), out(4), inp(4)), {"constants": {"use_bias": False, "alpha": 2.0}}))

# --- kernels the CPU backend cannot run
# --- threadgroup memory arguments
case("threadgroup_memory_size_missing", "fixtures", "threadgroup_sum_float", DE,
     ["argument 2 'scratch' (threadgroup(0), threadgroup float*)", "needs its size",
      "threadgroup_memory={0: nbytes}"],
     lambda: ((inp(8), out(2)), {"threads": 8, "group_size": 4}))
case("threadgroup_memory_not_multiple_of_16", "fixtures", "threadgroup_sum_float", DE,
     ["threadgroup_memory[0] (scratch)", "expected a positive multiple of 16 bytes", "got 20"],
     lambda: ((inp(8), out(2)), {"threads": 8, "group_size": 4, "threadgroup_memory": {0: 20}}))
case("threadgroup_memory_unknown_index", "fixtures", "threadgroup_sum_float", DE,
     ["threadgroup_memory: no threadgroup argument at index 1", "expected 0 (scratch)"],
     lambda: ((inp(8), out(2)), {"threads": 8, "group_size": 4, "threadgroup_memory": {0: 16, 1: 16}}))
case("threadgroup_memory_too_large", "fixtures", "threadgroup_sum_float", DE,
     ["expected at most 32768 bytes per threadgroup", "got 65536"],
     lambda: ((inp(8), out(2)), {"threads": 8, "group_size": 4, "threadgroup_memory": {0: 65536}}))
case("threadgroup_argument_given_a_value", "fixtures", "threadgroup_sum_float", KAE,
     ["argument 2 'scratch'", "is threadgroup memory, not a value", "threadgroup_memory={0: nbytes}"],
     lambda: ((inp(8), out(2)), {"scratch": inp(4), "threads": 8, "group_size": 4}))
case("unknown_intrinsic", "unknown_intrinsic", "vector_add_float", UKE,
     ["vector_add_float: the CPU backend has no implementation of air.made_up_op.f32",
      "Run it on a Mac with MPS tensors, or report the intrinsic"],
     lambda: ((inp(4), inp(4), out(4)), {}))
case("vertex_function", "vertex", "vector_add_float", UKE,
     ["cannot be called", "vertex function", "only kernel functions"],
     lambda: ((inp(4), inp(4), out(4)), {}))


def test_case_table_is_large_and_ids_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(CASES) >= 30


# --- the runner ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def libraries(request) -> Dict[str, Callable[[], tm.Library]]:
    """Libraries by name, loaded on first use (the MLX corpus may be unavailable)."""
    cache = {}

    def get(name):
        if name not in cache:
            if name == "mlx":
                cache[name] = request.getfixturevalue("mlx_lib")
            elif name == "fixtures":
                cache[name] = tm.load(request.getfixturevalue("fixture_metallib"))
            elif name == "vertex":
                cache[name] = tm.load(tm.pack([tm.FunctionSource(
                    "vector_add_float", fixture_bitcode("vector_add_float"), type="vertex")]))
            else:  # "unknown_intrinsic": the sum goes through an intrinsic no backend knows
                text = (FIXTURES / "vector_add_float.ll").read_text().replace(
                    "%10 = fadd float %7, %9",
                    "%10 = tail call float @air.made_up_op.f32(float %7, float %9)") + \
                    "declare float @air.made_up_op.f32(float, float)\n"
                module = llvm.parse_assembly(text, context=llvm.create_context())
                cache[name] = tm.load(tm.pack([tm.FunctionSource("vector_add_float", module.as_bitcode())]))
        return cache[name]

    return get


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_call_is_refused_and_writes_nothing(case: Case, libraries):
    kernel = libraries(case.library)[case.kernel]
    args, kwargs = case.build()
    tensors = [t for t in tensors_in(list(args) + list(kwargs.values()))
               if t.device.type == "cpu" and t.layout == torch.strided]
    before = [storage_bytes(t) for t in tensors]

    try:
        kernel(*args, **kwargs)
    except Exception as caught:  # noqa: BLE001 - the type is what is tested
        error = caught
    else:
        error = None

    touched = [i for i, (t, saved) in enumerate(zip(tensors, before)) if not torch.equal(storage_bytes(t), saved)]
    assert error is not None, f"{case.id}: the call was accepted (tensors touched: {touched})"
    assert type(error) is case.error, (
        f"{case.id}: expected {case.error.__name__}, got {type(error).__module__}.{type(error).__name__}: {error}")
    assert isinstance(error, tm.TorchMetallibError)
    assert isinstance(error, BUILTIN_BASE[case.error])
    message = str(error)
    assert message.startswith(f"{case.kernel}: "), message
    missing = [fragment for fragment in case.fragments if fragment not in message]
    assert not missing, f"{case.id}: {missing} not in message: {message}"
    assert not touched, f"{case.id}: refused, but tensors {touched} (of {len(tensors)}) were written"


# --- beside the table -----------------------------------------------------------------------------

def test_refusals_leave_the_kernels_usable(libraries):
    """The kernels of the table run correctly with good arguments, also right after a
    refused call with the same tensors (so the refusals above are about the arguments)."""
    mlx, fixtures = libraries("mlx"), libraries("fixtures")
    a, b, c = inp(10), inp(10) * 3, out(10)
    with pytest.raises(KAE):
        mlx.vv_Addfloat32(a, b, c, 4, 5)
    mlx.vv_Addfloat32(a, b, c)
    assert torch.equal(c, a + b)

    x, y = inp(6), out(6).fill_(1.0)
    fixtures.struct_arg_axpy(x, y, params(2.0, 6))
    assert torch.equal(y, 2.0 * x + 1.0)

    x, y = inp(5), out(5)
    with pytest.raises(DE):
        fixtures.function_constant_scale(x, y, bias=x, constants={"use_bias": False, "alpha": 2.0})
    fixtures.function_constant_scale(x, y, constants={"use_bias": False, "alpha": 2.0})
    assert torch.equal(y, 2.0 * x)

    a, b, c = inp(6).reshape(2, 3), inp(6).reshape(2, 3) * 2, out(6)
    mlx.g2_Addfloat32(a, b, c, [3, 1], [3, 1], threads=(3, 2))
    assert torch.equal(c, (a + b).reshape(-1))


def test_strided_memoryview_struct_is_packed_or_refused(libraries):
    """A non-contiguous memoryview whose logical bytes are a valid Params must either be
    packed by its logical bytes or refused; copying its raw memory instead hands the kernel
    bytes the caller never passed."""
    fixtures = libraries("fixtures")
    good = params(2.0, 4)
    interleaved = bytes(byte for pair in zip(good, b"\xff" * len(good)) for byte in pair)
    view = memoryview(interleaved)[::2]
    assert view.tobytes() == good and not view.contiguous
    x, y = inp(4), torch.ones(4)
    try:
        fixtures.struct_arg_axpy(x, y, view)
    except KAE as error:
        assert "struct_arg_axpy" in str(error) and "'p'" in str(error)
        assert torch.equal(y, torch.ones(4)), "refused, but y was written"
    else:
        assert torch.equal(y, 2.0 * x + 1.0), f"the kernel saw other bytes than the memoryview's: y = {y}"
