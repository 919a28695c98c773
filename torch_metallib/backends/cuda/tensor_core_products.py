"""Float 8x8 simdgroup products on tensor cores where their operands are half or bfloat.

MLX's steel GEMM loads its A and B fragments from half (or bfloat) threadgroup tiles into
float simdgroup matrices: each product multiplies values that are exactly half (bfloat)
numbers. matrix_products.py calls PLACEHOLDER for each float product; once LLVM has
optimized the kernel (fragments out of memory, in registers), each call whose A and B
elements are both ``fpext`` from half (or both from bfloat) becomes one ``mma.sync
m16n8k8`` with float accumulation (the products exact, the sums in the tensor core's
order: what the f16/bf16 path promises), every other call the exact path (24 shuffles, 16
fused multiply-adds in k order, bit for bit the CPU's). The tensor-core path needs the
lanes relabelled (lane_relabeling.py: A, C and D then already sit where mma.sync wants
them; B's column pairs take two shuffles) and the whole warp present: it checks both at run
time, per warp, and takes the exact path otherwise. f32 products never use TF32.
"""

import re
from typing import Dict, List

from .matrix_products import PLACEHOLDER, exact_product_lines

__all__ = ["tensor_core_products"]

_CALL = re.compile(r"call <2 x float> @" + re.escape(PLACEHOLDER)
                   + r"\(<2 x float> (\S+), <2 x float> (\S+), <2 x float> (\S+), i1 (\S+)\)")
_DEFINED = re.compile(r"^\s*(%[-\w.$]+) = (.*)$", re.M)
_MMA = {"half": "f16", "bfloat": "bf16"}
_NEEDED = ["declare float @llvm.fma.f32(float, float, float)", "declare i32 @llvm.nvvm.activemask()",
           "declare i32 @llvm.nvvm.read.ptx.sreg.laneid()",
           "declare i32 @llvm.nvvm.shfl.sync.idx.i32(i32, i32, i32, i32)"]


def _origin(value: str, defined: Dict[str, str]) -> str:
    """'half' or 'bfloat' where each element of <2 x float> `value` is an fpext from that
    type, else ''."""
    line = defined.get(value, "")
    vector = re.match(r"fpext <2 x (half|bfloat)> \S+ to <2 x float>", line)
    if vector:
        return vector.group(1)
    kinds = []
    for slot in (1, 0):
        inserted = re.match(r"insertelement <2 x float> (\S+), float (\S+), i(?:32|64) (\d)$", line)
        if not inserted or int(inserted.group(3)) != slot:
            return ""
        scalar = re.match(r"fpext (half|bfloat) \S+ to float$", defined.get(inserted.group(2), ""))
        if not scalar:
            return ""
        kinds.append(scalar.group(1))
        line = defined.get(inserted.group(1), "") if slot == 1 else ""
    return kinds[0] if kinds[0] == kinds[1] else ""


def tensor_core_products(text: str) -> str:
    """`text` (an optimized module) with PLACEHOLDER defined: each call as a tensor-core
    product where its A and B are half (bfloat) values, else the exact one; `text` itself
    where it has no such call."""
    if f"@{PLACEHOLDER}(" not in text:
        return text
    defined = {name: rest.split(", !")[0].strip() for name, rest in _DEFINED.findall(text)}
    used = set()

    def route(match) -> str:
        a, b = _origin(match.group(1), defined), _origin(match.group(2), defined)
        kind = a if a and a == b else "exact"
        used.add(kind)
        return match.group(0).replace(f"@{PLACEHOLDER}(", f"@{PLACEHOLDER}.{kind}(", 1)

    text = _CALL.sub(route, text)
    text = re.sub(r"^declare [^\n]*@" + re.escape(PLACEHOLDER) + r"\([^\n]*\n", "", text, flags=re.M)
    definitions = [_exact()] + [_tensor_core(kind) for kind in sorted(used - {"exact"})]
    declared = set(re.findall(r"^declare [^\n]*?@([-\w$.]+)\(", text, re.M))
    needed = [d for d in _NEEDED if re.search(r"@([-\w$.]+)\(", d).group(1) not in declared]
    return text + "\n" + "\n".join(definitions + needed) + "\n"


