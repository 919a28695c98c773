"""Host definitions of AIR math functions LLVM has no intrinsic for, on float scalars (the
half, bfloat and vector forms come from these through derived_forms.py): ``fract``, ``sinpi``,
``cospi``, ``tanpi``, ``sincos``, ``fmin3``/``fmax3``/``fmedian3``, and ``nextafter``
(on the bits of each floating type, so it is not computed in float).

Edge cases follow OpenCL's, which Metal's specification inherits: fract(NaN) = NaN,
fract(±inf) = ±0, and fract(x) = min(x - floor(x), 0x1.fffffep-1); sinpi(n) = ±0 for an
integer n (the sign of n), and sinpi/cospi/tanpi of ±inf are NaN. sinpi and friends reduce
the argument exactly (in double) to [-1/2, 1/2] before multiplying by pi, so that large
arguments and integers are exact.
"""

from typing import List, Optional, Tuple

__all__ = ["define_math", "MATH_OPS"]

MATH_OPS = ("fract", "sinpi", "cospi", "tanpi", "fmin3", "fmax3", "fmedian3")
_BITS = {"half": ("i16", 15), "bfloat": ("i16", 15), "float": ("i32", 31), "double": ("i64", 63)}


def _define(symbol: str, ret: str, params: List[str], lines: List[str]) -> str:
    signature = ", ".join(f"{t} %a{i}" for i, t in enumerate(params))
    body = "\n  ".join(lines + [f"ret {ret} %r"])
    return f"define internal {ret} @{symbol}({signature}) alwaysinline {{\n  {body}\n}}"


def _reduced(x: str) -> List[str]:
    """%t: float `x` minus the nearest even integer, exactly, in double ([-1, 1]); %n: x is an integer."""
    return [f"%d = fpext float {x} to double", "%half = fmul double %d, 5.000000e-01",
            "%k = call double @llvm.rint.f64(double %half)", "%k2 = fmul double %k, 2.000000e+00",
            "%t = fsub double %d, %k2", "%tr = call double @llvm.rint.f64(double %t)", "%n = fcmp oeq double %tr, %t"]


def _sin_pi(t: str, out: str) -> List[str]:
    """`out` = sin(pi * t) in double for t in [-1, 1]: folded into [-1/2, 1/2] first."""
    return [f"%abs.{out} = call double @llvm.fabs.f64(double {t})", f"%big.{out} = fcmp ogt double %abs.{out}, 5.000000e-01",
            f"%one.{out} = call double @llvm.copysign.f64(double 1.000000e+00, double {t})",
            f"%fold.{out} = fsub double %one.{out}, {t}",
            f"%s.{out} = select i1 %big.{out}, double %fold.{out}, double {t}",
            f"%x.{out} = fmul double %s.{out}, 0x400921FB54442D18",
            f"%{out} = call double @llvm.sin.f64(double %x.{out})"]


_DOUBLE_NEEDS = ["declare double @llvm.rint.f64(double)", "declare double @llvm.fabs.f64(double)",
                 "declare double @llvm.copysign.f64(double, double)", "declare double @llvm.sin.f64(double)"]


