"""AIR's cooperative intrinsics: threadgroup and SIMD-group barriers and the SIMD-group
and quad-group functions (docs/formats.md, AIR; ARCHITECTURE.md, "Rules"), for every target.

Each collective deposits the lane's value in an exchange and waits until the active lanes
of the SIMD-group have arrived at the same call site; it then knows the mask of lanes that
took part and reads any lane's value, and computes its result from them here, in IR. How a
target deposits, waits and reads is its Target's (target.py): the CPU's runtime returns
every lane's value in 32 slots of 64 bytes, or its lane loops read them from the
SIMD-group's memory (backends/cpu/target.py); a warp shuffles (backends/cuda/warp_spelling.py).
Shuffles whose source lane is outside the SIMD-group or did not take part return the lane's
own value (``simd_shuffle_up``/``down`` do not wrap); ``simd_shuffle_and_fill_*`` from a
lane that did not take part return zero, as Apple GPUs do in practice. A result that is the
same for every lane (a SIMD-group reduction) is computed once, by the first lane to read
the exchange (``%leads``), into the slots' unused bytes (RESULT_OFFSET), where the others
read it, unless the target has every lane compute it.

``simdgroup_barrier(mem_flags::mem_none)`` (MLX's GEMM loops call it between loads and
multiplies) orders no memory, so no lane can observe it: it is a no-op here, and only
barriers with memory flags make the SIMD-group meet.
"""

import functools
from typing import List, Optional, Tuple

from .intrinsics import SIMD_WIDTH, element_type, is_float_type, overload_suffix, type_bytes
from .target import MASK_OFFSET, RESULT_OFFSET, SITE_ORDER, SLOT_BYTES, WAIT_ALLOCA, Target

__all__ = ["define_collective", "simd_position", "THREAD_IN_GROUP", "MASK_OFFSET", "SLOT_BYTES", "WAIT_ALLOCA",
           "FOLD_PREFIX", "butterfly_of_halves", "reduction_identity"]

# The running thread's index in its threadgroup: a function every target's runtime answers
# (the CPU's in csrc/cpu/cooperative.cpp; the CUDA backend defines it from %tid and %ntid).
THREAD_IN_GROUP = "declare i32 @tm_rt_thread_in_group()"
# The functions a SIMD-group's reduction over its active lanes calls, of the exchange's slots
# alone: a float sum or product (_tree_or_in_order), on lane loops the others (_in_order_function).
FOLD_PREFIX = "tm.simd_fold."


def simd_position(op: str, value: str) -> List[str]:
    """`value` (i32): the running thread's index in its SIMD-group (`op` urem) or its
    SIMD-group's index in the threadgroup (udiv), from its index in the threadgroup."""
    return ["%thread = call i32 @tm_rt_thread_in_group()", f"{value} = {op} i32 %thread, {SIMD_WIDTH}"]


def _exchange(values: List[Tuple[str, str]], target: Target) -> List[str]:
    """Deposits `values` ((type, operand)...) one after another; leaves %slots (where the
    target reads from memory), %mask, %lane and %leads (this lane is the first to read the
    result). A definition whose lines take the call site's order (SITE_ORDER) takes it as
    its last parameter."""
    return target.exchange(values) + target.claim()


def _staged_exchange(bytes_: str, fill: List[str], target: Target) -> List[str]:
    """Given %wait (WAIT_ALLOCA): takes `bytes_` (an i64 operand) of the SIMD-group's staging
    memory as %staged, runs `fill` (straight-line lines that may use %lane) to write this
    lane's part, then waits until every lane has staged; leaves %staged, %lane, %slots and
    %leads (Target.staged_exchange)."""
    return target.staged_exchange(bytes_, fill)


