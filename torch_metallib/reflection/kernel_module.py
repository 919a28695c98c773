"""A one-kernel AIR module written as LLVM IR text, laid out as Apple's compiler writes one:
its triple and datalayout, module flags, version and compile-option metadata, and the
``!air.kernel`` node with the kernel's argument nodes (those tests/fixtures/vector_add_float.ll
mirrors). The doctor's self-test kernels and the tests' hand-written kernels are written
through it, so they load, reflect and run like Apple-built ones.
"""

from typing import Sequence

__all__ = ["kernel_module", "buffer_node", "builtin_node"]

_DATALAYOUT = ("e-p:64:64:64-i1:8:8-i8:8:8-i16:16:16-i32:32:32-i64:64:64-f32:32:32-f64:64:64-v16:16:16-v24:32:32-"
               "v32:32:32-v48:64:64-v64:64:64-v96:128:128-v128:128:128-v192:256:256-v256:256:256-v512:512:512-"
               "v1024:1024:1024-n8:16:32")
_TRIPLE = "air64_v26-apple-macosx14.0.0"
# What the compiler gives a kernel function; a kernel that waits for other threads is also convergent.
_KERNEL_ATTRIBUTES = ('mustprogress nounwind "frame-pointer"="all" "min-legal-vector-width"="0" "no-builtins" '
                      '"no-trapping-math"="true" "stack-protector-buffer-size"="8"')
# Nodes !0-!14; !15-!17 are the kernel's, its argument nodes follow from !18.
_MODULE_METADATA = """!llvm.module.flags = !{!0, !1, !2, !3, !4, !5, !6, !7, !8}
!llvm.ident = !{!9}
!air.version = !{!10}
!air.language_version = !{!11}
!air.compile_options = !{!12, !13, !14}
!air.kernel = !{!15}

!0 = !{i32 2, !"SDK Version", [2 x i32] [i32 26, i32 5]}
!1 = !{i32 1, !"wchar_size", i32 4}
!2 = !{i32 7, !"frame-pointer", i32 2}
!3 = !{i32 7, !"air.max_device_buffers", i32 31}
!4 = !{i32 7, !"air.max_constant_buffers", i32 31}
!5 = !{i32 7, !"air.max_threadgroup_buffers", i32 31}
!6 = !{i32 7, !"air.max_textures", i32 128}
!7 = !{i32 7, !"air.max_read_write_textures", i32 8}
!8 = !{i32 7, !"air.max_samplers", i32 16}
!9 = !{!"Apple metal version 32023.883 (metalfe-32023.883)"}
!10 = !{i32 2, i32 6, i32 0}
!11 = !{!"Metal", i32 3, i32 1, i32 0}
!12 = !{!"air.compile.denorms_disable"}
!13 = !{!"air.compile.fast_math_disable"}
!14 = !{!"air.compile.framebuffer_fetch_enable"}
"""
_FIRST_ARGUMENT_NODE = 18


def kernel_module(name: str, definitions: str, argument_nodes: Sequence[str], convergent: bool,
                  attributes: Sequence[str]) -> str:
    """The module of kernel `name`. `definitions`: its globals, functions and declarations
    as IR text, the kernel's definition with attribute group #0 (convergent where
    `convergent`), the others with #1, #2, ... as `attributes` lists them;
    `argument_nodes`: the kernel's argument nodes in parameter order (``buffer_node``,
    ``builtin_node``)."""
    groups = [("convergent " if convergent else "") + _KERNEL_ATTRIBUTES, *attributes]
    refs = ", ".join(f"!{_FIRST_ARGUMENT_NODE + i}" for i in range(len(argument_nodes)))
    return (f'source_filename = "{name}"\ntarget datalayout = "{_DATALAYOUT}"\ntarget triple = "{_TRIPLE}"\n\n'
            "@llvm.global_ctors = appending global [0 x { i32, ptr, ptr }] zeroinitializer\n\n"
            + definitions.strip("\n") + "\n\n"
            + "".join(f"attributes #{i} = {{ {group} }}\n" for i, group in enumerate(groups)) + "\n"
            + _MODULE_METADATA
            + f"!15 = !{{ptr @{name}, !16, !17}}\n!16 = !{{}}\n!17 = !{{{refs}}}\n"
            + "".join(f"!{_FIRST_ARGUMENT_NODE + i} = {node}\n" for i, node in enumerate(argument_nodes)))


def buffer_node(position: int, name: str, type_name: str, size: int, *, slot: int, access: str,
                space: int = 1) -> str:
    """The argument node of a buffer of Metal type `type_name` (`size` bytes, aligned to
    its size) at ``[[buffer(slot)]]`` (``[[threadgroup(slot)]]`` in address space 3);
    `access`: ``air.read``, ``air.write`` or ``air.read_write``."""
    return (f'!{{i32 {position}, !"air.buffer", !"air.location_index", i32 {slot}, i32 1, !"{access}", '
            f'!"air.address_space", i32 {space}, !"air.arg_type_size", i32 {size}, '
            f'!"air.arg_type_align_size", i32 {size}, !"air.arg_type_name", !"{type_name}", !"air.arg_name", '
            f'!"{name}"}}')


def builtin_node(position: int, builtin: str, name: str) -> str:
    """The argument node of a ``uint`` builtin, `builtin` as AIR names it
    (``air.thread_position_in_grid``)."""
    return f'!{{i32 {position}, !"{builtin}", !"air.arg_type_name", !"uint", !"air.arg_name", !"{name}"}}'