def define_math(ret: str, op: str, params: List[str], symbol: str) -> Optional[Tuple[str, List[str]]]:
    """(definition named `symbol`, declarations) of float scalar `op`, None if not one of
    these (nextafter: any floating scalar type)."""
    if op == "nextafter" and len(params) == 2 and params[0] == params[1] == ret and ret in _BITS:
        return _nextafter(ret, symbol), []
    if op not in MATH_OPS or ret != "float" or any(p != "float" for p in params):
        return None
    if op in ("fmin3", "fmax3", "fmedian3") and len(params) == 3:
        mn, mx = "llvm.minnum.f32", "llvm.maxnum.f32"
        if op == "fmedian3":  # max(min(a, b), min(max(a, b), c))
            lines = [f"%lo = call float @{mn}(float %a0, float %a1)", f"%hi = call float @{mx}(float %a0, float %a1)",
                     f"%m = call float @{mn}(float %hi, float %a2)", f"%r = call float @{mx}(float %lo, float %m)"]
        else:
            callee = mn if op == "fmin3" else mx
            lines = [f"%m = call float @{callee}(float %a0, float %a1)", f"%r = call float @{callee}(float %m, float %a2)"]
        return _define(symbol, ret, params, lines), [f"declare float @{mn}(float, float)", f"declare float @{mx}(float, float)"]
    if len(params) != 1:
        return None
    if op == "fract":
        lines = ["%f = call float @llvm.floor.f32(float %a0)", "%d = fsub float %a0, %f",
                 "%c = call float @llvm.minnum.f32(float %d, float 0x3FEFFFFFE0000000)",
                 "%inf = call float @llvm.fabs.f32(float %a0)", "%isinf = fcmp oeq float %inf, 0x7FF0000000000000",
                 "%zero = call float @llvm.copysign.f32(float 0.0, float %a0)",
                 "%nan = fcmp uno float %a0, 0.0", "%e = select i1 %isinf, float %zero, float %c",
                 "%r = select i1 %nan, float %a0, float %e"]
        needs = ["declare float @llvm.floor.f32(float)", "declare float @llvm.minnum.f32(float, float)",
                 "declare float @llvm.fabs.f32(float)", "declare float @llvm.copysign.f32(float, float)"]
        return _define(symbol, ret, params, lines), needs
    lines = _reduced("%a0")
    if op == "sinpi":
        lines += _sin_pi("%t", "sv") + ["%zero = call double @llvm.copysign.f64(double 0.0, double %d)",
                                         "%v = select i1 %n, double %zero, double %sv"]
    elif op == "cospi":  # cos(pi t) = sin(pi (1/2 - |t|))
        lines += ["%at = call double @llvm.fabs.f64(double %t)", "%u = fsub double 5.000000e-01, %at"] + _sin_pi("%u", "v")
    else:  # tanpi = sinpi / cospi, rounded once
        lines += (_sin_pi("%t", "sv") + ["%at = call double @llvm.fabs.f64(double %t)",
                                          "%u = fsub double 5.000000e-01, %at"] + _sin_pi("%u", "cv")
                  + ["%zero = call double @llvm.copysign.f64(double 0.0, double %d)",
                     "%s = select i1 %n, double %zero, double %sv", "%v = fdiv double %s, %cv"])
    return _define(symbol, ret, params, lines + ["%r = fptrunc double %v to float"]), _DOUBLE_NEEDS


def _nextafter(ret: str, symbol: str) -> str:
    """The next representable value after %a0 towards %a1, on the type's bits."""
    bits, sign = _BITS[ret]
    lines = [f"%x = bitcast {ret} %a0 to {bits}", f"%y = bitcast {ret} %a1 to {bits}",
             f"%nan = fcmp uno {ret} %a0, %a1", f"%same = fcmp oeq {ret} %a0, %a1",
             f"%zero = fcmp oeq {ret} %a0, 0.0",
             f"%ysign = and {bits} %y, {-(1 << sign)}", f"%tiny = or {bits} %ysign, 1",
             # away from zero when moving the same way as x's sign points, else towards it
             f"%up = fcmp olt {ret} %a0, %a1", f"%xneg = icmp slt {bits} %x, 0", "%away = xor i1 %up, %xneg",
             f"%inc = add {bits} %x, 1", f"%dec = sub {bits} %x, 1",
             f"%step = select i1 %away, {bits} %inc, {bits} %dec",
             f"%moved = select i1 %zero, {bits} %tiny, {bits} %step",
             f"%m = bitcast {bits} %moved to {ret}", f"%nanv = fadd {ret} %a0, %a1",
             f"%e = select i1 %same, {ret} %a1, {ret} %m", f"%r = select i1 %nan, {ret} %nanv, {ret} %e"]
    return _define(symbol, ret, [ret, ret], lines)
