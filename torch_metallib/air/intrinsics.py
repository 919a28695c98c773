"""Host definitions of AIR's per-lane ``air.*`` intrinsics, as LLVM IR text.

Each ``declare RET @air.NAME(PARAMS)`` of a kernel module is replaced by a definition
built from the name and the declared types (docs/formats.md, AIR): math maps onto LLVM
intrinsics (which the host backend lowers to vector instructions or libm calls),
conversions onto LLVM casts with Metal's rules (float -> integer saturates, NaN -> 0;
to bool is ``!= 0``; f16/bf16 round to nearest even), integer ops onto LLVM intrinsics.
SIMD-group, barrier and atomic intrinsics are not per-lane and are not defined here.
"""

import re
from typing import List, Optional, Tuple

from .derived_forms import element_type, lanewise, via_wider  # element_type: re-exported
from .math_functions import MATH_OPS, define_math

__all__ = [
    "define_intrinsic", "parse_declaration", "element_type", "overload_suffix", "with_element",
    "is_float_type", "type_bytes", "SIMD_WIDTH", "VIA_DOUBLE",
]

# air.<op>.<type> -> llvm.<op>.<type>, unary on floats (also fast_<op>).
_FLOAT_UNARY = {
    "exp": "exp", "exp2": "exp2", "exp10": "exp10", "log": "log", "log2": "log2",
    "log10": "log10", "sin": "sin", "cos": "cos", "tan": "tan", "asin": "asin", "acos": "acos",
    "atan": "atan", "sinh": "sinh", "cosh": "cosh", "tanh": "tanh", "sqrt": "sqrt",
    "fabs": "fabs", "floor": "floor", "ceil": "ceil", "trunc": "trunc", "rint": "rint",
    "round": "round",
}
_FLOAT_BINARY = {"pow": "pow", "powr": "pow", "atan2": "atan2", "fmin": "minnum", "fmax": "maxnum",
                 "copysign": "copysign"}
# Functions LLVM has no intrinsic for: the C library's float versions.
_LIBM_UNARY = {"asinh": "asinhf", "acosh": "acoshf", "atanh": "atanhf", "erf": "erff",
               "expm1": "expm1f", "log1p": "log1pf"}
_INT_BINARY = {("max", "s"): "smax", ("max", "u"): "umax", ("min", "s"): "smin", ("min", "u"): "umin"}
_BIT_COUNTS = {"popcount": "ctpop", "clz": "ctlz", "ctz": "cttz"}
# Float functions defined once, on float scalars: their half/bfloat forms are computed in
# float, their vector forms lane by lane (derived_forms.py).
_FLOAT_MATH = (set(_FLOAT_UNARY) | set(_FLOAT_BINARY) | set(_LIBM_UNARY) | set(MATH_OPS)
               | {"fma", "fmod", "rsqrt", "ldexp"})
_LANEWISE = _FLOAT_MATH | set(_BIT_COUNTS) | {"nextafter"}
# Precise (not fast_) float functions that libm's float versions get within 2 ulp of the
# correctly rounded result: computed in double instead (benchmarks/precision.py).
VIA_DOUBLE = ({"exp", "exp2", "exp10", "log", "log2", "log10", "sin", "cos", "tan", "asin", "acos", "atan",
                "sinh", "cosh", "tanh", "pow", "powr", "atan2"} | set(_LIBM_UNARY))
SIMD_WIDTH = 32  # threads per SIMD-group on Apple GPUs
_FLOAT_BITS = {"half": 16, "bfloat": 16, "float": 32, "double": 64}
_FLOAT_CODES = {"half": "f16", "bfloat": "bf16", "float": "f32", "double": "f64"}

_DECLARATION = re.compile(r"^declare (?:[\w ]+ )?(\{[^}]*\}|<[^>]+>|\S+) @([\w.]+)\(")
_PARAMETER_TYPE = re.compile(r"ptr(?: addrspace\(\d+\))?|<\d+ x \w+>|\S+")


def parse_declaration(line: str) -> Optional[Tuple[str, str, List[str]]]:
    """(return type, name, parameter types without attributes) of a ``declare`` line,
    None if unreadable."""
    match = _DECLARATION.match(line)
    if match is None:
        return None
    params, depth, start = [], 0, match.end()
    for i in range(match.end(), len(line)):  # up to the matching ')': attributes nest
        character = line[i]
        if character in "(<":
            depth += 1
        elif character in ">)" and depth > 0:
            depth -= 1
        elif character in ",)" and depth == 0:
            if line[start:i].strip():
                params.append(_PARAMETER_TYPE.match(line[start:i].strip()).group(0))
            start = i + 1
            if character == ")":
                return match.group(1), match.group(2), params
    return None


