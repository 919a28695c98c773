"""Rules on the bitcode as written (bitstream.py): what Apple's bitcode reader, an older LLVM
than the one that wrote the module, cannot read."""

from .model import ERROR, WARNING, Rule

__all__ = ["RULES"]

# LLVM's ATTR_KIND_* numbers added after LLVM 14 (llvm/Bitcode/LLVMBitCodes.h). Apple-built
# modules in the corpus use kinds up to 71 (nocallback).
_NEWER_KINDS = {79: "nosanitize_bounds", 80: "allocalign", 81: "allocptr", 82: "allockind",
                83: "presplitcoroutine", 84: "fn_ret_thunk_extern", 85: "skipprofile", 86: "memory",
                87: "nofpclass", 88: "optdebug", 89: "writable", 90: "coro_only_destroy_when_complete",
                91: "dead_on_unwind", 92: "range", 93: "sanitize_numerical_stability", 94: "initializes",
                95: "hybrid_patchable", 96: "sanitize_realtime", 97: "sanitize_realtime_blocking",
                98: "coro_elide_safe", 99: "no_ext", 100: "no_divergence_source", 101: "sanitize_type",
                102: "captures"}
_LAST_LLVM14_KIND = 78


def opaque_pointers(view):
    """Apple's AIR is typed-pointer bitcode: every Apple-built module in the corpus has only
    TYPE_CODE_POINTER entries. Metal.jl lowers its (opaque-pointer) IR to LLVM 14 bitcode with
    typed pointers before packing, because "Metal's metallib loader is a backward-compatible
    reader that accepts real LLVM <= 15 bitcode"
    (https://github.com/JuliaGPU/GPUCompiler.jl/blob/7dd4056d9144e20e5a2912be9e81eda1c7d59336/src/metal.jl#L561-L570),
    and its downgrader had to learn to write typed pointers from opaque-pointer IR for the same
    reason (https://github.com/JuliaLLVM/llvm-downgrade-old/pull/5). Breaks: the library is
    refused at load or its pipeline fails to build."""
    facts = view.facts
    if facts.opaque_pointers:
        source = " (IR text is written as this LLVM's bitcode)" if view.from_text else ""
        yield (f"the type table has {facts.opaque_pointers} opaque pointer type(s) ('ptr'){source}; expected "
               f"typed pointers (i8 addrspace(1)*, ...) as Apple's compiler writes. Write LLVM 14-era bitcode "
               f"(e.g. llvm-downgrade --bitcode-version=14.0, as Metal.jl does)")


def newer_attributes(view):
    """Attribute kinds LLVM added after LLVM 14 are unknown to Apple's reader:
    ``memory(none)`` (kind 86, LLVM 16's spelling of ``readnone``) makes Apple's ``metallib``
    stop with "LLVM ERROR: Invalid bitcode file!"
    (https://github.com/SamoZ256/metal-air-docs/blob/main/docs.md, Introduction); Metal.jl
    had to work around LLVM 16's attribute changes for the same reader
    (https://github.com/JuliaGPU/GPUCompiler.jl/pull/564). Apple-built modules in the corpus
    use kinds up to 71. Breaks: refused at load ("Invalid bitcode")."""
    newer = sorted(k for k in view.facts.attribute_kinds if k > _LAST_LLVM14_KIND)
    if newer:
        names = ", ".join(f"{_NEWER_KINDS.get(k, 'unknown')} ({k})" for k in newer)
        yield (f"attribute kinds newer than LLVM 14: {names}; expected only kinds LLVM 14 knows (<= "
               f"{_LAST_LLVM14_KIND}). Drop them or write older bitcode (memory(none) -> readnone)")


def producer(view):
    """Apple's modules carry an IDENTIFICATION block with an empty producer string and epoch 0
    (every Apple-built module in the corpus). A producer string such as "LLVM22.1.0" says the
    module was written by a newer LLVM than Apple's reader; LLVM's readers name it when they
    fail ("Invalid phi record (Producer: 'LLVM16.0.6' ...)",
    https://github.com/JuliaGPU/Metal.jl/issues/488). A hint, not an error by itself."""
    facts = view.facts
    if facts.producer:
        yield (f"bitcode written by {facts.producer!r}; Apple's compiler writes an empty producer. Expect "
               f"Apple's older reader to refuse constructs this LLVM writes (see the other rules)")
    if facts.epoch not in (None, 0):
        yield f"bitcode epoch {facts.epoch}; expected 0"


RULES = (
    Rule("AIR001", ERROR, "typed pointers", opaque_pointers),
    Rule("AIR002", ERROR, "attribute kinds LLVM 14 knows", newer_attributes),
    Rule("AIR003", WARNING, "bitcode producer", producer),
)
