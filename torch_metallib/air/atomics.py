"""Host definitions of AIR's atomic intrinsics, as LLVM IR text (docs/formats.md, AIR).

``air.atomic.{global|local}.<op>[.s|.u].<type>(ptr, T, i32 order, i32 scope, i1 volatile)``
becomes an LLVM ``atomicrmw``: threadgroups run in parallel on torch's threads, so device
atomics must be real atomics (threads of one threadgroup are coroutines on one OS thread, for
which any atomic is trivially atomic). Metal only has relaxed ordering (``monotonic``);
``air.atomic.fence`` is a full fence. The census (``python -m torch_metallib census``)
lists the spellings Apple's compilers emit; cmpxchg.weak's shape is read from kernels of
the public corpus (diffusion-rs, mlx 0.0.11, metal-linalg).
"""

from typing import List, Optional, Tuple

from .intrinsics import is_float_type, type_bytes

__all__ = ["define_atomic"]

# air op -> atomicrmw operation: the same for either signedness, except min and max.
_RMW = {"add": "add", "sub": "sub", "and": "and", "or": "or", "xor": "xor", "xchg": "xchg"}
_ORDERED_RMW = {("min", "s"): "min", ("min", "u"): "umin", ("max", "s"): "max", ("max", "u"): "umax"}
_FLOAT_RMW = {"add": "fadd", "sub": "fsub", "min": "fmin", "max": "fmax", "xchg": "xchg"}


def define_atomic(ret: str, name: str, params: List[str]) -> Optional[Tuple[str, List[str]]]:
    """(definition, declarations) of an atomic intrinsic, None if not one we implement."""
    parts = name.split(".")
    if parts[:2] != ["air", "atomic"]:
        return None
    signature = ", ".join(f"{t} %a{i}" for i, t in enumerate(params))
    if parts[2:] == ["fence"] and ret == "void":
        return f"define internal void @{name}({signature}) alwaysinline {{\n  fence seq_cst\n  ret void\n}}", []
    if len(parts) < 5 or parts[2] not in ("global", "local") or not params or not params[0].startswith("ptr"):
        return None
    op, sign = parts[3], parts[4] if parts[4] in ("s", "u") else ""
    if op == "cmpxchg":
        # cmpxchg.weak(ptr object, ptr expected, T desired, success order, failure order,
        # scope, volatile) -> the value found (Apple's compilers compare it with expected);
        # like C++'s compare_exchange, the value found is also written to *expected. Floats
        # compare as bits. Never fails spuriously, which a weak exchange allows.
        value = params[2] if len(params) >= 3 else ""
        if parts[4:5] != ["weak"] or not params[1].startswith("ptr") or ret not in (value, "i1"):
            return None
        bits = f"i{type_bytes(value) * 8}"
        lines = [f"%e = load {bits}, {params[1]} %a1",
                 f"%d = bitcast {value} %a2 to {bits}",
                 f"%p = cmpxchg weak {params[0]} %a0, {bits} %e, {bits} %d monotonic monotonic",
                 f"%old = extractvalue {{ {bits}, i1 }} %p, 0", f"store {bits} %old, {params[1]} %a1",
                 f"%ok = extractvalue {{ {bits}, i1 }} %p, 1"]
        lines.append("%r = or i1 %ok, false" if ret == "i1" else f"%r = bitcast {bits} %old to {value}")
    elif op == "load" and len(params) == 4:
        lines = [f"%r = load atomic {ret}, {params[0]} %a0 monotonic, align {type_bytes(ret)}"]
    elif op == "store" and ret == "void" and len(params) == 5:
        lines = [f"store atomic {params[1]} %a1, {params[0]} %a0 monotonic, align {type_bytes(params[1])}"]
    elif len(params) == 5 and params[1] in (ret, "i64") and (ret == params[1] or ret == "void"):
        # Metal's 64-bit atomic_min/max_explicit return nothing: `void (ptr, i64, ...)`.
        value = params[1]
        operation = _FLOAT_RMW.get(op) if is_float_type(value) else (_RMW.get(op) or _ORDERED_RMW.get((op, sign)))
        if operation is None:
            return None
        lines = [f"%r = atomicrmw {operation} {params[0]} %a0, {value} %a1 monotonic, align {type_bytes(value)}"]
    else:
        return None
    body = "\n  ".join(lines + ["ret void" if ret == "void" else f"ret {ret} %r"])
    return f"define internal {ret} @{name}({signature}) alwaysinline {{\n  {body}\n}}", []
