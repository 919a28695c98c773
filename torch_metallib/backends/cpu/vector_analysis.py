"""What vector lanes (vectorize.py) know of a region before widening it: which blocks its
lanes may run apart (divergence, post-dominators, divergent parts and their joins), where
its loops end in a weak topological order, and how values likely grow from lane to lane."""

import re
from typing import Dict, List, Optional, Set, Tuple

from ...reflection import ir_model
from ...reflection.ir_model import LOCAL
from .vector_ir import ELEMENTWISE, FLAGS, PER_LANE, indexed_type, type_size, split_operands, strip_metadata, typed

__all__ = ["line_facts", "divergence", "agreeing_slots", "guess_strides", "loop_ends"]




class Part:
    """A divergent part of a region: `blocks` that lanes may run apart (those a divergent
    branch reaches before its join), run as one ordered sequence under masks; `join`: the
    one block its lanes leave to (None: they leave the region), where they run together
    again; `first`: a name for it."""

    def __init__(self, blocks: Set[str], first: str):
        self.blocks, self.first, self.join = blocks, first, None


def divergence(order: List[str], graph: Dict[str, List[str]], lines_of: Dict[str, List[str]], facts,
               slots: Dict[str, str], private: Set[str]) -> Tuple[Set[str], Dict[str, Part]]:
    """(the reg2mem values that vary between lanes, block -> the divergent part that holds
    it): a branch on a varying value diverges until its immediate post-dominator; a value
    stored in a divergent block, or varying, varies (to a fixed point). Where the parts do
    not each have one join, every block but the start is one divergent part (`facts`:
    line_facts of the blocks)."""
    exits = {name for name in order if any("label %tm.latch" in line or line.strip() == "unreachable"
                                           for line in lines_of[name][-1:])}
    post = _post_dominators(order, graph, exits)
    varying_slots: Set[str] = set()
    while True:
        branches, stored = _varying_branches(facts, slots, varying_slots, private)
        divergent: Set[str] = set()
        regions = []
        for branch in branches:
            region = ir_model.reachable_blocks(graph, graph[branch], avoiding={post[branch]})
            regions.append(region)
            divergent |= region
        found = {slot for slot, (varying, blocks) in stored.items() if varying or blocks & divergent}
        if found <= varying_slots:
            break
        varying_slots |= found
    parts = _parts(order, graph, regions)
    if parts is None:  # not one join per part: every block but the start apart
        everything = set(order[1:])
        part = Part(everything, order[1] if len(order) > 1 else order[0])
        parts = {name: part for name in everything}
        _, stored = _varying_branches(facts, slots, set(slots), private)
        varying_slots = {slot for slot, (varying, blocks) in stored.items() if varying or blocks & everything}
    return varying_slots, parts


def agreeing_slots(order: List[str], graph: Dict[str, List[str]], lines_of: Dict[str, List[str]], facts,
                   slots: Dict[str, str], varying_slots: Set[str], private: Set[str],
                   parts: Dict[str, Part]) -> Dict[int, Set[str]]:
    """id(part) -> the varying reg2mem values that lanes running a divergent part together
    (its convergent copies, where they agreed at every branch since entering it) hold
    alike: stored only in the part, only values alike given the others (a loop counter),
    read nowhere before the part writes them (on entering it, after it). Scalars there."""
    live = _live_slots(order, graph, lines_of, slots)
    _, stored = _varying_branches(facts, slots, varying_slots, private)
    found: Dict[int, Set[str]] = {}
    for part in {id(p): p for p in parts.values()}.values():
        inside = part.blocks
        edges = {s for name in order if name not in inside for s in graph[name] if s in inside}
        edges |= {s for name in inside for s in graph[name] if s not in inside}
        candidates = {slot for slot in varying_slots if stored[slot][1] and stored[slot][1] <= inside
                      and not any(slot in live[edge] for edge in edges)}
        while candidates:  # alike where every value stored is, given the candidates alike
            _, alike = _varying_branches(facts, slots, varying_slots - candidates, private)
            kept = {slot for slot in candidates if not alike[slot][0]}
            if kept == candidates:
                break
            candidates = kept
        found[id(part)] = candidates
    return found


