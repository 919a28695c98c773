"""Kernel arguments as AIR describes them: one ``!air.kernel`` argument node -> Argument.

An argument node is ``i32 position`` followed by keys (``!"air.buffer"``,
``!"air.location_index", i32 slot, i32 count``, ``!"air.arg_name", !"a"``, ...), each with
a fixed number of values (docs/formats.md, AIR). Keys this table does not know are kept in
``Argument.extra`` with the values that follow them, never dropped.
"""

import re
from typing import NamedTuple, Optional, Tuple

from .air_text import MalformedNode, Ref

__all__ = ["Argument", "StructField", "decode_argument", "decode_struct_fields"]


class StructField(NamedTuple):
    """One member of a struct argument (``air.struct_type_info``).

    Attributes:
        offset: byte offset of the member in the struct.
        size: bytes of one element.
        array_length: number of elements for an array member, 0 for a scalar one.
        type_name: the member's type as written, e.g. ``"long"``.
        name: the member's name.
        fields: the members of a struct-typed member, else empty.
        indirect: for a member of an argument buffer (``air.indirect_argument``), what
            it binds: an Argument whose ``binding`` is the member's ``[[id(n)]]`` and whose
            ``kind`` is ``"buffer"`` (a pointer; with ``address_space`` and ``access``),
            ``"indirect_constant"`` (a value), ``"texture"`` or ``"sampler"``; else None.
    """

    offset: int
    size: int
    array_length: int
    type_name: str
    name: str
    fields: Tuple["StructField", ...] = ()
    indirect: Optional["Argument"] = None


class Argument(NamedTuple):
    """One parameter of a kernel, as the AIR metadata describes it. An immutable record
    (a NamedTuple: reflection builds thousands of them, and it is cheaper than a dataclass).

    Attributes:
        name: the parameter's name in the Metal source.
        position: its index in the IR function's parameter list.
        kind: ``"buffer"``, ``"threadgroup"`` (a buffer node in threadgroup memory),
            ``"texture"``, ``"sampler"``, ``"indirect_buffer"`` or ``"builtin"``. A node
            kind this version does not know keeps its AIR name without the ``air.`` prefix.
        binding: the ``[[buffer(i)]]`` / ``[[threadgroup(i)]]`` / ``[[texture(i)]]`` index;
            None for builtins.
        binding_count: how many consecutive binding slots it takes (1 for a plain buffer);
            None for builtins.
        address_space: ``"device"``, ``"constant"``, ``"threadgroup"``; None for builtins,
            textures and samplers.
        access: ``"read"``, ``"write"``, ``"read_write"`` (``"sample"`` for a sampled
            texture); None for builtins.
        type_name: the pointee / value type as written, e.g. ``"float"``, ``"uint3"`` or a
            long C++ spelling such as ``"mlx::steel::GEMMParams"``.
        type_size: bytes of one element of `type_name`; None when not declared.
        type_align: its alignment in bytes; None when not declared.
        buffer_size: bytes the kernel reads through a reference (``constant uint& n``
            gives 4); None for pointers.
        struct_fields: members of a struct type (``air.struct_type_info``), else empty.
        unused: the compiler found the kernel never reads or writes it.
        function_constant: name of the boolean function constant that guards it
            (``[[function_constant(name)]]``); None when it is always present.
        builtin: for builtins, the attribute name, e.g. ``"thread_position_in_grid"``.
        components: for builtins, 1 (scalar), 2 or 3 vector components.
        component_bits: for builtins, 16 (``ushort``) or 32 (``uint``) bits per component.
        ir_type: the LLVM type of the IR parameter, e.g. ``"ptr addrspace(1)"``, ``"i32"``.
        extra: ``(key, values)`` pairs of metadata keys this version does not interpret.
        holds_pointer: the buffer holds a pointer (Mojo's pointer arguments): the kernel only
            reads the 8-byte address at its start and reaches memory through it. A call
            passes the tensor pointed to; its address is bound (reflection/pointer_arguments.py).
        pointee_address_space: for such a buffer, the address space of the memory the
            pointer reaches (``"device"``, ``"constant"``...).
        pointee_type: for such a buffer, the one LLVM type the kernel reads or writes
            through the pointer (``"float"``, ``"half"``, ...), None if not one type.
        pointee_access: for such a buffer, what the kernel does through the pointer:
            ``"read"``, ``"write"`` or ``"read_write"`` (also where the pointer escapes
            the kernel's reading: passed to a function, stored).
    """

    name: str
    position: int
    kind: str
    binding: Optional[int] = None
    binding_count: Optional[int] = None
    address_space: Optional[str] = None
    access: Optional[str] = None
    type_name: str = ""
    type_size: Optional[int] = None
    type_align: Optional[int] = None
    buffer_size: Optional[int] = None
    struct_fields: Tuple[StructField, ...] = ()
    unused: bool = False
    function_constant: Optional[str] = None
    builtin: Optional[str] = None
    components: Optional[int] = None
    component_bits: Optional[int] = None
    ir_type: Optional[str] = None
    extra: Tuple[Tuple[str, tuple], ...] = ()
    holds_pointer: bool = False
    pointee_address_space: Optional[str] = None
    pointee_type: Optional[str] = None
    pointee_access: Optional[str] = None

    @property
    def is_builtin(self) -> bool:
        return self.kind == "builtin"


