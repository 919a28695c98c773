"""A cooperative kernel's threads as lane loops: the kernel cut into regions at its
waits, each region a loop over threads that LLVM can vectorize.

Lowered for the LaneLoops target (target.py), a wait is a marker: ``@tm.lanes.barrier()`` or
``@tm.lanes.deposit(value, bytes)`` (a SIMD-group exchange; the region after it starts by
taking the exchange's slots, ``@tm.lanes.exchanged()``). After inlining everything into
``__tm_lanes_<symbol>``:

1. ``cut_at_markers`` ends a block after every marker (numbered k = 1, 2, ...; the code
   after marker k starts block ``tm.after.k``) and gives the thread's index where the
   runtime would. LLVM's reg2mem then moves every value used outside its block to memory.
2. ``build_regions`` makes region r (0: the kernel's start; k: after marker k) of the
   blocks reachable from its start without passing a marker, as
   ``tm.region.r(ctx, args, dims, group, begin, end, points)``: a loop over threads
   [begin, end), lanes of one SIMD-group that all stand at r (so exchange slots have one
   address and no lane is tested), leaving in points[t] the marker each stops at (DONE:
   returned). Memory a thread keeps across a
   wait (reg2mem's values live across a marker, and its private arrays) moves into a
   context shared by the threadgroup, one array per allocation indexed by thread, so a
   loop over threads reads and writes it in consecutive addresses. A region works on its
   own copy of reg2mem's values, reading when a lane starts it those live there and
   writing back at a marker those it wrote that are live after it, so LLVM keeps them in
   registers (in a loop, too); a simdgroup-matrix value (<64 x T>) is kept as the lane's
   two elements. Likewise a small private array that a loop
   of the region stores to, where no pointer into it outlives a region run (addresses
   kept across a wait are recomputed from their index where used). What is used in one
   region only stays on the stack. The slots a region's exchange reads are a noalias
   parameter of its loop, so a result every lane computes from them is computed once.
   A staged exchange (simdgroup-matrix products) is a deposit of no bytes after the lanes
   wrote their elements into their SIMD-group's staging memory (``@tm.lanes.stage``, one
   area per staged exchange and phase in the context); in the region after it, the first
   lane that took part multiplies and every lane reads its results there
   (``@tm.lanes.staged``).

The runtime (csrc/cpu/lanes.cpp) runs region 0 for the threadgroup, completes exchanges
when a SIMD-group's lanes have all stopped, releases barriers when every thread has, and
runs the region after. Lanes stopped at different markers go on from the lowest in a weak
topological order first (the reconvergence rule of reconvergence.py). A kernel with a wait
this scheme does not take (tensor operations, which stage through the runtime) raises
NotLanes (target.py) and is compiled as coroutines.
"""

import re
from dataclasses import dataclass
from typing import Dict, List, Set, Tuple

from ...reflection import ir_model
from ...air.intrinsics import SIMD_WIDTH, type_bytes
from ...reflection.ir_model import LABEL, LOCAL, NAME, function, retarget_phis, substitute
from ...air.collectives import FOLD_PREFIX
from ...air.target import MASK_OFFSET, SLOT_BYTES
from .reconvergence import weak_topological_order
from .recompute import recompute, recomputable, slot_value
from .target import NotLanes

__all__ = ["NotLanes", "cut_at_markers", "build_regions", "DONE", "SCAN", "AGREEMENT_PHIS", "KIND_START",
           "KIND_BARRIER", "KIND_EXCHANGE", "KIND_WHOLE_GROUP", "MEET"]

DONE = -1  # points[t] of a thread that returned (0xFFFFFFFF in the runtime)
SCAN = -2  # what a region returns where its lanes stopped at different points (kScanPoints in the runtime)
# The lane loop's OR and AND of the points its lanes stopped at so far.
AGREEMENT_PHIS = ["  %tm.or = phi i32 [ 0, %tm.rentry ], [ %tm.or.next, %tm.latch ]",
                  "  %tm.and = phi i32 [ -1, %tm.rentry ], [ %tm.and.next, %tm.latch ]"]
KIND_START, KIND_BARRIER, KIND_EXCHANGE = 0, 1, 2
# Added to a region's kind where it keeps nothing of its SIMD-group's own (no exchange, staging
# or kept area): the runtime runs it over all the threadgroup's threads at once when they all
# stand at it, making its set-up (the launch's values, addresses) once, not per SIMD-group.
KIND_WHOLE_GROUP = 4
MEET = "tm.lanes.meet"  # where a region's lanes have all deposited into an exchange inside it
MAX_THREADS = 1024  # Metal's threadgroup limit: context arrays have this many elements
# ... and this many more: arrays a multiple of 4 KB long put a thread's values in one L1 set,
# which a region keeping more values than the cache has ways evicts in turn (the steel GEMM
# took 1.25x the time).
ARRAY_SKEW = 16
MAX_COPY_BYTES = 256  # a private array up to this size is copied per region (see build_regions)
MAX_COPY_ELEMENTS = 16  # ... element by element up to this length, else as one memcpy
assert MASK_OFFSET == SIMD_WIDTH * 64, "%tm.xphase's slots are [32 x <16 x i32>]"
_PADS = {1: "i8", 2: "i16", 4: "i32", 8: "i64", 16: "<4 x i32>", 32: "<8 x i32>", 64: "<16 x i32>"}