def _live_slots(order: List[str], graph: Dict[str, List[str]], lines_of: Dict[str, List[str]],
                slots: Dict[str, str]) -> Dict[str, Set[str]]:
    """Block -> the reg2mem values read on some path from its start before being written
    (reg2mem's allocations are only loaded and stored)."""
    reads: Dict[str, Set[str]] = {}
    writes: Dict[str, Set[str]] = {}
    for name in order:
        read, written = set(), set()
        for line in lines_of[name]:
            text = line.split(" = ", 1)[1].strip() if ir_model.defined_name(line) else line.strip()
            if text.startswith(("store ", "load ")):
                parts = split_operands(strip_metadata(text.split(" ", 1)[1]))
                pointer = typed(parts[1])[1] if len(parts) > 1 else ""
                if pointer in slots and text.startswith("store "):
                    written.add(pointer)
                elif pointer in slots and pointer not in written:
                    read.add(pointer)
        reads[name], writes[name] = read, written
    live = {name: set(reads[name]) for name in order}
    changed = True
    while changed:
        changed = False
        for name in reversed(order):
            new = reads[name] | (set().union(*(live[s] for s in graph[name])) - writes[name])
            if new != live[name]:
                live[name], changed = new, True
    return live


def _parts(order: List[str], graph: Dict[str, List[str]], regions: List[Set[str]]) -> Optional[Dict[str, Part]]:
    """Divergent regions that share blocks merged into parts, each with its join; None
    where a part leaves to two blocks, or a loop with its head in a part leaves it."""
    merged: List[Set[str]] = []
    for region in regions:
        if not region:
            continue
        touching = [m for m in merged if m & region]
        for m in touching:
            merged.remove(m)
            region = region | m
        merged.append(region)
    position = {name: i for i, name in enumerate(order)}
    ends = loop_ends(graph, order)
    parts: Dict[str, Part] = {}
    for blocks in merged:
        part = Part(blocks, min(blocks, key=position.get))
        leaving = {s for name in blocks for s in graph[name] if s not in blocks}
        if len(leaving) > 1:
            return None
        part.join = next(iter(leaving), None)
        for head, end in ends.items():
            if order[head] in blocks and not all(order[i] in blocks for i in range(head, end + 1)):
                return None
        parts.update((name, part) for name in blocks)
    return parts


def _post_dominators(order: List[str], graph: Dict[str, List[str]], exits: Set[str]) -> Dict[str, Optional[str]]:
    """Block -> its immediate post-dominator (None: the region's exit), every exit leading
    to one virtual exit."""
    bit = {name: 1 << i for i, name in enumerate(order)}
    every = (1 << len(order)) - 1
    sets = {name: every for name in order}
    changed = True
    while changed:
        changed = False
        for name in reversed(order):
            successors = graph[name]
            common = 0 if name in exits else every
            for s in successors:
                common &= sets[s]
            if name in exits or not successors:
                common = 0
            new = common | bit[name]
            if new != sets[name]:
                sets[name], changed = new, True
    immediate: Dict[str, Optional[str]] = {}
    for name in order:
        strict = sets[name] & ~bit[name]
        immediate[name] = next((other for other in order if strict & bit[other] and sets[other] == strict), None)
    return immediate


def line_facts(order: List[str], lines_of: Dict[str, List[str]]) -> List[Tuple[str, list]]:
    """Each block's lines as what _varying_branches reads of them (parsed once: the fixed
    points over divergence read them many times): (block, [(kind, result, used, pointer,
    stored)]), kind "store", "load", "impure" (a call), "branch" or ""."""
    facts = []
    for name in order:
        records = []
        for line in lines_of[name]:
            result = ir_model.defined_name(line)
            used = tuple(n for n in LOCAL.findall(line) if n != result)
            text = line.split(" = ", 1)[1].strip() if result else line.strip()
            kind, pointer, stored = "", "", ()
            if text.startswith("store "):
                parts = split_operands(strip_metadata(text[6:]))
                kind, pointer = "store", typed(parts[1])[1] if len(parts) > 1 else ""
                stored = tuple(LOCAL.findall(parts[0]))
            elif text.startswith("load "):
                kind, pointer = "load", typed(split_operands(strip_metadata(text[5:]))[1])[1]
            elif text.startswith("call ") and not _pure_call(text):
                kind = "impure"
            elif text.startswith(("br i1 ", "switch ")):
                kind = "branch"
            records.append((kind, result, used, pointer, stored))
        facts.append((name, records))
    return facts