# Bindable argument kinds: AIR key -> Argument.kind.
_BINDABLE_KINDS = {
    "air.buffer": "buffer",
    "air.indirect_buffer": "indirect_buffer",
    "air.texture": "texture",
    "air.sampler": "sampler",
}
_ADDRESS_SPACES = {1: "device", 2: "constant", 3: "threadgroup"}
_ACCESS = {"air.read": "read", "air.write": "write", "air.read_write": "read_write", "air.sample": "sample"}

# Kernel builtins (Metal attributes that the GPU fills in) AIR spells as `air.<name>`.
BUILTINS = frozenset((
    "thread_position_in_grid", "threads_per_grid", "threadgroup_position_in_grid",
    "threadgroups_per_grid", "thread_position_in_threadgroup", "threads_per_threadgroup",
    "thread_index_in_threadgroup", "thread_execution_width", "thread_index_in_simdgroup",
    "threads_per_simdgroup", "simdgroup_index_in_threadgroup", "simdgroups_per_threadgroup",
    "thread_index_in_quadgroup", "quadgroup_index_in_threadgroup", "quadgroups_per_threadgroup",
    "dispatch_threads_per_threadgroup", "dispatch_quadgroups_per_threadgroup",
    "dispatch_simdgroups_per_threadgroup", "grid_origin", "grid_size",
))

# Values that follow each key: a tuple of expected element types (int, str or Ref).
_KEY_VALUES = {
    "air.location_index": (int, int),
    "air.buffer_size": (int,),
    "air.address_space": (int,),
    "air.struct_type_info": (Ref,),
    "air.arg_type_size": (int,),
    "air.arg_type_align_size": (int,),
    "air.arg_type_name": (str,),
    "air.arg_name": (str,),
    "air.function_constant": (Ref,),
}
_MAX_STRUCT_DEPTH = 16
_KNOWN_KEYS = frozenset(_KEY_VALUES) | frozenset(_ACCESS) | {"air.arg_unused"}
_TYPE_NAMES = {int: "an integer", str: "a string", Ref: "a node reference"}
_VECTOR_INT = re.compile(r"<([234]) x i(16|32)>|i(16|32)")


def _describe(value) -> str:
    return f'!"{value}"' if type(value) is str else repr(value)


def _is_key(value) -> bool:
    return type(value) is str and value.startswith("air.")


def _read_keys(node: str, elements: list) -> dict:
    """Key -> tuple of values, for every key after the position, in node order."""
    keys = {}
    i = 1
    while i < len(elements):
        key = elements[i]
        if not _is_key(key):
            raise MalformedNode(node, f"element {i}: expected an 'air.*' key, got {_describe(key)}")
        if key in keys:
            raise MalformedNode(node, f"element {i}: {key!r} appears twice")
        expected = _KEY_VALUES.get(key)
        if expected is None:  # a flag key, a kind, or a key this version does not know
            end = i + 1
            while end < len(elements) and not _is_key(elements[end]):
                end += 1
        else:
            end = i + 1 + len(expected)
            for offset, kind in enumerate(expected):
                at = i + 1 + offset
                if at >= len(elements) or type(elements[at]) is not kind:
                    found = "the end of the node" if at >= len(elements) else _describe(elements[at])
                    raise MalformedNode(
                        node, f"element {at}: expected {_TYPE_NAMES[kind]} after {key!r}, got {found}")
        keys[key] = tuple(elements[i + 1:end])
        i = end
    return keys