def _computed_once(type_name: str, compute: List[str], result: str, target: Target) -> List[str]:
    """%r = `result` of the `compute` lines, which only the leading lane runs: the others
    read what it stored in the slots. Where the target has every lane compute it (lane
    loops: a lane reading what another stored in the same loop would keep LLVM from
    vectorizing it; warps), each lane does."""
    if target.every_lane_computes:
        return compute + [f"%r = bitcast {type_name} {result} to {type_name}"]
    return (["%shared = getelementptr i8, ptr %slots, i32 " + str(RESULT_OFFSET),
             "br i1 %leads, label %compute, label %read", "compute:"] + compute
            + [f"store {type_name} {result}, ptr %shared", "br label %read",
               "read:", f"%r = load {type_name}, ptr %shared"])


def _from_lane(type_name: str, source: str, own: str, target: Target, offset: int = 0) -> List[str]:
    """%r = the value at `source` lane if it is in range and took part, else `own`."""
    return [f"%src.in = icmp ult i32 {source}, {SIMD_WIDTH}",
            f"%src.safe = select i1 %src.in, i32 {source}, i32 0",
            "%src.bit = shl i32 1, %src.safe",
            "%src.set = and i32 %mask, %src.bit",
            "%src.took = icmp ne i32 %src.set, 0",
            "%src.ok = and i1 %src.in, %src.took"] + target.read(type_name, "%src.safe", "v", offset) + [
            f"%r = select i1 %src.ok, {type_name} %v, {type_name} {own}"]


def _combine(op: str, signed: bool, type_name: str, a: str, b: str, out: str) -> Tuple[List[str], List[str]]:
    floating = is_float_type(type_name)
    suffix = overload_suffix(type_name)
    if op in ("sum", "product"):
        instruction = ("fadd" if op == "sum" else "fmul") if floating else ("add" if op == "sum" else "mul")
        return [f"{out} = {instruction} {type_name} {a}, {b}"], []
    if op in ("and", "or", "xor"):
        return [f"{out} = {op} {type_name} {a}, {b}"], []
    if floating:
        callee = f"llvm.{'minnum' if op == 'min' else 'maxnum'}.{suffix}"
    else:
        callee = f"llvm.{'s' if signed else 'u'}{op}.{suffix}"
    return [f"{out} = call {type_name} @{callee}({type_name} {a}, {type_name} {b})"], \
        [f"declare {type_name} @{callee}({type_name}, {type_name})"]


def reduction_identity(op: str, signed: bool, type_name: str) -> Optional[str]:
    """The IR constant `op` (sum, product, min, max, and, or, xor) leaves a value of
    `type_name` unchanged with: what a lane that takes no part contributes."""
    if is_float_type(type_name):
        element = element_type(type_name)
        value = {"sum": "-0.0", "product": "1.0", "min": "0x7FF0000000000000", "max": "0xFFF0000000000000"}.get(op)
        if value is None:
            return None
        if element == "half" and op in ("min", "max"):
            value = "0xH7C00" if op == "min" else "0xHFC00"
        if element == "bfloat":
            value = {"sum": "0xR8000", "product": "0xR3F80", "min": "0xR7F80", "max": "0xRFF80"}[op]
        return value if not type_name.startswith("<") else f"splat ({element} {value})"
    bits = int(element_type(type_name)[1:])
    value = {"sum": 0, "product": 1, "or": 0, "xor": 0, "and": -1,
             "min": (1 << (bits - 1)) - 1 if signed else -1,
             "max": -(1 << (bits - 1)) if signed else 0}[op]
    return str(value) if not type_name.startswith("<") else f"splat (i{bits} {value})"


def _fold(op: str, signed: bool, type_name: str, condition, target: Target) -> Tuple[List[str], List[str], str]:
    """(lines, declarations, result): `op` over the lanes j that took part and for which
    `condition(j)` (an IR i1 instruction, or None) holds, in lane order; a float sum or
    product over every lane of the SIMD-group in CUDA's order (_tree_or_in_order)."""
    identity = reduction_identity(op, signed, type_name)
    if target.blended_folds and condition(0) is None:  # over every active lane
        combine = functools.partial(_combine, op, signed, type_name)
        reduced = target.reduce(lambda a, b, out: combine(a, b, out)[0], identity, type_name)
        if reduced is not None:
            lines, result = reduced
            return lines, combine("%a", "%b", "%r")[1][:1], result  # the step's declarations
    if condition(0) is None and op in ("sum", "product") and is_float_type(type_name):
        return _tree_or_in_order(op, type_name, identity, target)
    if target.blended_folds and condition(0) is None:
        return _in_order_function(op, signed, type_name, identity, target)
    if target.blended_folds:
        return _fold_blended(op, signed, type_name, condition, identity, target)
    return _fold_in_order(op, signed, type_name, condition, identity, target)


