"""Reflection: what a kernel's AIR bitcode says about calling it (docs/formats.md, AIR).

`reflect` parses one function's bitcode with llvmlite in a fresh LLVM context (so struct
names are not renamed across modules and the memory is freed with it), prints the
module and reads the ``!air.kernel`` entry, ``!air.function_constants``, threadgroup
globals and the ``air.*`` declarations the kernel calls from the text.
"""

import re
from dataclasses import dataclass
from typing import Optional, Tuple

import llvmlite.binding as llvm

from .air_arguments import Argument, decode_argument, decode_standard_argument
from .bitcode import parse_bitcode
from .constant_predicates import derived_predicates
from .pointer_arguments import mark_pointer_arguments
from .air_text import GlobalRef, MalformedNode, ModuleText, Ref, alignment_of
from ..errors import ReflectionError
from ..container.function_constant import FunctionConstant
from .signature import format_signature

__all__ = ["Reflection", "ThreadgroupVariable", "reflect"]

_BARRIERS = ("air.wg.barrier", "air.simdgroup.barrier")
_SIMDGROUP_PREFIXES = ("air.simd_", "air.simdgroup", "air.quad_", "air.is_uniform", "air.get_thread_index_in_simdgroup",
                       "air.get_simdgroup_index_in_threadgroup")
# matmul2d's run on cooperative tensors is a SIMD-group collective, and a lane's share of
# a cooperative tensor depends on its index in the SIMD-group (air/tensor_ops.py).
_SIMDGROUP_DRIVER_PREFIX = tuple("__tensorops_impl_matmul2d_op_" + op for op in (
    "run_cooperative", "cooperative_tensor_load_", "cooperative_tensor_store_", "cooperative_tensor_get_coordinate"))
_MAX_THREADS_KEY = "air.max_work_group_size"
_REPORT = ("The bitcode does not follow the AIR conventions this version reads; please "
           "report it with the .metallib attached.")


@dataclass(frozen=True)
class ThreadgroupVariable:
    """A ``threadgroup`` variable declared inside the kernel (an ``addrspace(3)`` global).

    Attributes:
        name: the global's (mangled) name.
        size: its size in bytes.
        align: its alignment in bytes.
    """

    name: str
    size: int
    align: int