_BARRIER = re.compile(r"^\s*call void @tm\.lanes\.barrier\(\)")
_DEPOSIT = re.compile(r"^\s*call void @tm\.lanes\.deposit\(ptr ([^,]+), i32 (\d+)\)")
_EXCHANGED = re.compile(rf"^(\s*%{NAME}) = call ptr @tm\.lanes\.exchanged\(\)")
# A SIMD-group's reduction of the exchange's slots (collectives._tree_or_in_order).
_FOLD = re.compile(rf"^\s*(%{NAME}) = (?:tail )?call (<\d+ x \w+>|\S+) @({re.escape(FOLD_PREFIX)}[-\w$.]+)"
                   rf"\(ptr (%{NAME})\)$")
_RET = re.compile(r"^\s*ret void")
_SIMD = re.compile(r"%tm\.simd(?![-\w$.])")  # the region's SIMD-group (of its first lane)
# A staged exchange (simdgroup-matrix products): the SIMD-group's staging memory, where
# lanes write before the deposit and read in the region after it.
_STAGE = re.compile(rf"^(\s*%{NAME}) = call ptr @tm\.lanes\.stage\(i64 ([^)]+)\)")
_STAGED = re.compile(rf"^(\s*%{NAME}) = call ptr @tm\.lanes\.staged\(\)")
# A SIMD-group's kept area (simdgroup-matrix accumulators a loop keeps between its batches):
# memory of its own in the context, the same in every region.
_KEPT = re.compile(rf"^(\s*%{NAME}) = call ptr @tm\.lanes\.kept\(i32 (\d+), i32 (\d+)\)")
_THREAD = re.compile(r"= call i32 @tm_rt_thread_in_group\(\)( #\d+)?")
_ALLOCA = re.compile(rf"^\s*(%{NAME}) = alloca (.*)$")
# Dropped: stack save/restore around allocations, and lifetimes, which an allocation moved
# to the context may not have (and which would tie a region's buffer to the next region).
_STACK = re.compile(r"@llvm\.(stacksave|stackrestore|lifetime\.(start|end))")
_RUNTIME = re.compile(r"@(tm_rt_\w+|tm\.suspend)\(")
_ALLOWED_RUNTIME = {"tm_rt_thread_in_group", "tm_rt_async_copy_2d"}


def _may_alloca(line: str) -> bool:
    """Whether `line` may be an alloca: a substring test before _ALLOCA, on every line."""
    return "= alloca " in line


def _function_span(lines: List[str], entry: str) -> Tuple[int, int]:
    found = function(lines, entry)
    return found.start, found.end


def cut_at_markers(text: str, entry: str, exchanges: bool = True) -> str:
    """`text` with a block ending after every marker in function `entry` (the code after
    marker k in block ``tm.after.k``) and the running thread's index read from %t32;
    without `exchanges`, after barriers only (a SIMD-group's exchanges then happen inside
    a region: see build_regions)."""
    lines = text.split("\n")
    start, end = _function_span(lines, entry)
    if any("@tm.lanes." in line and " call " in f" {line}" for line in lines[:start] + lines[end:]):
        raise NotLanes("a function it calls waits but was not inlined (recursion)")
    body: List[str] = []
    moved: Dict[str, str] = {}  # block -> the block its terminator now ends
    block, markers = "entry", 0
    for line in lines[start + 1:end]:
        label = LABEL.match(line)
        if label:
            block = label.group(1)
        runtime = _RUNTIME.search(line)
        if runtime and runtime.group(1) not in _ALLOWED_RUNTIME:
            raise NotLanes(f"it calls @{runtime.group(1)}")
        if _ALLOCA.match(line) and re.search(r"= alloca [^,]+, i\d+ %", line):
            raise NotLanes("it allocates thread memory of a run-time size")
        line = _THREAD.sub("= add i32 %t32, 0", line)
        body.append(line)
        if _BARRIER.match(line) or (exchanges and _DEPOSIT.match(line)):
            markers += 1
            body += [f"  br label %tm.after.{markers}", f"tm.after.{markers}:"]
            moved[block] = f"tm.after.{markers}"
    body = _sink_array_addresses(retarget_phis(body, moved))
    return "\n".join(lines[:start + 1] + body + lines[end:])


_ARRAY_ADDRESS = re.compile(rf"^\s*(%{NAME}) = getelementptr (?:inbounds )?(?:nuw )?[^,]+, ptr (%{NAME}),")


def _sink_array_addresses(body: List[str]) -> List[str]:
    """`body` with an address into a thread's allocation recomputed in each block that uses
    it, so reg2mem keeps its index, not the address: then the allocation can be copied per
    region (build_regions), and LLVM keeps it in registers."""
    allocas = {m.group(1) for m in map(_ALLOCA.match, filter(_may_alloca, body)) if m}
    found = ir_model.blocks(body)
    defined = {}
    for name, block in found.items():
        for line in block.lines:
            match = "getelementptr" in line and _ARRAY_ADDRESS.match(line)
            if match and match.group(2) in allocas:
                defined[match.group(1)] = (name, line)
    out: List[str] = []
    for name, block in found.items():
        lines = block.lines
        if block.label is not None:
            out.append(block.label)
        clones, renames = [], {}
        used = {m.group(0) for l in lines if " = phi " not in l for m in LOCAL.finditer(l)}
        for value, (home, line) in defined.items():
            if home != name and value in used:
                renames[value] = f"{value}.in{len(out)}"
                clones.append(line.replace(value, renames[value], 1))
        phis = len(block.phis())
        for i, line in enumerate(lines):
            if i == phis:
                out += clones
            if i >= phis and renames:
                line = substitute(line, renames)
            out.append(line)
    return out