def _fold_in_order(op: str, signed: bool, type_name: str, condition, identity: str,
                   target: Target) -> Tuple[List[str], List[str], str]:
    """_fold with a select per lane (coroutines: a lane that did not take part is skipped)."""
    lines, declarations, acc = [], [], identity
    for j in range(SIMD_WIDTH):
        lines += [f"%b{j} = and i32 %mask, {1 << j}", f"%in{j} = icmp ne i32 %b{j}, 0"]
        keep = f"%in{j}"
        extra = condition(j)
        if extra:
            lines += [f"%c{j} = {extra}", f"%k{j} = and i1 %in{j}, %c{j}"]
            keep = f"%k{j}"
        lines += target.read(type_name, str(j), f"x{j}", 0)
        combined, needs = _combine(op, signed, type_name, acc, f"%x{j}", f"%y{j}")
        lines += combined
        declarations += needs
        lines.append(f"%acc{j} = select i1 {keep}, {type_name} %y{j}, {type_name} {acc}")
        acc = f"%acc{j}"
    return lines, declarations[:1], acc


def _tree_or_in_order(op: str, type_name: str, identity: str, target: Target) -> Tuple[List[str], List[str], str]:
    """A float sum or product over the SIMD-group in the order a CUDA warp computes it
    (backends/cuda/warp_spelling.py, WarpSpelling.reduce), so that both backends give the
    same bits: with all 32 lanes taking part, a butterfly (after the step of distance s,
    lane i holds acc_i op acc_(i^s), for s = 16, 8, 4, 2, 1: every lane ends with lane 0's
    value, the operations being commutative), as vector operations on two 16-lane halves,
    then 8, 4, 2 and 1; with fewer, lane after lane in lane order.

    A function of the exchange's slots alone (FOLD_PREFIX): a lane loop calls it once,
    before its loop over the lanes (regions.py), where LLVM would not move the branch
    between the two orders out of the loop."""
    name = f"{FOLD_PREFIX}{op}.{overload_suffix(type_name)}"
    tree, result = _butterfly(op, type_name, target)
    in_order, declarations, acc = _fold_blended(op, False, type_name, lambda j: None, identity, target)
    body = (["%tree.full = icmp eq i32 %mask, -1", "br i1 %tree.full, label %tree, label %in.order", "tree:"]
            + tree + [f"ret {type_name} {result}", "in.order:"] + in_order + [f"ret {type_name} {acc}"])
    return _slots_function(name, type_name, body, declarations)


def _slots_function(name: str, type_name: str, body: List[str], declarations: List[str]):
    """(lines, declarations, result) of a fold defined as function `name` of the exchange's
    slots alone: `body` (its lines after %mask is loaded, returning a `type_name`)."""
    lines = [f"%maskp = getelementptr i8, ptr %slots, i32 {MASK_OFFSET}", "%mask = load i32, ptr %maskp"] + body
    definition = (f"define internal {type_name} @{name}(ptr %slots) nounwind willreturn memory(argmem: read) "
                  "{\nentry:\n  " + "\n  ".join(lines) + "\n}")
    return [f"%folded = call {type_name} @{name}(ptr %slots)"], [definition] + declarations, "%folded"


def _in_order_function(op: str, signed: bool, type_name: str, identity: str,
                       target: Target) -> Tuple[List[str], List[str], str]:
    """`op` over the SIMD-group's active lanes in lane order (_fold_blended) as a function of
    the exchange's slots alone (FOLD_PREFIX), named by what it computes (``smax.i32``,
    ``max.f32``, ``and.i8``): a lane loop calls it once, and vector lanes compute it in
    registers where the order cannot change the result (integers; floats without a NaN
    or a zero among the values)."""
    kind = (("s" if signed else "u") + op) if op in ("min", "max") and not is_float_type(type_name) else op
    name = f"{FOLD_PREFIX}{kind}.{overload_suffix(type_name)}"
    in_order, declarations, acc = _fold_blended(op, signed, type_name, lambda j: None, identity, target)
    return _slots_function(name, type_name, in_order + [f"ret {type_name} {acc}"], declarations)


