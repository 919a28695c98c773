"""A lane-loop region (regions.py) as vector lanes: the loop over a SIMD-group's threads
run `width` threads at a time (WIDTH; a whole SIMD-group, GROUP_WIDTH, where its exchanges
are inside the regions), each thread a lane of LLVM vectors.

A region's per-thread body is in reg2mem's form (every value used outside its block goes
through memory), so each block can be widened on its own:

* Uniformity: parameters, constants and the values the region computes before its loop are
  uniform, and so is an instruction without side effects whose operands all are (a load
  from a uniform address included: lanes that race on it differ on every target). They stay
  scalar (computed once before the loop over lanes where that is safe); everything else
  becomes a vector of `width` lanes.
* Divergence (divergence): a branch on a varying value diverges until its immediate
  post-dominator; a reg2mem value stored in a divergent block, or a varying one, varies,
  to a fixed point. The others stay scalar, so a loop that every lane runs alike is a
  loop LLVM sees as one.
* Control flow: a convergent block runs for every lane still running, its uniform
  branches stay branches. A divergent part (the blocks divergent branches reach, merged
  where they overlap, with one join) runs twice over: as convergent copies while the lanes
  agree at each branch (checked at run time), else with a counter per lane naming the block
  it runs next: the part's blocks in a weak topological order (reconvergence.py), each for
  the lanes whose counter names it, under that mask, skipped where none does, a loop again
  while a lane is still in it; then the lanes at the join run on together. So divergent
  `if`s, loops whose trip count differs per lane and early returns need no other
  analysis. (Where the parts do not each have one join, everything after the region's
  start is one part.) In the convergent copies, a reg2mem value stored only in the part,
  only from values alike, and not read before the part writes it (a loop's counter) is a
  scalar (agreeing_slots), made every lane's where the lanes go apart.
* Memory: a varying reg2mem value is a vector in memory (stores in divergent blocks select
  under the mask; in convergent ones the lanes masked off have finished, so LLVM keeps it
  in registers); a thread's private arrays of one scalar type are interleaved element by
  element (one element of every lane's copy is read and written as a whole vector), its
  other allocations are `width` copies. An access through a varying address is one masked
  vector access where the lanes' addresses are consecutive, or a wide one where they are 2
  or 4 elements apart (known for the context's and the points' per-thread arrays and an
  interleaved array's elements, else checked at run time where the address is computed or
  loaded, once for the addresses a uniform offset from it), else a masked gather or
  scatter: a masked-off lane touches no memory, and a scatter writes lanes in order, as
  the lane loop does. A wide access to device memory also prefetches the lines of the
  lanes PREFETCH_LANES threads on. Loads of a block reading elements 0 to n - 1 from one
  base (values the block computes alike, such as reg2mem's reloads, counting as one:
  _ValueNumbers) are one wide access (_load_groups). A read of one of the lowering's
  tables (fast_exp's 32 entries) at an index per lane is two permutes of registers where
  the target has AVX-512, not a gather. A masked-off lane divides by one; the thread
  index divided by a uniform divisor is the first lane's division and a carry for the
  others where the divisor is at least the number of lanes.
* Calls: elementwise LLVM intrinsics become their vector forms (the same result per
  element); other pure math intrinsics are called per lane; a copy of 1 to 8 bytes (a
  deposit into its exchange slot) is an integer load and store of the lanes (of the vector
  the block just stored there, where it did: a buffer only stored to and copied from at
  once is then not written); other memory intrinsics run per lane under the mask.

* Exchanges inside a region (build_regions' `exchanges_inside`: a kernel cut at its
  barriers only): the lanes of the mask copy their deposits into the slots, then
  ``@tm.lanes.meet`` writes the mask of their lanes where the runtime would, so what reads
  the slots (shuffles, broadcasts, ballots) reads what every lane deposited. A reduction
  of the slots (a fold, collectives.py) of the vector just deposited is computed from it
  in registers where the order cannot change the result: integers, and a float minimum
  or maximum without a NaN or a zero among the values, as vector reductions; a float sum
  or product of all 32 lanes as the fold's own butterfly; else the fold reads the slots.
  The blocks run in a weak topological order, the order the runtime ranks waits by: lanes
  inside a loop or a divergent `if` meet before the lanes past it, as in the lane loops.

Anything else (atomics, phis, aggregate or vector values other than copies, other calls)
raises NotVector: that region stays a lane loop (decided at compile time, logged at debug
level); where it holds an exchange, the kernel is cut at its exchanges too (jit.py).
"""

import re
from typing import Dict, List, Optional, Set, Tuple

from ...reflection import ir_model
from ...reflection.ir_model import LOCAL, NAME
from .reconvergence import weak_topological_order
from ...air.collectives import FOLD_PREFIX, butterfly_of_halves, reduction_identity
from ...air.intrinsics import SIMD_WIDTH
from ...air.target import MASK_OFFSET
from .regions import AGREEMENT_PHIS, MEET, SCAN
from .vector_analysis import agreeing_slots, divergence, guess_strides, line_facts, loop_ends
from .vector_ir import (ELEMENTWISE, FLAGS, PER_LANE, SCALAR, NotVector, array_elements, indexed, indexed_type,
                        leaf_type, mangled, only_accessed_as, scalar_bytes, scalar_count, split_operands,
                        strip_metadata, type_size, typed)

__all__ = ["WIDTH", "GROUP_WIDTH", "NotVector", "vectorize_regions", "refuses"]

WIDTH = 16  # lanes per vector: 16 x 32 bits, an AVX-512 register (two AVX2 ones)
# ... and in regions with exchanges inside: a whole SIMD-group, whose lanes meet there (the
# steel GEMM's regions, whose matrix products stay lane loops, took 1.1x the time with 32).
GROUP_WIDTH = SIMD_WIDTH
# Lanes' elements 2 or 4 apart are read and written as one wide access (a few registers and a
# shuffle); further apart, the wide access and its shuffle cost more than a gather.
SPACINGS = (1, 2, 4)
# A wide access to device memory also asks for the lines the lanes this many threads on will
# read or write (two SIMD-groups: the next regions to run): a thread's few accesses per region
# leave the out-of-order core no work to hide a cache miss behind.
PREFETCH_LANES = 64
EXIT = -1  # the counter of a lane that left the region or is past its end (the highest, unsigned)
_REGION = re.compile(r"^define internal (void|i32) @(tm\.region\.\d+(?:\.lanes)?)\(")
_BINARY = {"add", "sub", "mul", "udiv", "sdiv", "urem", "srem", "shl", "lshr", "ashr", "and", "or", "xor",
           "fadd", "fsub", "fmul", "fdiv", "frem"}
_DIVISIONS = {"udiv", "sdiv", "urem", "srem"}  # a masked-off lane's divisor must not trap
_CASTS = {"trunc", "zext", "sext", "fptrunc", "fpext", "fptoui", "fptosi", "uitofp", "sitofp", "ptrtoint",
          "inttoptr", "bitcast", "addrspacecast"}
_GEP_BASE = re.compile(rf"^\s*(%{NAME}) = getelementptr (?:\w+ )*?[^,]+, ptr(?: addrspace\(\d+\))? (%{NAME}),")
_MEMORY_CALLS = re.compile(r"@llvm\.(memcpy|memmove|memset)\.")
_CONSTANT_GEP = re.compile(rf"^(%{NAME}) = getelementptr (?:(?:inbounds|nuw|nusw) )*(\w+), ptr(?: addrspace\(\d+\))? "
                           rf"(%{NAME}), i(?:32|64) (\d+)$")
# The lowering's own small tables (fast_exp's), whose indices are always in range.
_TABLE = re.compile(r"^(@tm\.[\w.]+) = internal unnamed_addr constant \[(\d+) x i64\] \[(.*)\], align \d+$", re.M)
_PERMUTE = "llvm.x86.avx512.vpermi2var.q.512"  # 8 of 16 64-bit entries, picked by each lane's index
_PLAIN_LOAD = re.compile(rf"^%{NAME} = load (\w+), ptr(?: addrspace\(\d+\))? (%{NAME})(?:, align \d+)?$")
# What a block computes alike more than once (reg2mem reloads a value at each use): a
# reload of a slot, an extension, an address by a variable index.
_RELOAD = re.compile(rf"^(%{NAME}) = load ([^,]+), ptr (%{NAME})(?:, align \d+)?$")
_EXTENSION = re.compile(rf"^(%{NAME}) = ([sz]ext) (i\d+) (%{NAME}) to (i\d+)$")
_VARIABLE_GEP = re.compile(rf"^(%{NAME}) = getelementptr (?:(?:inbounds|nuw|nusw) )*(\w+), (ptr(?: addrspace\(\d+\))?) "
                           rf"(%{NAME}), (i32|i64) (%{NAME})$")
_STORE_TO = re.compile(rf"^store .*, ptr (%{NAME})(?:, align \d+)?$")
# Refused before any analysis: values of vector type, and instructions vector lanes do not take.
_REFUSED = re.compile(r"<\d+ x |\b(?:atomicrmw|cmpxchg|fence|extractelement|insertelement|shufflevector|"
                      r"extractvalue|insertvalue|va_arg|landingpad|indirectbr|callbr|invoke)\b| atomic | volatile ")


def _indices(indices) -> str:
    """A shufflevector's mask of `indices`."""
    indices = list(indices)
    return f"<{len(indices)} x i32> <" + ", ".join(f"i32 {i}" for i in indices) + ">"


def refuses(line: str) -> bool:
    """Whether vector lanes refuse any region holding the line `line` (_REFUSED)."""
    return bool(_REFUSED.search(line))


def vectorize_regions(text: str, width: int = WIDTH, permutes: bool = False
                      ) -> Tuple[str, List[str], Dict[str, str]]:
    """`text` (build_regions' module) with every region that allows it run as vector lanes,
    `width` of them at a time: (the module, the regions vectorized, region -> why the others
    were not). `permutes`: the target has AVX-512's permutes of two registers (lanes read
    the lowering's tables with them)."""
    lines = text.split("\n")
    out: List[str] = []
    done, vectorized, refused = 0, [], {}
    declarations: Dict[str, str] = {}
    fields: Dict[str, Optional[int]] = {}  # the context's per-thread fields -> their guessed growth (guess_strides)
    types = dict(re.findall(rf"^(%{NAME}) = type (.*)$", text, re.M))
    tables = {name: entries.split(", ") for name, count, entries in _TABLE.findall(text)
              if permutes and width % 8 == 0 and int(count) <= 32}
    for found in ir_model.functions(lines):
        region = _REGION.match(found.header)
        if not region or not any(line.startswith("tm.loop:") for line in found.body):
            continue
        try:
            body = _Region(found.body, declarations, types, fields, width, tables).build(region.group(1))
        except NotVector as why:
            refused[region.group(2)] = str(why)
            continue
        out += lines[done:found.start + 1] + body
        done = found.end
        vectorized.append(region.group(2))
    out += lines[done:]
    declared = set(re.findall(r"^declare [^@]*@([-\w$.]+)\(", text, re.M))
    out += [line for name, line in sorted(declarations.items()) if name not in declared]
    return "\n".join(out), vectorized, refused


class _ValueNumbers:
    """The values a block computes alike, each named by the first of them: reloads of a
    reg2mem slot with no store to it between them, and extensions and addresses by a
    variable index computed from values alike (a lane's row address, which reg2mem
    recomputes for each element read)."""

    def __init__(self, slots: Set[str]):
        self.slots = slots
        self.first: Dict[Tuple[str, ...], str] = {}  # what a value computes -> its first name
        self.names: Dict[str, str] = {}  # value -> the first value computed alike
        self.stores: Dict[str, int] = {}  # slot -> the stores to it so far

    def __getitem__(self, value: str) -> str:
        return self.names.get(value, value)

    def stored(self, slot: str) -> None:
        self.stores[slot] = self.stores.get(slot, 0) + 1

    def note(self, line: str) -> bool:
        """Names the value `line` computes where it is one of those (whether it is)."""
        reload, extension, gep = _RELOAD.match(line), _EXTENSION.match(line), _VARIABLE_GEP.match(line)
        if reload and reload.group(3) in self.slots:
            name, computed = reload.group(1), ("reload", reload.group(2), reload.group(3),
                                               str(self.stores.get(reload.group(3), 0)))
        elif extension:
            name, computed = extension.group(1), extension.group(2, 3, 5) + (self[extension.group(4)],)
        elif gep:
            name, computed = gep.group(1), ("gep",) + gep.group(2, 3, 5) + (self[gep.group(4)], self[gep.group(6)])
        else:
            return False
        self.names[name] = self.first.setdefault(computed, name)
        return True