def overload_suffix(type_name: str) -> str:
    """LLVM's overload suffix: float -> f32, <4 x half> -> v4f16, i32 -> i32."""
    match = re.fullmatch(r"<(\d+) x (\w+)>", type_name)
    code = _FLOAT_CODES.get(element_type(type_name), element_type(type_name))
    return f"v{match.group(1)}{code}" if match else code


def with_element(type_name: str, element: str) -> str:
    """`type_name` with its element type replaced (<4 x half>, float -> <4 x float>)."""
    match = re.fullmatch(r"<(\d+) x (\w+)>", type_name)
    return f"<{match.group(1)} x {element}>" if match else element


def is_float_type(type_name: str) -> bool:
    return element_type(type_name) in _FLOAT_BITS


def type_bytes(type_name: str) -> int:
    """Bytes of a scalar or vector LLVM type's elements (no padding)."""
    match = re.fullmatch(r"<(\d+) x (\w+)>", type_name)
    count = int(match.group(1)) if match else 1
    element = element_type(type_name)
    if element == "ptr":
        return count * 8  # the host's pointers
    return count * (_FLOAT_BITS.get(element) or int(element[1:])) // 8


def _call(ret: str, callee: str, args: List[Tuple[str, str]]) -> str:
    return f"call {ret} @{callee}({', '.join(f'{t} {v}' for t, v in args)})"


def _convert(ret: str, param: str, dst_kind: str, src_kind: str) -> Tuple[List[str], List[str]]:
    """Lines and extra declarations converting %a0 (param) to ret."""
    src, dst = element_type(param), element_type(ret)
    if src_kind == "f" and dst_kind == "f":
        if _FLOAT_BITS[src] == _FLOAT_BITS[dst] and src != dst:  # half <-> bfloat: via float
            mid = with_element(param, "float")
            return [f"%m = fpext {param} %a0 to {mid}", f"%r = fptrunc {mid} %m to {ret}"], []
        op = "fpext" if _FLOAT_BITS[dst] > _FLOAT_BITS[src] else "fptrunc"
        if src == dst:
            return [f"%r = bitcast {ret} %a0 to {ret}"], []
        return [f"%r = {op} {param} %a0 to {ret}"], []
    if dst_kind == "f":  # integer -> float; i1 is always unsigned
        op = "sitofp" if src_kind == "s" and src != "i1" else "uitofp"
        if dst == "bfloat":  # via float: the host lowers i -> bf16 only through a libcall
            mid = with_element(ret, "float")
            return [f"%m = {op} {param} %a0 to {mid}", f"%r = fptrunc {mid} %m to {ret}"], []
        return [f"%r = {op} {param} %a0 to {ret}"], []
    if src_kind == "f":  # float -> integer
        lines, value, wide = [], "%a0", param
        if src in ("half", "bfloat"):
            wide = with_element(param, "float")
            lines.append(f"%w = fpext {param} %a0 to {wide}")
            value = "%w"
        if dst == "i1":
            return lines + [f"%r = fcmp une {wide} {value}, zeroinitializer"], []
        name = f"llvm.fpto{'s' if dst_kind == 's' else 'u'}i.sat.{overload_suffix(ret)}.{overload_suffix(wide)}"
        return lines + [f"%r = {_call(ret, name, [(wide, value)])}"], [f"declare {ret} @{name}({wide})"]
    # integer -> integer
    src_bits, dst_bits = int(src[1:]), int(dst[1:])
    if dst == "i1":
        return [f"%r = icmp ne {param} %a0, zeroinitializer"], []
    if dst_bits == src_bits:
        return [f"%r = bitcast {param} %a0 to {ret}"], []
    if dst_bits < src_bits:
        return [f"%r = trunc {param} %a0 to {ret}"], []
    extend = "sext" if src_kind == "s" and src != "i1" else "zext"
    return [f"%r = {extend} {param} %a0 to {ret}"], []


