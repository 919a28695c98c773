"""What calling a kernel needs from its reflection, as plain data cached on disk.

The record is keyed by the function's HASH and the package's code (cache/fingerprint.py)
(``<cache>/calls``), so a warm start builds a binding plan without parsing the bitcode;
ahead-of-time archives carry them too (target ``calls``), so their first calls skip it.
"""

import json
import os

from ..cache.archives import record_payloads
from ..cache.disk_cache import cache_directory, read_entry, write_entry
from ..cache.fingerprint import code_fingerprint

__all__ = ["call_record", "cached_call_record", "record_key", "record_file_name", "binding_problem", "RECORD_TARGET",
           "record_toolchain"]

RECORD_TARGET = "calls"  # an archive's call records: form = the function's type, no constants


def call_record(function) -> dict:
    """The plain data calling needs from reflection: the bindable arguments, constants,
    max threads per threadgroup, what cannot be bound, and how threads must run."""
    reflection = function.reflection
    fields = ("name", "position", "kind", "binding", "address_space", "access", "type_name",
              "type_size", "buffer_size", "function_constant", "unused")
    return {
        "parameter_count": len(reflection.arguments),
        "arguments": [_argument_record(a, fields) for a in reflection.arguments if not a.is_builtin],
        "constants": [[c.name, c.type, c.index, c.required] for c in reflection.function_constants],
        "max_threads": reflection.max_total_threads_per_threadgroup or 0,
        "static_threadgroup_bytes": reflection.threadgroup_memory_static,
        "problem": binding_problem(function),
        # Guards derived from the constants: name -> expression, None if unreadable.
        "predicates": dict(reflection.derived_predicates),
        "serial": bool(reflection.threadgroup_variables),
        # Threadgroup-memory arguments need a buffer per threadgroup: the cooperative runner's.
        "cooperative": reflection.uses_barriers or reflection.uses_simdgroup_ops
        or any(a.kind == "threadgroup" for a in reflection.arguments),
    }


def _argument_record(argument, fields) -> dict:
    record = {f: getattr(argument, f) for f in fields}
    if argument.kind == "indirect_buffer":
        record["members"] = argument_buffer_members(argument)
    if argument.holds_pointer:
        record.update(pointer_argument(argument))
    return record


# What a pointer argument's element type binds: the float types name their dtype; an
# integer's signedness is not in LLVM's type, and bytes may be any dtype: no dtype check.
_POINTEE_TYPES = {"float": ("float", 4), "half": ("half", 2), "bfloat": ("bfloat", 2)}


def pointer_argument(argument) -> dict:
    """A buffer holding a pointer (reflection/pointer_arguments.py) as the binding plan
    binds it: an 8-byte argument buffer whose one member, at byte 0, points to the tensor
    passed. The kernel's bounds through the pointer are not known: no size is checked."""
    type_name, size = _POINTEE_TYPES.get(argument.pointee_type, ("void", None))
    member = {"name": argument.name or "pointer", "id": 0, "pointer": True, "offset": 0, "count": 1,
              "address_space": argument.pointee_address_space, "access": argument.pointee_access,
              "type_name": type_name, "type_size": size}
    return {"kind": "indirect_buffer", "type_size": 8, "holds_pointer": True, "members": [member]}


def argument_buffer_members(argument) -> list:
    """An argument buffer's members as the binding plan binds them: a pointer (``count``
    of them for an array of pointers) or a value, at its byte offset, by ``[[id(n)]]``.
    Members binding textures or samplers, or without an id, come back with
    ``"pointer": None`` (binding_problem refuses them)."""
    members = []
    for field in argument.struct_fields:
        indirect = field.indirect
        pointer = None if indirect is None else {"buffer": True, "indirect_constant": False}.get(indirect.kind)
        if indirect is not None and indirect.kind == "indirect_buffer" and not indirect.struct_fields:
            pointer = True  # Apple's compiler marks a bfloat* member so (PyTorch's AMP kernels): a plain pointer
        element = next((f for f in field.fields if f.indirect is not None), None)
        members.append({
            "name": field.name, "id": indirect.binding if indirect else -1, "pointer": pointer,
            "offset": field.offset, "count": max(1, (element or field).array_length),
            "address_space": indirect.address_space if indirect else None,
            "access": indirect.access if indirect else None,
            "type_name": indirect.type_name if indirect else field.type_name,
            "type_size": (indirect.type_size or field.size) if indirect else field.size,
        })
    return members


def cached_call_record(function) -> dict:
    """call_record, from an archive or the disk cache when this function (by HASH) was
    seen before."""
    record = _archived_record(function)
    if record is not None:
        return record
    directory = cache_directory("calls")
    key = record_key(function)
    path = os.path.join(directory, record_file_name(function)) if directory else None
    payload = read_entry(path, key) if path else None
    if payload is not None:
        record = _decoded_record(payload)
        if record is not None:
            return record
    record = call_record(function)
    if path:
        write_entry(path, key, json.dumps(record).encode())
    return record


def record_toolchain() -> str:
    """What an archive's call records must share with this process: the code that makes them."""
    return f"call record {code_fingerprint()}"


def _archived_record(function):
    decoded = map(_decoded_record, record_payloads(function, RECORD_TARGET, record_toolchain()))
    return next(filter(None, decoded), None)


def record_key(function) -> str:
    """The disk cache's key of `function`'s call record."""
    return f"call record {code_fingerprint()} {function.type} {function.hash}"


def record_file_name(function) -> str:
    """The file name of `function`'s call record in ``<cache>/calls``."""
    return f"{function.hash}-{function.type}-{code_fingerprint()[:16]}.json"


# The fields of a call record and their types: a stored record must have exactly these.
_RECORD_FIELDS = {"parameter_count": int, "arguments": list, "constants": list, "max_threads": int,
                  "static_threadgroup_bytes": int, "problem": str, "serial": bool, "cooperative": bool,
                  "predicates": dict}


def _decoded_record(payload: bytes):
    """The record in `payload`, or None if it is not one (then it is rebuilt)."""
    try:
        record = json.loads(payload)
    except ValueError:  # UnicodeDecodeError and JSONDecodeError included
        return None
    if not isinstance(record, dict) or set(record) != set(_RECORD_FIELDS):
        return None
    if not all(type(record[name]) is kind for name, kind in _RECORD_FIELDS.items()):
        return None
    if not all(isinstance(a, dict) for a in record["arguments"]):
        return None
    return record


def binding_problem(function) -> str:
    """Why no call of kernel `function` can be bound yet ("" if it can). An argument of a
    kind the plan does not bind refuses every call only when no function constant can
    leave it out; otherwise the plan refuses the calls that keep it."""
    reflection = function.reflection
    bound = ("buffer", "threadgroup", "builtin", "indirect_buffer")
    kinds = sorted({a.kind for a in reflection.arguments if a.kind not in bound and not a.function_constant})
    if kinds:
        return (f"it takes {', '.join(kinds)} arguments, which the binding plan does not bind yet. "
                f"Run it on a Mac with MPS tensors")
    for argument in reflection.arguments:
        if argument.kind != "indirect_buffer":
            continue
        odd = [m["name"] for m in argument_buffer_members(argument) if m["pointer"] is None]
        if odd:
            return (f"argument buffer '{argument.name}' has members that are not device/constant "
                    f"pointers or values ({', '.join(odd)}), which the binding plan does not bind yet")
    return ""
