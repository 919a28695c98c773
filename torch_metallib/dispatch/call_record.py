"""What calling a kernel needs from its reflection, as plain data cached on disk.

The record is keyed by the function's HASH (``<cache>/calls``), so a warm start builds a
binding plan without parsing the bitcode.
"""

import json
import os

from ..cache.disk_cache import cache_directory, read_entry, write_entry

__all__ = ["CALL_RECORD_VERSION", "call_record", "cached_call_record", "binding_problem"]

CALL_RECORD_VERSION = 4  # bump when call_record's fields change


def call_record(function) -> dict:
    """The plain data calling needs from reflection: the bindable arguments, constants,
    max threads per threadgroup, what cannot be bound, and how threads must run."""
    reflection = function.reflection
    fields = ("name", "position", "kind", "binding", "address_space", "access", "type_name",
              "type_size", "buffer_size", "function_constant", "unused")
    return {
        "parameter_count": len(reflection.arguments),
        "arguments": [{f: getattr(a, f) for f in fields} for a in reflection.arguments if not a.is_builtin],
        "constants": [[c.name, c.type, c.index, c.required] for c in reflection.function_constants],
        "max_threads": reflection.max_total_threads_per_threadgroup or 0,
        "static_threadgroup_bytes": reflection.threadgroup_memory_static,
        "problem": binding_problem(function),
        "serial": bool(reflection.threadgroup_variables),
        # Threadgroup-memory arguments need a buffer per threadgroup: the cooperative runner's.
        "cooperative": reflection.uses_barriers or reflection.uses_simdgroup_ops
        or any(a.kind == "threadgroup" for a in reflection.arguments),
    }


def cached_call_record(function) -> dict:
    """call_record, from the disk cache when this function (by HASH) was seen before."""
    directory = cache_directory("calls")
    path = os.path.join(directory, f"{function.hash}-{function.type}-v{CALL_RECORD_VERSION}.json") \
        if directory else None
    payload = read_entry(path) if path else None
    if payload is not None:
        return json.loads(payload)
    record = call_record(function)
    if path:
        write_entry(path, json.dumps(record).encode())
    return record


def binding_problem(function) -> str:
    """Why no call of kernel `function` can be bound yet ("" if it can)."""
    reflection = function.reflection
    kinds = sorted({a.kind for a in reflection.arguments if a.kind not in ("buffer", "threadgroup", "builtin")})
    if kinds:
        return (f"it takes {', '.join(kinds)} arguments, which the binding plan does not bind yet. "
                f"Run it on a Mac with MPS tensors")
    return ""
