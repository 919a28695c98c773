"""What ``ops.define`` checks a kernel against: its bindable arguments (struct layouts
included) and its function constants, exactly as reflection gives them.

Reflecting a kernel parses its bitcode (milliseconds each; MLX's operators use about two
hundred kernels), so the summary is kept beside the call records, keyed by the function's
HASH and the package's code: in the archives ``precompile`` writes, on disk, and in memory
per process. A warm start, or one with an archive of the kernels, defines operators without
parsing any bitcode, and a kernel several operators share is read once.
"""

import json
import os
import threading

from ..cache.archives import record_payloads
from ..cache.disk_cache import cache_directory, read_entry, write_entry
from ..cache.fingerprint import code_fingerprint
from ..container.function_constant import FunctionConstant
from ..reflection.air_arguments import Argument, StructField

__all__ = ["KernelSummary", "kernel_summary", "summary_entry", "summary_payload", "SUMMARY_TARGET",
           "summary_toolchain"]

SUMMARY_TARGET = "ops"  # an archive's summaries: form = the function's type, no constants


class KernelSummary:
    """A kernel's `buffers` and `function_constants`, as ``KernelFunction`` has them."""

    __slots__ = ("buffers", "function_constants")

    def __init__(self, buffers, function_constants):
        self.buffers = tuple(buffers)
        self.function_constants = tuple(function_constants)


_summaries = {}  # (function type, HASH) -> KernelSummary
_lock = threading.Lock()


def kernel_summary(function) -> KernelSummary:
    """`function`'s summary: from memory, else an archive, else the disk cache, else its
    reflection (then stored in the disk cache)."""
    key = (function.type, function.hash)
    summary = _summaries.get(key)
    if summary is None:
        with _lock:
            summary = _summaries.get(key)
            if summary is None:
                summary = _summaries[key] = _cached_summary(function)
    return summary


def summary_entry(function) -> tuple:
    """(path, key) of `function`'s summary in the disk cache; path None when it is off."""
    directory = cache_directory("calls")
    fingerprint = code_fingerprint()
    name = f"{function.hash}-{function.type}-{fingerprint[:16]}.ops.json"
    return (os.path.join(directory, name) if directory else None,
            f"ops summary {fingerprint} {function.type} {function.hash}")


def summary_toolchain() -> str:
    """What an archive's summaries must share with this process: the code that makes them."""
    return f"ops summary {code_fingerprint()}"


def summary_payload(function) -> bytes:
    """`function`'s summary as the disk cache and archives store it, from its reflection."""
    return _payload(KernelSummary(function.buffers, function.function_constants))


def _cached_summary(function) -> KernelSummary:
    decoded = map(_decoded, record_payloads(function, SUMMARY_TARGET, summary_toolchain()))
    summary = next(filter(None, decoded), None)
    if summary is not None:
        return summary
    path, key = summary_entry(function)
    payload = read_entry(path, key) if path else None
    if payload is not None:
        summary = _decoded(payload)
        if summary is not None:
            return summary
    summary = KernelSummary(function.buffers, function.function_constants)
    if path:
        write_entry(path, key, _payload(summary))
    return summary


def _payload(summary: KernelSummary) -> bytes:
    return json.dumps({"buffers": [_argument_data(a) for a in summary.buffers],
                       "constants": [[c.name, c.type, c.index, c.required] for c in summary.function_constants]
                       }).encode()


def _argument_data(argument: Argument) -> dict:
    data = argument._asdict()
    data["struct_fields"] = [_field_data(f) for f in argument.struct_fields]
    return data


def _field_data(field: StructField) -> dict:
    data = field._asdict()
    data["fields"] = [_field_data(f) for f in field.fields]
    data["indirect"] = None if field.indirect is None else _argument_data(field.indirect)
    return data


def _decoded(payload: bytes):
    """The summary in `payload`, or None if it is not one (then it is rebuilt)."""
    try:
        data = json.loads(payload)
        return KernelSummary([_argument(a) for a in data["buffers"]],
                             [FunctionConstant(name, kind, index, required)
                              for name, kind, index, required in data["constants"]])
    except (ValueError, KeyError, TypeError):  # UnicodeDecodeError and JSONDecodeError included
        return None


def _argument(data: dict) -> Argument:
    if set(data) != set(Argument._fields):
        raise KeyError("argument fields")
    return Argument(**{**data, "struct_fields": tuple(_field(f) for f in data["struct_fields"]),
                       "extra": _tuples(data["extra"])})


def _field(data: dict) -> StructField:
    if set(data) != set(StructField._fields):
        raise KeyError("struct field fields")
    return StructField(**{**data, "fields": tuple(_field(f) for f in data["fields"]),
                          "indirect": None if data["indirect"] is None else _argument(data["indirect"])})


def _tuples(value):
    """JSON's lists back into the tuples reflection holds."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value