def define_intrinsic(ret: str, name: str, params: List[str], symbol: Optional[str] = None
                     ) -> Optional[Tuple[str, List[str]]]:
    """(an internal LLVM IR definition of `name`, called `symbol` (default: `name`), the
    declarations it needs), or None if this intrinsic is not a per-lane operation this
    backend implements."""
    symbol = symbol or name
    parts = name.split(".")
    if parts[0] != "air" or len(parts) < 3:
        return None
    op = parts[1][5:] if parts[1].startswith("fast_") else parts[1]
    if op in _LANEWISE and any(t.startswith("<") for t in [ret, *params]):
        return lanewise(ret, name, params, symbol, define_intrinsic)
    narrow = [t for t in [ret, *params] if t in ("half", "bfloat")]
    if op in _FLOAT_MATH and narrow:
        return via_wider(ret, name, params, symbol, define_intrinsic)
    if op in VIA_DOUBLE and not parts[1].startswith("fast_") and ret == "float" and set(params) == {"float"}:
        return via_wider(ret, name, params, symbol, define_intrinsic, ("float",), "double")
    made = define_math(ret, op, params, symbol)
    if made is not None:
        return made
    if op == "sincos":
        return _sincos(ret, params, symbol)
    args = [(t, f"%a{i}") for i, t in enumerate(params)]
    lines: List[str] = []
    declarations: List[str] = []
    if op == "convert" and len(parts) == 6 and len(params) == 1:
        lines, declarations = _convert(ret, params[0], parts[2], parts[4])
    elif op == "normalize_function_constant_predicate" and params == ["i8"]:
        lines = ["%c = icmp ne i8 %a0, 0", "%r = zext i1 %c to i8"]
    elif op in _FLOAT_UNARY and len(params) == 1:
        callee = f"llvm.{_FLOAT_UNARY[op]}.{overload_suffix(ret)}"
        lines, declarations = [f"%r = {_call(ret, callee, args)}"], [f"declare {ret} @{callee}({ret})"]
    elif op in _FLOAT_BINARY and len(params) == 2:
        callee = f"llvm.{_FLOAT_BINARY[op]}.{overload_suffix(ret)}"
        lines, declarations = [f"%r = {_call(ret, callee, args)}"], [f"declare {ret} @{callee}({ret}, {ret})"]
    elif op == "fma" and len(params) == 3:
        callee = f"llvm.fma.{overload_suffix(ret)}"
        lines, declarations = [f"%r = {_call(ret, callee, args)}"], [f"declare {ret} @{callee}({ret}, {ret}, {ret})"]
    elif op == "fmod" and len(params) == 2:
        lines = [f"%r = frem {ret} %a0, %a1"]
    elif op == "rsqrt" and params == ["float"] and ret == "float":  # in double: rounded once
        lines = ["%d = fpext float %a0 to double", "%s = call double @llvm.sqrt.f64(double %d)",
                 "%q = fdiv double 1.0, %s", "%r = fptrunc double %q to float"]
        declarations = ["declare double @llvm.sqrt.f64(double)"]
    elif op == "rsqrt" and len(params) == 1:
        callee = f"llvm.sqrt.{overload_suffix(ret)}"
        one = "1.0" if not ret.startswith("<") else f"splat ({element_type(ret)} 1.0)"
        lines = [f"%s = {_call(ret, callee, args)}", f"%r = fdiv {ret} {one}, %s"]
        declarations = [f"declare {ret} @{callee}({ret})"]
    elif op == "ldexp" and len(params) == 2:
        callee = f"llvm.ldexp.{overload_suffix(ret)}.{overload_suffix(params[1])}"
        lines, declarations = [f"%r = {_call(ret, callee, args)}"], [f"declare {ret} @{callee}({ret}, {params[1]})"]
    elif op in _LIBM_UNARY and params == [ret] and ret in ("float", "double"):
        libm = _LIBM_UNARY[op] if ret == "float" else _LIBM_UNARY[op][:-1]  # asinhf / asinh
        lines, declarations = [f"%r = call {ret} @{libm}({ret} %a0)"], [f"declare {ret} @{libm}({ret})"]
    elif op in _BIT_COUNTS and params[:1] == [ret] and len(params) in (1, 2) and not is_float_type(ret):
        callee = f"llvm.{_BIT_COUNTS[op]}.{overload_suffix(ret)}"
        extra = [] if op == "popcount" else [("i1", "false")]  # clz/ctz of 0: the bit width
        lines = [f"%r = {_call(ret, callee, args[:1] + extra)}"]
        declarations = [f"declare {ret} @{callee}({', '.join([ret] + [t for t, _ in extra])})"]
    elif op in ("all", "any") and ret == "i1" and len(params) == 1 and element_type(params[0]) == "i1":
        if params[0] == "i1":
            lines = ["%r = or i1 %a0, false"]
        else:
            callee = f"llvm.vector.reduce.{'and' if op == 'all' else 'or'}.{overload_suffix(params[0])}"
            lines, declarations = [f"%r = call i1 @{callee}({params[0]} %a0)"], [f"declare i1 @{callee}({params[0]})"]
    elif (op, parts[2]) in _INT_BINARY and len(params) == 2:
        callee = f"llvm.{_INT_BINARY[(op, parts[2])]}.{overload_suffix(ret)}"
        lines, declarations = [f"%r = {_call(ret, callee, args)}"], [f"declare {ret} @{callee}({ret}, {ret})"]
    elif op == "clamp" and len(params) == 3 and all(t == ret for t in params):
        if is_float_type(ret):  # Metal: fmin(fmax(x, lo), hi)
            low, high = f"llvm.maxnum.{overload_suffix(ret)}", f"llvm.minnum.{overload_suffix(ret)}"
        elif parts[2] in ("s", "u"):
            low, high = (f"llvm.{parts[2]}{m}.{overload_suffix(ret)}" for m in ("max", "min"))
        else:
            return None
        lines = [f"%m = {_call(ret, low, args[:2])}", f"%r = {_call(ret, high, [(ret, '%m'), args[2]])}"]
        declarations = [f"declare {ret} @{low}({ret}, {ret})", f"declare {ret} @{high}({ret}, {ret})"]
    elif op == "dot" and len(params) == 2 and params[0] == params[1] and is_float_type(ret) \
            and element_type(params[0]) == ret:
        # In element order, without reassociation: the sum Metal's dot spells out.
        callee = f"llvm.vector.reduce.fadd.{overload_suffix(params[0])}"
        lines = [f"%m = fmul {params[0]} %a0, %a1", f"%r = call {ret} @{callee}({ret} -0.0, {params[0]} %m)"]
        declarations = [f"declare {ret} @{callee}({ret}, {params[0]})"]
    elif op in ("load", "store") and parts[2] in ("device_coherent", "system_coherent"):
        # Coherent (and volatile) accesses: volatile, so a spinning kernel rereads memory.
        pointer = next((t for t in params if t.startswith("ptr")), "")
        if op == "load" and params == [pointer] and pointer:
            lines = [f"%r = load volatile {ret}, {pointer} %a0"]
        elif op == "store" and ret == "void" and len(params) == 2 and params[1] == pointer and pointer:
            signature = ", ".join(f"{t} %a{i}" for i, t in enumerate(params))
            return (f"define internal void @{symbol}({signature}) alwaysinline {{\n"
                    f"  store volatile {params[0]} %a0, {pointer} %a1\n  ret void\n}}"), []
    elif op == "get_simdgroup_size" and not params and ret in ("i16", "i32"):
        lines = [f"%r = add {ret} 0, {SIMD_WIDTH}"]
    elif op == "abs" and parts[2] in ("s", "u") and len(params) == 1:
        if parts[2] == "u":
            lines = [f"%r = add {ret} %a0, zeroinitializer"]
        else:
            callee = f"llvm.abs.{overload_suffix(ret)}"
            lines = [f"%r = {_call(ret, callee, args + [('i1', 'false')])}"]
            declarations = [f"declare {ret} @{callee}({ret}, i1)"]
    else:
        return None
    if not lines:
        return None
    signature = ", ".join(f"{t} %a{i}" for i, t in enumerate(params))
    body = "\n  ".join(lines + [f"ret {ret} %r"])
    return f"define internal {ret} @{symbol}({signature}) alwaysinline {{\n  {body}\n}}", declarations


