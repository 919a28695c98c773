"""A Metal-like signature for a reflected kernel, e.g.
``kernel void f(device const float* a [[buffer(0)]], uint i [[thread_position_in_grid]])``."""

from typing import Sequence

from .air_arguments import Argument

__all__ = ["format_signature", "format_argument"]

# Argument.kind -> the Metal attribute naming its binding slot.
_BINDING_ATTRIBUTES = {"buffer": "buffer", "indirect_buffer": "buffer", "threadgroup": "threadgroup",
                       "texture": "texture", "sampler": "sampler"}

# LLVM types -> Metal's names, for what a pointer argument points to.
_METAL_NAMES = {"float": "float", "half": "half", "bfloat": "bfloat", "double": "double", "i64": "long",
                "i32": "int", "i16": "short", "i8": "char", "i1": "bool"}


def format_argument(argument: Argument) -> str:
    """One parameter as Metal source would declare it."""
    type_name = argument.type_name or argument.ir_type or "?"  # no air.arg_type_name: say what IR says
    if argument.is_builtin:
        declaration = f"{type_name} {argument.name}"
        attributes = [argument.builtin]
    elif argument.holds_pointer:  # the buffer's space after the pointee's, as C declares it
        pointee = _METAL_NAMES.get(argument.pointee_type, argument.pointee_type or "void")
        declaration = f"{argument.pointee_address_space} {pointee}* {argument.address_space}* {argument.name}"
        attributes = [f"buffer({argument.binding})"]
    elif argument.address_space is None:  # textures, samplers and unknown kinds: by value
        declaration = f"{type_name} {argument.name}"
        attributes = [f"{_BINDING_ATTRIBUTES.get(argument.kind, argument.kind)}({argument.binding})"]
    else:
        const = " const" if argument.access == "read" and argument.address_space == "device" else ""
        declaration = f"{argument.address_space}{const} {type_name}{_declarator(argument)}"
        attributes = [f"{_BINDING_ATTRIBUTES.get(argument.kind, argument.kind)}({argument.binding})"]
    if argument.function_constant is not None:
        attributes.append(f"function_constant({argument.function_constant})")
    return f"{declaration} [[{', '.join(attributes)}]]"


def _declarator(argument: Argument) -> str:
    """``* name`` for a pointer, ``& name`` for a reference (``buffer_size`` declared),
    ``(&name)[n]`` for a reference to an array of n elements, and for a buffer holding a
    pointer ``device float* device* name``."""
    if argument.buffer_size is None:
        return f"* {argument.name}"
    count = argument.buffer_size // argument.type_size if argument.type_size else 1
    return f"& {argument.name}" if count == 1 else f" (&{argument.name})[{count}]"


def format_signature(name: str, arguments: Sequence[Argument], function_type: str = "kernel") -> str:
    """The declaration; vertex and fragment functions show ``auto`` for their outputs."""
    ordered = sorted(arguments, key=lambda argument: argument.position)
    result = "void" if function_type == "kernel" else "auto"
    return f"{function_type} {result} {name}({', '.join(format_argument(a) for a in ordered)})"