def _varying_branches(facts: List[Tuple[str, list]], slots: Dict[str, str], varying_slots: Set[str],
                      private: Set[str]):
    """(blocks ending in a branch on a varying value, slot -> (a varying value stored to
    it, the blocks storing to it)), where reg2mem's `varying_slots` and the addresses of
    the lanes' `private` allocations vary (`facts`: the region's lines, line_facts)."""
    varying = {"%t32"} | private
    stored: Dict[str, Tuple[bool, Set[str]]] = {slot: (False, set()) for slot in slots}
    branches = []
    for name, records in facts:
        for kind, result, used, pointer, values in records:
            if kind == "store":
                if pointer in slots:
                    old_varies, blocks = stored[pointer]
                    stored[pointer] = (old_varies or any(n in varying for n in values), blocks | {name})
                continue
            if kind == "load" and pointer in slots:
                if pointer in varying_slots:
                    varying.add(result)
                continue
            if result and (kind == "impure" or any(n in varying for n in used)):
                varying.add(result)
            if kind == "branch" and any(n in varying for n in used):
                branches.append(name)
    return branches, stored


def _pure_call(text: str) -> bool:
    intrinsic = re.search(r"@llvm\.([a-z]+(?:\.sat)?)\.", text)
    return bool(intrinsic) and (intrinsic.group(1) in ELEMENTWISE or intrinsic.group(1) in PER_LANE)