def decode_struct_fields(node: str, elements: list, read_node, depth: int = 0) -> Tuple[StructField, ...]:
    """``air.struct_type_info``: per member ``[!"air.struct_type_info", !N,] offset, size,
    array length, type, name``; the optional prefix describes a struct member's own members."""
    if depth > _MAX_STRUCT_DEPTH:
        raise MalformedNode(node, f"struct members nest deeper than {_MAX_STRUCT_DEPTH} levels "
                                  f"(a reference cycle?)")
    members, i = [], 0
    while i < len(elements):
        nested = ()
        if elements[i] == "air.struct_type_info" and type(elements[i]) is str:
            if i + 1 >= len(elements) or type(elements[i + 1]) is not Ref:
                raise MalformedNode(node, f"element {i + 1}: expected a node reference after "
                                          f"'air.struct_type_info'")
            nested = decode_struct_fields(str(elements[i + 1]), read_node(elements[i + 1]),
                                          read_node, depth + 1)
            i += 2
        member = elements[i:i + 5]
        if [type(value) for value in member] != [int, int, int, str, str]:
            raise MalformedNode(node, f"element {i}: expected a member (offset, size, array length, "
                                      f"type, name), got {member!r}")
        i += 5
        indirect = None
        if i < len(elements) and elements[i] == "air.indirect_argument" and type(elements[i]) is str:
            # A node describing the member, or, for an aggregate (an array of pointers), its
            # first [[id(n)]]: the aggregate's element member carries the node.
            target = elements[i + 1] if i + 1 < len(elements) else None
            if type(target) is Ref:
                indirect = decode_argument(str(target), read_node(target), None, read_node)
            elif type(target) is int:
                inner = next((f.indirect for f in nested if f.indirect is not None), None)
                if inner is None:
                    raise MalformedNode(node, f"element {i + 1}: member {member[4]!r} has id {target} "
                                              f"but no member that describes what it binds")
                indirect = inner._replace(binding=target)
            else:
                raise MalformedNode(node, f"element {i + 1}: expected a node reference or an id after "
                                          f"'air.indirect_argument', got {_describe(target) if target is not None else 'nothing'}")
            i += 2
        members.append(StructField(*member, fields=nested, indirect=indirect))
    return tuple(members)


def _builtin_shape(ir_type: Optional[str]) -> Tuple[Optional[int], Optional[int]]:
    match = _VECTOR_INT.fullmatch(ir_type or "")
    if match is None:
        return None, None
    if match.group(3):
        return 1, int(match.group(3))
    return int(match.group(1)), int(match.group(2))


# The layouts Apple's compiler writes for nearly every buffer and builtin, matched whole so
# that reflection stays well under a millisecond per kernel; anything else (extra or
# reordered keys, textures, escapes in strings) goes through decode_argument.
_STANDARD_BUFFER = re.compile(
    r'i32 (\d+), !"air\.buffer"(?:, !"air\.buffer_size", i32 (\d+))?, '
    r'!"air\.location_index", i32 (\d+), i32 (\d+), !"air\.(read|write|read_write)", '
    r'!"air\.address_space", i32 ([12]), !"air\.arg_type_size", i32 (\d+), '
    r'!"air\.arg_type_align_size", i32 (\d+), !"air\.arg_type_name", !"([^"\\]*)", '
    r'!"air\.arg_name", !"([^"\\]*)"(, !"air\.arg_unused")?')
_STANDARD_BUILTIN = re.compile(
    r'i32 (\d+), !"air\.(\w+)", !"air\.arg_type_name", !"([^"\\]*)", '
    r'!"air\.arg_name", !"([^"\\]*)"(, !"air\.arg_unused")?')


def decode_standard_argument(body: str, ir_type: Optional[str]) -> Optional[Argument]:
    """The Argument for a node body in one of Apple's standard layouts, else None.
    Gives exactly what decode_argument gives for the same node (tested on the corpus)."""
    match = _STANDARD_BUFFER.fullmatch(body)
    if match is not None:
        position, size, binding, count, access, space, type_size, align, type_name, name, unused = match.groups()
        return Argument(
            name=name, position=int(position), kind="buffer", binding=int(binding),
            binding_count=int(count), address_space=_ADDRESS_SPACES[int(space)], access=access,
            type_name=type_name, type_size=int(type_size), type_align=int(align),
            buffer_size=None if size is None else int(size), unused=unused is not None,
            ir_type=ir_type)
    match = _STANDARD_BUILTIN.fullmatch(body)
    if match is not None and match.group(2) in BUILTINS:
        position, builtin, type_name, name, unused = match.groups()
        components, bits = _builtin_shape(ir_type)
        return Argument(
            name=name, position=int(position), kind="builtin", type_name=type_name,
            unused=unused is not None, builtin=builtin, components=components,
            component_bits=bits, ir_type=ir_type)
    return None