@dataclass
class _Block:
    label: str
    lines: List[str]
    successors: List[str]
    marker: int = 0  # the marker this block ends with (0: none)


def _blocks(body: List[str]) -> List[_Block]:
    found = ir_model.blocks([line for line in body if line.strip() and not line.lstrip().startswith(";")])
    targets = ir_model.successors(found)
    result = [_Block(name or "entry", block.lines, targets[name]) for name, block in found.items()]
    for b in result:  # a block cut_at_markers ended (an exchange it did not cut at is no marker)
        after = b.successors and re.fullmatch(r"tm\.after\.(\d+)", b.successors[0])
        if after and any(_BARRIER.match(line) or _DEPOSIT.match(line) for line in b.lines):
            b.marker = int(after.group(1))
    return result


def _ends_at_deposit(b: _Block) -> bool:
    """Whether marker block `b` ends at an exchange's deposit, not at a barrier: its last
    wait (with exchanges inside regions, a barrier's block may hold deposits before it)."""
    last = next((line for line in reversed(b.lines) if _BARRIER.match(line) or _DEPOSIT.match(line)), "")
    return bool(_DEPOSIT.match(last))


def _blocks_in_loops(by_label: Dict[str, "_Block"], labels: List[str]) -> Set[str]:
    """The blocks among `labels` (one region's) that lie on a cycle within them (a block
    ending in a marker leaves the region: its edges are not followed). One pass over the
    strongly connected components (Tarjan's, iterative): a block is on a cycle when its
    component has another block or it branches to itself."""
    inside = set(labels)
    edges = {label: [] if by_label[label].marker else [s for s in by_label[label].successors if s in inside]
             for label in labels}
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    looped: Set[str] = set()
    for root in labels:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, next_edge = work.pop()
            if next_edge == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            successors = edges[node]
            while next_edge < len(successors):
                successor = successors[next_edge]
                next_edge += 1
                if successor not in index:
                    work.append((node, next_edge))
                    work.append((successor, 0))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                if low[node] == index[node]:  # the root of a component: pop it
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in edges[node]:
                        looped.update(component)
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
    return looped


def _split_type(text: str) -> Tuple[str, str]:
    """(the type at the start of `text`, the rest after its top-level comma)."""
    depth = 0
    for i, c in enumerate(text):
        depth += c in "<[{(" and 1 or 0
        depth -= c in ">]})" and 1 or 0
        if c == "," and depth == 0:
            return text[:i].strip(), text[i + 1:].strip()
    return text.strip(), ""


def _alloca_type(rest: str) -> Tuple[str, int]:
    """(element type of one thread's allocation, its alignment) from an alloca's operands."""
    type_name, rest = _split_type(rest)
    align = 1
    for part in [p.strip() for p in rest.split(",") if p.strip()]:
        count = re.fullmatch(r"i\d+ (\d+)", part)
        if count and int(count.group(1)) != 1:
            type_name = f"[{count.group(1)} x {type_name}]"
        aligned = re.fullmatch(r"align (\d+)", part)
        if aligned:
            align = int(aligned.group(1))
    return type_name, align