def guess_strides(order: List[str], lines_of: Dict[str, List[str]], slots: Dict[str, str], uniform: Set[str],
                   types: Dict[str, str], arrays: Set[str],
                   fields: Dict[str, Optional[int]]) -> Tuple[Dict[str, int], Set[str]]:
    """(value -> how much it likely grows from one lane to the next (bytes for addresses),
    the values computed from data): the thread index grows by one, through sums, products
    and shifts by constants, remainders and masks (exact within a SIMD-group for small
    values), extensions, reg2mem's values, a lane's private `arrays` (what a load from one
    reads grows as what every store to it wrote: a table of row addresses), the context's
    per-thread `fields` (what a thread kept across a wait, such as its position: a load
    grows as the regions before stored, field index -> guess, updated with this region's
    stores) and getelementptr. Only a guess: the accesses it
    picks check the lanes' addresses at run time. Data (what a kernel loads from its
    buffers, float bits as integers) says nothing of lanes: addresses computed from it
    (table lookups) are not checked."""
    guess: Dict[str, int] = {"%t32": 1}
    slot_guess: Dict[str, Optional[int]] = {}
    root: Dict[str, str] = {name: name for name in arrays}  # an address into a private array -> the array
    data: Set[str] = set()
    field_of: Dict[str, str] = {}  # a thread's own element of a context field -> the field's index
    stored_fields: Dict[str, Optional[int]] = {}

    def of(operand: str) -> Optional[int]:
        value = typed(operand)[1] if " " in operand.strip() else operand.strip()
        if value in guess:
            return guess[value]
        return 0 if value in uniform or not value.startswith("%") else None
    parsed = []  # (result, text, words, opcode) per line, read twice below
    for name in order:
        for line in lines_of[name]:
            result = ir_model.defined_name(line)
            text = strip_metadata(line.split(" = ", 1)[1].strip() if result else line.strip())
            words = [w for w in text.split(" ") if w not in FLAGS]
            parsed.append((result, text, words, words[0] if words else ""))
    for _ in range(2):  # twice: reg2mem's values flow around loops
        for result, text, words, code in parsed:
            found: Optional[int] = None
            if code == "store":
                parts = split_operands(text[6:])
                pointer = typed(parts[1])[1]
                pointer = root.get(pointer, pointer)
                if pointer in slots or pointer in arrays:
                    stored = of(parts[0])
                    slot_guess[pointer] = stored if slot_guess.get(pointer, stored) == stored else None
                elif pointer in field_of:
                    field, stored = field_of[pointer], None if typed(parts[0])[1] in data else of(parts[0])
                    stored_fields[field] = stored if stored_fields.get(field, stored) == stored else None
                continue
            if not result:
                continue
            used = [n for n in LOCAL.findall(text) if n != result]
            if (code == "load" and " addrspace(" in text.split(",", 1)[-1] or any(n in data for n in used)
                    or code in ("fptosi", "fptoui") or code == "bitcast" and not words[1].startswith(("i", "ptr"))):
                data.add(result)
            if code != "load" and all(of(n) == 0 for n in used):
                found = 0  # uniform operands, a uniform result
            elif code == "load":
                pointer = typed(split_operands(text[5:])[1])[1]
                pointer = root.get(pointer, pointer)
                kept = pointer in slots or pointer in arrays
                found = slot_guess.get(pointer) if kept else of(pointer)
                if pointer in field_of:
                    found = fields.get(field_of[pointer])
                elif not kept:
                    found = 0 if found == 0 else None
            elif code in ("add", "sub", "mul", "shl", "urem", "and", "or") and len(words) >= 3:
                parts = split_operands(" ".join(words[1:]))
                a, b = of(parts[0]), of(parts[1])
                constant = parts[1].strip().lstrip("-").isdigit()
                if a is not None and b is not None and code in ("add", "sub"):
                    found = a + b if code == "add" else a - b
                elif a is not None and constant and code == "mul":
                    found = a * int(parts[1])
                elif a is not None and constant and code == "shl":
                    found = a << int(parts[1])
                elif a is not None and b == 0 and code in ("urem", "and", "or"):
                    found = a
            elif code in ("zext", "sext", "trunc", "bitcast", "addrspacecast", "freeze"):
                found = of(" ".join(words[1:]).rsplit(" to ", 1)[0])
            elif code == "getelementptr":
                parts = split_operands(" ".join(words[1:]))
                if typed(parts[1])[1] in root:
                    root[result] = root[typed(parts[1])[1]]
                    continue  # the lanes' copies of an array: no stride of interest
                source, total = parts[0], of(parts[1])
                values = [typed(p)[1] for p in parts[2:]]
                if typed(parts[1])[1] == "%ctx" and len(values) == 3 and values[0] == "0" and values[2] == "%t32":
                    field_of[result] = values[1]
                for depth, index in enumerate(parts[2:]):
                    step = of(index)
                    if total is None or step is None:
                        total = None
                        break
                    if step:  # index k steps over the type the indices after the first reach
                        size = type_size(indexed_type(source, values[1:depth + 1], types), types)
                        total = None if size is None else total + step * size
                found = total
            if found is not None:
                guess[result] = found
    for field, stored in stored_fields.items():
        fields[field] = stored if fields.get(field, stored) == stored else None
    return {name: value for name, value in guess.items() if value}, data - set(guess)


def loop_ends(graph: Dict[str, List[str]], order: List[str]) -> Dict[int, int]:
    """Loop head's position -> the position of its loop's last block, in `order` (a weak
    topological order: a loop's blocks follow its head, together; every edge to an earlier
    block goes to the head of a loop that holds its source)."""
    position = {name: i for i, name in enumerate(order)}
    ends: Dict[int, int] = {}
    for source, targets in graph.items():
        for target in targets:
            if position[target] <= position[source]:
                head = position[target]
                ends[head] = max(ends.get(head, head), _component_end(graph, position, head))
    return ends


def _component_end(graph: Dict[str, List[str]], position: Dict[str, int], head: int) -> int:
    """The last position of the blocks on a cycle through the block at `head`, among the
    blocks from `head` on."""
    start = next(n for n, p in position.items() if p == head)
    before = {n for n, p in position.items() if p < head}
    forward = ir_model.reachable_blocks(graph, [start], avoiding=before)
    backward = ir_model.reachable_blocks(ir_model.predecessors(graph), [start], avoiding=before)
    return max(position[n] for n in forward & backward)