def _sincos(ret: str, params: List[str], symbol: str) -> Optional[Tuple[str, List[str]]]:
    """Metal's ``sincos(x, cosval)``: returns sin(x) and stores cos(x) through the pointer
    (Apple's compiler merges a sin and a cos of one value into it). Computed in double and
    rounded once, as the precise sin and cos are (VIA_DOUBLE)."""
    if ret not in _FLOAT_BITS or ret == "double" or len(params) != 2 or params[0] != ret \
            or not params[1].startswith("ptr"):
        return None
    lines = ["%d = fpext {0} %a0 to double".format(ret) if ret != "bfloat" else
             "%f = fpext bfloat %a0 to float\n  %d = fpext float %f to double"]
    lines += ["%s = call double @llvm.sin.f64(double %d)", "%c = call double @llvm.cos.f64(double %d)"]
    for name in ("s", "c"):
        if ret == "float":
            lines.append(f"%{name}r = fptrunc double %{name} to float")
        else:  # rounded to float first, as Metal computes half and bfloat math in float
            lines += [f"%{name}f = fptrunc double %{name} to float", f"%{name}r = fptrunc float %{name}f to {ret}"]
    lines += [f"store {ret} %cr, {params[1]} %a1", f"ret {ret} %sr"]
    body = "\n  ".join(lines)
    return (f"define internal {ret} @{symbol}({ret} %a0, {params[1]} %a1) alwaysinline {{\n  {body}\n}}",
            ["declare double @llvm.sin.f64(double)", "declare double @llvm.cos.f64(double)"])