def _butterfly(op: str, type_name: str, target: Target) -> Tuple[List[str], str]:
    """(lines, result): `op` over all 32 lanes' values in a warp butterfly's order."""
    lines: List[str] = []
    for j in range(SIMD_WIDTH):
        lines += target.read(type_name, str(j), f"t{j}", 0)
    if type_name.startswith("<"):  # vectors of values: the same tree, a value at a time
        values = [f"%t{j}" for j in range(SIMD_WIDTH)]
        for step in (16, 8, 4, 2, 1):
            for j in range(step):
                lines += _combine(op, False, type_name, values[j], values[j + step], f"%tb{step}.{j}")[0]
            values = [f"%tb{step}.{j}" for j in range(step)]
        return lines, values[0]
    half = SIMD_WIDTH // 2
    for name, first in (("lo", 0), ("hi", half)):
        previous = "poison"
        for j in range(half):
            lines.append(f"%t.{name}{j} = insertelement <{half} x {type_name}> {previous}, {type_name} "
                         f"%t{first + j}, i32 {j}")
            previous = f"%t.{name}{j}"
    more, result = butterfly_of_halves(op, type_name, f"%t.lo{half - 1}", f"%t.hi{half - 1}", "%t")
    return lines + more, result


def butterfly_of_halves(op: str, type_name: str, low: str, high: str, prefix: str) -> Tuple[List[str], str]:
    """(lines, result): a float sum or product (`op`) of 32 lanes' values of scalar
    `type_name` in a warp butterfly's order, given them as two vectors of 16 (`low`: lanes
    0-15, `high`: 16-31); the lines' names start with `prefix`. Vector lanes
    (backends/cpu/vectorize.py) use it on a SIMD-group's values in registers."""
    half = SIMD_WIDTH // 2
    lines = _combine(op, False, f"<{half} x {type_name}>", low, high, f"{prefix}v{half}")[0]
    width = half
    while width > 1:  # the lower half of the lanes holds lane 0's partial results so far
        width //= 2
        wide = f"<{width * 2} x {type_name}>"
        for name, first in (("l", 0), ("h", width)):
            picked = ", ".join(f"i32 {first + j}" for j in range(width))
            lines.append(f"{prefix}v{width}.{name} = shufflevector {wide} {prefix}v{width * 2}, {wide} poison, "
                         f"<{width} x i32> <{picked}>")
        lines += _combine(op, False, f"<{width} x {type_name}>", f"{prefix}v{width}.l", f"{prefix}v{width}.h",
                          f"{prefix}v{width}")[0]
    lines.append(f"{prefix}.r = extractelement <1 x {type_name}> {prefix}v1, i32 0")
    return lines, f"{prefix}.r"


def prefix_lanes(inclusive: bool, quad: bool) -> List[str]:
    """Lines leaving %mask.before: the lanes of %mask at or before (`inclusive`) or before
    %lane, within its quad where `quad`."""
    top = "%lane.next = add i32 %lane, 1" if inclusive else "%lane.next = or i32 %lane, 0"
    low = "%lane.first = and i32 %lane, -4" if quad else "%lane.first = and i32 %lane, 0"
    return [top, "%lane.next.w = zext i32 %lane.next to i64", "%upto.w = shl i64 1, %lane.next.w",
            "%upto.m = sub i64 %upto.w, 1", "%upto = trunc i64 %upto.m to i32", low,
            "%below.s = shl i32 1, %lane.first", "%below = sub i32 %below.s, 1", "%from = xor i32 %below, -1",
            "%range = and i32 %upto, %from", "%mask.before = and i32 %mask, %range"]


