"""``fast_exp`` on floats as inline LLVM IR: the algorithm of glibc's ``expf`` (2.28 and
later, from Arm's optimized-routines; the FMA build x86-64 hosts with FMA run), step by
step, so the result is the same bit for bit as the libm call it replaces on those hosts
(checked over all 2^32 inputs, tests/test_float_exp.py) while LLVM can inline it and
vectorize loops around it: a call to libm cannot be.

exp(x) = 2^(k/32) * 2^(r/32): k = round(x * 32/ln 2) (by adding 1.5 * 2^52 in one fused
multiply-add), r the remainder (another), 2^(k/32) from a 32-entry table of 2^(i/32)'s bits
(less i << 47) plus k << 47, 2^(r/32) by a cubic; in double, rounded once to float. The
special cases glibc branches to (|x| >= 88, infinities, NaN) are selects here, behind
the same branch (or, for vector lanes, computed for every input and selected: a branch
lanes may take apart costs vector lanes two copies of the code and a check, while the
scalar lane loops run 1.35-1.6x the time of MLX's softmax kernels without the branch).
"""

import struct
from typing import List, Tuple

__all__ = ["define_fast_exp_float"]

_N = 32
# Bits of 2^(i/32) less i << 47 (glibc's __exp2f_data.tab; correctly rounded doubles).
_TABLE = [struct.unpack("<Q", struct.pack("<d", 2 ** (i / _N)))[0] - (i << 47) for i in range(_N)]
_TABLE_NAME = "tm.fast_exp.table"
_INV_LN2_N = "0x40471547652B82FE"  # 0x1.71547652b82fep+0 * 32
_SHIFT = "0x4338000000000000"  # 0x1.8p+52: adding it rounds to an integer
_C0, _C1, _C2 = "0x3EBC6AF84B912394", "0x3F2EBFCE50FAC4F3", "0x3F962E42FF0C52D6"  # the cubic / 32^3, 32^2, 32
_OVER = "0x40562E42E0000000"  # 0x1.62e42ep6f: above, +inf (log(2^128))
_UNDER = "0xC059FE3680000000"  # -0x1.9fe368p6f: below, 0 (log(2^-150))
_MAY_UNDER = "0xC059D1D9E0000000"  # -0x1.9d1d9ep6f: below, 2^-149 (glibc's __math_may_uflowf)


def define_fast_exp_float(symbol: str, branches: bool = True) -> Tuple[str, List[str]]:
    """(the definition of float `symbol`(float) = expf as glibc computes it, declarations);
    without `branches`, the special cases are computed for every input and selected."""
    table = ", ".join(f"i64 {entry}" for entry in _TABLE)
    lines = [
        "%bits = bitcast float %a0 to i32", "%top = lshr i32 %bits, 20", "%abstop = and i32 %top, 2047",
        "%big = icmp ugt i32 %abstop, 1066",  # |x| >= 88 or not finite: glibc's slow path
        "%xd = fpext float %a0 to double",
        f"%kd.s = call double @llvm.fma.f64(double {_INV_LN2_N}, double %xd, double {_SHIFT})",
        "%ki = bitcast double %kd.s to i64", f"%kd = fsub double %kd.s, {_SHIFT}", "%kd.n = fneg double %kd",
        f"%red = call double @llvm.fma.f64(double {_INV_LN2_N}, double %xd, double %kd.n)",
        "%index = and i64 %ki, 31", f"%tab.p = getelementptr inbounds [{_N} x i64], ptr @{_TABLE_NAME}, i64 0, i64 %index",
        "%tab = load i64, ptr %tab.p, align 8",
        "%scale = shl i64 %ki, 47", "%t = add i64 %tab, %scale", "%s = bitcast i64 %t to double",
        f"%z = call double @llvm.fma.f64(double {_C0}, double %red, double {_C1})",
        "%r2 = fmul double %red, %red",
        f"%y0 = call double @llvm.fma.f64(double {_C2}, double %red, double 1.0)",
        "%y1 = call double @llvm.fma.f64(double %z, double %r2, double %y0)",
        "%y = fmul double %y1, %s", "%main = fptrunc double %y to float"]
    lines += ["br i1 %big, label %slow, label %done", "slow:"] if branches else []
    lines += [
        # glibc's slow path, in its order: -inf, then inf and NaN (x + x), overflow, underflow.
        "%neginf = icmp eq i32 %bits, -8388608", "%naninf = icmp ugt i32 %abstop, 2039",
        "%twice = fadd float %a0, %a0",
        f"%over = fcmp ogt float %a0, {_OVER}", f"%under = fcmp olt float %a0, {_UNDER}",
        f"%may.under = fcmp olt float %a0, {_MAY_UNDER}",
        "%s1 = select i1 %may.under, float 0x36A0000000000000, float %main",
        "%s2 = select i1 %under, float 0.0, float %s1",
        "%s3 = select i1 %over, float 0x7FF0000000000000, float %s2",
        "%s4 = select i1 %naninf, float %twice, float %s3",
        "%s5 = select i1 %neginf, float 0.0, float %s4"]
    lines += (["br label %done", "done:", "%r = phi float [ %main, %entry ], [ %s5, %slow ]"] if branches
              else ["%r = select i1 %big, float %s5, float %main"])
    body = "\n  ".join(lines + ["ret float %r"])
    return (f"define internal float @{symbol}(float %a0) alwaysinline {{\nentry:\n  {body}\n}}",
            ["declare double @llvm.fma.f64(double, double, double)",
             f"@{_TABLE_NAME} = internal unnamed_addr constant [{_N} x i64] [{table}], align 64"])