@dataclass(frozen=True)
class Reflection:
    """Everything the AIR bitcode says about one kernel. See KernelFunction for each field."""

    function: str
    arguments: Tuple[Argument, ...]
    function_constants: Tuple[FunctionConstant, ...]
    max_total_threads_per_threadgroup: Optional[int]
    threadgroup_variables: Tuple[ThreadgroupVariable, ...]
    intrinsics: Tuple[str, ...]
    triple: str
    extra: Tuple[Tuple[str, tuple], ...] = ()
    function_type: str = "kernel"  # or "vertex", "fragment"
    # Argument guards that are not function constants but expressions of them:
    # (name, expression or None), see constant_predicates.
    derived_predicates: Tuple[Tuple[str, Optional[list]], ...] = ()
    # Functions Metal's driver supplies that the kernel calls (Metal 4's tensor operations).
    driver_functions: Tuple[str, ...] = ()

    @property
    def buffers(self) -> Tuple[Argument, ...]:
        return tuple(sorted((a for a in self.arguments if not a.is_builtin),
                            key=lambda a: (a.kind, a.binding, a.position)))

    @property
    def builtins(self) -> Tuple[Argument, ...]:
        return tuple(a for a in self.arguments if a.is_builtin)

    @property
    def threadgroup_memory_static(self) -> int:
        total = 0
        for variable in self.threadgroup_variables:
            total = -(-total // variable.align) * variable.align + variable.size
        return total

    @property
    def uses_barriers(self) -> bool:
        return any(name.startswith(_BARRIERS) for name in self.intrinsics)

    @property
    def uses_simdgroup_ops(self) -> bool:
        return any(name.startswith(_SIMDGROUP_PREFIXES) for name in self.intrinsics) \
            or any(name.startswith(_SIMDGROUP_DRIVER_PREFIX) for name in self.driver_functions)

    @property
    def signature(self) -> str:
        return format_signature(self.function, self.arguments, self.function_type)


def reflect(name: str, bitcode, function_type: str = "kernel") -> Reflection:
    """Reflects the kernel `name` from its raw LLVM bitcode.

    Raises:
        ReflectionError: llvmlite cannot parse the bitcode, or the AIR metadata is not in
            the expected shape; the message names the function and the metadata node.
    """
    context = llvm.create_context()
    try:
        module = parse_bitcode(name, bitcode, context)
        try:
            return _reflect_module(name, function_type, module, ModuleText(str(module)))
        except UnicodeDecodeError as error:  # llvmlite decodes names and the printed IR as UTF-8
            raise ReflectionError(
                f"{name}: the bitcode holds a name or string that is not UTF-8 ({error.reason} at byte "
                f"{error.start} of {error.object[:40]!r}). The module is damaged or was not written by "
                f"Apple's compiler", function=name) from None
        except MalformedNode as error:
            raise ReflectionError(f"{name}: AIR metadata node {error.node}: {error.detail}. {_REPORT}",
                                  function=name, node=error.node) from None
        finally:
            module.close()
    finally:
        context.close()


def _reflect_module(name: str, function_type: str, module, text: ModuleText) -> Reflection:
    entry = _kernel_entry(name, function_type, text)
    parameters = text.parameter_types(name)
    if parameters is None:
        raise MalformedNode("!air.kernel", f"names @{name}, but the module defines no such function")
    if len(entry) < 3 or type(entry[2]) is not Ref:
        raise MalformedNode("!air.kernel", f"entry for @{name}: expected (function, outputs, "
                                           f"arguments[, attributes...]), got {entry!r}")
    argument_list = str(entry[2])
    arguments = tuple(_argument(text, argument_list, ref, parameters) for ref in text.node(entry[2]))
    _check_positions(argument_list, name, arguments, len(parameters))
    arguments = mark_pointer_arguments(text.text, name, arguments)
    max_threads, extra = _attributes(text, entry[3:])
    constants, initializers = _function_constants(text)
    return Reflection(
        function=name,
        arguments=arguments,
        function_constants=constants,
        max_total_threads_per_threadgroup=max_threads,
        threadgroup_variables=_threadgroup_variables(module, text),
        intrinsics=tuple(sorted(text.called_declarations(name, "air."))),
        triple=module.triple,
        extra=extra,
        function_type=function_type,
        derived_predicates=_derived_predicates(text, arguments, constants, initializers),
        driver_functions=tuple(sorted(text.called_declarations(name, "__tensorops_impl_"))),
    )


# The named metadata listing a function of each type: (function, outputs, arguments, ...).
_ENTRY_METADATA = {"kernel": "air.kernel", "vertex": "air.vertex", "fragment": "air.fragment"}


def _kernel_entry(name: str, function_type: str, text: ModuleText) -> list:
    metadata = _ENTRY_METADATA.get(function_type)
    if metadata is None:
        raise ReflectionError(
            f"{name}: reflection reads kernel, vertex and fragment functions; this is a {function_type} "
            f"function, whose bitcode has no argument table", function=name, node=None)
    entries = text.named(metadata)
    for ref in entries or ():
        entry = text.node(ref)
        if entry and isinstance(entry[0], GlobalRef) and entry[0] == name:
            return entry
    found = (f"no !{metadata} metadata" if entries is None
             else f"{len(entries)} !{metadata} entries, none for @{name}")
    raise MalformedNode(f"!{metadata}", f"expected an entry for @{name}; found {found}")


def _argument(text: ModuleText, argument_list: str, ref, parameters: list) -> Argument:
    if type(ref) is not Ref:
        raise MalformedNode(argument_list, f"argument list: expected node references, got {ref!r}")
    body = text.body(ref)
    position = body[4:body.find(",")]  # "i32 P, ..." in every argument node
    ir_type = parameters[int(position)] if position.isdigit() and int(position) < len(parameters) else None
    return (decode_standard_argument(body, ir_type)
            or decode_argument(str(ref), text.node(ref), ir_type, text.node))


def _check_positions(argument_list: str, name: str, arguments: tuple, parameter_count: int) -> None:
    positions = sorted(a.position for a in arguments)
    if positions != list(range(parameter_count)):
        raise MalformedNode(argument_list, f"argument positions of @{name}: expected one node "
                                           f"per parameter 0..{parameter_count - 1}, got {positions}")


def _attributes(text: ModuleText, refs: list) -> Tuple[Optional[int], tuple]:
    """``air.max_work_group_size`` and any other kernel attribute nodes (kept raw)."""
    max_threads, extra = None, []
    for ref in refs:
        if type(ref) is not Ref:
            raise MalformedNode("!air.kernel", f"attributes: expected node references, got {ref!r}")
        elements = text.node(ref)
        if not elements or type(elements[0]) is not str:
            raise MalformedNode(f"!{int(ref)}", f"expected a kernel attribute (!\"air.*\", values...), got {elements!r}")
        if elements[0] == _MAX_THREADS_KEY:
            if len(elements) != 2 or type(elements[1]) is not int or elements[1] <= 0:
                raise MalformedNode(f"!{int(ref)}", f"expected ({_MAX_THREADS_KEY!r}, positive integer), got {elements!r}")
            max_threads = elements[1]
        else:
            extra.append((elements[0], tuple(elements[1:])))
    return max_threads, tuple(extra)


def _function_constants(text: ModuleText) -> Tuple[Tuple[FunctionConstant, ...], dict]:
    """The function constants, and their initializer globals' names -> constant index."""
    constants, initializers = [], {}
    for ref in text.named("air.function_constants") or ():
        elements = text.node(ref) if type(ref) is Ref else None
        shape = [type(value) for value in elements or ()]
        if shape[:5] != [GlobalRef, str, str, int, bool]:
            raise MalformedNode(f"!{int(ref)}", "expected a function constant (initializer global, type, "
                                           f"name, index, required), got {elements!r}")
        _init, type_name, constant_name, index, required = elements[:5]
        constants.append(FunctionConstant(constant_name, type_name, index, required))
        initializers[str(_init)] = index
    return tuple(constants), initializers


# A guard's predicate node: (ptr addrspace(2) @global, !"bool", !"name").
_PREDICATE_NODE = re.compile(r'!\{ptr addrspace\(2\) @("[^"]+"|[\w.$-]+), !"bool", !"([^"]+)"\}')


def _derived_predicates(text: ModuleText, arguments, constants, initializers) -> tuple:
    declared = {c.name for c in constants}
    guards = {a.function_constant for a in arguments if a.function_constant and a.function_constant not in declared}
    if not guards:
        return ()
    metadata = text.text[text.metadata_start:]
    globals_ = {name: global_.strip('"') for global_, name in _PREDICATE_NODE.findall(metadata) if name in guards}
    found = derived_predicates(text, globals_, initializers)
    return tuple((name, found.get(name)) for name in sorted(guards))


def _threadgroup_variables(module, text: ModuleText) -> Tuple[ThreadgroupVariable, ...]:
    definitions = text.globals(containing="addrspace(3) global ")
    if not definitions:
        return ()
    # llvmlite's get_global_variable skips internal globals, which these always are.
    target_data = llvm.create_target_data(module.data_layout)
    variables = []
    for variable in module.global_variables:
        definition = definitions.get(variable.name)
        if definition is not None:
            value_type = variable.global_value_type
            align = alignment_of(definition) or target_data.get_abi_alignment(value_type)
            variables.append(ThreadgroupVariable(variable.name, target_data.get_abi_size(value_type), align))
    return tuple(variables)
