"""Metal 4's tensors in device and threadgroup memory as AIR hands them around: a
``tensor_inline`` descriptor in thread memory, which the ``air.*_private_tensor``
intrinsics create, slice and query and matmul2d's tensor operations read (tensor_ops.py,
csrc/cpu/tensor_ops.cpp: TmTensorDescriptor).

A kernel only passes a descriptor's address and allocates ``air.get_descriptor_size_tensor``
bytes for it, so the layout is the CPU backend's own: the data pointer (8 bytes), the
element offset of the view's first element (8 bytes: a slice moves it, as a slice does not
know the element size), then the extents and the strides (in elements), one per dimension,
dimension 0 innermost (a matrix's columns), in the index type: 4 bytes for the ``.i32``
forms, the only ones Apple's compilers have been seen to emit.
"""

import re
from typing import List, Optional, Tuple

from .collectives import _definition

__all__ = ["define_private_tensor", "HEADER_BYTES"]

HEADER_BYTES = 16  # data pointer, origin
_MEMCPY = "declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)"
_SLICE = "declare void @tm_rt_tensor_slice(ptr, ptr, i32, ptr, ptr)"


def define_private_tensor(ret: str, name: str, params: List[str]) -> Optional[Tuple[str, List[str]]]:
    """(definition, declarations) of an ``air.*_private_tensor`` intrinsic, or None."""
    if name == "air.get_descriptor_size_tensor" and params == ["i16", "i16"] and ret == "i16":
        lines = ["%per = mul i16 %a0, %a1", "%both = mul i16 %per, 2", f"%r = add i16 %both, {HEADER_BYTES}"]
        return _definition(ret, name, params, lines), []
    init = re.fullmatch(r"air\.init_strided_private_tensor\.i32\.(global|local|constant)", name)
    if init and len(params) == 6 and params[0] == "ptr" and params[1] == "i16" and params[2].startswith("ptr") \
            and params[3:] == ["ptr", "ptr", "i8"] and ret == "void":
        data = ("%data = getelementptr i8, ptr %a2, i64 0" if params[2] == "ptr"
                else f"%data = addrspacecast {params[2]} %a2 to ptr")
        lines = [data, "store ptr %data, ptr %a0", "%origin = getelementptr i8, ptr %a0, i64 8",
                 "store i64 0, ptr %origin", "%rank = zext i16 %a1 to i64", "%bytes = mul i64 %rank, 4",
                 f"%extents = getelementptr i8, ptr %a0, i64 {HEADER_BYTES}",
                 "call void @llvm.memcpy.p0.p0.i64(ptr %extents, ptr %a3, i64 %bytes, i1 false)",
                 "%strides = getelementptr i8, ptr %extents, i64 %bytes",
                 "call void @llvm.memcpy.p0.p0.i64(ptr %strides, ptr %a4, i64 %bytes, i1 false)"]
        return _definition(ret, name, params, lines), [_MEMCPY]
    if name == "air.slice_private_tensor_private_tensor.s.i32" and params == ["ptr", "ptr", "i16", "ptr", "ptr"] \
            and ret == "void":
        lines = ["%rank = zext i16 %a2 to i32",
                 "call void @tm_rt_tensor_slice(ptr %a0, ptr %a1, i32 %rank, ptr %a3, ptr %a4)"]
        return _definition(ret, name, params, lines), [_SLICE]
    if name == "air.get_extent_private_tensor.i32" and params == ["ptr", "i16", "i16"] and ret == "i32":
        lines = ["%dimension = zext i16 %a2 to i64", "%offset = mul i64 %dimension, 4",
                 f"%at = add i64 %offset, {HEADER_BYTES}", "%p = getelementptr i8, ptr %a0, i64 %at",
                 "%r = load i32, ptr %p"]
        return _definition(ret, name, params, lines), []
    return None