def build_regions(text: str, entry: str, symbol: str, exchanges_inside: bool = False) -> str:
    """The module `text` (cut_at_markers, then reg2mem) with `entry` replaced by its region
    functions and the table the runtime reads, ``@__tm_lanes_<symbol>``.

    `exchanges_inside` (cut_at_markers without `exchanges`): a SIMD-group's exchange stays
    inside its region, for vector lanes that run the whole SIMD-group at once
    (vectorize.py): each lane copies its deposit into the slots, ``@tm.lanes.meet(slots)``
    marks where the lanes have all deposited (vector lanes write there the mask of those
    that took part), and the lanes read the slots right after. As a loop over lanes, one
    lane after another, such a region would be wrong: vectorize.py must take it."""
    lines = text.split("\n")
    start, end = _function_span(lines, entry)
    blocks = _blocks(lines[start + 1:end])
    by_label = {b.label: b for b in blocks}
    markers = {b.marker: b for b in blocks if b.marker}
    count = len(markers)

    # Blocks of each region: reachable from its start without passing a marker.
    members: List[List[str]] = []
    for r in range(count + 1):
        first = blocks[0].label if r == 0 else f"tm.after.{r}"
        seen, stack = [first], [first]
        while stack:
            b = by_label[stack.pop()]
            if b.marker:
                continue
            for s in b.successors:
                if s not in seen:
                    seen.append(s)
                    stack.append(s)
        members.append(seen)
    regions_of: Dict[str, Set[int]] = {}
    for r, labels in enumerate(members):
        for label in labels:
            regions_of.setdefault(label, set()).add(r)

    # Allocations: kept in the context unless one run of one region is all that uses them.
    allocas: Dict[str, Tuple[str, int]] = {}
    for b in blocks:
        for line in b.lines:
            match = _may_alloca(line) and _ALLOCA.match(line)
            if match:
                allocas[match.group(1)] = _alloca_type(match.group(2))
    used_in: Dict[str, Set[int]] = {name: set() for name in allocas}
    stored_in_loop: Dict[str, Set[int]] = {name: set() for name in allocas}  # the regions where a loop stores to it
    in_loop = [_blocks_in_loops(by_label, labels) for labels in members]
    for b in blocks:
        addresses = {}  # address -> the allocation it points into, in this block
        for line in b.lines:
            if (_may_alloca(line) and _ALLOCA.match(line)) or ("@llvm." in line and _STACK.search(line)):
                continue
            for name in LOCAL.findall(line):
                if name in used_in:
                    used_in[name] |= regions_of.get(b.label, set())
            address = "getelementptr" in line and _ARRAY_ADDRESS.match(line)
            if address and address.group(2) in allocas:
                addresses[address.group(1)] = address.group(2)
            store = "store " in line and _STORE_TO.match(line)
            target = store and addresses.get(store.group(1), store.group(1))
            if target in allocas:
                stored_in_loop[target] |= {r for r in regions_of.get(b.label, set()) if b.label in in_loop[r]}
    reentered = {r for r in range(1, count + 1) if markers[r].label in members[r]}
    # A value (reg2mem's) is kept only where it is live across a marker: read after the
    # marker before being written. Then a lane reads at a region's start only the values
    # live there, and writes back at a marker only those live after it.
    values = {n for n in allocas if _is_value(n)}
    live = _live_values(blocks, values)
    across = set().union(*(live[f"tm.after.{k}"] for k in markers))
    deposited = _deposit_buffers(blocks, {n for n in allocas if n not in values})
    context = [n for n in allocas if (n in across if n in values else (len(used_in[n]) > 1 or used_in[n] & reentered)
                                      and n not in deposited)]
    # What the entry block computes from the launch, and cheap functions of the thread's index
    # and that, each region that uses it computes again (recompute.py): not kept.
    again = recomputable(blocks[0].lines, [line for b in blocks[1:] for line in b.lines])
    recomputed = [n for n in context if n in values and slot_value(n, again)]
    context = [n for n in context if n not in recomputed]
    # Values and small private arrays whose address never outlives a region run get a copy
    # per region (below); reg2mem's are only ever loaded and stored.
    body_lines = [line for b in blocks for line in b.lines]
    copyable = {n for n in context if n in values or (
        (_type_bytes(allocas[n][0]) or MAX_COPY_BYTES + 1) <= MAX_COPY_BYTES
        and _address_stays_in_region(body_lines, n, set(context)))}
    field = {name: i for i, name in enumerate(context)}
    exchanges = [k for k in range(1, count + 1) if _ends_at_deposit(markers[k])]
    site = {k: i for i, k in enumerate(exchanges)}
    # An exchange inside a region: its slots are the context's, of its own site, the first
    # SIMD-group's and phase 0 (every run of a region has the exchange to itself).
    inside = [(b.label, i) for b in blocks for i, line in enumerate(b.lines)
              if exchanges_inside and "@tm.lanes.deposit(" in line and _DEPOSIT.match(line)]
    inside_site = {at_line: len(exchanges) + i for i, at_line in enumerate(inside)}
    sites = max(len(exchanges) + len(inside), 1)
    phases_field, areas_field, staging_field = len(context), len(context) + 1, len(context) + 2
    stage_bytes = _stage_bytes(blocks)
    staged = {k: i for i, k in enumerate(sorted(stage_bytes))}  # staged exchange -> its staging area

    # A kept i1 is stored as a byte: LLVM does not vectorize i1 loads and stores.
    booleans = {n for n in context if allocas[n][0] == "i1"}
    for n in booleans:
        allocas[n] = ("i8", allocas[n][1])

    # A simdgroup-matrix value (<64 x T>) is kept as the lane's two elements, the only ones
    # it holds (simdgroup_matrix.py); the others, never defined, are not carried across a wait.
    fragments = {n: f"<2 x {m.group(1)}>" for n in context if n in values
                 for m in [re.fullmatch(r"<64 x (\w+)>", allocas[n][0])] if m}

    def element(name: str) -> str:
        type_name, align = allocas[name]
        if name in fragments:
            type_name, align = fragments[name], 8
        return f"{{ {type_name}, [0 x {_PADS[min(max(align, 1), 64)]}] }}"

    context_type = f"%tm.ctx.{symbol}"
    fields = [f"[{MAX_THREADS + ARRAY_SKEW} x {element(n)}]" for n in context] + [
        f"[{SIMD_WIDTH} x [{sites} x i32]]", f"[{SIMD_WIDTH} x [{sites} x [2 x %tm.xphase]]]"]
    if staged:  # per SIMD-group, staged exchange and phase: as many bytes as the largest stages
        lines64 = (max(stage_bytes.values()) + 63) // 64
        fields.append(f"[{SIMD_WIDTH} x [{len(staged)} x [2 x [{lines64} x <16 x i32>]]]]")
    kept_bytes: Dict[int, int] = {}
    for line in body_lines:
        asks = "@tm.lanes.kept(" in line and _KEPT.match(line)
        if asks:
            kept_bytes[int(asks.group(2))] = max(kept_bytes.get(int(asks.group(2)), 0), int(asks.group(3)))
    kept_area = {area: i for i, area in enumerate(sorted(kept_bytes))}
    kept_field = len(fields)
    if kept_area:  # per SIMD-group and kept area: as many bytes as the largest asks
        fields.append(f"[{SIMD_WIDTH} x [{len(kept_area)} x [{(max(kept_bytes.values()) + 63) // 64} x <16 x i32>]]]")

    def at(field_index: int, *indices: str) -> str:
        return (f"getelementptr inbounds {context_type}, ptr %ctx, i32 0, i32 {field_index}"
                + "".join(f", i32 {i}" for i in indices))

    def phase(k: int, deposit: bool) -> Tuple[List[str], str]:
        """(lines, value): exchange `k`'s phase, the one being read, or the other one
        (lanes deposit there, so a lane that deposits again does not overwrite what lanes
        after it in the loop still read). The same for every lane of the loop: computed
        before it."""
        ending = f"{'d' if deposit else 'r'}{k}"
        return [f"  %tm.pp.{ending} = {at(phases_field, '%tm.simd', str(site[k]))}",
                f"  %tm.ph.{ending} = load i32, ptr %tm.pp.{ending}"] + (
                [f"  %tm.dp.{ending} = xor i32 %tm.ph.{ending}, 1"] if deposit else []), \
            f"%tm.dp.{ending}" if deposit else f"%tm.ph.{ending}"

    def slots(k: int, deposit: bool, name: str) -> List[str]:
        """`name` = the slots of exchange `k`'s phase (see phase)."""
        lines, value = phase(k, deposit)
        return lines + [f"  {name} = {at(areas_field, '%tm.simd', str(site[k]), value)}"]

    first_metadata = 1 + max((int(n) for n in re.findall(r"!(\d+)\b", text)), default=0)
    metadata = [f'!{first_metadata} = !{{!"llvm.loop.vectorize.enable", i1 false}}']
    functions: List[str] = []
    whole_group: Set[int] = set()  # the regions of KIND_WHOLE_GROUP
    for r, labels in enumerate(members):
        local = [n for n in allocas if n not in field and r in used_in[n]]
        kept = [n for n in context if r in used_in[n]]
        # An array is copied where a loop stores to it (LLVM then keeps it in registers); a
        # copy only read, or written once, costs more than it saves (its write-back stalls
        # store forwarding).
        copied = [n for n in kept if n in copyable and (n in values or r in stored_in_loop[n])]
        live_at_start = live[labels[0]] if r else set()
        slots_again = [n for n in recomputed if r and r in used_in[n]]
        before_loop, per_lane, renames = recompute([slot_value(n, again) for n in slots_again], again, ".again")
        per_lane += [f"  store {allocas[n][0]} {renames[slot_value(n, again)]}, ptr {n}" for n in slots_again]
        written = {m.group(1) for label in labels for line in by_label[label].lines
                   for m in ["store " in line and _STORE_TO.match(line)] if m and m.group(1) in values}

        def copy(n: str, target: str, source: str, value: str) -> List[str]:
            """Lines copying kept allocation `n` from `source` to `target`: a value or a short
            array through `value` (element by element: a wide load of what was just stored
            element-wise stalls store forwarding), a longer array as one memcpy."""
            type_name, align = allocas[n]
            length = re.match(r"\[(\d+) x ", type_name)
            if n in fragments:  # two elements in the context
                pair = fragments[n]
                if target == n:
                    return [f"  {value} = load {pair}, ptr {source}",
                            f"  {value}.w = shufflevector {pair} {value}, {pair} poison, <64 x i32> <i32 0, i32 1"
                            + ", i32 poison" * 62 + ">", f"  store {type_name} {value}.w, ptr {target}"]
                return [f"  {value} = load {type_name}, ptr {source}",
                        f"  {value}.n = shufflevector {type_name} {value}, {type_name} poison, <2 x i32> <i32 0, i32 1>",
                        f"  store {pair} {value}.n, ptr {target}"]
            if not length or int(length.group(1)) <= MAX_COPY_ELEMENTS:
                return [f"  {value} = load {type_name}, ptr {source}", f"  store {type_name} {value}, ptr {target}"]
            return [f"  call void @llvm.memcpy.p0.p0.i64(ptr align {max(align, 1)} {target}, "
                    f"ptr align {max(align, 1)} {source}, i64 {_type_bytes(type_name)}, i1 false)"]

        def write_back(number: int, marker: int) -> List[str]:
            """Lines storing, at `marker`, the region's copies of kept arrays and of the values
            it writes that are live after the marker into the context (LLVM drops the stores
            of arrays the region did not change)."""
            after = live[f"tm.after.{marker}"] & written
            return [line for n in copied if n not in values or n in after
                    for line in copy(n, f"{n}.ctx", n, f"%tm.out.{number}.{n[1:]}")]
        invariant = ["  %tm.simd = lshr i32 %tm.begin, 5"]
        prepared: Set[Tuple[int, bool]] = set()
        prepared_inside: Set[int] = set()

        def phase_value(k: int, deposit: bool) -> str:
            """Exchange `k`'s phase (see phase), its lines added before the loop once."""
            lines, value = phase(k, deposit)
            if (k, deposit) not in prepared:
                prepared.add((k, deposit))
                invariant.extend(lines)
            return value
        body: List[str] = []
        read = None  # the name of this region's exchanged slots
        met = None  # the slots of the exchange inside the region the lanes just deposited into
        slots_inside: Dict[str, str] = {}  # the name an exchange inside the region read its slots as -> them
        for label in labels:
            b = by_label[label]
            body.append(f"{label}:")
            for i, line in enumerate(b.lines):
                if (" alloca " in line and _ALLOCA.match(line)) or ("@llvm." in line and _STACK.search(line)):
                    continue
                marker = "@tm.lanes." in line  # most lines are none of these: one test, not five patterns
                exchanged = marker and _EXCHANGED.match(line)
                deposit = marker and _DEPOSIT.match(line)
                stage = marker and (_STAGE.match(line) or _STAGED.match(line))
                fold = (read or slots_inside) and "@" + FOLD_PREFIX in line and _FOLD.match(line)
                if exchanged and met:
                    slots_inside[exchanged.group(1).strip()] = met
                    body.append(f"  {exchanged.group(1).strip()} = getelementptr i8, ptr {met}, i32 0")
                    met = None
                elif fold and fold.group(4) in slots_inside:  # of the slots themselves: vector lanes know whose
                    body.append(f"  {fold.group(1)} = call {fold.group(2)} @{fold.group(3)}(ptr {slots_inside[fold.group(4)]})")
                elif exchanged:
                    read = exchanged.group(1).strip()
                    body.append(f"  {read} = getelementptr i8, ptr %tm.read, i32 0")
                elif fold and fold.group(4) == read:  # once, before the loop: the same for every lane
                    name, type_name = fold.group(1), fold.group(2)
                    invariant.append(f"  {name}.once = call {type_name} @{fold.group(3)}(ptr %tm.read)")
                    body.append(f"  {name} = bitcast {type_name} {name}.once to {type_name}")
                elif stage:
                    k = b.marker if stage.re is _STAGE else r  # filled before marker k, read after it
                    if k not in staged:
                        raise NotLanes("a staged exchange's memory is used away from its exchange")
                    value = phase_value(k, stage.re is _STAGE)
                    body.append(f"  {stage.group(1).strip()} = {at(staging_field, '%tm.simd', str(staged[k]), value)}")
                elif marker and _KEPT.match(line):
                    asks = _KEPT.match(line)
                    body.append(f"  {asks.group(1).strip()} = {at(kept_field, '%tm.simd', str(kept_area[int(asks.group(2))]))}")
                elif deposit and (label, i) in inside_site:
                    j = inside_site[(label, i)]
                    met = f"%tm.area.i{j}"
                    if j not in prepared_inside:
                        prepared_inside.add(j)
                        invariant.append(f"  {met} = {at(areas_field, '0', str(j), '0')}")
                    body.append(f"  %tm.slot.i{j} = getelementptr inbounds [{SIMD_WIDTH} x [{SLOT_BYTES} x i8]], "
                                f"ptr {met}, i32 0, i32 %tm.lane")
                    if int(deposit.group(2)):
                        body.append(f"  call void @llvm.memcpy.p0.p0.i64(ptr align 4 %tm.slot.i{j}, "
                                    f"ptr align 4 {deposit.group(1)}, i64 {deposit.group(2)}, i1 false)")
                    body.append(f"  call void @{MEET}(ptr {met})")
                elif deposit:
                    k = b.marker
                    invariant.append(f"  %tm.area.{k} = {at(areas_field, '%tm.simd', str(site[k]), phase_value(k, True))}")
                    body.append(f"  %tm.slot.{k} = getelementptr inbounds [{SIMD_WIDTH} x [{SLOT_BYTES} x i8]], "
                                f"ptr %tm.area.{k}, i32 0, i32 %tm.lane")
                    if int(deposit.group(2)):
                        body.append(f"  call void @llvm.memcpy.p0.p0.i64(ptr align 4 %tm.slot.{k}, "
                                    f"ptr align 4 {deposit.group(1)}, i64 {deposit.group(2)}, i1 false)")
                elif marker and _BARRIER.match(line):
                    continue
                elif line is b.lines[-1] and b.marker:
                    body += write_back(len(body), b.marker) + [f"  store i32 {b.marker}, ptr %tm.pt", "  br label %tm.latch"]
                elif "ret void" in line and _RET.match(line):  # the thread's memory is not read again
                    body += [f"  store i32 {DONE}, ptr %tm.pt", "  br label %tm.latch"]
                elif " = phi " in line:
                    body.append(_keep_incoming(line, regions_of, r))
                else:
                    body += _as_bytes(line, booleans, len(body)) if booleans else [line]
        parameters = "ptr noalias %ctx, ptr %args, ptr %dims, i32 %g32, i32 %tm.begin, i32 %tm.end, ptr noalias %tm.points"
        arguments = parameters.replace("noalias ", "")
        if r in site:
            # The slots this region reads are its parameter, noalias: the deposits go to the
            # other phase, so LLVM may compute what every lane computes from them once.
            functions.append("\n".join(
                [f"define internal i32 @tm.region.{r}({parameters}) {{", "  %tm.simd = lshr i32 %tm.begin, 5"]
                + slots(r, False, "%tm.read")
                + [f"  %tm.agreed = call i32 @tm.region.{r}.lanes({arguments}, ptr %tm.read)", "  ret i32 %tm.agreed",
                   "}"]))
        name = f"tm.region.{r}.lanes" if r in site else f"tm.region.{r}"
        extra = ", ptr noalias readonly %tm.read) alwaysinline" if r in site else ")"
        out = ([f"define internal i32 @{name}({parameters}{extra} {{", "tm.rentry:"] + invariant
               + [f"  {n} = alloca {allocas[n][0]}, align {max(allocas[n][1], 1)}" for n in local + copied]
               + before_loop
               + ["  br label %tm.loop", "tm.loop:",
                  "  %t32 = phi i32 [ %tm.begin, %tm.rentry ], [ %tm.next, %tm.latch ]"] + AGREEMENT_PHIS
               + ["  %tm.pt = getelementptr inbounds i32, ptr %tm.points, i32 %t32",
                  f"  %tm.lane = and i32 %t32, {SIMD_WIDTH - 1}"]
               + per_lane
               + [f"  {n} = {at(field[n], '%t32')}" for n in kept if n not in copied]
               + [f"  {n}.ctx = {at(field[n], '%t32')}" for n in copied]
               + [line for n in copied if n not in values or n in live_at_start for line in copy(n, n, f"{n}.ctx", f"{n}.in")]
               + [f"  br label %{labels[0]}"] + body)
        # Not vectorized yet: on some regions with SIMD-group reductions in divergent code
        # LLVM 20's loop vectorizer did not return (in VPlan construction), marked
        # llvm.loop.parallel_accesses or not.
        # The region returns the point every lane stopped at, or SCAN where they differ
        # (all equal: their OR is their AND), so the runtime need not read the points back.
        out += ["tm.latch:", "  %tm.p = load i32, ptr %tm.pt", "  %tm.or.next = or i32 %tm.or, %tm.p",
                "  %tm.and.next = and i32 %tm.and, %tm.p",
                "  %tm.next = add nuw i32 %t32, 1", "  %tm.more = icmp ult i32 %tm.next, %tm.end",
                f"  br i1 %tm.more, label %tm.loop, label %tm.exit, !llvm.loop !{first_metadata + 1 + r}",
                "tm.exit:", "  %tm.same = icmp eq i32 %tm.or.next, %tm.and.next",
                f"  %tm.agreed = select i1 %tm.same, i32 %tm.or.next, i32 {SCAN}", "  ret i32 %tm.agreed", "}"]
        functions.append("\n".join(out))
        if r not in site and sum(len(_SIMD.findall(line)) for line in out) == 1:  # its definition alone
            whole_group.add(r)
        metadata.append(f"!{first_metadata + 1 + r} = distinct !{{!{first_metadata + 1 + r}, !{first_metadata}}}")

    order = weak_topological_order({b.label: b.successors for b in blocks}, blocks[0].label)
    position = {label: i for i, label in enumerate(order)}
    kinds = [(KIND_START if r == 0 else KIND_EXCHANGE if r in site else KIND_BARRIER)
             + (KIND_WHOLE_GROUP if r in whole_group else 0) for r in range(count + 1)]
    ranks = [0] + [position.get(markers[k].label, len(order)) + 1 for k in range(1, count + 1)]
    entries = ", ".join(f"{{ ptr, i32, i32 }} {{ ptr @tm.region.{r}, i32 {kinds[r]}, i32 {ranks[r]} }}"
                        for r in range(count + 1))

    def offset(*indices: str) -> str:
        return f"i64 ptrtoint (ptr getelementptr ({context_type}, ptr null, {', '.join(indices)}) to i64)"

    table = (f"@__tm_lanes_{symbol} = constant {{ i64, i64, i64, i32, i32, [{count + 1} x {{ ptr, i32, i32 }}] }} "
             f"{{ {offset('i32 1')}, {offset('i32 0', f'i32 {phases_field}')}, {offset('i32 0', f'i32 {areas_field}')}, "
             f"i32 {sites}, i32 {count + 1}, [{count + 1} x {{ ptr, i32, i32 }}] [{entries}] }}")
    types = [f"{context_type} = type {{ {', '.join(fields)} }}"]
    if "%tm.xphase = type" not in text:
        types.append(f"%tm.xphase = type {{ [{SIMD_WIDTH} x <16 x i32>], i32, i32 }}  ; ExchangePhase: slots, mask, claimed")
    declarations = [] if "@llvm.memcpy.p0.p0.i64(" in text else ["declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)"]
    if inside:
        declarations.append(f"declare void @{MEET}(ptr)")
    # Types before their first use (a GEP's type must be known where it is parsed), after
    # the header (source_filename must come first).
    header = next(i for i, line in enumerate(lines) if line.startswith("target triple")) + 1
    module = "\n".join(lines[:header] + types + lines[header:start] + functions + lines[end + 1:]
                       + declarations + [table] + metadata + [""])
    return module


