"""Small private arrays indexed at run time, kept in registers on NVIDIA GPUs.

LLVM's SROA puts a thread's private array (``float thread_x[8]`` in MLX's layer_norm)
in registers only where every access has a constant index; an index known only at run
time (a loop LLVM cannot unroll fully, like layer_norm's reads up to the row's end)
leaves the array in local memory: slow, and what ptxas then makes of it depends on its
heuristics. Here each access whose index is run-time (only the ones
private_arrays.clamp_private_array_indices already clamped into the array, so the index
is always in range) becomes accesses of every element at a constant index and a chain of
selects on the index: a load picks the element equal to the index, a store writes the
value to that element and each other element's own value back. The same values, so the
same results; SROA then promotes the array, and where the index becomes constant
(unrolled loops) the selects fold away. Arrays of scalars up to _MAX_ELEMENTS elements.
ptx.py applies it to a kernel whose PTX kept a private array in local memory.
"""

import re
from typing import Dict, List, Tuple

from ...reflection.ir_model import NAME, edit_function_bodies, used_names

__all__ = ["private_arrays_in_registers"]

_MAX_ELEMENTS = 17  # 16 and the clamp's extra element: beyond, the selects cost more than local memory
_SCALAR = r"(?:half|bfloat|float|double|i\d+)"
_ALLOCA = re.compile(rf"^\s*(%{NAME}) = alloca \[(\d+) x ({_SCALAR})\]")
_GEP = re.compile(rf"^\s*(%{NAME}) = getelementptr (?:inbounds )?\[(\d+) x ({_SCALAR})\], ptr (%{NAME}), "
                  r"i\d+ 0, (i\d+) (%tm\.index\d+)$")
_LOAD = re.compile(rf"^\s*(%{NAME}) = load ({_SCALAR}), ptr (%{NAME})(?:, align \d+)?(?:, !.*)?$")
_STORE = re.compile(rf"^\s*store ({_SCALAR}) ([^,]+), ptr (%{NAME})(?:, align \d+)?(?:, !.*)?$")


def _uses(body: List[str], name: str) -> List[int]:
    return [i for i, line in enumerate(body) if name in line and name in used_names(line)]


def _element_pointers(tag: str, array: Tuple[str, int, str], index_type: str) -> List[str]:
    name, count, element = array
    return [f"  %{tag}.p{k} = getelementptr inbounds [{count} x {element}], ptr {name}, {index_type} 0, {index_type} {k}"
            for k in range(count)]


def _registers(body: List[str], counter: List[int]) -> List[str]:
    arrays: Dict[str, Tuple[str, int, str]] = {}
    for line in body:
        alloca = _ALLOCA.match(line)
        if alloca and int(alloca.group(2)) <= _MAX_ELEMENTS:
            arrays[alloca.group(1)] = (alloca.group(1), int(alloca.group(2)), alloca.group(3))
    if not arrays:
        return body
    replaced: Dict[int, List[str]] = {}
    for i, line in enumerate(body):
        gep = _GEP.match(line)
        if not gep or arrays.get(gep.group(4)) != (gep.group(4), int(gep.group(2)), gep.group(3)):
            continue
        pointer, index_type, index = gep.group(1), gep.group(5), gep.group(6)
        array = arrays[gep.group(4)]
        count, element = array[1], array[2]
        uses = [u for u in _uses(body, pointer) if u != i]
        accesses = [(u, _LOAD.match(body[u]), _STORE.match(body[u])) for u in uses]
        if not all((load and load.group(2) == element and load.group(3) == pointer) or
                   (store and store.group(1) == element and store.group(3) == pointer and store.group(2).strip() != pointer)
                   for _, load, store in accesses):
            continue  # the pointer escapes or is read as another type: left in memory
        for u, load, store in accesses:
            n = counter[0] = counter[0] + 1
            tag = f"tm.reg{n}"
            lines = _element_pointers(tag, array, index_type)
            lines += [f"  %{tag}.v{k} = load {element}, ptr %{tag}.p{k}" for k in range(count)]
            lines += [f"  %{tag}.is{k} = icmp eq {index_type} {index}, {k}" for k in range(count)]
            if load:
                chain = f"%{tag}.v0"
                for k in range(1, count):
                    target = load.group(1) if k == count - 1 else f"%{tag}.s{k}"
                    lines.append(f"  {target} = select i1 %{tag}.is{k}, {element} %{tag}.v{k}, {element} {chain}")
                    chain = target
            else:
                value = store.group(2)
                for k in range(count):
                    lines += [f"  %{tag}.w{k} = select i1 %{tag}.is{k}, {element} {value}, {element} %{tag}.v{k}",
                              f"  store {element} %{tag}.w{k}, ptr %{tag}.p{k}"]
            replaced[u] = lines
    return [new for i, line in enumerate(body) for new in replaced.get(i, [line])]


def private_arrays_in_registers(text: str) -> str:
    """`text` (a printed module, its private arrays clamped) with run-time indexed accesses
    of small private arrays as constant-index accesses and selects."""
    if "%tm.index" not in text:
        return text
    counter = [0]  # names are numbered across the module
    return edit_function_bodies(text, lambda body: _registers(body, counter))