_IR_ADDRESS_SPACE = re.compile(r"addrspace\((\d+)\)")


def _ir_address_space(ir_type: Optional[str]) -> Optional[int]:
    """The address space of a pointer parameter type (``ptr addrspace(1)``, typed
    ``float addrspace(1)*``); None for anything else."""
    match = _IR_ADDRESS_SPACE.search(ir_type or "")
    return int(match.group(1)) if match else None


def decode_argument(node: str, elements: list, ir_type: Optional[str], read_node) -> Argument:
    """Decodes one argument node. `read_node(ref)` returns the elements of another node.

    Raises:
        MalformedNode: the node does not have the shape AIR gives argument nodes.
    """
    if not elements or type(elements[0]) is not int:
        raise MalformedNode(node, f"element 0: expected the parameter position (an integer), "
                                  f"got {_describe(elements[0]) if elements else 'an empty node'}")
    keys = _read_keys(node, elements)
    name = keys.get("air.arg_name", ("",))[0]
    fields = dict(name=name, position=elements[0], ir_type=ir_type,
                  type_name=keys.get("air.arg_type_name", ("",))[0],
                  unused="air.arg_unused" in keys)
    guard = keys.get("air.function_constant")
    if guard:
        predicate = read_node(guard[0])
        # (ptr @__metal_implicit_fc_pred_N, !"bool", !"name")
        if len(predicate) < 3 or type(predicate[2]) is not str:
            raise MalformedNode(str(guard[0]), "expected a function-constant predicate "
                                                "(global, type, name)")
        fields["function_constant"] = predicate[2]
    kind_key = next((key for key in keys if key in _BINDABLE_KINDS or key[4:] in BUILTINS), None)
    if kind_key is None:  # a kind this version does not know: keep its AIR name
        kind_key = next((key for key in keys if key not in _KNOWN_KEYS), None)
        if kind_key is None:
            raise MalformedNode(node, f"argument {name!r}: expected a kind such as 'air.buffer' or a "
                                      f"builtin such as 'air.thread_position_in_grid'; found none")
    if kind_key not in _BINDABLE_KINDS and (kind_key[4:] in BUILTINS or "air.location_index" not in keys):
        components, bits = _builtin_shape(ir_type)
        return Argument(kind="builtin", builtin=kind_key[4:], components=components,
                        component_bits=bits, extra=_extra(keys, kind_key), **fields)
    location = keys.get("air.location_index")
    if location is None:
        raise MalformedNode(node, f"{kind_key!r} argument {name!r} has no 'air.location_index'")
    kind = _BINDABLE_KINDS.get(kind_key, kind_key[4:])
    address_space = None
    if "air.address_space" in keys:
        code = keys["air.address_space"][0]
        address_space = _ADDRESS_SPACES.get(code)
        if address_space is None:
            raise MalformedNode(node, f"'air.address_space' of {name!r}: expected 1 (device), "
                                      f"2 (constant) or 3 (threadgroup), got {code}")
        if kind == "buffer" and address_space == "threadgroup":
            kind = "threadgroup"
    elif kind in ("buffer", "indirect_buffer"):
        # AIR 2.3/2.4 leave the key out: the IR pointer type's address space is the truth.
        address_space = _ADDRESS_SPACES.get(_ir_address_space(ir_type))
        if address_space is None:
            raise MalformedNode(node, f"buffer argument {name!r} has no 'air.address_space', and its IR "
                                      f"type {ir_type!r} is not a pointer into address space 1 (device), "
                                      f"2 (constant) or 3 (threadgroup)")
        if kind == "buffer" and address_space == "threadgroup":
            kind = "threadgroup"
    struct = keys.get("air.struct_type_info")
    access = [_ACCESS[key] for key in keys if key in _ACCESS]
    if len(access) > 1:
        raise MalformedNode(node, f"argument {name!r}: expected one access key, got {access}")
    return Argument(
        kind=kind,
        binding=location[0],
        binding_count=location[1],
        address_space=address_space,
        access=access[0] if access else None,
        type_size=keys.get("air.arg_type_size", (None,))[0],
        type_align=keys.get("air.arg_type_align_size", (None,))[0],
        buffer_size=keys.get("air.buffer_size", (None,))[0],
        struct_fields=decode_struct_fields(str(struct[0]), read_node(struct[0]), read_node) if struct else (),
        extra=_extra(keys, kind_key),
        **fields,
    )


def _extra(keys: dict, kind_key: str) -> tuple:
    return tuple((key, values) for key, values in keys.items()
                 if key not in _KNOWN_KEYS and key != kind_key)