def _deposit_buffers(blocks: List[_Block], candidates: Set[str]) -> Set[str]:
    """The allocations among `candidates` used only in blocks that end with their deposit,
    and there only stored to (an exchange's buffer): what they hold never crosses a marker,
    so each region run has its own (kept in the context, 64 bytes a thread, each lane's
    deposit wrote a cache line of its own)."""
    kept = set(candidates)
    for b in blocks:
        deposit = b.marker and next((m for m in map(_DEPOSIT.match, b.lines) if m), None)
        deposited = set(LOCAL.findall(deposit.group(1))) if deposit else set()
        roots: Dict[str, str] = {}  # an address into an allocation -> the allocation
        for line in b.lines:
            if (_may_alloca(line) and _ALLOCA.match(line)) or ("@llvm." in line and _STACK.search(line)):
                continue
            names = [roots.get(n, n) for n in LOCAL.findall(line)]
            for name in set(names) & kept:
                address = "getelementptr" in line and _ARRAY_ADDRESS.match(line)
                store = "store " in line and _STORE_TO.match(line)
                if name not in deposited:
                    kept.discard(name)
                elif address and roots.get(address.group(2), address.group(2)) == name:
                    roots[address.group(1)] = name
                elif not (_DEPOSIT.match(line) or store and names[-1] == name and name not in names[:-1]):
                    kept.discard(name)  # read, or its address stored
    return kept