def _fold_blended(op: str, signed: bool, type_name: str, condition, identity: str, target: Target,
                  mask: str = "%mask") -> Tuple[List[str], List[str], str]:
    """_fold without a branch or select per lane, for other targets' prefix and quad folds:
    a lane that does not count (not in `mask`, or failing `condition`) gives the identity,
    chosen with integer masks (op(acc, identity) is acc, so the result is the same). ptxas
    (sm_90) failed to allocate predicate registers for 32 unrolled selects in divergent code."""
    bits = f"i{type_bytes(type_name) * 8}"
    widen = {"i8": "trunc", "i16": "trunc", "i32": None}.get(bits, "sext")  # the i32 all-ones mask to `bits`
    lines, declarations, acc = [], [], identity
    for j in range(SIMD_WIDTH):
        lines += [f"%sh{j} = lshr i32 {mask}, {j}", f"%bit{j} = and i32 %sh{j}, 1"]
        bit = f"%bit{j}"
        extra = condition(j)
        if extra:
            lines += [f"%c{j} = {extra}", f"%cz{j} = zext i1 %c{j} to i32", f"%k{j} = and i32 %bit{j}, %cz{j}"]
            bit = f"%k{j}"
        lines += target.read(type_name, str(j), f"x{j}", 0)
        lines += [f"%all{j} = sub i32 0, {bit}",
                  f"%sel{j} = {widen} i32 %all{j} to {bits}" if widen else f"%sel{j} = or i32 %all{j}, 0",
                  f"%xb{j} = bitcast {type_name} %x{j} to {bits}", f"%ib{j} = bitcast {type_name} {identity} to {bits}",
                  f"%xm{j} = and {bits} %xb{j}, %sel{j}", f"%ns{j} = xor {bits} %sel{j}, -1",
                  f"%im{j} = and {bits} %ib{j}, %ns{j}", f"%vb{j} = or {bits} %xm{j}, %im{j}",
                  f"%v{j} = bitcast {bits} %vb{j} to {type_name}"]
        combined, needs = _combine(op, signed, type_name, acc, f"%v{j}", f"%acc{j}")
        lines += combined
        declarations += needs
        acc = f"%acc{j}"
    return lines, declarations[:1], acc


def _quad_source(op: str, lines: List[str]) -> str:
    """Appends lines computing the source lane of quad shuffle `op` from %lane and %d (32:
    outside the quad, so the lane keeps its own value); returns its operand."""
    if op in ("shuffle", "broadcast"):
        lines += ["%q.base = and i32 %lane, -4", "%q.at = add i32 %q.base, %d", "%q.ok = icmp ult i32 %d, 4"]
    elif op == "shuffle_xor":
        lines += ["%q.at = xor i32 %lane, %d", "%q.hi = lshr i32 %q.at, 2", "%q.ok = icmp eq i32 %q.hi, %quad"]
    elif op == "shuffle_up":
        lines += ["%q.at = sub i32 %lane, %d", "%q.ok = icmp uge i32 %quadlane, %d"]
    else:  # shuffle_down
        lines += ["%q.at = add i32 %lane, %d", "%q.end = add i32 %quadlane, %d", "%q.ok = icmp ult i32 %q.end, 4"]
    lines.append("%q.src = select i1 %q.ok, i32 %q.at, i32 32")
    return "%q.src"


