"""Small AIR kernels written on the fly, one per intrinsic variant under test: each thread
loads its operands from input buffers, calls the intrinsic once and stores the result.
The modules carry the AIR metadata a kernel needs (written by the package's
``reflection.kernel_module``: the module flags and node shapes of
tests/fixtures/vector_add_float.ll, which mirrors Apple's compiler output), so they go
through load, reflection, binding and the CPU backend like any Apple-built kernel.

``lane_kernel`` makes a per-lane kernel (``out[gid] = f(in0[gid], ...)``, vector operands
laid out as consecutive elements); ``simd_kernel`` the same for a SIMD-group function
(convergent, so every thread of a group must call it).
"""

import itertools
from typing import List

import llvmlite.binding as llvm

import torch_metallib as tm
from torch_metallib.reflection.kernel_module import buffer_node, builtin_node, kernel_module

# LLVM element type -> (Metal type name, bytes, LLVM type in memory)
_ELEMENTS = {
    "float": ("float", 4, "float"), "half": ("half", 2, "half"), "bfloat": ("bfloat", 2, "bfloat"),
    "i64": ("long", 8, "i64"), "i32": ("int", 4, "i32"), "i16": ("short", 2, "i16"),
    "i8": ("char", 1, "i8"), "i1": ("bool", 1, "i8"),
}
_UNSIGNED = {"i64": "ulong", "i32": "uint", "i16": "ushort", "i8": "uchar"}


def _split(type_name: str):
    """(lanes, element) of an LLVM scalar or vector type."""
    if type_name.startswith("<"):
        count, element = type_name[1:-1].split(" x ")
        return int(count), element
    return 1, type_name


def _metal_name(element: str, unsigned: bool) -> str:
    return _UNSIGNED[element] if unsigned and element in _UNSIGNED else _ELEMENTS[element][0]


def _module(name: str, intrinsic: str, ret: str, params: List[str], constants: List[str], unsigned: bool,
            collective: bool) -> str:
    """`out[gid] = intrinsic(in0[gid], ..., constants...)` for every thread."""
    body, operands = [], []
    buffers = params[:len(params) - len(constants)]
    counter = itertools.count()
    for index, param in enumerate(buffers):
        lanes, element = _split(param)
        memory = _ELEMENTS[element][2]
        value = "poison"
        for lane in range(lanes):
            n = next(counter)
            body += [f"%i{n} = mul i64 %gid64, {lanes}", f"%j{n} = add i64 %i{n}, {lane}",
                     f"%p{n} = getelementptr {memory}, ptr addrspace(1) %in{index}, i64 %j{n}",
                     f"%l{n} = load {memory}, ptr addrspace(1) %p{n}"]
            loaded = f"%l{n}"
            if element == "i1":
                body.append(f"%b{n} = trunc i8 %l{n} to i1")
                loaded = f"%b{n}"
            if lanes == 1:
                value = loaded
            else:
                body.append(f"%v{n} = insertelement {param} {value}, {element} {loaded}, i32 {lane}")
                value = f"%v{n}"
        operands.append(f"{param} {value}")
    operands += [f"{t} {c}" for t, c in zip(params[len(buffers):], constants)]
    body.append(f"%r = call {ret} @{intrinsic}({', '.join(operands)}) #2" if ret != "void"
                else f"call void @{intrinsic}({', '.join(operands)}) #2")
    lanes, element = _split(ret)
    memory = _ELEMENTS[element][2]
    for lane in range(lanes):
        n = next(counter)
        value = "%r"
        if lanes > 1:
            body.append(f"%e{n} = extractelement {ret} %r, i32 {lane}")
            value = f"%e{n}"
        if element == "i1":
            body.append(f"%z{n} = zext i1 {value} to i8")
            value = f"%z{n}"
        body += [f"%o{n} = mul i64 %gid64, {lanes}", f"%q{n} = add i64 %o{n}, {lane}",
                 f"%s{n} = getelementptr {memory}, ptr addrspace(1) %out, i64 %q{n}",
                 f"store {memory} {value}, ptr addrspace(1) %s{n}"]
    arguments = [(f"in{index}", _split(param)[1], "air.read") for index, param in enumerate(buffers)]
    arguments.append(("out", _split(ret)[1], "air.read_write"))
    declaration = f"declare {ret} @{intrinsic}({', '.join(params)}) local_unnamed_addr #1"
    return module_text(name, body, arguments, [declaration], collective, unsigned)


def module_text(name: str, body: List[str], arguments, declarations: List[str], collective: bool,
                unsigned: bool = False) -> str:
    """An AIR module whose kernel `name` takes device buffers `arguments` ((IR name,
    element type, "air.read" or "air.read_write")...) then ``uint gid [[thread_position_in_grid]]``
    (also as %gid64), and runs `body`. Calls to the intrinsics should carry attribute #2."""
    signature = [f'ptr addrspace(1) noundef "air-buffer-no-alias" %{argument}' for argument, _, _ in arguments]
    signature.append("i32 noundef %gid")
    nodes = [buffer_node(index, argument, _metal_name(element, unsigned), _ELEMENTS[element][1], slot=index,
                         access=access) for index, (argument, element, access) in enumerate(arguments)]
    nodes.append(builtin_node(len(arguments), "air.thread_position_in_grid", "gid"))
    definitions = (f"define weak_odr void @{name}({', '.join(signature)}) local_unnamed_addr #0 {{\n"
                   "entry:\n  %gid64 = zext i32 %gid to i64\n  " + "\n  ".join(body) + "\n  ret void\n}\n\n"
                   + "\n".join(declarations))
    declared = ("convergent mustprogress nounwind willreturn" if collective
                else "mustprogress nofree nosync nounwind willreturn memory(none)")
    called = f"{'convergent ' if collective else ''}nounwind willreturn"
    return kernel_module(name, definitions, nodes, True, [declared, called])


def library(name: str, text: str):
    module = llvm.parse_assembly(text, context=llvm.create_context())
    module.verify()
    return tm.load(tm.pack([tm.FunctionSource(name, module.as_bitcode())]))


def lane_kernel(intrinsic: str, ret: str, params: List[str], constants: List[str] = (), unsigned: bool = False):
    """The kernel function calling `intrinsic` per thread; trailing `constants` (IR
    literals) are passed as the last parameters instead of being loaded."""
    name = "k_" + intrinsic.replace(".", "_")
    return library(name, _module(name, intrinsic, ret, list(params), list(constants), unsigned, False))[name]


def simd_kernel(intrinsic: str, ret: str, params: List[str], constants: List[str] = (), unsigned: bool = False):
    """As lane_kernel, for a SIMD-group function (every thread of a group calls it)."""
    name = "s_" + intrinsic.replace(".", "_")
    return library(name, _module(name, intrinsic, ret, list(params), list(constants), unsigned, True))[name]