_VALUE_SLOT = re.compile(r"\.reg2mem\d*$")
_STORE_TO = re.compile(rf"^\s*store .*, ptr (%{NAME})")


def _is_value(name: str) -> bool:
    """Whether allocation `name` is reg2mem's (a value moved to memory: only loaded and stored)."""
    return bool(_VALUE_SLOT.search(name))


def _live_values(blocks: List[_Block], values: Set[str]) -> Dict[str, Set[str]]:
    """Block label -> the `values` live at its start: read on some path from there before
    being written (backward data flow; a value used otherwise counts as read)."""
    reads: Dict[str, Set[str]] = {}
    writes: Dict[str, Set[str]] = {}
    for b in blocks:
        read, written = set(), set()
        for line in b.lines:
            if _may_alloca(line) and _ALLOCA.match(line):
                continue
            store = "store " in line and _STORE_TO.match(line)
            if store and store.group(1) in values:
                written.add(store.group(1))
                line = line[:store.start(1)]  # the stored value may be read too (not a slot here)
            for name in LOCAL.findall(line):
                if name in values and name not in written:
                    read.add(name)
        reads[b.label], writes[b.label] = read, written
    live = {b.label: set(reads[b.label]) for b in blocks}
    changed = True
    while changed:
        changed = False
        for b in reversed(blocks):
            out = set().union(*(live[s] for s in b.successors if s in live))
            new = reads[b.label] | (out - writes[b.label])
            if new != live[b.label]:
                live[b.label] = new
                changed = True
    return live


