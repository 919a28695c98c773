"""Out-of-range indices into a thread's private arrays stay inside the array.

Metal leaves an out-of-range index into a private (thread-local) array undefined, and GPUs
tolerate it: MLX's ``layer_norm{float16,bfloat16}`` store ``thread_x[i]`` for i from
``axis_size - lid * 8``, negative on the idle threads MLX's grid gives most axis sizes.
On the CPU such a store lands in the thread's coroutine frame or the stack (another
thread's saved values, a return address) and corrupts results or crashes the process. So each private array gets one more element, and a
variable index into its outer dimension is clamped to that element: stray stores land
there, stray loads read it (an unspecified value, as on a GPU). Indices of inner
dimensions and accesses through other pointer arithmetic are left as they are.
"""

import re
from typing import Dict, List, Tuple

from ..reflection.ir_model import NAME, edit_function_bodies

__all__ = ["clamp_private_array_indices"]

_ALLOCA = re.compile(rf"^(\s*(%{NAME}) = alloca )\[(\d+) x (.*)\](, align \d+)?$")
_GEP = re.compile(rf"getelementptr (inbounds )?\[(\d+) x (.*?)\], ptr (%{NAME}), (i\d+) 0, (i\d+) (%{NAME})")


def _clamp_function(body: List[str], counter: List[int]) -> List[str]:
    arrays: Dict[str, Tuple[int, str]] = {}
    out: List[str] = []
    for line in body:
        alloca = _ALLOCA.match(line)
        if alloca:
            prefix, name, count, element, align = alloca.groups()
            arrays[name] = (int(count), element)
            out.append(f"{prefix}[{int(count) + 1} x {element}]{align or ''}")
            continue
        gep = _GEP.search(line)
        if gep and arrays.get(gep.group(4)) == (int(gep.group(2)), gep.group(3)):
            inbounds, count, element, array, zero_type, index_type, index = gep.groups()
            n = counter[0] = counter[0] + 1
            out += [f"  %tm.in{n} = icmp ult {index_type} {index}, {count}",
                    f"  %tm.index{n} = select i1 %tm.in{n}, {index_type} {index}, {index_type} {count}"]
            line = (line[:gep.start()] + f"getelementptr {inbounds or ''}[{int(count) + 1} x {element}], ptr {array}, "
                    f"{zero_type} 0, {index_type} %tm.index{n}" + line[gep.end():])
        out.append(line)
    return out


def clamp_private_array_indices(text: str) -> str:
    """`text` (a printed module) with every function's private arrays guarded."""
    if " = alloca [" not in text:
        return text
    counter = [0]  # clamp values are numbered across the module
    return edit_function_bodies(text, lambda body: _clamp_function(body, counter))