def _vote(op: str, ret: str, quad: bool, target: Target) -> Optional[List[str]]:
    """ballot / active_threads_mask / is_first: lines leaving %r."""
    if op == "ballot":
        lines = ["%z = zext i1 %a0 to i8"] + _exchange([("i8", "%z")], target) + ["%acc.init = and i32 %mask, 0"]
        acc = "%acc.init"
        for j in range(SIMD_WIDTH):
            lines += target.read("i8", str(j), f"x{j}", 0) + [
                f"%t{j} = icmp ne i8 %x{j}, 0", f"%bit{j} = and i32 %mask, {1 << j}",
                f"%on{j} = select i1 %t{j}, i32 %bit{j}, i32 0", f"%acc{j} = or i32 {acc}, %on{j}"]
            acc = f"%acc{j}"
        lines.append(f"%votes = or i32 {acc}, 0")
    elif op in ("active_threads_mask", "is_first"):
        lines = _exchange([], target) + ["%votes = or i32 %mask, 0"]
    else:
        return None
    if quad:  # the quad's 4 bits, from bit 0 [ASSUMED layout of quad_vote]
        lines += ["%q.shift = and i32 %lane, -4", "%q.bits = lshr i32 %votes, %q.shift", "%own = and i32 %q.bits, 15"]
    else:
        lines.append("%own = or i32 %votes, 0")
    if op == "is_first":
        lines += ["%first = call i32 @llvm.cttz.i32(i32 %own, i1 true)",
                  "%mine = and i32 %lane, " + ("3" if quad else "31"), "%r = icmp eq i32 %first, %mine"]
    elif ret == "i32":
        lines.append("%r = or i32 %own, 0")
    else:
        lines.append(f"%r = zext i32 %own to {ret}")
    return lines


