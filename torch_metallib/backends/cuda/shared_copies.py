"""Copies from global into shared memory, versioned on the source's alignment at run time.

MLX's steel GEMM copies each thread's 16 bytes of a tile from device into threadgroup
memory with one ``memcpy``: the threadgroup side is 16-byte aligned (lowering.py aligns
threadgroup arrays), the device side only as aligned as a half. NVPTX then copies two bytes
at a time (8 loads, 8 stores). Where the source is aligned at run time (a matrix whose rows
are a multiple of 16 bytes, as torch's contiguous f16 4096^3 are) one 16-byte load and one
16-byte store do it; the unaligned copy stays for the other launches, in a function of its
own: inline, ptxas predicated both copies into every step of steel GEMM's loop (16 two-byte
loads and stores issued, predicated off, beside each 16-byte copy).
"""

import re
from typing import Dict

__all__ = ["versioned_shared_copies"]

_COPY = re.compile(r"^(\s*)(?:tail )?call void @llvm\.memcpy\.p3\.p1\.i64\(ptr addrspace\(3\) [^,\n]*?align (\d+)"
                   r"[^,\n]* (%[-\w.$]+), ptr addrspace\(1\) [^,\n]*?align (\d+)[^,\n]* (%[-\w.$]+), i64 (\d+), "
                   r"i1 false\)[^\n]*$", re.M)
_WIDEST = 16


def _definition(name: str, size: int, target: int, source: int) -> str:
    # The wide copy as a vector load and store: two memcpys differing only in alignment are
    # merged back into the narrow one by LLVM's CFG simplification. The narrow one called.
    words = f"<{size // 4} x i32>" if size > 4 else "i32"
    return (f"define internal void @{name}(ptr addrspace(3) %d, ptr addrspace(1) %s) alwaysinline nounwind {{\n"
            f"entry:\n  %address = ptrtoint ptr addrspace(1) %s to i64\n  %low = and i64 %address, {size - 1}\n"
            f"  %aligned = icmp eq i64 %low, 0\n  br i1 %aligned, label %wide, label %narrow\n"
            f"wide:\n  %v = load {words}, ptr addrspace(1) %s, align {size}\n"
            f"  store {words} %v, ptr addrspace(3) %d, align {size}\n  ret void\n"
            f"narrow:\n  call void @{name}.narrow(ptr addrspace(3) %d, ptr addrspace(1) %s)\n  ret void\n}}\n"
            f"define internal void @{name}.narrow(ptr addrspace(3) %d, ptr addrspace(1) %s) noinline nounwind {{\n"
            f"  call void @llvm.memcpy.p3.p1.i64(ptr addrspace(3) align {target} %d, ptr addrspace(1) "
            f"align {source} %s, i64 {size}, i1 false)\n  ret void\n}}\n")


def versioned_shared_copies(text: str) -> str:
    """`text` (a module) with each global-to-shared memcpy of 4, 8 or 16 bytes whose target
    is aligned to its size but whose source is not known to be a call that tests the
    source and copies at once where it is aligned."""
    definitions: Dict[str, str] = {}

    def versioned(match) -> str:
        indent, target, destination, source, origin, size = match.groups()
        size, target, source = int(size), int(target), int(source)
        if size not in (4, 8, _WIDEST) or target < size or source >= size:
            return match.group(0)
        name = f"tm.cuda.copy.{size}.{target}.{source}"
        definitions[name] = _definition(name, size, target, source)
        return f"{indent}call void @{name}(ptr addrspace(3) {destination}, ptr addrspace(1) {origin})"

    text = _COPY.sub(versioned, text)
    return text + "\n" + "".join(definitions.values()) if definitions else text
