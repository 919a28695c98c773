"""Cross-checks of reflection against facts it does not derive them from, run over many
corpus kernels (in worker processes: reflecting all 17,248 MLX kernels takes ~18 s on
one core). Each check returns a list of problems; an empty list means it held."""

import re

import llvmlite.binding as llvm

import torch_metallib as tm
from torch_metallib.reflection.air_arguments import BUILTINS, decode_argument, decode_standard_argument
from torch_metallib.reflection.air_text import ModuleText

# Metal builtin type -> (components, bits per component).
_BUILTIN_SHAPES = {"uint": (1, 32), "uint2": (2, 32), "uint3": (3, 32),
                   "ushort": (1, 16), "ushort2": (2, 16), "ushort3": (3, 16)}
_POINTER_SPACES = {"device": "ptr addrspace(1)", "constant": "ptr addrspace(2)",
                   "threadgroup": "ptr addrspace(3)"}


def argument_problems(function) -> list:
    """Every argument's reflected fields agree with the IR parameter type and each other."""
    problems = []
    names = {c.name for c in function.function_constants if c.type == "bool"}
    for a in function.arguments:
        where = f"{function.name} argument {a.position} {a.name!r}"
        if a.is_builtin:
            if a.builtin not in BUILTINS:
                problems.append(f"{where}: unknown builtin {a.builtin}")
            if (a.components, a.component_bits) != _BUILTIN_SHAPES.get(a.type_name):
                problems.append(f"{where}: {a.type_name} but {a.components} x {a.component_bits} bits")
        else:
            if a.ir_type != _POINTER_SPACES.get(a.address_space):
                problems.append(f"{where}: {a.address_space} buffer with IR type {a.ir_type}")
            if a.binding is None or a.binding_count != 1 or a.access is None:
                problems.append(f"{where}: binding {a.binding} x {a.binding_count}, access {a.access}")
            if a.buffer_size is not None and (a.buffer_size == 0 or a.buffer_size % a.type_size):
                problems.append(f"{where}: reference of {a.buffer_size} bytes to a {a.type_size}-byte type")
            for field in a.struct_fields:
                end = field.offset + field.size * max(field.array_length, 1)
                if end > a.type_size:
                    problems.append(f"{where}: member {field.name} ends at {end} > {a.type_size}")
        if a.function_constant is not None and a.function_constant not in names:
            problems.append(f"{where}: guarded by {a.function_constant}, not a bool constant")
    bound = [(a.kind, a.binding) for a in function.buffers if a.function_constant is None]
    if len(bound) != len(set(bound)):
        problems.append(f"{function.name}: two unguarded arguments share a binding: {bound}")
    if tuple(function.function_constants) != tuple(function.declared_constants):
        problems.append(f"{function.name}: !air.function_constants {function.function_constants} "
                        f"!= CNST {function.declared_constants}")
    return problems


def check_kernels(path: str, names: list) -> dict:
    """Reflects `names` from the library at `path`. Returns failures and problems."""
    lib = tm.load(path)
    failures, problems = {}, []
    for name in names:
        try:
            problems.extend(argument_problems(lib[name]))
        except tm.ReflectionError as error:
            failures[name] = str(error)
    return {"count": len(names), "failures": failures, "problems": problems}


def decoder_problems(name: str, bitcode) -> list:
    """The fast path for Apple's standard node layouts gives exactly what the general
    key-table decoder gives, for every argument node of the kernel."""
    module = llvm.parse_bitcode(bytes(bitcode), context=llvm.create_context())
    text = ModuleText(str(module))
    entry = next(text.node(ref) for ref in text.named("air.kernel"))
    parameters = text.parameter_types(name)
    problems, fast_hits = [], 0
    for ref in text.node(entry[2]):
        body = text.body(ref)
        position = int(body[4:body.index(",")])
        fast = decode_standard_argument(body, parameters[position])
        general = decode_argument(str(ref), text.node(ref), parameters[position], text.node)
        fast_hits += fast is not None
        if fast is not None and fast != general:
            problems.append(f"{name} {ref}: fast {fast} != general {general}")
    return problems, fast_hits


def unused_flag_problems(name: str, bitcode, arguments) -> list:
    """``air.arg_unused`` is set exactly for the parameters the function body never uses."""
    text = str(llvm.parse_bitcode(bytes(bitcode), context=llvm.create_context()))
    header = re.search(rf"^define [^\n]*@{re.escape(name)}\(.*\n", text, re.M)
    body = text[header.end():text.index("\n}\n", header.end())]
    problems = []
    for a in arguments:
        used = re.search(rf"%{a.position}\b", body) is not None
        if used == a.unused:
            problems.append(f"{name} argument {a.position} {a.name!r}: unused={a.unused}, "
                            f"referenced in the body: {used}")
    return problems