def _stage_bytes(blocks: List[_Block]) -> Dict[int, int]:
    """Marker k -> the bytes its staged exchange stages (regions.py takes only a constant
    size, staged in the block that ends with the exchange)."""
    found: Dict[int, int] = {}
    for b in blocks:
        for line in b.lines:
            stage = "@tm.lanes.stage(" in line and _STAGE.match(line)
            if not stage:
                continue
            if not b.marker or not stage.group(2).isdigit():
                raise NotLanes("it stages an exchange of a run-time size or apart from its deposit")
            found[b.marker] = max(found.get(b.marker, 0), int(stage.group(2)))
    return found


def _type_bytes(type_name: str):
    """The size of an array of scalars or vectors, or of one (None for anything else, e.g. structs)."""
    type_name = re.sub(r" addrspace\(\d+\)$", "", type_name.strip())
    array = re.fullmatch(r"\[(\d+) x (.+)\]", type_name)
    if array:
        inner = _type_bytes(array.group(2))
        return None if inner is None else int(array.group(1)) * inner
    if type_name == "i1":
        return 1  # a byte in memory
    try:
        return type_bytes(type_name)
    except ValueError:
        return None


def _address_stays_in_region(lines: List[str], name: str, context: Set[str]) -> bool:
    """Whether every pointer into allocation `name` is used only to load, store, copy or
    deposit, and kept (if at all) only in memory that stays in one region run: then a
    region can work on a copy of it, which LLVM keeps in registers."""
    derived, holders = {name}, set()
    changed = True
    while changed:
        changed = False
        for line in lines:
            used = set(LOCAL.findall(line))
            if not used & (derived | holders) or _ALLOCA.match(line):
                continue
            result = re.match(rf"^\s*(%{NAME}) = (\w+)", line)
            op = result.group(2) if result else line.split()[0]
            new = None
            if op in ("getelementptr", "bitcast", "addrspacecast", "phi", "select") and used & derived:
                new = result.group(1)
            elif op == "load":
                address = re.search(rf", ptr (%{NAME})", line).group(1)
                if address in holders and " = load ptr" in line:
                    new = result.group(1)
                elif address not in derived | holders:
                    return False
            elif op == "store":
                value, _, address = line.split("store ", 1)[1].rpartition(", ptr ")
                address = address.split(",")[0].strip()
                if used & derived & set(LOCAL.findall(value)):
                    if address in context:
                        return False
                    if address not in holders:
                        holders.add(address)
                        changed = True
            elif op == "call" and re.search(r"@(llvm\.(memset|memcpy|memmove|lifetime)\.|tm\.lanes\.deposit\()", line):
                pass
            elif op == "call" or used & derived:
                return False
            if new and new not in derived:
                derived.add(new)
                changed = True
    return True


