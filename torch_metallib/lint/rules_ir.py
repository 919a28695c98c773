"""Rules on function bodies (as llvmlite's LLVM prints them): instruction flags Apple's older
reader cannot decode, and types and shapes Metal's back-end rejects."""

import re

from .model import ERROR, WARNING, Rule

__all__ = ["RULES"]

_NAMES = re.compile(r'[@%](?:"[^"]*"|[-\w$.]+)|!"[^"]*"|c"[^"]*"')
# llvm.* intrinsics Apple's compiler emits (every declaration in the Apple-built corpus).
APPLE_LLVM_INTRINSICS = ("llvm.lifetime.start", "llvm.lifetime.end", "llvm.fmuladd", "llvm.memset",
                         "llvm.memcpy", "llvm.memmove", "llvm.umax", "llvm.umin", "llvm.smax", "llvm.smin",
                         "llvm.abs", "llvm.assume", "llvm.bitreverse", "llvm.fshl", "llvm.fshr",
                         "llvm.usub.with.overflow", "llvm.uadd.with.overflow", "llvm.usub.sat",
                         "llvm.experimental.noalias.scope.decl")


def _stripped(line: str) -> str:
    return _NAMES.sub("_", line)


def cast_flags(view):
    """``zext nneg`` (LLVM 18) and ``trunc nuw``/``trunc nsw`` (LLVM 19) add an operand to the
    cast record; LLVM 14's reader accepts a cast record only with exactly its four operands
    ("Invalid record", FUNC_CODE_INST_CAST in ``BitcodeReader.cpp``, https://github.com/llvm/llvm-project/blob/release/14.x/llvm/lib/Bitcode/Reader/BitcodeReader.cpp),
    and Metal.jl targets LLVM 14 bitcode for Apple's reader
    (https://github.com/JuliaGPU/GPUCompiler.jl/blob/7dd4056d9144e20e5a2912be9e81eda1c7d59336/src/metal.jl#L561-L570).
    Breaks: refused at load."""
    for function, line in view.instructions():
        plain = _stripped(line)
        flag = re.search(r"= (zext nneg|uitofp nneg|trunc (?:nuw|nsw)(?: nsw)?) ", plain)
        if flag:
            yield f"@{function}: '{flag.group(1)}' ({line[:80]}); expected the cast without flags (LLVM 14 reads no cast flags)"


def comparison_and_gep_flags(view):
    """``icmp samesign`` (LLVM 20), ``or disjoint`` (LLVM 18) and ``getelementptr nusw``/``nuw``
    or ``inrange`` (LLVM 19) are written as flags LLVM 14's reader does not know
    (https://github.com/llvm/llvm-project/blob/release/14.x/llvm/lib/Bitcode/Reader/BitcodeReader.cpp): it reads a GEP's flags word as a plain inbounds bit (so ``nusw``
    or ``nuw`` alone becomes ``inbounds``, a stronger promise), ignores ``disjoint`` and treats
    an icmp's extra operand as fast-math flags. Apple-built modules in the corpus carry none of
    them. Breaks: refused at load or code compiled under a promise the module did not make."""
    for function, line in view.instructions():
        plain = _stripped(line)
        flag = re.search(r"= (icmp samesign|or disjoint)\b|getelementptr (?:inbounds )?(nusw|nuw)\b|\b(inrange)\b",
                         plain)
        if flag:
            found = next(g for g in flag.groups() if g)
            yield f"@{function}: '{found}' ({line[:80]}); expected instructions without flags newer than LLVM 14"


def unsupported_types(view):
    """"Metal does not support double precision, except for logging" and "Metal never supports
    128-bit integers": Metal.jl's IR validator refuses both
    (https://github.com/JuliaGPU/GPUCompiler.jl/blob/7dd4056d9144e20e5a2912be9e81eda1c7d59336/src/metal.jl#L280-L312);
    no Apple-built module in the corpus computes with either. Breaks: pipeline creation fails."""
    for function, line in view.instructions():
        plain = _stripped(line)
        found = re.search(r"\b(double|i128)\b", plain)
        if found and not re.search(r"call .*os_log", line):
            yield f"@{function}: {found.group(1)} value ({line[:80]}); expected float/half/bfloat and integers up to i64"


def aggregate_loads(view):
    """Apple's AGX back-end "crashes during native-code generation when lowering such a wide
    aggregate load" (a struct or array loaded whole): Metal.jl splits them into per-field loads
    (https://github.com/JuliaGPU/GPUCompiler.jl/blob/7dd4056d9144e20e5a2912be9e81eda1c7d59336/src/metal.jl#L314-L336,
    https://github.com/JuliaGPU/Metal.jl/issues/792). No Apple-built module in the corpus loads
    or stores an aggregate whole. Breaks: pipeline creation crashes (not every such load)."""
    for function, line in view.instructions():
        found = re.search(r"(?:= load (?:volatile )?|^store (?:volatile )?)([{\[%])", line)
        if found:
            yield f"@{function}: whole-aggregate access ({line[:80]}); expected per-field loads and stores"


def llvm_intrinsics(view):
    """Metal has no LLVM back-end: an ``llvm.*`` intrinsic reaches Apple's compiler as it is,
    and only those Apple's front end itself emits are known to be lowered. Metal.jl rewrites the
    others into ``air.*`` functions before packing ("lower LLVM intrinsics that AIR doesn't
    support",
    https://github.com/JuliaGPU/GPUCompiler.jl/blob/7dd4056d9144e20e5a2912be9e81eda1c7d59336/src/metal.jl#L1660-L1710).
    Allowed: the ``llvm.*`` declarations of the Apple-built corpus. Breaks: pipeline creation
    fails on an unknown function."""
    for name in view.text.declarations("llvm."):
        if not any(name == known or name.startswith(known + ".") for known in APPLE_LLVM_INTRINSICS):
            yield (f"@{name}: an LLVM intrinsic Apple's compiler never emits; expected its air.* equivalent "
                   f"(e.g. llvm.sqrt -> air.sqrt, llvm.maxnum -> air.fmax)")


RULES = (
    Rule("AIR020", ERROR, "cast flags newer than LLVM 14", cast_flags),
    Rule("AIR021", WARNING, "comparison, or and GEP flags newer than LLVM 14", comparison_and_gep_flags),
    Rule("AIR022", ERROR, "double and i128", unsupported_types),
    Rule("AIR023", WARNING, "whole-aggregate loads and stores", aggregate_loads),
    Rule("AIR024", WARNING, "llvm.* intrinsics", llvm_intrinsics),
)
