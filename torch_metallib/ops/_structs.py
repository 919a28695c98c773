"""Struct and array arguments of an operator: ``ops.struct(...)`` for a kernel argument of
struct type (``constant GEMMParams& params`` or ``const constant GEMMParams* params``) and a
tuple or list for an array reference (``constant int64_t (&strides)[3]``).

At definition each value is laid out against the kernel's reflection (its fields' names,
byte offsets and types, arrays and nested structs included) and every field is checked:
one the struct lacks, one reflection does not have, a value of the wrong kind. What is
fixed (numbers, defaults) is packed once then; what varies (rules, scalar arguments) is
packed by the operator's native kernel at each call, into the bytes the binding plan binds.
"""

import difflib
from typing import NamedTuple, Optional, Union

from .. import _C
from ..errors import OpDefinitionError, TorchMetallibError
from ._rules import Rule

__all__ = ["Struct", "struct", "Leaf", "lay_out"]


class Struct:
    """The value of a struct argument, field name -> value; build it with :func:`struct`."""

    __slots__ = ("fields", "defaults")

    def __init__(self, fields: dict, defaults):
        self.fields = fields
        self.defaults = defaults

    def __repr__(self):
        shown = ", ".join(f"{name}={_shown(value)}" for name, value in self.fields.items())
        tail = "" if self.defaults is None else f", defaults={self.defaults!r}"
        return f"ops.struct({shown}{tail})"


def struct(_fields: Optional[dict] = None, *, defaults: Union[int, float, bool, None] = None, **fields) -> Struct:
    """The value of a struct kernel argument, for ``bind``: each field by the name the
    kernel's reflection gives it (``KernelFunction.arguments[i].struct_fields``), bound to an
    ops rule, a number, the name of a float, int or bool argument, a tuple or list for an
    array field, or another ``ops.struct`` for a nested struct. Every field must be given,
    unless `defaults` (a number) is: then fields not given hold it. Fields with names that
    are not Python identifiers can be passed as a dict, ``ops.struct({"name": ...})``."""
    given = dict(_fields or {})
    for name, value in fields.items():
        if name in given:
            raise TorchMetallibError(f"ops.struct: field '{name}' is given twice")
        given[name] = value
    if defaults is not None and not isinstance(defaults, (bool, int, float)):
        raise TorchMetallibError(f"ops.struct: defaults must be a number, got {defaults!r}")
    return Struct(given, defaults)


def _shown(value) -> str:
    if isinstance(value, Rule):
        return value.text
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_shown(v) for v in value) + ")"
    return repr(value)


class Leaf(NamedTuple):
    """One scalar the operator packs: `source` is ("rule", Rule), ("input", argument name)
    or ("number", value)."""

    offset: int      # bytes from the start of the argument
    type_name: str   # the field's Metal type ("int", "long", "float"; a vector's: one leaf per component)
    path: str        # "params.M", "strides[2]", for messages
    source: tuple


def _scalar(type_name: str):
    """(kind, components, bytes of one component) of a scalar or vector Metal type, or None."""
    described = _C.metal_type(type_name)
    if described is None:
        return None
    kind, components, _ = described
    return kind, components, _C.metal_element_bytes(type_name)