_STORE_I1 = re.compile(rf"^(\s*)store i1 ([^,]+), ptr (%{NAME})(.*)$")
_LOAD_I1 = re.compile(rf"^(\s*)(%{NAME}) = load i1, ptr (%{NAME})(.*)$")


def _as_bytes(line: str, booleans: Set[str], number: int) -> List[str]:
    """`line` with its i1 loads from and stores to `booleans` on bytes (`number` names
    the value it adds)."""
    store = _STORE_I1.match(line)
    if store and store.group(3) in booleans:
        return [f"  %tm.byte.{number} = zext i1 {store.group(2)} to i8",
                f"  store i8 %tm.byte.{number}, ptr {store.group(3)}{store.group(4)}"]
    load = _LOAD_I1.match(line)
    if load and load.group(3) in booleans:
        return [f"  %tm.byte.{number} = load i8, ptr {load.group(3)}{load.group(4)}",
                f"  {load.group(2)} = trunc i8 %tm.byte.{number} to i1"]
    return [line]


def _keep_incoming(line: str, regions_of: Dict[str, Set[int]], region: int) -> str:
    """A phi of region `region` without the incoming values of blocks outside it."""
    head, _, rest = line.partition(" = phi ")
    type_name = rest[:rest.index("[")].strip()
    pairs = re.findall(rf"\[\s*([^\[\]]+?),\s*%({NAME})\s*\]", rest)
    kept = [f"[ {v}, %{b} ]" for v, b in pairs if region in regions_of.get(b, set())]
    return f"{head} = phi {type_name} {', '.join(kept)}"