def _elements(prefix: str = "") -> List[str]:
    return [f"%{prefix}f{operand}{k} = extractelement <2 x float> %{operand}, i32 {k}" for operand in "abc" for k in (0, 1)]


def _exact_body() -> List[str]:
    return _elements() + exact_product_lines() + [
        "%e.0 = insertelement <2 x float> poison, float %d0.7, i32 0",
        "%e = insertelement <2 x float> %e.0, float %d1.7, i32 1"]


def _exact() -> str:
    body = "\n  ".join(_exact_body() + ["ret <2 x float> %e"])
    return (f"define internal <2 x float> @{PLACEHOLDER}.exact(<2 x float> %a, <2 x float> %b, <2 x float> %c, "
            f"i1 %relabel) alwaysinline convergent nounwind {{\n  {body}\n}}")


def _tensor_core(kind: str) -> str:
    """One m16n8k8 (rows 8-15 of A zero, D's rows 0-7 kept) where the whole warp runs
    relabelled, else the exact product."""
    mma = _MMA[kind]
    lines = ["%all = call i32 @llvm.nvvm.activemask()", "%whole = icmp eq i32 %all, -1",
             "%go = and i1 %whole, %relabel", "br i1 %go, label %mma, label %exact", "mma:",
             f"%ah = fptrunc <2 x float> %a to <2 x {kind}>", f"%ai = bitcast <2 x {kind}> %ah to i32",
             f"%bh = fptrunc <2 x float> %b to <2 x {kind}>", f"%bi = bitcast <2 x {kind}> %bh to i32",
             "%l = call i32 @llvm.nvvm.read.ptx.sreg.laneid()", "%g = lshr i32 %l, 2", "%t = and i32 %l, 3",
             # B[2t][g] and B[2t+1][g]: in the pairs of lanes 8t + g/2 and 8t + 4 + g/2, half g&1.
             "%t8 = shl i32 %t, 3", "%g2 = lshr i32 %g, 1", "%src0 = or i32 %t8, %g2", "%src1 = add i32 %src0, 4",
             "%s0 = call i32 @llvm.nvvm.shfl.sync.idx.i32(i32 -1, i32 %bi, i32 %src0, i32 31)",
             "%s1 = call i32 @llvm.nvvm.shfl.sync.idx.i32(i32 -1, i32 %bi, i32 %src1, i32 31)",
             "%odd = and i32 %g, 1", "%shift = shl i32 %odd, 4", "%e0 = lshr i32 %s0, %shift",
             "%lo = and i32 %e0, 65535", "%e1 = lshr i32 %s1, %shift", "%hi = shl i32 %e1, 16", "%bf = or i32 %lo, %hi",
             "%c0 = extractelement <2 x float> %c, i32 0", "%c1 = extractelement <2 x float> %c, i32 1",
             f'%d = call {{ float, float, float, float }} asm sideeffect "mma.sync.aligned.m16n8k8.row.col.f32.{mma}.'
             f'{mma}.f32 {{$0,$1,$2,$3}}, {{$4,$5}}, {{$6}}, {{$7,$8,$9,$10}};", "=f,=f,=f,=f,r,r,r,f,f,f,f"'
             "(i32 %ai, i32 0, i32 %bf, float %c0, float %c1, float 0.0, float 0.0) convergent nounwind",
             "%m0 = extractvalue { float, float, float, float } %d, 0",
             "%m1 = extractvalue { float, float, float, float } %d, 1",
             "%m.0 = insertelement <2 x float> poison, float %m0, i32 0",
             "%m = insertelement <2 x float> %m.0, float %m1, i32 1", "br label %done", "exact:"]
    lines += _exact_body() + ["br label %done", "done:", "%r = phi <2 x float> [ %m, %mma ], [ %e, %exact ]",
                              "ret <2 x float> %r"]
    body = "\n  ".join(lines)
    return (f"define internal <2 x float> @{PLACEHOLDER}.{kind}(<2 x float> %a, <2 x float> %b, <2 x float> %c, "
            f"i1 %relabel) alwaysinline convergent nounwind {{\nentry:\n  {body}\n}}")
