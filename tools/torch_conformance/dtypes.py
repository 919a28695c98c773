"""Metal type names in PyTorch's kernel names, their torch dtypes and ``c10::ScalarType`` codes."""

import torch

# The type tokens PyTorch's kernel names end with (``add_dense_float_float``).
METAL_DTYPES = {
    "bool": torch.bool, "uchar": torch.uint8, "char": torch.int8, "short": torch.int16,
    "int": torch.int32, "long": torch.int64, "ushort": torch.uint16, "uint": torch.uint32,
    "ulong": torch.uint64, "half": torch.float16, "float": torch.float32,
    "bfloat": torch.bfloat16, "half2": torch.complex32, "float2": torch.complex64,
}

# c10::ScalarType, as c10/metal/common.h numbers it (the kernels switch on these values).
SCALAR_TYPE_CODES = {
    torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4,
    torch.float16: 5, torch.float32: 6, torch.complex32: 8, torch.complex64: 9, torch.bool: 11,
    torch.bfloat16: 15, torch.uint16: 27, torch.uint32: 28, torch.uint64: 29,
}


def is_complex(dtype: torch.dtype) -> bool:
    return dtype in (torch.complex32, torch.complex64)


def is_floating(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


def is_integral(dtype: torch.dtype) -> bool:
    return not dtype.is_floating_point and not is_complex(dtype)


def wide(dtype: torch.dtype) -> torch.dtype:
    """The dtype references are computed in: float64, complex128, or int64."""
    if is_complex(dtype):
        return torch.complex128
    if dtype.is_floating_point:
        return torch.float64
    return torch.int64