def define_collective(ret: str, name: str, params: List[str], target: Target) -> Optional[Tuple[str, List[str]]]:
    """(definition, declarations) of a cooperative intrinsic as `target` spells its waits,
    None if not one we implement."""
    # (memory flags, scope), and in newer AIR a third i32 operand, which changes neither.
    if name == "air.wg.barrier" and params in (["i32", "i32"], ["i32", "i32", "i32"]):
        return _definition("void", name, params, target.barrier()), []
    if name == "air.simdgroup.barrier" and params in (["i32", "i32"], ["i32", "i32", "i32"]):
        lines = ([WAIT_ALLOCA, "%no.memory = icmp eq i32 %a0, 0", "br i1 %no.memory, label %done, label %meet", "meet:"]
                 + target.meet("null", 0) + ["br label %done", "done:"])
        return _definition("void", name, params, lines), []
    parts = name.split(".")
    if len(parts) < 2 or parts[0] != "air":
        return None
    if parts[1] in ("get_thread_index_in_simdgroup", "get_simdgroup_index_in_threadgroup") and not params \
            and ret in ("i16", "i32"):
        # The builtins' values as functions: from the running thread's index in its group.
        op = "urem" if parts[1] == "get_thread_index_in_simdgroup" else "udiv"
        lines = simd_position(op, "%v") + [f"%r = trunc i32 %v to {ret}" if ret == "i16" else "%r = or i32 %v, 0"]
        return _definition(ret, name, params, lines), []
    lines: List[str] = []
    declarations: List[str] = []
    if parts[1] == "is_uniform" and len(params) == 1 and ret == "i1" and not params[0].startswith("<"):
        # True when every active lane holds the same value (floats: equal as numbers).
        value_type = params[0]
        compare = "fcmp une" if is_float_type(value_type) else "icmp ne"
        lines = _exchange([(value_type, "%a0")], target) + ["%diff.init = icmp ne i32 %mask, %mask"]
        differs = "%diff.init"
        for j in range(SIMD_WIDTH):
            lines += target.read(value_type, str(j), f"x{j}", 0) + [
                f"%ne{j} = {compare} {value_type} %x{j}, %a0", f"%b{j} = and i32 %mask, {1 << j}",
                f"%in{j} = icmp ne i32 %b{j}, 0", f"%d{j} = and i1 %ne{j}, %in{j}", f"%any{j} = or i1 {differs}, %d{j}"]
            differs = f"%any{j}"
        lines.append(f"%r = xor i1 {differs}, true")
        return _definition(ret, name, params, lines), declarations
    if parts[1] in ("simd_vote_all", "simd_vote_any") and ret == "i1" and params in (["i64"], ["i32"]):
        # simd_vote::all() / any() of a ballot: over the lanes active here.
        widen = f"zext i32 %mask to {params[0]}" if params[0] == "i64" else "or i32 %mask, 0"
        lines = _exchange([], target) + [f"%active = {widen}", f"%on = and {params[0]} %a0, %active"]
        lines.append(f"%r = icmp eq {params[0]} %on, %active" if parts[1] == "simd_vote_all"
                     else f"%r = icmp ne {params[0]} %on, 0")
        return _definition(ret, name, params, lines), []
    scope, _, op = parts[1].partition("_")
    if scope not in ("simd", "quad") or not op:
        return None
    quad = scope == "quad"
    signed = len(parts) > 2 and parts[2] == "s"
    # Lanes of this lane's quad (for quad_*), as an extra fold condition.
    quad_lines = ["%quad = lshr i32 %lane, 2", "%quadlane = and i32 %lane, 3"] if quad else []
    in_quad = (lambda j: f"icmp eq i32 %quad, {j >> 2}") if quad else (lambda j: None)
    if op in ("ballot", "active_threads_mask", "is_first"):
        lines = _vote(op, ret, quad, target)
        declarations = ["declare i32 @llvm.cttz.i32(i32, i1)"] if op == "is_first" else []
        if lines is None or (op == "ballot" and params != ["i1"]) or (op != "ballot" and params):
            return None
        return _definition(ret, name, params, lines), declarations
    if not params:
        return None
    value_type = params[0]
    if op in ("sum", "product", "min", "max", "and", "or", "xor") and len(params) == 1:
        lines = _exchange([(value_type, "%a0")], target) + quad_lines
        folded, declarations, result = _fold(op, signed, value_type, in_quad, target)
        if quad or type_bytes(value_type) > SLOT_BYTES - RESULT_OFFSET:  # a result per quad
            lines += folded + [f"%r = bitcast {value_type} {result} to {value_type}"]
        else:
            lines += _computed_once(value_type, folded, result, target)
    elif op.startswith("prefix_") and len(params) == 1:
        _, kind, reduction = op.split("_")
        compare = "ule" if kind == "inclusive" else "ult"
        lines = _exchange([(value_type, "%a0")], target) + quad_lines
        if target.blended_folds:
            # The lanes before this one (in its quad), as a mask: one test per lane, not 32
            # compares held across the kernel (ptxas, sm_90, gave lanes of warps other than
            # the first a wrong one after a branch that only the first warp took).
            lines += prefix_lanes(kind == "inclusive", quad)
            folded, declarations, result = _fold_blended(reduction, signed, value_type, lambda j: None,
                                                         reduction_identity(reduction, signed, value_type), target, "%mask.before")
            lines += folded + [f"%r = bitcast {value_type} {result} to {value_type}"]
            return _definition(ret, name, params, lines), declarations
        if quad:  # lane j counts if it is in this lane's quad and before it
            for j in range(SIMD_WIDTH):
                lines += [f"%qs{j} = icmp eq i32 %quad, {j >> 2}", f"%qp{j} = icmp {compare} i32 {j}, %lane"]
            before = lambda j: f"and i1 %qs{j}, %qp{j}"  # noqa: E731
        else:
            before = lambda j: f"icmp {compare} i32 {j}, %lane"  # noqa: E731
        folded, declarations, result = _fold(reduction, signed, value_type, before, target)
        lines += folded + [f"%r = bitcast {value_type} {result} to {value_type}"]
    elif op in ("shuffle", "broadcast", "shuffle_xor", "shuffle_up", "shuffle_down") and len(params) == 2:
        lines = _exchange([(value_type, "%a0")], target) + quad_lines + [f"%d = zext {params[1]} %a1 to i32"]
        if quad:
            source = _quad_source(op, lines)
        else:
            source = {"shuffle": "%d", "broadcast": "%d"}.get(op)
            if op == "shuffle_xor":
                lines.append("%s.x = xor i32 %lane, %d")
                source = "%s.x"
            elif op == "shuffle_up":
                lines.append("%s.x = sub i32 %lane, %d")  # wraps to a huge index: out of range
                source = "%s.x"
            elif op == "shuffle_down":
                lines.append("%s.x = add i32 %lane, %d")
                source = "%s.x"
        lines += _from_lane(value_type, source, "%a0", target)
    elif op in ("shuffle_and_fill_up", "shuffle_and_fill_down") and len(params) in (3, 4):
        size = type_bytes(value_type)
        width = "%a3" if len(params) == 4 else str(4 if quad else SIMD_WIDTH)  # modulo: the group by default
        lines = _exchange([(value_type, "%a0"), (value_type, "%a1")], target) + [
            f"%d = zext {params[2]} %a2 to i32",
            f"%m = zext {params[3]} %a3 to i32" if len(params) == 4 else f"%m = add i32 0, {width}",
            "%i = urem i32 %lane, %m", "%base = sub i32 %lane, %i"]
        if op == "shuffle_and_fill_up":  # i >= d: data[l - d]; else filling[base + m - d + i]
            lines += ["%fromdata = icmp uge i32 %i, %d", "%s.d = sub i32 %lane, %d",
                      "%s.f0 = add i32 %base, %m", "%s.f1 = sub i32 %s.f0, %d", "%s.f = add i32 %s.f1, %i"]
        else:  # i + d < m: data[l + d]; else filling[base + i + d - m]
            lines += ["%id = add i32 %i, %d", "%fromdata = icmp ult i32 %id, %m", "%s.d = add i32 %lane, %d",
                      "%s.f0 = add i32 %base, %id", "%s.f = sub i32 %s.f0, %m"]
        lines += ["%src = select i1 %fromdata, i32 %s.d, i32 %s.f"]
        lines += target.read(value_type, "%src", "vd", 0) + target.read(value_type, "%src", "vf", size)
        # A source lane that did not take part gives zero: what Apple GPUs return in
        # practice (the result is undefined; PyTorch's 64-bit simd_sum relies on it when
        # fewer lanes than a SIMD-group reduce), never another call's leftover value.
        lines += ["%src.in = icmp ult i32 %src, 32", "%src.safe = select i1 %src.in, i32 %src, i32 0",
                  "%src.bit = shl i32 1, %src.safe", "%src.set = and i32 %mask, %src.bit",
                  "%src.took = icmp ne i32 %src.set, 0", "%src.ok = and i1 %src.in, %src.took",
                  f"%picked = select i1 %fromdata, {value_type} %vd, {value_type} %vf",
                  f"%r = select i1 %src.ok, {value_type} %picked, {value_type} zeroinitializer"]
    elif op == "broadcast_first" and len(params) == 1:
        lines = _exchange([(value_type, "%a0")], target) + quad_lines
        own = "%mask"
        if quad:
            lines += ["%q.shift = and i32 %lane, -4", "%q.bits = lshr i32 %mask, %q.shift", "%q.own = and i32 %q.bits, 15"]
            own = "%q.own"
        lines += [f"%first0 = call i32 @llvm.cttz.i32(i32 {own}, i1 true)"]
        lines += ["%first = add i32 %first0, %q.shift"] if quad else ["%first = or i32 %first0, 0"]
        lines += target.read(value_type, "%first", "r0", 0) + [f"%r = bitcast {value_type} %r0 to {value_type}"]
        declarations = ["declare i32 @llvm.cttz.i32(i32, i1)"]
    elif op in ("all", "any") and params == ["i1"] and ret == "i1":
        lines = ["%z = zext i1 %a0 to i8"] + _exchange([("i8", "%z")], target) + quad_lines
        folded, declarations, result = _fold("and" if op == "all" else "or", False, "i8", in_quad, target)
        lines += folded + [f"%r = icmp ne i8 {result}, 0"]
    else:
        return None
    return _definition(ret, name, params, lines), declarations


def _definition(ret: str, name: str, params: List[str], lines: List[str], names: Optional[List[str]] = None) -> str:
    """`lines` as the body of intrinsic `name`, returning %r; parameters %a0... (or `names`),
    plus the call site's order when the body exchanges."""
    signature = [f"{t} {n}" for t, n in zip(params, names or [f"%a{i}" for i in range(len(params))])]
    if any(SITE_ORDER in line for line in lines):
        signature.append(SITE_ORDER)
    body = "\n  ".join(lines + ["ret void" if ret == "void" else f"ret {ret} %r"])
    return f"define internal {ret} @{name}({', '.join(signature)}) alwaysinline {{\n  {body}\n}}"
