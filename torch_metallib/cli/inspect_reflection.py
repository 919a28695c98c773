"""Reflection output of `python -m torch_metallib inspect`: one function's signature and
argument table (``--function``), and every function with a progress bar (``--all``)."""

import collections
import concurrent.futures
import gc
import sys
import time

from ..errors import ReflectionError
from ..library.library import load

__all__ = ["reflection_record", "print_reflection", "reflect_all", "print_failure_summary"]


def _plain(value):
    """JSON-friendly form of a reflection value (records -> dicts, tuples -> lists)."""
    if hasattr(value, "_asdict"):
        return {key: _plain(item) for key, item in value._asdict().items()}
    if hasattr(value, "__dataclass_fields__"):
        return {key: _plain(getattr(value, key)) for key in value.__dataclass_fields__}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if value is None or isinstance(value, (bool, int, float)) or type(value) is str:
        return value
    return str(value)  # node references, globals and raw elements in `extra`


def reflection_record(function) -> dict:
    """The reflection of `function` as a dict, or ``{"error": message}``."""
    try:
        reflection = function.reflection
    except ReflectionError as error:
        return {"error": str(error), "node": error.node}
    record = _plain(reflection)
    for name in ("threadgroup_memory_static", "uses_barriers", "uses_simdgroup_ops", "signature"):
        record[name] = getattr(reflection, name)
    return record


def _cell(value) -> str:
    return "-" if value is None or value == "" else str(value)


def _notes(argument) -> str:
    notes = []
    if argument.is_builtin:
        if argument.components is not None:
            notes.append(f"{argument.components} x {argument.component_bits}-bit")
    if argument.holds_pointer:
        notes.append(f"holds a pointer to {argument.pointee_address_space} {argument.pointee_type or 'memory'} "
                     f"({argument.pointee_access})")
    if argument.buffer_size is not None:
        notes.append(f"{argument.buffer_size}-byte value")
    if argument.function_constant is not None:
        notes.append(f"only if {argument.function_constant}")
    if argument.struct_fields:
        notes.append("struct { " + "; ".join(_field(f) for f in argument.struct_fields) + " }")
    if argument.unused:
        notes.append("unused")
    notes.extend(f"{key}={list(values)}" for key, values in argument.extra)
    return ", ".join(notes)


def _field(field) -> str:
    array = f"[{field.array_length}]" if field.array_length else ""
    return f"{field.type_name} {field.name}{array} @{field.offset}"