class _Layout:
    """Walks a value against a reflected layout, collecting leaves and problems."""

    def __init__(self, schema, where: str):
        self.schema, self.where = schema, where
        self.leaves, self.problems = [], []

    def problem(self, text: str) -> None:
        self.problems.append(f"{self.where}: {text}")

    def value(self, value, type_name, offset, path, defaults):
        """A scalar or vector of `type_name` at `offset`."""
        scalar = _scalar(type_name)
        if scalar is None:
            self.problem(f"bind['{path}'] has type {type_name}, which operators cannot pack; bind the argument to "
                         f"a tensor holding its bytes instead")
            return
        kind, components, element = scalar
        if components > 1:
            if value is None:
                values = [defaults] * components
            elif isinstance(value, (tuple, list)) and len(value) == components:
                values = list(value)
            else:
                self.problem(f"bind['{path}'] is a {type_name}; expected {components} values in a tuple, got "
                             f"{_shown(value)}")
                return
            for i, item in enumerate(values):
                self.component(item, type_name, kind, offset + i * element, f"{path}.{'xyzw'[i]}")
            return
        self.component(defaults if value is None else value, type_name, kind, offset, path)

    def component(self, value, type_name, kind, offset, path):
        """One component of scalar or vector type `type_name`, packed at `offset`."""
        if isinstance(value, Rule):
            self.leaves.append(Leaf(offset, type_name, path, ("rule", value)))
        elif isinstance(value, str):
            if value not in self.schema.names:
                self.problem(f"bind['{path}'] names '{value}', which is not an argument of the schema; expected "
                             f"one of: {', '.join(self.schema.names)}")
                return
            schema_kind = self.schema.kinds[self.schema.names.index(value)]
            if schema_kind not in ("float", "int", "bool"):
                self.problem(f"bind['{path}'] ({type_name}) names '{value}', a {schema_kind}; struct fields and "
                             f"array elements take float, int and bool arguments, rules and numbers")
                return
            if schema_kind == "float" and kind != "float":
                self.problem(f"bind['{path}'] holds {type_name} values; '{value}' is a float")
                return
            self.leaves.append(Leaf(offset, type_name, path, ("input", value)))
        elif isinstance(value, (bool, int, float)):
            problem = _C.metal_number_problem(type_name, value)
            if problem:
                self.problem(f"bind['{path}'] ({type_name}): {problem}. Give a value {type_name} holds")
                return
            self.leaves.append(Leaf(offset, type_name, path, ("number", value)))
        else:
            self.problem(f"bind['{path}'] ({type_name}): expected an ops rule, a number or the name of a float, "
                         f"int or bool argument, got {_shown(value)}")

    def array(self, value, element, count, stride, offset, path, defaults):
        """`count` elements laid out by `element(value, offset, path, defaults)`."""
        if value is None:
            values = [None] * count
        elif isinstance(value, (tuple, list)) and len(value) == count:
            values = list(value)
        else:
            found = f"{len(value)} values" if isinstance(value, (tuple, list)) else _shown(value)
            self.problem(f"bind['{path}'] is an array of {count}; expected a tuple or list of {count} values, "
                         f"got {found}")
            return
        for i, item in enumerate(values):
            element(item, offset + i * stride, f"{path}[{i}]", defaults)

    def fields(self, value, fields, type_name, offset, path, defaults):
        """A struct of reflected `fields` at `offset`."""
        if value is None:
            value = Struct({}, defaults)
        if not isinstance(value, Struct):
            self.problem(f"bind['{path}'] is a struct ({type_name}); expected ops.struct(...) with its fields "
                         f"{', '.join(f.name for f in fields)}, got {_shown(value)}")
            return
        defaults = value.defaults if value.defaults is not None else defaults
        names = [f.name for f in fields]
        for name in value.fields:
            if name not in names:
                near = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
                self.problem(f"bind['{path}'] gives field '{name}', which {type_name} does not have; its fields are: "
                             f"{', '.join(names)}" + (f". Did you mean '{near[0]}'?" if near else ""))
        missing = [name for name in names if name not in value.fields]
        if missing and defaults is None:
            self.problem(f"bind['{path}'] lacks fields {', '.join(missing)} of {type_name}; expected a value for "
                         f"each field ({', '.join(names)}): give them, or ops.struct(..., defaults=0) for the "
                         f"fields not given")
        for f in fields:
            if f.name in value.fields or defaults is not None:
                self.field(value.fields.get(f.name), f, offset, f"{path}.{f.name}", defaults)

    def field(self, value, f, offset, path, defaults):
        if f.fields:
            def element(item, at, where, fill):
                self.fields(item, f.fields, f.type_name, at, where, fill)
        else:
            def element(item, at, where, fill):
                self.value(item, f.type_name, at, where, fill)
        if f.array_length:
            self.array(value, element, f.array_length, f.size, offset + f.offset, path, defaults)
        else:
            element(value, offset + f.offset, path, defaults)


def lay_out(schema, where: str, argument, value) -> tuple:
    """(bytes of the argument, leaves, problems) of `value` (a Struct, tuple or list) bound
    to kernel `argument`: each problem is an OpDefinitionError's message; raises one where
    the argument cannot take such a value at all."""
    layout = _Layout(schema, where)
    size = argument.type_size or 0
    reference = argument.buffer_size
    name = argument.name
    if argument.struct_fields:
        count = (reference // size) if reference and size else 1
        if count > 1:
            layout.array(value, lambda item, at, path, fill: layout.fields(item, argument.struct_fields,
                                                                           argument.type_name, at, path, fill),
                         count, size, 0, name, None)
        else:
            layout.fields(value, argument.struct_fields, argument.type_name, 0, name, None)
        total = max(reference or 0, size * count)
    elif isinstance(value, Struct):
        raise OpDefinitionError(f"{where}: bind['{name}'] is ops.struct(...), but kernel argument '{name}' has type "
                                f"{argument.type_name}, which is not a struct; bind a rule, a number, or a tuple "
                                f"for an array")
    else:
        scalar = _scalar(argument.type_name)
        if scalar is None or not size:
            raise OpDefinitionError(f"{where}: bind['{name}']: kernel argument '{name}' has type "
                                    f"{argument.type_name}, which operators cannot pack; bind a tensor holding its "
                                    f"bytes")
        if reference is None:  # a pointer: as many elements as given
            count = len(value)
            if not count:
                raise OpDefinitionError(f"{where}: bind['{name}']: expected at least one value, got an empty "
                                        f"{type(value).__name__}")
        else:
            count = reference // size
        if count == 1 and reference is not None:  # `constant T&`: one value, a vector's in a tuple
            if scalar[1] == 1:
                raise OpDefinitionError(f"{where}: bind['{name}']: kernel argument '{name}' ({argument.type_name}&) "
                                        f"holds one value; bind a rule or a number, not a {type(value).__name__}")
            layout.value(value, argument.type_name, 0, name, None)
        else:
            layout.array(value, lambda item, at, path, fill: layout.value(item, argument.type_name, at, path, fill),
                         count, size, 0, name, None)
        total = reference if reference is not None else size * count
    return total, layout.leaves, layout.problems