class _Region:
    """One region function's body rewritten as vector lanes."""

    def __init__(self, body: List[str], declarations: Dict[str, str], types: Dict[str, str],
                 fields: Dict[str, Optional[int]], width: int, tables: Dict[str, List[str]]):
        self.width = width  # lanes per vector
        self.tables = tables  # the lowering's tables lanes read by permutes -> their entries
        self.lookups: Dict[str, Tuple[str, str]] = {}  # pointer -> (the table, the lanes' index)
        self.blocks = ir_model.blocks(body)
        self.fields = fields
        self.declarations = declarations
        self.out: List[str] = []
        self.counter = 0
        self.uniform: Set[str] = set(types)  # locals that stay scalar (named types read as locals too)
        self.types = types
        self.hoisted: List[str] = []  # uniform lines moved before the loop over lanes
        self.scans = False  # a lane's point is not a constant: the region returns SCAN
        self.before_loop: Set[str] = set(types)  # values defined there
        self.runtime = {"%args", "%dims", "%tm.read"}  # addresses into the runtime's arrays
        self.strides: Dict[str, int] = {}  # pointer -> the bytes between its lanes' addresses, where known
        self.guesses: Dict[str, int] = {}  # value -> its likely difference between lanes (guess_strides)
        self.data: Set[str] = set()  # values computed from data (guess_strides)
        self.varying: Dict[str, str] = {}  # local -> its scalar type (the value is <width x type>)
        self.slots: Dict[str, str] = {}  # reg2mem's allocations -> their scalar type (a vector in memory)
        self.private: Set[str] = set()  # pointers into a lane's copy of another allocation
        self.deposited: Set[str] = set()  # allocations only stored to and copied from at once (_only_deposited)
        # Allocations of one scalar type (arrays of it) accessed only as that type, by element:
        # the lanes' copies interleaved, element by element, so lanes that access the same
        # element access consecutive addresses. -> the scalar type.
        self.interleaved: Dict[str, str] = {}
        self.elements: Dict[str, str] = {}  # pointers into an interleaved allocation -> its scalar type
        # (pointer, bytes) -> (its lanes' addresses frozen, lane 0's, whether they are `spacing`
        # accesses apart, spacing): an access through it may be one wide one.
        self.checked: Dict[Tuple[str, int], Tuple[str, str, str, int]] = {}
        self.copies: Dict[str, Tuple[str, str, str]] = {}  # an aggregate loaded to be stored: (type, address)
        self.sizes: Dict[str, Set[int]] = {}  # pointer -> the bytes of the accesses through it
        self.mask = ""
        self.converged = True  # the block being widened runs for every lane still running
        self.scalar_slots: Set[str] = set()  # reg2mem's allocations every lane holds alike: scalar
        # id(divergent part) -> its reg2mem values scalar in its convergent copies (agreeing_slots),
        # kept in ``<slot>.u``; those of the block being widened.
        self.agreement: Dict[int, Set[str]] = {}
        self.copied: Set[int] = set()  # id(divergent part) of those with convergent copies
        self.agreeing: Set[str] = set()
        # The block's last memory write, where it was a varying store of a number: (address,
        # bytes, its type, the vector stored), so a copy from there right after (a deposit)
        # takes the vector.
        self.last_store: Optional[Tuple[str, int, str, str]] = None
        # A deposit that the block just copied from a vector (_small_copy): (the vector, its type);
        # and after its exchange met inside the region: the slots -> (the vector, its type, the mask).
        self.last_deposit: Optional[Tuple[str, str]] = None
        self.in_registers: Dict[str, Tuple[str, str, str, str]] = {}
        # The lines writing the last deposit into its slots, held back while only its meet
        # and instructions that touch no memory follow: a fold done in registers writes
        # them on its slots' path only (_flush_deposit writes them anywhere else).
        self.held_deposit: List[str] = []
        self.held_for: Optional[str] = None  # the slots the held deposit's exchange met at
        # Loads of the block being widened that read neighbouring elements from one base
        # (_load_groups): pointer -> ((run, base, type), its element index, the run's indices);
        # and each group's wide load, once: (group, spacing) -> the members' vectors.
        self.load_groups: Dict[str, Tuple[Tuple[int, str, str], int, frozenset]] = {}
        self.group_values: Dict[Tuple[Tuple[int, str, str], int], List[str]] = {}

    # --- helpers -----------------------------------------------------------------------
    def fresh(self, tag: str = "v") -> str:
        self.counter += 1
        return f"%tm.{tag}.{self.counter}"

    def declare(self, name: str, line: str) -> None:
        self.declarations.setdefault(name, line)

    def vec(self, type_name: str, value: str) -> str:
        """`value` (of scalar `type_name`) as a vector: itself if varying, else a splat."""
        if value in self.varying:
            return value
        if value in self.copies:
            raise NotVector("an aggregate is used other than to be copied")
        name = self.fresh("s")
        self.out += [f"  {name}.i = insertelement <{self.width} x {type_name}> poison, {type_name} {value}, i64 0",
                     f"  {name} = shufflevector <{self.width} x {type_name}> {name}.i, <{self.width} x {type_name}> poison, "
                     f"<{self.width} x i32> zeroinitializer"]
        return name

    def is_varying(self, text: str) -> bool:
        names = LOCAL.findall(text)
        for name in names:
            if name in self.copies:
                raise NotVector("an aggregate is used other than to be copied")
            if name not in self.varying and name not in self.uniform and name not in self.slots:
                raise NotVector(f"{name} is used where it is not known (a value across blocks)")
        return any(n in self.varying or n in self.slots for n in names)

    def lanes_constant(self, type_name: str, scale: int = 1) -> str:
        """The typed vector <0, scale, 2 scale, ...>."""
        return f"<{self.width} x {type_name}> <" + ", ".join(f"{type_name} {i * scale}" for i in range(self.width)) + ">"

    def reduce(self, operation: str, element: str, value: str) -> str:
        name = self.fresh("r")
        function = f"llvm.vector.reduce.{operation}.v{self.width}{mangled(element)}"
        self.declare(function, f"declare {element} @{function}(<{self.width} x {element}>)")
        self.out.append(f"  {name} = call {element} @{function}(<{self.width} x {element}> {value})")
        return name

    def label(self, tag: str) -> str:
        self.counter += 1
        return f"tm.{tag}.{self.counter}"

    # --- the function ------------------------------------------------------------------
    def build(self, returns: str) -> List[str]:
        names = list(self.blocks)
        rentry, loop = self.blocks[names[0]], self.blocks["tm.loop"]
        if names[0] != "tm.rentry" or "tm.latch" not in self.blocks:
            raise NotVector("not a lane loop")
        body = [n for n in names if n not in ("tm.rentry", "tm.loop", "tm.latch", "tm.exit")]
        loop_lines = loop.instructions()
        first = re.match(rf"^\s*br label %({NAME})$", loop_lines[-1])
        if not first or "%t32 = phi" not in loop_lines[0]:
            raise NotVector("not a lane loop")
        for name in body + ["tm.rentry"]:
            for line in self.blocks[name].lines:
                refused = _REFUSED.search(line)
                if refused:
                    raise NotVector(f"{refused.group(0).strip()} in {line.strip()[:80]}")
        latch = self.blocks["tm.latch"].instructions()
        latch_end = re.search(r"(, !llvm\.loop !\d+)$", latch[-1])

        # Blocks by their number: the loop's per-thread start (its own block, as the region's
        # first block may be entered again), then the body in a weak topological order.
        graph = {"tm.vstart": [first.group(1)]}
        agreement = {line.strip() for line in AGREEMENT_PHIS}  # the lane loop's: vector lanes keep their own (_agree)
        lines_of = {"tm.vstart": [line for line in loop_lines[1:] if line.strip() not in agreement]}
        for name in body:
            graph[name] = [s for s in self.blocks[name].successors() if s in self.blocks and s != "tm.latch"]
            lines_of[name] = self.blocks[name].instructions()
        order = weak_topological_order(graph, "tm.vstart")
        if len(order) != len(graph):
            raise NotVector("a block the region does not reach")
        number = {name: i for i, name in enumerate(order)}
        every = [line for name in names for line in self.blocks[name].instructions()]
        self._classify_allocations(rentry.instructions(), every)
        self.uniform |= {"%ctx", "%args", "%dims", "%g32", "%tm.begin", "%tm.end", "%tm.points", "%tm.read"}
        allocas = {ir_model.defined_name(line) for line in rentry.instructions() if " = alloca " in line}
        facts = line_facts(order, lines_of)  # parsed once for both analyses
        varying_slots, parts = divergence(order, graph, lines_of, facts, self.slots, allocas - set(self.slots))
        # Reg2mem's values that every lane holds alike stay scalar (stored only where every
        # lane runs, only uniform values).
        self.scalar_slots = {n for n in self.slots if n not in varying_slots}
        ends = loop_ends(graph, order)
        # Only parts holding a loop get convergent copies: there its blocks run many times,
        # each under masks (even a thread's 4 reads: without a copy MLX's looped softmax took
        # 1.5x the time); elsewhere a copy costs compile time for little.
        loops = {order[head] for head in ends}
        with_copies = {name: p for name, p in parts.items() if loops & p.blocks}
        self.copied = {id(p) for p in with_copies.values()}
        agreeing = self.agreement = agreeing_slots(order, graph, lines_of, facts, self.slots, varying_slots,
                                                   allocas - set(self.slots), with_copies) if with_copies else {}
        before = {ir_model.defined_name(line) for line in rentry.instructions()[:-1]} - allocas  # uniform
        self.guesses, self.data = guess_strides(order, lines_of, self.slots, self.uniform | before, self.types,
                                                 allocas - set(self.slots), self.fields)

        out = self.out
        out.append("tm.rentry:")
        for line in rentry.instructions()[:-1]:
            alloca = re.match(rf"^\s*(%{NAME}) = alloca (.*)$", line)
            if alloca and alloca.group(1) in self.scalar_slots:
                out.append(line)
            elif alloca:
                self._widen_allocation(alloca.group(1), alloca.group(2))
                if any(alloca.group(1) in found for found in agreeing.values()):
                    out.append(f"  {alloca.group(1)}.u = alloca {self.slots[alloca.group(1)]}")
            else:
                self.uniform.add(ir_model.defined_name(line))
                out.append(line)
        self.before_loop |= self.uniform
        hoist_at = len(out)
        out += [f"  %tm.vpc = alloca <{self.width} x i32>, align 64", f"  %tm.vlive = alloca <{self.width} x i1>",
                "  %tm.vor = alloca i32", "  %tm.vand = alloca i32", "  store i32 0, ptr %tm.vor",
                "  store i32 -1, ptr %tm.vand",
                "  br label %tm.vloop", "tm.vloop:",
                "  %tm.v0 = phi i32 [ %tm.begin, %tm.rentry ], [ %tm.vnext, %tm.vlatch ]"]
        start = self.vec("i32", "%tm.v0")
        out += [f"  %t32 = add <{self.width} x i32> {start}, {self.lanes_constant('i32').split(' ', 3)[3]}"]
        self.varying["%t32"] = "i32"
        end = self.vec("i32", "%tm.end")
        out += [f"  %tm.alive = icmp ult <{self.width} x i32> %t32, {end}",
                f"  store <{self.width} x i1> %tm.alive, ptr %tm.vlive", "  br label %tm.vstart"]
        emitted: Set[int] = set()
        for name in order:
            part = parts.get(name)
            if part is None:
                self._convergent_block(name, number, parts, lines_of[name])
            elif id(part) not in emitted:
                emitted.add(id(part))
                self._divergent_part(part, order, number, ends, lines_of)
                for member in sorted(part.blocks, key=number.get) if id(part) in self.copied else ():
                    self._convergent_block(member, number, parts, lines_of[member], copy=True)
        out += ["tm.vlatch:", f"  %tm.vnext = add nuw i32 %tm.v0, {self.width}",
                "  %tm.vmore = icmp ult i32 %tm.vnext, %tm.end",
                f"  br i1 %tm.vmore, label %tm.vloop, label %tm.exit{latch_end.group(1) if latch_end else ''}",
                "tm.exit:"] + (self._agreement() if returns == "i32" else ["  ret void"])
        out[hoist_at:hoist_at] = self.hoisted
        return out

    def _convergent_block(self, name: str, number: Dict[str, int], parts, lines: List[str], copy: bool = False) -> None:
        """A block every lane that is still running runs together: under the mask of those
        lanes, its branches as branches where their condition is uniform, or where all
        those lanes agree at run time; else its lanes go on in the divergent part of its
        targets. `copy`: a divergent part's block, run so while its lanes agree (its
        values renamed ``.u``, the part's blocks entered at their copies)."""
        k = number[name]
        out = self.out
        self.agreeing = self.agreement.get(id(parts[name]), set()) if copy else set()
        if copy:
            lines = self._renamed(lines, ".u")
        tag = f"{k}u" if copy else str(k)
        out += [f"{name}{'.u' if copy else ''}:", f"  %tm.m.{tag} = load <{self.width} x i1>, ptr %tm.vlive"]
        self.mask, self.converged, self.last_store, self.in_registers = f"%tm.m.{tag}", True, None, {}
        self._load_groups(lines)
        for line in lines[:-1]:
            self._instruction(strip_metadata(line.strip()))
        self._flush_deposit()
        line = strip_metadata(lines[-1].strip())
        entries: List[Tuple[str, str]] = []  # (a block entering a part without copies, at which block)

        def edge(label: str) -> str:
            """Where the lanes going to block `label` go: the block, its convergent copy, or
            (a part without copies) a block that enters the part there."""
            if label == "tm.latch":
                return "tm.vlatch"
            if label not in parts:
                return label
            if id(parts[label]) in self.copied:
                return f"{label}.u"
            entries.append((self.label("enter"), label))
            return entries[-1][0]
        self._branch(line, number, parts, edge)
        for entry, label in entries:
            out.append(f"{entry}:")
            self._leave_agreement()
            self._enter_part(f"splat (i32 {number[label]})", parts[label].first)

    def _enter_part(self, chosen: str, first: str) -> None:
        """The running lanes go on in the divergent part named `first`, each at the block
        `chosen` (a vector of block numbers) names; the others' counters say they left."""
        running = self.fresh("to")
        self.out += [f"  {running} = select <{self.width} x i1> {self.mask}, <{self.width} x i32> {chosen}, "
                     f"<{self.width} x i32> splat (i32 {EXIT})", f"  store <{self.width} x i32> {running}, ptr %tm.vpc",
                     f"  br label %tm.part.{first}"]

    def _branch(self, line: str, number: Dict[str, int], parts, edge) -> None:
        """The terminator `line` of a convergent block, its targets through `edge`."""
        out = self.out
        branch = re.match(rf"^br label %({NAME})$", line)
        conditional = re.match(rf"^br i1 ([^,]+), label %({NAME}), label %({NAME})$", line)
        if branch:
            out.append(f"  br label %{edge(branch.group(1))}")
        elif line == "unreachable":
            out.append("  br label %tm.vlatch")
        elif conditional and not self.is_varying(conditional.group(1)):
            out.append(f"  br i1 {conditional.group(1)}, label %{edge(conditional.group(2))}, "
                       f"label %{edge(conditional.group(3))}")
        elif line.startswith("switch ") and not self.is_varying(line.split(",")[0]):
            head, _, rest = line.partition("[")
            head = re.sub(rf"label %({NAME})", lambda m: f"label %{edge(m.group(1))}", head)
            rest = re.sub(rf"label %({NAME})", lambda m: f"label %{edge(m.group(1))}", rest)
            out.append(f"  {head}[{rest}")
        else:  # a divergent branch: a branch still where the lanes agree
            targets = list(dict.fromkeys(re.findall(rf"label %({NAME})", line)))
            inside = [parts[t] for t in targets if t in parts]
            if not inside:
                raise NotVector("a divergent branch to no divergent block")
            if not any(id(part) in self.copied for part in inside):  # no copy to run while they agree
                self._leave_agreement()
                return self._enter_part(self._targets(line, number), inside[0].first)
            apart = self.label("apart")
            if conditional:  # two ways: every running lane's condition true, or none
                self._agree_on(conditional.group(1), edge(conditional.group(2)), edge(conditional.group(3)), apart)
                out.append(f"{apart}:")
                self._leave_agreement()
                return self._enter_part(self._targets(line, number), inside[0].first)
            chosen = self._targets(line, number)
            vector = f"<{self.width} x i32>"
            running = self.fresh("to")
            out.append(f"  {running} = select <{self.width} x i1> {self.mask}, {vector} {chosen}, "
                       f"{vector} splat (i32 {EXIT})")
            lead = self.reduce("umin", "i32", running)
            same, off, agreeing = self.fresh("same"), self.fresh("off"), self.fresh("same")
            lead_vector = self.vec("i32", lead)
            out += [f"  {same} = icmp eq {vector} {running}, {lead_vector}",
                    f"  {off} = xor <{self.width} x i1> {self.mask}, splat (i1 true)",
                    f"  {agreeing} = or <{self.width} x i1> {same}, {off}"]
            agree = self.reduce("and", "i1", agreeing)
            together = self.label("agree")
            out += [f"  br i1 {agree}, label %{together}, label %{apart}", f"{together}:",
                    f"  switch i32 {lead}, label %{apart} [ "
                    + " ".join(f"i32 {EXIT if t == 'tm.latch' else number[t]}, label %{edge(t)}" for t in targets)
                    + " ]", f"{apart}:"]
            self._leave_agreement()
            out += [f"  store {vector} {running}, ptr %tm.vpc",
                    f"  br label %tm.part.{inside[0].first}"]

    def _leave_agreement(self) -> None:
        """Where lanes of a convergent copy go apart: the values they held alike as scalars
        become every lane's in the vector slots the divergent blocks read."""
        for slot in sorted(self.agreeing):
            value, type_name = self.fresh("agreed"), self.slots[slot]
            self.out.append(f"  {value} = load {type_name}, ptr {slot}.u")
            self.out.append(f"  store <{self.width} x {type_name}> {self.vec(type_name, value)}, ptr {slot}")

    def _agree_on(self, condition: str, taken: str, not_taken: str, apart: str) -> None:
        """Branches to `taken` where `condition` holds for every lane of the mask, to
        `not_taken` where for none, else to `apart`."""
        held, missing = self.fresh("held"), self.fresh("held")
        self.out += [f"  {held} = and <{self.width} x i1> {condition}, {self.mask}",
                     f"  {missing} = xor <{self.width} x i1> {held}, {self.mask}"]
        some = self.reduce("or", "i1", held)
        short = self.reduce("or", "i1", missing)
        mixed = self.label("mixed")
        self.out += [f"  br i1 {short}, label %{mixed}, label %{taken}", f"{mixed}:",
                     f"  br i1 {some}, label %{apart}, label %{not_taken}"]

    def _renamed(self, lines: List[str], suffix: str) -> List[str]:
        """`lines` with the values they define renamed (a second copy of a block), the
        sizes accessed through renamed pointers kept."""
        names = {n: ir_model.renamed(n, suffix.strip(".")) for n in map(ir_model.defined_name, lines) if n}
        for old, new in names.items():
            if old in self.sizes:
                self.sizes[new] = self.sizes[old]
            if old in self.guesses:
                self.guesses[new] = self.guesses[old]
            if old in self.data:
                self.data.add(new)
        return [ir_model.substitute(line, names) for line in lines]

    def _divergent_part(self, part, order: List[str], number: Dict[str, int], ends: Dict[int, int],
                        lines_of: Dict[str, List[str]]) -> None:
        """The blocks of a divergent part in order, each for the lanes whose counter names
        it (skipped where none does); at a loop's last block back to its head while a lane
        is still in the loop; then the lanes that reached the part's join run on there."""
        out = self.out
        positions = sorted(number[n] for n in part.blocks)
        out += [f"tm.part.{part.first}:", f"  br label %tm.g.{positions[0]}"]
        self.converged, self.agreeing = False, set()
        for i, k in enumerate(positions):
            name = order[k]
            following = f"tm.g.{positions[i + 1]}" if i + 1 < len(positions) else f"tm.join.{part.first}"
            self._block(name, k, number, lines_of[name])
            checks = sorted((h for h, e in ends.items() if e == k and order[h] in part.blocks), reverse=True)
            if not checks:
                out += [f"tm.c.{k}.0:", f"  br label %{following}"]
            for j, head in enumerate(checks):
                pc, offset, inside = self.fresh("pc"), self.fresh("in"), self.fresh("in")
                out += [f"tm.c.{k}.{j}:", f"  {pc} = load <{self.width} x i32>, ptr %tm.vpc",
                        f"  {offset} = sub <{self.width} x i32> {pc}, splat (i32 {head})",
                        f"  {inside} = icmp ule <{self.width} x i32> {offset}, splat (i32 {k - head})"]
                again = self.reduce("or", "i1", inside)
                after = f"tm.c.{k}.{j + 1}" if j + 1 < len(checks) else following
                out.append(f"  br i1 {again}, label %tm.g.{head}, label %{after}")
        out += [f"tm.join.{part.first}:"]
        if part.join is None:
            out.append("  br label %tm.vlatch")
            return
        pc, live = self.fresh("pc"), self.fresh("live")
        out += [f"  {pc} = load <{self.width} x i32>, ptr %tm.vpc",
                f"  {live} = icmp eq <{self.width} x i32> {pc}, splat (i32 {number[part.join]})",
                f"  store <{self.width} x i1> {live}, ptr %tm.vlive"]
        any_live = self.reduce("or", "i1", live)
        out.append(f"  br i1 {any_live}, label %{part.join}, label %tm.vlatch")

    def _classify_allocations(self, entry: List[str], every: List[str]) -> None:
        """reg2mem's allocations (only loaded and stored, as one scalar) become vectors; the
        accesses' sizes per pointer are noted for the consecutive checks."""
        allocas = {}
        for line in entry:
            alloca = re.match(rf"^\s*(%{NAME}) = alloca ([^,]+)", line)
            if alloca:
                allocas[alloca.group(1)] = alloca.group(2).strip()
        direct = {n for n, t in allocas.items() if SCALAR.match(t)}
        for line in every:
            if " = alloca " in line:
                continue
            load = re.match(rf"^\s*%{NAME} = load ([^,]+), ptr(?: addrspace\(\d+\))? (%{NAME})(?:,|$)", line)
            store = re.match(r"^\s*store (.*)$", line)
            pointer, type_name = None, None
            if load:
                type_name, pointer = load.group(1), load.group(2)
                used = []
            elif store:
                parts = split_operands(strip_metadata(store.group(1)))
                type_name, value = typed(parts[0])
                pointer = typed(parts[1])[1] if len(parts) > 1 else None
                used = LOCAL.findall(value)
            else:
                used = LOCAL.findall(line)
            leaf = pointer and leaf_type(type_name or "")
            if leaf:  # a scalar, or an array copied whole (_copy)
                self.sizes.setdefault(pointer, set()).add(scalar_count(type_name) * scalar_bytes(leaf))
                if pointer in direct and allocas[pointer] != type_name:
                    direct.discard(pointer)
            direct -= set(used)
        self.slots = {n: allocas[n] for n in direct}
        self._sizes_of_bases(every)
        for name, type_name in allocas.items():
            leaf = leaf_type(type_name)
            if name not in self.slots and leaf and only_accessed_as(name, type_name, leaf, every):
                self.interleaved[name] = leaf
        self.deposited = {name for name in allocas if name not in self.slots and _only_deposited(name, every)}

    def _sizes_of_bases(self, every: List[str]) -> None:
        """A getelementptr's base is noted with the sizes accessed through its result, so
        its lanes' addresses are checked once where it is defined and an address a uniform
        offset from it takes that check (_offset_checks), in a loop too."""
        bases = {}
        for line in every:
            gep = " = getelementptr " in line and _GEP_BASE.match(line)
            if gep:
                bases[gep.group(1)] = gep.group(2)
        changed = True
        while changed:
            changed = False
            for result, base in bases.items():
                missing = self.sizes.get(result, set()) - self.sizes.get(base, set())
                if missing:
                    self.sizes.setdefault(base, set()).update(missing)
                    changed = True

    def _widen_allocation(self, name: str, rest: str) -> None:
        type_name = split_operands(rest)[0]
        align = re.search(r"align (\d+)", rest)
        align = int(align.group(1)) if align else 1
        if name in self.slots:
            self.out.append(f"  {name} = alloca <{self.width} x {type_name}>, align {max(align, 64)}")
            return
        if name in self.interleaved:
            leaf = self.interleaved[name]
            count = scalar_count(type_name)
            self.out += [f"  {name}.w = alloca [{count * self.width} x {leaf}], align {max(align, 64)}",
                         f"  {name} = getelementptr {leaf}, ptr {name}.w, {self.lanes_constant('i64')}"]
            self.varying[name] = "ptr"
            self.elements[name] = leaf
            self.checked[(name, scalar_bytes(leaf))] = (name, f"{name}.w", "true", 1)  # its first element
            return
        if not re.fullmatch(r"(\[\d+ x )*[^\s\[\]{}<>]+\]*", type_name):
            raise NotVector(f"an allocation of {type_name}")
        self.out += [f"  {name}.w = alloca [{self.width} x {type_name}], align {max(align, 16)}",
                     f"  {name} = getelementptr [{self.width} x {type_name}], ptr {name}.w, i64 0, "
                     f"{self.lanes_constant('i64')}"]
        self.varying[name] = "ptr"
        self.private.add(name)

    # --- blocks ------------------------------------------------------------------------
    def _block(self, name: str, k: int, number: Dict[str, int], lines: List[str]) -> None:
        """Block `name` of a divergent part, for the lanes whose counter is its number `k`."""
        out = self.out
        after = f"tm.c.{k}.0"
        out += [f"tm.g.{k}:", f"  %tm.pcin.{k} = load <{self.width} x i32>, ptr %tm.vpc",
                f"  %tm.m.{k} = icmp eq <{self.width} x i32> %tm.pcin.{k}, splat (i32 {k})"]
        self.mask, self.last_store, self.in_registers = f"%tm.m.{k}", None, {}
        here = self.reduce("or", "i1", self.mask)
        out += [f"  br i1 {here}, label %{name}, label %{after}", f"{name}:"]
        self._load_groups(lines)
        for line in lines[:-1]:
            self._instruction(strip_metadata(line.strip()))
        self._flush_deposit()
        self._terminator(strip_metadata(lines[-1].strip()), number, k, f"%tm.pcin.{k}")
        out.append(f"  br label %{after}")

    def _load_groups(self, lines: List[str]) -> None:
        """Groups the loads of a block that read elements 0, 1, ... of one type from one
        base (directly or through a getelementptr by a constant) with no write to memory
        or call between them (writes to reg2mem's slots aside): where the lanes' bases
        are `n` elements apart and the group holds elements 0 to n - 1, one wide access
        reads them all (_grouped_load), not one wide access per element."""
        self.load_groups, self.group_values = {}, {}
        offsets: Dict[str, Tuple[str, int]] = {}  # pointer -> (its base, bytes past it)
        groups: Dict[Tuple[int, str, str], Dict[int, List[str]]] = {}
        same = _ValueNumbers(set(self.slots))  # (scalar_slots are among them)
        run = 0
        for line in lines:
            line = strip_metadata(line.strip())
            if same.note(line):
                continue
            gep = _CONSTANT_GEP.match(line)
            if gep and SCALAR.match(gep.group(2)):
                offsets[gep.group(1)] = (same[gep.group(3)], int(gep.group(4)) * scalar_bytes(gep.group(2)))
                continue
            load = _PLAIN_LOAD.match(line)
            if load:
                type_name, pointer = load.groups()
                base, bytes_past = offsets.get(pointer, (same[pointer], 0))
                base, index = (base, bytes_past // scalar_bytes(type_name)) if bytes_past % scalar_bytes(type_name) == 0 \
                    else (pointer, 0)
                groups.setdefault((run, base, type_name), {}).setdefault(index, []).append(pointer)
                continue
            store = _STORE_TO.match(line)
            if store and (store.group(1) in self.slots or store.group(1) in self.scalar_slots):
                same.stored(store.group(1))
                continue
            if line.startswith("store ") or "call " in line:
                run += 1
        for key, members in groups.items():
            if len(members) > 1:
                indices = frozenset(members)
                for index, pointers in members.items():
                    for pointer in pointers:
                        self.load_groups[pointer] = (key, index, indices)

    def _grouped_load(self, type_name: str, pointer_type: str, pointer: str, align: str, loaded: str) -> bool:
        """Loads `loaded` through `pointer` from its group's one wide access (_load_groups)
        where the group covers every element between the lanes' bases (whether it did)."""
        key, index, indices = self.load_groups.get(pointer, (None, 0, frozenset()))
        size = scalar_bytes(type_name)
        checked = key and self.checked.get((key[1], size))
        if not checked or checked[3] < 2 or not indices >= set(range(checked[3])) or index >= checked[3]:
            return False
        spacing = checked[3]
        values = self.group_values.get((key, spacing))
        if values is None:
            values = self.group_values[(key, spacing)] = [self.fresh("gv") for _ in range(spacing)]
            self._wide_load(type_name, pointer_type, str(min(int(align), size)), checked, list(enumerate(values)),
                            self.fresh("gw"))
        self.out.append(f"  {loaded} = bitcast <{self.width} x {type_name}> {values[index]} to <{self.width} x {type_name}>")
        return True

    def _terminator(self, line: str, number: Dict[str, int], k: int, others: str) -> None:
        """The lanes of the mask go on at the block the terminator names for each; the
        others' counters are `others`."""
        chosen = self._targets(line, number)
        after, vector = self.fresh("pc"), f"<{self.width} x i32>"
        self.out += [f"  {after} = select <{self.width} x i1> {self.mask}, {vector} {chosen}, {vector} {others}",
                     f"  store {vector} {after}, ptr %tm.vpc"]

    def _targets(self, line: str, number: Dict[str, int]) -> str:
        """The number of the block terminator `line` goes to, per lane (a vector)."""
        def target(label: str) -> int:
            return EXIT if label == "tm.latch" else number[label]
        vector = f"<{self.width} x i32>"
        branch = re.match(rf"^br label %({NAME})$", line)
        conditional = re.match(rf"^br i1 ([^,]+), label %({NAME}), label %({NAME})$", line)
        if branch:
            chosen = f"splat (i32 {target(branch.group(1))})"
        elif conditional:
            condition = conditional.group(1)
            ids = [target(conditional.group(2)), target(conditional.group(3))]
            chosen = self.fresh("to")
            if self.is_varying(condition):
                self.out.append(f"  {chosen} = select <{self.width} x i1> {condition}, {vector} splat (i32 {ids[0]}), "
                                f"{vector} splat (i32 {ids[1]})")
            else:  # uniform: every lane takes the same edge
                self.out.append(f"  {chosen}.u = select i1 {condition}, i32 {ids[0]}, i32 {ids[1]}")
                chosen = self.vec("i32", f"{chosen}.u")
        elif line.startswith("switch "):
            head, _, rest = line.partition("[")
            kind, value = typed(head[len("switch "):].split(", label")[0])
            default = re.search(rf"label %({NAME})", head).group(1)
            value = self.vec(kind, value)
            chosen = f"splat (i32 {target(default)})"
            for case, label in re.findall(rf"{re.escape(kind)} ([^,]+), label %({NAME})", rest):
                test, picked = self.fresh("case"), self.fresh("to")
                self.out += [f"  {test} = icmp eq <{self.width} x {kind}> {value}, splat ({kind} {case})",
                             f"  {picked} = select <{self.width} x i1> {test}, {vector} splat (i32 {target(label)}), "
                             f"{vector} {chosen}"]
                chosen = picked
        elif line == "unreachable":
            chosen = f"splat (i32 {EXIT})"
        else:
            raise NotVector(f"a terminator: {line.split()[0]}")
        return chosen

    # --- instructions ------------------------------------------------------------------
    def _instruction(self, line: str) -> None:
        name = ir_model.defined_name(line)
        text = line.split(" = ", 1)[1] if name else line
        words = text.split(" ")
        code = words[0] if words[0] not in ("tail", "notail") else words[1]
        if " atomic " in f" {text} " or " volatile " in f" {text} " or code in ("atomicrmw", "cmpxchg", "fence"):
            raise NotVector(f"an atomic or volatile access ({code})")
        if code != "call":
            self.last_deposit = None  # a meet follows its deposit's copy at once
        if code == "load":
            self._flush_deposit()
            return self._load(name, text)
        if code == "store":
            self._flush_deposit()
            return self._store(text)
        if code == "call":
            return self._call(name, line, text)
        if code not in _BINARY | _CASTS | {"icmp", "fcmp", "select", "fneg", "freeze", "getelementptr"}:
            raise NotVector(f"an instruction: {code}")
        if not self.is_varying(text):
            safe = code not in _DIVISIONS or re.search(r", [1-9]\d*$", text)  # no division by zero moved
            self._uniform(name, line, bool(safe))
            if code == "getelementptr" and typed(split_operands(text.split(" ", 1)[1])[1])[1] in self.runtime:
                self.runtime.add(name)
            return None
        flags = []
        rest = text[len(code) + 1:]
        while rest.split(" ", 1)[0] in FLAGS:
            word, rest = rest.split(" ", 1)
            flags.append(word)
        head = " ".join([code] + flags)
        if code == "getelementptr":
            return self._getelementptr(name, head, rest)
        if code in _CASTS:
            operand, target = rest.rsplit(" to ", 1)
            type_name, value = typed(operand)
            self._define(name, target.strip(), f"{head} <{self.width} x {type_name}> {self.vec(type_name, value)} "
                         f"to <{self.width} x {target.strip()}>")
            return None
        if code in ("icmp", "fcmp"):
            predicate, rest = rest.split(" ", 1)
            parts = split_operands(rest)
            type_name, left = typed(parts[0])
            self._define(name, "i1", f"{head} {predicate} <{self.width} x {type_name}> {self.vec(type_name, left)}, "
                         f"{self.vec(type_name, parts[1])}")
            return None
        parts = split_operands(rest)
        if code == "select":
            _, condition = typed(parts[0])
            type_name, left = typed(parts[1])
            _, right = typed(parts[2])
            vector = f"<{self.width} x {type_name}>"
            self._define(name, type_name, f"{head} <{self.width} x i1> {self.vec('i1', condition)}, "
                         f"{vector} {self.vec(type_name, left)}, {vector} {self.vec(type_name, right)}")
            return None
        type_name, first = typed(parts[0])
        if not SCALAR.match(type_name):
            raise NotVector(f"a value of type {type_name}")
        vector = f"<{self.width} x {type_name}>"
        if code in ("fneg", "freeze"):
            self._define(name, type_name, f"{head} {vector} {self.vec(type_name, first)}")
            return None
        if code in ("udiv", "urem") and first == "%t32" and not self.is_varying(parts[1]):
            return self._thread_divided(name, code, parts[1])
        second = self.vec(type_name, parts[1])
        if code in _DIVISIONS:  # lanes masked off divide by one
            safe = self.fresh("div")
            self.out.append(f"  {safe} = select <{self.width} x i1> {self.mask}, {vector} {second}, "
                            f"{vector} splat ({type_name} 1)")
            second = safe
        self._define(name, type_name, f"{head} {vector} {self.vec(type_name, first)}, {second}")
        return None

    def _thread_divided(self, name: str, code: str, divisor: str) -> None:
        """The lanes' thread indices (the first lane's plus 0, 1, ...) divided by a uniform
        `divisor` (a thread's position from its index): the first lane's quotient and
        remainder once, the lanes after it passing the divisor at most once where it is
        at least self.width, else a division per lane. (A divisor of 0, which the kernel may not
        divide by, gives some value without trapping.)"""
        d, q0, r0, wide, room = (self.fresh(tag) for tag in ("dd", "dq", "dr", "dw", "dm"))
        fast, slow, joined = self.label("fewwraps"), self.label("perlane"), self.label("divided")
        vector, lanes = f"<{self.width} x i32>", self.lanes_constant("i32").split(" ", 3)[3]
        zero = self.fresh("dz")
        self.out += [f"  {zero} = icmp eq i32 {divisor}, 0", f"  {d} = select i1 {zero}, i32 1, i32 {divisor}",
                     f"  {q0} = udiv i32 %tm.v0, {d}", f"  {r0} = urem i32 %tm.v0, {d}",
                     f"  {wide} = icmp uge i32 {d}, {self.width}", f"  br i1 {wide}, label %{fast}, label %{slow}",
                     f"{fast}:", f"  {room} = sub i32 {d}, {r0}"]
        wraps, rooms = self.fresh("dx"), self.vec("i32", room)  # lane i passes the divisor where i >= d - r0
        self.out.append(f"  {wraps} = icmp uge {vector} {lanes}, {rooms}")
        if code == "urem":
            after, before, first = self.fresh("da"), self.fresh("db"), self.vec("i32", r0)
            self.out += [f"  {after} = sub {vector} {lanes}, {rooms}", f"  {before} = add {vector} {first}, {lanes}",
                         f"  {name}.f = select <{self.width} x i1> {wraps}, {vector} {after}, {vector} {before}"]
        else:
            step, first = self.fresh("ds"), self.vec("i32", q0)
            self.out += [f"  {step} = zext <{self.width} x i1> {wraps} to {vector}",
                         f"  {name}.f = add {vector} {first}, {step}"]
        self.out += [f"  br label %{joined}", f"{slow}:"]
        divisors = self.vec("i32", d)
        self.out += [f"  {name}.s = {code} {vector} %t32, {divisors}", f"  br label %{joined}", f"{joined}:",
                     f"  {name} = phi {vector} [ {name}.f, %{fast} ], [ {name}.s, %{slow} ]"]
        self.varying[name] = "i32"

    def _uniform(self, name: str, line: str, movable: bool) -> None:
        """A uniform value, computed once before the loop over lanes where its operands are
        there already and `movable` (it may run where the kernel would not: no load but
        from the runtime's arrays, no division by a variable)."""
        self.uniform.add(name)
        if movable and all(n in self.before_loop for n in LOCAL.findall(line) if n != name):
            self.hoisted.append(f"  {line.strip()}")
            self.before_loop.add(name)
        else:
            self.out.append(f"  {line.strip()}")

    def _define(self, name: str, type_name: str, text: str) -> None:
        if not SCALAR.match(type_name):
            raise NotVector(f"a value of type {type_name}")
        self.out.append(f"  {name} = {text}")
        self.varying[name] = type_name
        if type_name.startswith("ptr"):
            self._check_consecutive(name, type_name)

    def _getelementptr(self, name: str, head: str, rest: str) -> None:
        parts = split_operands(rest)
        source = parts[0]
        pointer_type, base = typed(parts[1])
        if base in self.elements:
            return self._element_address(name, source, base, parts[2:])
        if base in self.tables and (source, len(parts)) in (("i64", 3), (f"[{len(self.tables[base])} x i64]", 4)):
            index_type, index = typed(parts[-1])  # (after the array's "i64 0")
            if index_type == "i64" and self.is_varying(index) and parts[2:-1] in ([], ["i64 0"]):
                self.lookups[name] = (base, index)
        if base in self.varying:
            operands = [f"<{self.width} x {pointer_type}> {base}"]
        else:
            operands = [f"{pointer_type} {base}"]
        for part in parts[2:]:
            type_name, value = typed(part)
            operands.append(f"<{self.width} x {type_name}> {value}" if value in self.varying else part)
        if base in self.private:
            self.private.add(name)
        if base in self.strides and not any(self.is_varying(p) for p in parts[2:]):
            self.strides[name] = self.strides[base]  # a uniform offset from each lane's address
        if base in self.varying and not any(self.is_varying(p) for p in parts[2:]):
            self._offset_checks(name, source, pointer_type, base, parts[2:])
        # An element of a uniform array indexed by the thread (the context's, the points):
        # the lanes' addresses are consecutive where the element is as large as the access.
        last = typed(parts[-1])
        if last[1] == "%t32" and len(parts) > 2 and not any(self.is_varying(p) for p in parts[1:-1]):
            stride = type_size(indexed_type(source, [typed(p)[1] for p in parts[3:]], self.types), self.types)
            if stride is not None:
                self.strides[name] = stride
            spaced = [size for size in self.sizes.get(name, ()) if stride and stride % size == 0
                      and stride // size in SPACINGS]
            if spaced:
                first = self.fresh("p0")
                indices = ", ".join(parts[2:-1] + [f"{last[0]} %tm.v0"])
                self.out.append(f"  {first} = {head} {source}, {pointer_type} {base}, {indices}")
                for size in spaced:
                    self.checked[(name, size)] = (name, first, "true", stride // size)
        self._define(name, pointer_type, f"{head} {source}, {', '.join(operands)}")

    def _offset_checks(self, name: str, source: str, pointer_type: str, base: str, indices: List[str]) -> None:
        """Pointer `name`, `base` moved by the same offset in every lane, is as far apart
        between lanes as `base`: its accesses of a size checked for `base` take that check
        (no second one), from lane 0's address moved alike."""
        for size in self.sizes.get(name, ()):
            checked = self.checked.get((base, size))
            if checked is None or (name, size) in self.checked:
                continue
            frozen, first, ok, spacing = checked
            moved, lanes = self.fresh("p0"), self.fresh("pf")
            offsets = ", ".join(indices)
            self.out += [f"  {moved} = getelementptr {source}, {pointer_type} {first}, {offsets}",
                         f"  {lanes} = getelementptr {source}, <{self.width} x {pointer_type}> {frozen}, "
                         f"{offsets}"]
            self.checked[(name, size)] = (lanes, moved, ok, spacing)

    def _element_address(self, name: str, source: str, base: str, indices: List[str]) -> None:
        """An address into an interleaved allocation: the element's index times self.width past
        the lane's first element."""
        terms = []
        for depth, part in enumerate(indices):
            type_name, value = typed(part)
            stride = scalar_count(indexed(source, depth)) * self.width
            wide, scaled = self.fresh("ix"), self.fresh("ix")
            extend = "sext" if type_name != "i64" else "bitcast"
            if value in self.varying:
                self.out += [f"  {wide} = {extend} <{self.width} x {type_name}> {value} to <{self.width} x i64>",
                             f"  {scaled} = mul <{self.width} x i64> {wide}, splat (i64 {stride})"]
                self.varying[scaled] = "i64"
            else:
                self.out += [f"  {wide} = {extend} {type_name} {value} to i64", f"  {scaled} = mul i64 {wide}, {stride}"]
                self.uniform.add(scaled)
            terms.append(scaled)
        varying = any(t in self.varying for t in terms)
        total = terms[0]
        for term in terms[1:]:
            added = self.fresh("ix")
            if varying:
                self.out.append(f"  {added} = add <{self.width} x i64> {self.vec('i64', total)}, {self.vec('i64', term)}")
                self.varying[added] = "i64"
            else:
                self.out.append(f"  {added} = add i64 {total}, {term}")
            total = added
        offset = f"<{self.width} x i64> {self.vec('i64', total)}" if varying else f"i64 {total}"
        leaf = self.elements[name] = self.elements[base]
        size = scalar_bytes(leaf)
        # One element of every lane's copy (a uniform offset from lanes' consecutive
        # addresses): consecutive by the layout, no check at run time.
        consecutive = not varying and (base in self.interleaved or self.checked.get((base, size), ())[2:] == ("true", 1))
        if consecutive:
            first = self.fresh("p0")
            self.checked[(name, size)] = (name, first, "true", 1)
        self._define(name, "ptr", f"getelementptr {leaf}, <{self.width} x ptr> {base}, {offset}")
        if consecutive:
            self.out.append(f"  {first} = extractelement <{self.width} x ptr> {name}, i64 0")

    def _check_consecutive(self, name: str, pointer_type: str) -> None:
        """For each size accessed through pointer `name`: whether its lanes' addresses are
        consecutive, or as far apart as the stride guessed for it (guess_strides), computed
        once where it is defined."""
        if name in self.private or name in self.data:
            return
        for size in sorted(self.sizes.get(name, ())):
            if (name, size) in self.checked or self.strides.get(name, size) != size:
                continue  # known consecutive, or known not to be (_getelementptr)
            stride = self.guesses.get(name) or size
            spacing = stride // size
            if stride % size or spacing not in SPACINGS:
                continue
            # Every lane of the mask at its place from its first lane k, lane 0's address
            # being k's less k strides (the others' may be anything: a lane masked off
            # touches no memory; k is 0 where every lane runs).
            frozen, first, ok = self.fresh("pf"), self.fresh("p0"), self.fresh("ok")
            bits, lead, at_lead, back = self.fresh("pb"), self.fresh("pk"), self.fresh("pa"), self.fresh("pn")
            expected, equal, fine = self.fresh("pe"), self.fresh("eq"), self.fresh("pm")
            vector = f"<{self.width} x {pointer_type}>"
            self.out += [f"  {frozen} = freeze {vector} {name}",
                         f"  {bits} = bitcast <{self.width} x i1> {self.mask} to i{self.width}",
                         f"  {lead}.z = call i{self.width} @llvm.cttz.i{self.width}(i{self.width} {bits}, i1 false)",
                         f"  {lead} = and i{self.width} {lead}.z, {self.width - 1}",  # no lane: lane 0
                         f"  {at_lead} = extractelement {vector} {frozen}, i{self.width} {lead}",
                         f"  {back} = mul i{self.width} {lead}, {-stride}",
                         f"  {first} = getelementptr i8, {pointer_type} {at_lead}, i{self.width} {back}",
                         f"  {expected} = getelementptr i8, {pointer_type} {first}, "
                         f"{self.lanes_constant('i64', stride)}",
                         f"  {equal} = icmp eq {vector} {frozen}, {expected}",
                         f"  {fine} = select <{self.width} x i1> {self.mask}, <{self.width} x i1> {equal}, "
                         f"<{self.width} x i1> splat (i1 true)"]
            self.declare(f"llvm.cttz.i{self.width}", f"declare i{self.width} @llvm.cttz.i{self.width}(i{self.width}, i1)")
            all_equal = self.reduce("and", "i1", fine)
            self.out.append(f"  {ok} = freeze i1 {all_equal}")
            self.checked[(name, size)] = (frozen, first, ok, spacing)

    # --- memory ------------------------------------------------------------------------
    def _load(self, name: str, text: str) -> None:
        parts = split_operands(text[len("load "):])
        type_name = parts[0]
        pointer_type, pointer = typed(parts[1])
        align = next((p for p in parts[2:] if p.startswith("align ")), "align 1").split()[1]
        if pointer in self.scalar_slots:
            self.uniform.add(name)
            self.out.append(f"  {name} = {text}")
            return
        if pointer in self.agreeing:
            self.uniform.add(name)
            self.out.append(f"  {name} = load {type_name}, ptr {pointer}.u")
            return
        if pointer in self.slots:
            self.out.append(f"  {name} = load <{self.width} x {type_name}>, ptr {pointer}")
            self.varying[name] = type_name
            if type_name.startswith("ptr"):  # an address reloaded in a loop: checked once (LLVM hoists it out)
                self._check_consecutive(name, type_name)
            return
        if not SCALAR.match(type_name):
            self.copies[name] = (type_name, pointer_type, pointer)
            return
        if not self.is_varying(pointer):
            self._uniform(name, f"{name} = {text}", pointer in self.runtime)
            return
        if pointer in self.lookups and type_name == "i64":
            self._table_lookup(name, *self.lookups[pointer])
            self.varying[name] = type_name
            return
        own = self._own_element(pointer, type_name)
        if own:  # every lane's copy of one element of its private array: no mask needed to read it
            self.out.append(f"  {name} = load <{self.width} x {type_name}>, ptr {own}")
        elif not self._grouped_load(type_name, pointer_type, pointer, align, name):
            self._masked_access(type_name, pointer_type, pointer, align, loaded=name)
        self.varying[name] = type_name
        if type_name.startswith("ptr"):  # an address from a private array
            self._check_consecutive(name, type_name)

    def _table_lookup(self, name: str, table: str, index: str) -> None:
        """`name` = `table`[`index`] for every lane, 8 lanes at a time, by two permutes of
        the table's 32 entries in 4 registers and a select on the index's bit 4: no memory
        access, so no mask."""
        self.declare(_PERMUTE, f"declare <8 x i64> @{_PERMUTE}(<8 x i64>, <8 x i64>, <8 x i64>)")
        entries = self.tables[table] + ["i64 0"] * (32 - len(self.tables[table]))
        quarters = ["<8 x i64> <" + ", ".join(entries[q * 8:q * 8 + 8]) + ">" for q in range(4)]
        frozen = self.fresh("ix")
        self.out.append(f"  {frozen} = freeze <{self.width} x i64> {index}")  # masked-off lanes' may be poison
        parts = []
        for start in range(0, self.width, 8):
            chunk, low, high, bit, upper = (self.fresh(tag) for tag in ("ixc", "lo", "hi", "b4", "up"))
            parts.append(name if self.width == 8 else self.fresh("tv"))
            self.out += [f"  {chunk} = shufflevector <{self.width} x i64> {frozen}, <{self.width} x i64> poison, "
                         f"{_indices(range(start, start + 8))}",
                         f"  {low} = call <8 x i64> @{_PERMUTE}({quarters[0]}, <8 x i64> {chunk}, {quarters[1]})",
                         f"  {high} = call <8 x i64> @{_PERMUTE}({quarters[2]}, <8 x i64> {chunk}, {quarters[3]})",
                         f"  {bit} = and <8 x i64> {chunk}, <" + ", ".join(["i64 16"] * 8) + ">",
                         f"  {upper} = icmp ne <8 x i64> {bit}, zeroinitializer",
                         f"  {parts[-1]} = select <8 x i1> {upper}, <8 x i64> {high}, <8 x i64> {low}"]
        size = 8
        while len(parts) > 1:  # joined in pairs into one vector of the width
            joined = [name if len(parts) == 2 else self.fresh("tj") for _ in parts[::2]]
            self.out += [f"  {whole} = shufflevector <{size} x i64> {left}, <{size} x i64> {right}, "
                         f"{_indices(range(2 * size))}" for whole, left, right in zip(joined, parts[::2], parts[1::2])]
            parts, size = joined, 2 * size

    def _store(self, text: str) -> None:
        self.last_store = None
        parts = split_operands(text[len("store "):])
        type_name, value = typed(parts[0])
        pointer_type, pointer = typed(parts[1])
        align = next((p for p in parts[2:] if p.startswith("align ")), "align 1").split()[1]
        if value in self.copies:
            return self._copy(value, type_name, pointer_type, pointer)
        vector = f"<{self.width} x {type_name}>"
        if pointer in self.agreeing:
            if self.is_varying(value):
                raise NotVector(f"a varying value stored to {pointer} where lanes agree")  # agreeing_slots prevents it
            self.out.append(f"  store {type_name} {value}, ptr {pointer}.u")
            return None
        if pointer in self.scalar_slots:
            if self.is_varying(value):
                raise NotVector(f"a varying value stored to uniform {pointer}")  # divergence prevents it
            self.out.append(f"  {text}")
            return None
        if pointer in self.slots and self.converged:  # the lanes masked off have finished
            self.out.append(f"  store {vector} {self.vec(type_name, value)}, ptr {pointer}")
            return None
        if pointer in self.slots:
            old, new = self.fresh("old"), self.fresh("new")
            self.out += [f"  {old} = load {vector}, ptr {pointer}",
                         f"  {new} = select <{self.width} x i1> {self.mask}, {vector} {self.vec(type_name, value)}, "
                         f"{vector} {old}",
                         f"  store {vector} {new}, ptr {pointer}"]
            return None
        if not SCALAR.match(type_name):
            raise NotVector(f"a store of {type_name}")
        if not self.is_varying(text):  # every lane stores the same value at the same place
            self.out.append(f"  {text}")
            return None
        if pointer == "%tm.pt":
            self._agree(value)
        if pointer in self.deposited:  # read only by the copy right after, from this vector
            self.last_store = (pointer, scalar_bytes(type_name), type_name, self.vec(type_name, value))
            return None
        own = self._own_element(pointer, type_name)
        if own:
            self._masked_private_store(f"<{self.width} x {type_name}>", self.vec(type_name, value), own)
        else:
            data = self.vec(type_name, value)
            self._masked_access(type_name, pointer_type, pointer, align, data=data)
            if not type_name.startswith("ptr"):
                self.last_store = (pointer, scalar_bytes(type_name), type_name, data)
        return None

    def _agree(self, point: str) -> None:
        """The lanes of the mask stop at `point` (a constant): into the OR and AND of the
        points the region's lanes stopped at (regions.py, AGREEMENT_PHIS)."""
        if not re.fullmatch(r"-?\d+", point):
            self.scans = True
            return
        some = self.reduce("or", "i1", self.mask)
        for name, op in (("%tm.vor", "or"), ("%tm.vand", "and")):
            old, new, kept = self.fresh("ag"), self.fresh("ag"), self.fresh("ag")
            self.out += [f"  {old} = load i32, ptr {name}", f"  {new} = {op} i32 {old}, {point}",
                         f"  {kept} = select i1 {some}, i32 {new}, i32 {old}", f"  store i32 {kept}, ptr {name}"]

    def _agreement(self) -> List[str]:
        """The region's return: the point every lane stopped at, else SCAN."""
        if self.scans:
            return [f"  ret i32 {SCAN}"]
        return ["  %tm.or.all = load i32, ptr %tm.vor", "  %tm.and.all = load i32, ptr %tm.vand",
                "  %tm.same = icmp eq i32 %tm.or.all, %tm.and.all",
                f"  %tm.agreed = select i1 %tm.same, i32 %tm.or.all, i32 {SCAN}", "  ret i32 %tm.agreed"]

    def _own_element(self, pointer: str, type_name: str) -> Optional[str]:
        """Where `pointer` addresses one element of every lane's copy of an interleaved
        private array (consecutive by the layout): the vector's address, accessed as a whole
        (masked-off lanes' copies are theirs alone), so LLVM keeps it in registers; else None."""
        checked = self.checked.get((pointer, scalar_bytes(type_name)))
        if pointer in self.elements and checked and checked[2:] == ("true", 1):
            return checked[1]
        return None

    def _masked_access(self, type_name: str, pointer_type: str, pointer: str, align: str,
                       loaded: Optional[str] = None, data: Optional[str] = None) -> None:
        """The lanes of the mask load `loaded` (its name) or store vector `data` through
        varying `pointer`: one masked access where its lanes' addresses are consecutive, a
        wide one (its elements `spacing` apart) where they are evenly spaced (self.checked;
        where that was checked at run time, else the next), else a masked gather or scatter."""
        vector, pointers = f"<{self.width} x {type_name}>", f"<{self.width} x {pointer_type}>"
        element, space = mangled(type_name), mangled(pointer_type)
        lanes = f"<{self.width} x i1> {self.mask}"
        if loaded is not None:
            apart_call = f"llvm.masked.gather.v{self.width}{element}.v{self.width}{space}"
            self.declare(apart_call, f"declare {vector} @{apart_call}({pointers}, i32, <{self.width} x i1>, {vector})")
        else:
            apart_call = f"llvm.masked.scatter.v{self.width}{element}.v{self.width}{space}"
            self.declare(apart_call, f"declare void @{apart_call}({vector}, {pointers}, i32, <{self.width} x i1>)")

        def apart(addresses: str, result: str) -> str:
            if loaded is not None:
                return (f"  {result} = call {vector} @{apart_call}({pointers} {addresses}, i32 {align}, {lanes}, "
                        f"{vector} zeroinitializer)")
            return f"  call void @{apart_call}({vector} {data}, {pointers} {addresses}, i32 {align}, {lanes})"
        checked = self.checked.get((pointer, scalar_bytes(type_name)))
        if checked is None:  # (a store's address may be uniform: every lane's value there, in lane order)
            self.out.append(apart(self.vec(pointer_type, pointer), loaded))
            return
        if loaded is not None:
            return self._wide_load(type_name, pointer_type, align, checked, [(0, loaded)], f"{loaded}.w")
        frozen, first, ok, spacing = checked
        total = self.width * spacing
        wide = f"<{total} x {type_name}>"
        whole = f"llvm.masked.store.v{total}{element}.{space}"
        labels = [] if ok == "true" else [self.label("whole"), self.label("apart"), self.label("joined")]
        if labels:
            self.out += [f"  br i1 {ok}, label %{labels[0]}, label %{labels[1]}", f"{labels[0]}:"]
        self.declare(whole, f"declare void @{whole}({wide}, {pointer_type}, i32, <{total} x i1>)")
        self._prefetch(pointer_type, first, total * scalar_bytes(type_name), write=True)
        spread = data
        if spacing > 1:  # each lane's element at its place in a wide store, the others masked off
            spread = self.fresh("sp")
            self.out.append(f"  {spread} = shufflevector {vector} {data}, {vector} poison, <{total} x i32> <"
                            + ", ".join(f"i32 {i // spacing}" if i % spacing == 0 else "i32 poison"
                                        for i in range(total)) + ">")
        self.out.append(f"  call void @{whole}({wide} {spread}, {pointer_type} {first}, i32 {align}, "
                        f"<{total} x i1> {self._spread_mask(spacing, [0])})")
        if labels:
            self.out += [f"  br label %{labels[2]}", f"{labels[1]}:", apart(frozen, None),
                         f"  br label %{labels[2]}", f"{labels[2]}:"]

    def _wide_load(self, type_name: str, pointer_type: str, align: str, checked: Tuple[str, str, str, int],
                   elements: List[Tuple[int, str]], wide_name: str) -> None:
        """Loads `elements` ((index, name) of each: the lanes' element `index` past their
        addresses, `checked` `spacing` elements apart) with one masked load of every lane's
        elements (`wide_name`) and a shuffle per element, where the check holds (or is
        known, "true"); else a masked gather per element."""
        frozen, first, ok, spacing = checked
        vector, pointers = f"<{self.width} x {type_name}>", f"<{self.width} x {pointer_type}>"
        total, element, space = self.width * spacing, mangled(type_name), mangled(pointer_type)
        wide = f"<{total} x {type_name}>"
        whole = f"llvm.masked.load.v{total}{element}.{space}"
        self.declare(whole, f"declare {wide} @{whole}({pointer_type}, i32, <{total} x i1>, {wide})")
        known = ok == "true"
        labels = [] if known else [self.label("whole"), self.label("apart"), self.label("joined")]
        if labels:
            self.out += [f"  br i1 {ok}, label %{labels[0]}, label %{labels[1]}", f"{labels[0]}:"]
        self._prefetch(pointer_type, first, total * scalar_bytes(type_name))
        together = [(index, name if known else f"{name}.c") for index, name in elements]
        mask = self._spread_mask(spacing, [index for index, _ in elements])
        if spacing == 1:
            self.out.append(f"  {together[0][1]} = call {vector} @{whole}({pointer_type} {first}, i32 {align}, "
                            f"<{self.width} x i1> {mask}, {vector} zeroinitializer)")
        else:  # every lane's elements of a wide load
            self.out.append(f"  {wide_name} = call {wide} @{whole}({pointer_type} {first}, i32 {align}, "
                            f"<{total} x i1> {mask}, {wide} zeroinitializer)")
            self.out += [f"  {name} = shufflevector {wide} {wide_name}, {wide} poison, <{self.width} x i32> <"
                         + ", ".join(f"i32 {lane * spacing + index}" for lane in range(self.width)) + ">"
                         for index, name in together]
        if not labels:
            return
        gather = f"llvm.masked.gather.v{self.width}{element}.v{self.width}{space}"
        self.declare(gather, f"declare {vector} @{gather}({pointers}, i32, <{self.width} x i1>, {vector})")
        self.out += [f"  br label %{labels[2]}", f"{labels[1]}:"]
        for index, name in elements:
            addresses = frozen
            if index:
                addresses = f"{name}.p"
                self.out.append(f"  {addresses} = getelementptr {type_name}, {pointers} {frozen}, i64 {index}")
            self.out.append(f"  {name}.g = call {vector} @{gather}({pointers} {addresses}, i32 {align}, "
                            f"<{self.width} x i1> {self.mask}, {vector} zeroinitializer)")
        self.out += [f"  br label %{labels[2]}", f"{labels[2]}:"]
        self.out += [f"  {name} = phi {vector} [ {name}.c, %{labels[0]} ], [ {name}.g, %{labels[1]} ]"
                     for _, name in elements]

    def _prefetch(self, pointer_type: str, first: str, span: int, write: bool = False) -> None:
        """Asks for the lines the lanes PREFETCH_LANES threads on will read (or `write`),
        where these lanes access `span` bytes of device memory from `first` (their
        addresses, checked consecutive or evenly spaced, grow with the thread)."""
        if pointer_type != "ptr addrspace(1)" or not PREFETCH_LANES:
            return
        call = f"llvm.prefetch.{mangled(pointer_type)}"
        self.declare(call, f"declare void @{call}({pointer_type}, i32, i32, i32)")
        ahead = span * PREFETCH_LANES // self.width
        for line in range(0, span, 64):
            at = self.fresh("pre")
            self.out += [f"  {at} = getelementptr i8, {pointer_type} {first}, i64 {ahead + line}",
                         f"  call void @{call}({pointer_type} {at}, i32 {int(write)}, i32 3, i32 1)"]

    def _copy(self, value: str, type_name: str, target_type: str, target: str) -> None:
        """An aggregate loaded only to be stored: copied element by element; between a
        lanes' array in the context and an interleaved one, where the lanes' arrays lie one
        after another (checked at run time), as one wide access and a shuffle per element."""
        source_type_name, source_type, source = self.copies.pop(value)
        if source_type_name != type_name:
            raise NotVector("an aggregate copy changes type")
        leaf, count = leaf_type(type_name), scalar_count(type_name)
        wide = None
        if leaf and source in self.interleaved:
            wide = self.checked.get((target, count * scalar_bytes(leaf)))
        elif leaf and target in self.interleaved:
            wide = self.checked.get((source, count * scalar_bytes(leaf)))
        joined = None
        if wide is not None and wide[3] == 1:
            apart, joined = self.label("apart"), self.label("joined")
            together = self.label("whole")
            self.out += [f"  br i1 {wide[2]}, label %{together}, label %{apart}", f"{together}:"]
            self._copy_interleaved(leaf, count, source, target, wide[1])
            self.out += [f"  br label %{joined}", f"{apart}:"]
        self._copy_elements(type_name, source_type, source, target_type, target)
        if joined:
            self.out += [f"  br label %{joined}", f"{joined}:"]

    def _copy_interleaved(self, leaf: str, count: int, source: str, target: str, first: str) -> None:
        """Copies arrays of `count` `leaf`s between the lanes' consecutive arrays from
        `first` on and interleaved allocation `source` or `target`: the consecutive arrays
        are read or written in chunks of `width` elements, each with its own lanes' mask
        (one access of `width * count` elements under one mask is lowered bit by bit where
        `count` is not a power of two: hundreds of mask instructions at 32 lanes)."""
        vector, total = f"<{self.width} x {leaf}>", self.width * count
        wide = f"<{total} x {leaf}>"
        masks, places = [], []
        for chunk in range(count):  # each chunk's elements' lanes
            mask, place = self.fresh("wm"), self.fresh("wp")
            self.out += [f"  {mask} = shufflevector <{self.width} x i1> {self.mask}, <{self.width} x i1> poison, "
                         f"<{self.width} x i32> <" + ", ".join(f"i32 {(chunk * self.width + i) // count}"
                                                             for i in range(self.width)) + ">",
                         f"  {place} = getelementptr {leaf}, ptr {first}, i64 {chunk * self.width}"]
            masks.append(mask)
            places.append(place)
        if target in self.interleaved:
            load = f"llvm.masked.load.v{self.width}{mangled(leaf)}.p0"
            self.declare(load, f"declare {vector} @{load}(ptr, i32, <{self.width} x i1>, {vector})")
            chunks = []
            for mask, place in zip(masks, places):
                chunks.append(self.fresh("wl"))
                self.out.append(f"  {chunks[-1]} = call {vector} @{load}(ptr {place}, i32 1, <{self.width} x i1> {mask}, "
                                f"{vector} zeroinitializer)")
            size, loaded = self._concatenated(leaf, [(self.width, chunk) for chunk in chunks])
            for e in range(count):
                element, at = self.fresh("we"), self.fresh("wa")
                self.out += [f"  {element} = shufflevector <{size} x {leaf}> {loaded}, <{size} x {leaf}> poison, "
                             f"<{self.width} x i32> <" + ", ".join(f"i32 {lane * count + e}" for lane in range(self.width)) + ">",
                             f"  {at} = getelementptr {leaf}, ptr {target}.w, i64 {e * self.width}"]
                self.varying[element] = leaf
                self._masked_private_store(vector, element, at)
            return
        parts = []
        for e in range(count):
            element, at = self.fresh("we"), self.fresh("wa")
            self.out += [f"  {at} = getelementptr {leaf}, ptr {source}.w, i64 {e * self.width}",
                         f"  {element} = load {vector}, ptr {at}"]
            parts.append((self.width, element))
        size, concatenated = self._concatenated(leaf, parts)
        interleaved = self.fresh("wi")
        self.out.append(f"  {interleaved} = shufflevector <{size} x {leaf}> {concatenated}, <{size} x {leaf}> poison, "
                        f"<{total} x i32> <" + ", ".join(f"i32 {(i % count) * self.width + i // count}"
                                                         for i in range(total)) + ">")
        store = f"llvm.masked.store.v{self.width}{mangled(leaf)}.p0"
        self.declare(store, f"declare void @{store}({vector}, ptr, i32, <{self.width} x i1>)")
        for chunk, (mask, place) in enumerate(zip(masks, places)):
            part = self.fresh("ws")
            self.out += [f"  {part} = shufflevector {wide} {interleaved}, {wide} poison, <{self.width} x i32> <"
                         + ", ".join(f"i32 {chunk * self.width + i}" for i in range(self.width)) + ">",
                         f"  call void @{store}({vector} {part}, ptr {place}, i32 1, <{self.width} x i1> {mask})"]

    def _concatenated(self, leaf: str, parts: List[Tuple[int, str]]) -> Tuple[int, str]:
        """(size, name) of `parts`' (size, name) vectors joined pairwise, padded with poison
        to a power of two."""
        while len(parts) > 1:
            if len(parts) % 2:
                parts.append((parts[-1][0], "poison"))
            joined = []
            for (size, a), (_, b) in zip(parts[::2], parts[1::2]):
                name = self.fresh("wc")
                self.out.append(f"  {name} = shufflevector <{size} x {leaf}> {a}, <{size} x {leaf}> {b}, "
                                f"<{2 * size} x i32> <" + ", ".join(f"i32 {i}" for i in range(2 * size)) + ">")
                joined.append((2 * size, name))
            parts = joined
        return parts[0]

    def _spread_mask(self, spacing: int, indices: List[int]) -> str:
        """The mask of a wide access to `spacing` elements of each lane: each lane's bit at
        its elements `indices` (the positions between off)."""
        if spacing == 1:
            return self.mask
        spread = self.fresh("sm")
        self.out.append(f"  {spread} = shufflevector <{self.width} x i1> {self.mask}, <{self.width} x i1> zeroinitializer, "
                        f"<{self.width * spacing} x i32> <" + ", ".join(
                            f"i32 {i // spacing}" if i % spacing in indices else f"i32 {self.width}"
                            for i in range(self.width * spacing)) + ">")
        return spread

    def _masked_private_store(self, vector: str, value: str, at: str) -> None:
        """Stores `value` at `at` in a lane's private memory for the lanes of the mask."""
        if self.converged:
            self.out.append(f"  store {vector} {value}, ptr {at}")
            return
        old, new = self.fresh("old"), self.fresh("new")
        self.out += [f"  {old} = load {vector}, ptr {at}",
                     f"  {new} = select <{self.width} x i1> {self.mask}, {vector} {value}, {vector} {old}",
                     f"  store {vector} {new}, ptr {at}"]

    def _copy_elements(self, type_name: str, source_type: str, source: str, target_type: str, target: str) -> None:
        for indices, element in array_elements(type_name):
            path = ", ".join(f"i32 {i}" for i in (0,) + indices)
            at, to, loaded = self.fresh("ea"), self.fresh("et"), self.fresh("ev")
            self._instruction(f"{at} = getelementptr inbounds {type_name}, {source_type} {source}, {path}")
            self._instruction(f"{loaded} = load {element}, {source_type} {at}, align 1")
            self._instruction(f"{to} = getelementptr inbounds {type_name}, {target_type} {target}, {path}")
            self._instruction(f"store {element} {loaded}, {target_type} {to}, align 1")

    # --- calls -------------------------------------------------------------------------
    def _call(self, name: Optional[str], line: str, text: str) -> None:
        stored, self.last_store = self.last_store, None
        deposit, self.last_deposit = self.last_deposit, None
        function = ir_model.callee(line)
        if function is None:
            raise NotVector("a call through a pointer")
        function = function.strip('"')
        head, _, rest = text.partition(f"@{function}(")
        arguments_text = rest[:rest.rindex(")")]
        arguments = [typed(a) for a in split_operands(arguments_text)] if arguments_text.strip() else []
        return_type = head.split()[-1]
        intrinsic = re.match(r"llvm\.([a-z]+(?:\.sat)?)\.", function)
        base = intrinsic.group(1) if intrinsic else None
        if function == MEET:
            if not deposit:
                self._flush_deposit()
            self.held_for = arguments[0][1] if self.held_deposit else None
            return self._meet(arguments, deposit)
        if function.startswith(FOLD_PREFIX) and not self.is_varying(arguments_text):
            held = self.in_registers.get(arguments[0][1]) if len(arguments) == 1 else None
            if held and SCALAR.match(return_type) and scalar_bytes(held[1]) == scalar_bytes(return_type):
                if self.held_for != arguments[0][1]:  # another exchange's deposit: written here
                    self._flush_deposit()
                return self._fold_in_registers(name, line, function, return_type, held)
            self._flush_deposit()
            self._uniform(name, line, False)  # a SIMD-group's reduction of the slots: once
            return None
        self._flush_deposit()
        memory = bool(_MEMORY_CALLS.search(line))
        if not memory and (base in ELEMENTWISE or base in PER_LANE) and not self.is_varying(arguments_text):
            self._uniform(name, line, True)
            return None
        if base in ELEMENTWISE and SCALAR.match(return_type) and not return_type.startswith("ptr"):
            return self._elementwise(name, function, return_type, arguments)
        if base in PER_LANE and SCALAR.match(return_type):
            return self._per_lane(name, function, return_type, arguments, masked=False)
        if memory and self._small_copy(function, arguments, stored):
            return None
        if memory:
            return self._per_lane(None, function, "void", arguments, masked=True)
        raise NotVector(f"a call of @{function}")

    def _meet(self, arguments, deposit: Optional[Tuple[str, str]]) -> None:
        """The lanes of the mask have all deposited into the exchange whose slots are the
        argument: the mask of their lanes in the SIMD-group goes where the slots' readers
        look for it (the runtime's work where an exchange ends a region). `deposit`: the
        vector of the lanes' values just copied into the slots, kept for their folds."""
        (_, slots), = arguments
        if self.is_varying(slots):
            raise NotVector("an exchange's slots differ between lanes")
        if self.width != SIMD_WIDTH:
            raise NotVector(f"an exchange inside a region of {self.width} lanes, not the SIMD-group's {SIMD_WIDTH}")
        vector = f"<{self.width} x i32>"
        lanes, bits, taking, where = (self.fresh(tag) for tag in ("ml", "mb", "mt", "mp"))
        self.out += [f"  {lanes} = and {vector} %t32, splat (i32 {SIMD_WIDTH - 1})",
                     f"  {bits} = shl {vector} splat (i32 1), {lanes}",
                     f"  {taking} = select <{self.width} x i1> {self.mask}, {vector} {bits}, {vector} zeroinitializer"]
        mask = self.reduce("or", "i32", taking)
        self.out += [f"  {where} = getelementptr i8, ptr {slots}, i32 {MASK_OFFSET}", f"  store i32 {mask}, ptr {where}"]
        if deposit:
            self.in_registers[slots] = (*deposit, mask, self.mask)

    def _fold_in_registers(self, name: str, line: str, function: str, type_name: str,
                           held: Tuple[str, str, str, str]) -> None:
        """A SIMD-group's reduction (`function`, a fold of the slots, in `line`) of
        `type_name` values the lanes just deposited, `held` in registers (the vector, as an
        integer of their size, the mask of the lanes that took part, and as lanes): where
        the order cannot change the result, a vector reduction (integers; a float or double
        minimum or maximum without a NaN or a zero among the values); a float sum or product
        of all 32 lanes, the fold's butterfly on the vector's two halves (the same
        operations, so the same bits); else the fold (half and bfloat minima and maxima
        too: their vector reductions are not ones every LLVM target selects)."""
        vector, held_type, mask, lanes = held
        if held_type != type_name:
            vector = self.fresh("as")
            self.out.append(f"  {vector} = bitcast <{self.width} x {held_type}> {held[0]} to <{self.width} x {type_name}>")
        kind = function[len(FOLD_PREFIX):].split(".")[0]
        wide = f"<{self.width} x {type_name}>"
        floating = type_name in ("half", "bfloat", "float", "double")
        if floating and kind in ("min", "max") and type_name not in ("float", "double"):
            self._flush_deposit()
            return self._uniform(name, line, False)
        if not floating or kind in ("min", "max"):
            op = kind[1:] if kind in ("smin", "smax", "umin", "umax") else kind
            kept = self.fresh("kept")
            identity = reduction_identity(op, kind in ("smin", "smax"), type_name)
            self.out.append(f"  {kept} = select <{self.width} x i1> {lanes}, {wide} {vector}, {wide} splat ({type_name} "
                            f"{identity})")
            reduction = ("f" + kind) if floating else {"sum": "add", "product": "mul"}.get(kind, kind)
            if not floating:
                result = self.reduce(reduction, type_name, kept)
                self.out.append(f"  {name} = bitcast {type_name} {result} to {type_name}")
                self.uniform.add(name)
                return None
            ordered = self.fresh("nz")  # neither a NaN nor a zero (a lane not taking part: an infinity)
            self.out.append(f"  {ordered} = fcmp one {wide} {kept}, zeroinitializer")
            fast = self.reduce("and", "i1", ordered)
            reduced = lambda: self.reduce(reduction, type_name, kept)  # noqa: E731
        else:
            fast = self.fresh("full")
            self.out.append(f"  {fast} = icmp eq i32 {mask}, -1")

            def reduced() -> str:
                low, high, half = self.fresh("lo"), self.fresh("hi"), SIMD_WIDTH // 2
                picks = [", ".join(f"i32 {first + j}" for j in range(half)) for first in (0, half)]
                self.out += [f"  {low} = shufflevector {wide} {vector}, {wide} poison, <{half} x i32> <{picks[0]}>",
                             f"  {high} = shufflevector {wide} {vector}, {wide} poison, <{half} x i32> <{picks[1]}>"]
                lines, result = butterfly_of_halves(kind, type_name, low, high, self.fresh("bf"))
                self.out.extend(f"  {tree_line}" for tree_line in lines)
                return result
        tree, memory, read, joined = self.label("tree"), self.label("slots"), self.label("read"), self.label("folded")
        deposit, self.held_deposit, self.held_for = self.held_deposit, [], None
        self.out += [f"  br i1 {fast}, label %{tree}, label %{memory}", f"{tree}:"]
        result = reduced()
        self.out += [f"  br label %{joined}", f"{memory}:", *deposit, f"  br label %{read}", f"{read}:",
                     f"  {name}.slots = {line.split(' = ', 1)[1]}", f"  br label %{joined}", f"{joined}:",
                     f"  {name} = phi {type_name} [ {result}, %{tree} ], [ {name}.slots, %{read} ]"]
        self.uniform.add(name)

    def _small_copy(self, function: str, arguments, stored: Optional[Tuple[str, int, str, str]]) -> bool:
        """A copy of 1, 2, 4 or 8 bytes (a deposit's value into its slot) as one integer
        load and store (whether it was emitted): vector accesses, not a call per lane; from
        the vector the block stored at the source just before, where it did (no load)."""
        if not function.startswith(("llvm.memcpy.", "llvm.memmove.")) or len(arguments) != 4:
            return False
        (target_type, target), (source_type, source), (_, length), volatile = arguments
        if length not in ("1", "2", "4", "8") or volatile != ("i1", "false"):
            return False
        integer, value = f"i{8 * int(length)}", self.fresh("cp")
        if stored and stored[:2] == (source, int(length)):
            self.out.append(f"  {value} = bitcast <{self.width} x {stored[2]}> {stored[3]} to <{self.width} x {integer}>")
            self.varying[value] = integer
        else:
            self._instruction(f"{value} = load {integer}, {source_type} {source}, align 1")
        start, checks = len(self.out), len(self.checked)
        self._instruction(f"store {integer} {value}, {target_type} {target}, align 1")
        self.last_deposit = (value, integer) if value in self.varying else None
        if self.last_deposit and len(self.checked) == checks:  # (nothing it defines is used later)
            self.held_deposit = self.out[start:]
            del self.out[start:]
        return True

    def _flush_deposit(self) -> None:
        """Writes the deposit held back (held_deposit) where the code is now."""
        self.out += self.held_deposit
        self.held_deposit, self.held_for = [], None

    def _elementwise(self, name: str, function: str, return_type: str, arguments) -> None:
        vector_name = re.sub(r"\.(i\d+|f16|bf16|f32|f64)$", lambda m: f".v{self.width}{m.group(1)}", function)
        if vector_name == function:
            raise NotVector(f"a call of @{function}")
        operands, types = [], []
        for type_name, value in arguments:
            if type_name == "i1" and value in ("true", "false"):  # an immediate (ctlz, abs)
                operands.append(f"i1 {value}")
                types.append("i1")
            else:
                operands.append(f"<{self.width} x {type_name}> {self.vec(type_name, value)}")
                types.append(f"<{self.width} x {type_name}>")
        self.declare(vector_name, f"declare <{self.width} x {return_type}> @{vector_name}({', '.join(types)})")
        self._define(name, return_type, f"call <{self.width} x {return_type}> @{vector_name}({', '.join(operands)})")

    def _per_lane(self, name: Optional[str], function: str, return_type: str, arguments, masked: bool) -> None:
        """Each lane calls the scalar function; `masked`: only the lanes of the mask do."""
        declared = f"declare {return_type} @{function}({', '.join(t for t, _ in arguments)})"
        self.declare(function, declared)
        varying = [value in self.varying for _, value in arguments]
        result = f"<{self.width} x {return_type}>"
        previous = "poison"
        for lane in range(self.width):
            values = []
            for (type_name, value), vary in zip(arguments, varying):
                if vary:
                    element = self.fresh("x")
                    self.out.append(f"  {element} = extractelement <{self.width} x {type_name}> {value}, i64 {lane}")
                    if not masked:
                        frozen = self.fresh("x")
                        self.out.append(f"  {frozen} = freeze {type_name} {element}")
                        element = frozen
                    values.append(f"{type_name} {element}")
                else:
                    values.append(f"{type_name} {value}")
            call = f"call {return_type} @{function}({', '.join(values)})"
            if masked:
                active, run, next_label = self.fresh("on"), self.label("lane"), self.label("lanedone")
                self.out += [f"  {active} = extractelement <{self.width} x i1> {self.mask}, i64 {lane}",
                             f"  br i1 {active}, label %{run}, label %{next_label}", f"{run}:", f"  {call}",
                             f"  br label %{next_label}", f"{next_label}:"]
                continue
            scalar, inserted = self.fresh("y"), self.fresh("y")
            self.out += [f"  {scalar} = {call}",
                         f"  {inserted} = insertelement {result} {previous}, {return_type} {scalar}, i64 {lane}"]
            previous = inserted
        if name is not None:
            self.out.append(f"  {name} = freeze {result} {previous}")
            self.varying[name] = return_type


def _only_deposited(name: str, lines: List[str]) -> bool:
    """Whether allocation `name` is only ever stored to as a whole scalar of 1, 2, 4 or 8
    bytes and read by a copy of those bytes right after (a deposit's buffer: regions.py puts
    only its slot's address between): the copy then takes the stored vector (_small_copy)
    and the store itself, a scatter into the lanes' copies, is not needed."""
    stored, copied = None, False
    for line in lines:
        if name not in LOCAL.findall(line) or " = alloca " in line:
            if not re.match(r"^\s*%\S+ = (?:getelementptr|alloca) ", line):
                stored = None
            continue
        text = strip_metadata(line.strip())
        if text.startswith("store "):
            parts = split_operands(text[len("store "):])
            if len(parts) < 2 or typed(parts[1])[1] != name or name in LOCAL.findall(parts[0]):
                return False
            stored = scalar_bytes(typed(parts[0])[0]) if SCALAR.match(typed(parts[0])[0]) else None
            continue
        copy = re.match(r"^(?:tail )?call void @llvm\.mem(?:cpy|move)\.\S+\((.*)\)$", text)
        if not copy:
            return False
        arguments = [typed(a) for a in split_operands(copy.group(1))]
        if (len(arguments) != 4 or arguments[1][1] != name or arguments[0][1] == name
                or arguments[2][1] not in ("1", "2", "4", "8") or int(arguments[2][1]) != stored
                or arguments[3] != ("i1", "false")):
            return False
        stored, copied = None, True
    return copied