def print_reflection(function, out=sys.stdout) -> None:
    """Signature, argument table and the kernel's limits, as text."""
    try:
        reflection = function.reflection
    except ReflectionError as error:
        print(f"    reflection failed: {error}", file=out)
        return
    print(f"\n{reflection.signature}\n", file=out)
    header = ("pos", "name", "kind", "binding", "space", "access", "type", "size", "align", "notes")
    rows = [header] + [
        (str(a.position), a.name, a.kind, _cell(a.binding), _cell(a.address_space),
         _cell(a.access), a.type_name if not a.is_builtin else f"{a.type_name} ({a.builtin})",
         _cell(a.type_size), _cell(a.type_align), _notes(a))
        for a in reflection.arguments
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    for row in rows:
        print(("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1]).rstrip(),
              file=out)
    constants = ", ".join(f"{c.name}:{c.type}@{c.index}{'' if c.required else '?'}"
                          for c in reflection.function_constants)
    print(f"\nfunction constants:  {constants or '-'}", file=out)
    print(f"max threads/group:   {_cell(reflection.max_total_threads_per_threadgroup)}", file=out)
    print(f"threadgroup memory:  {reflection.threadgroup_memory_static} bytes in "
          f"{len(reflection.threadgroup_variables)} variables", file=out)
    print(f"barriers:            {'yes' if reflection.uses_barriers else 'no'}; SIMD-group ops: "
          f"{'yes' if reflection.uses_simdgroup_ops else 'no'}", file=out)
    print(f"intrinsics:          {', '.join(reflection.intrinsics) or '-'}", file=out)
    for key, values in reflection.extra:
        print(f"kernel attribute:    {key} {list(values)}", file=out)


class _Progress:
    """A one-line progress bar on a terminal; a line per 10% otherwise (logs, CI)."""

    def __init__(self, total: int, out):
        self.total, self.out = total, out
        self.tty = out.isatty()
        self.start = self.last = time.perf_counter()
        self.reported = 0

    def update(self, done: int, failed: int, final: bool = False) -> None:
        now = time.perf_counter()
        if self.tty:
            if not final and now - self.last < 0.2:
                return
            filled = 30 * done // max(self.total, 1)
            self.out.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {done:,}/{self.total:,} "
                           f"functions, {failed:,} failed, {now - self.start:.1f} s"
                           + ("\n" if final else ""))
        elif done * 10 // max(self.total, 1) > self.reported or (final and self.reported < 10):
            self.reported = done * 10 // max(self.total, 1)
            self.out.write(f"reflected {done:,}/{self.total:,} functions, {failed:,} failed, "
                           f"{now - self.start:.1f} s\n")
        self.out.flush()
        self.last = now


_CHUNK = 256  # functions per task when reflecting in worker processes
_worker_library = None


def _outcome(function, as_record: bool):
    """reflection_record(function) if `as_record`; otherwise only failures, as the same
    ``{"error", "node"}`` dict (None on success), so no record is built for nothing."""
    if as_record:
        return reflection_record(function)
    try:
        function.reflection
    except ReflectionError as error:
        return {"error": str(error), "node": error.node}
    return None


def _reflect_chunk(path: str, names: list, as_records: bool) -> list:
    """Worker process: outcomes for `names`, loading the library once per worker."""
    global _worker_library
    if _worker_library is None:
        _worker_library = load(path)
    return [_outcome(_worker_library[name], as_records) for name in names]


def reflect_all(lib, path: str = None, jobs: int = 1, records: bool = False, progress_out=sys.stderr):
    """Reflects every function of `lib` (loaded from `path`), in `jobs` processes.

    Returns (records by name, or None unless `records`; failure messages by name).
    """
    names = lib.function_names
    progress = _Progress(len(names), progress_out)
    if jobs > 1 and path is not None and len(names) > _CHUNK:
        chunks = [names[i:i + _CHUNK] for i in range(0, len(names), _CHUNK)]
        pool = concurrent.futures.ProcessPoolExecutor(jobs)
        batches = pool.map(_reflect_chunk, [path] * len(chunks), chunks, [records] * len(chunks))
    else:
        pool, batches = None, ([_outcome(lib[name], records)] for name in names)
    by_name, failures, done = {}, {}, 0
    # Thousands of long-lived, acyclic records: without this the cyclic collector rescans
    # them over and over (3.5 s of 22 s on the corpus).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for batch in batches:
            for outcome in batch:
                name = names[done]
                done += 1
                if outcome is not None and "error" in outcome:
                    failures[name] = outcome["error"]
                if records:
                    by_name[name] = outcome
            progress.update(done, len(failures))
    finally:
        if gc_was_enabled:
            gc.enable()
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    progress.update(len(names), len(failures), final=True)
    return (by_name if records else None), failures


def print_failure_summary(failures: dict, total: int, out=sys.stdout, examples: int = 5) -> None:
    """How many reflected, and the failures grouped by message (name removed)."""
    print(f"reflected {total - len(failures):,} of {total:,} functions; {len(failures):,} failed", file=out)
    groups = collections.defaultdict(list)
    for name, message in failures.items():
        groups[message[len(name) + 2:] if message.startswith(name + ": ") else message].append(name)
    for message, names in sorted(groups.items(), key=lambda item: -len(item[1])):
        shown = ", ".join(names[:examples]) + (", ..." if len(names) > examples else "")
        print(f"  {len(names):,} x {message}\n      e.g. {shown}", file=out)
