"""Vector loads and stores of global memory where a run of scalar accesses is aligned at run time.

MLX's row kernels (softmax, rms and layer norm) have each thread read and write
``N_READS`` consecutive elements (``in += gid * axis_size + lid * N_READS``) with scalar
accesses; after O3 these are straight-line runs off one pointer (``x, x+4, x+8, x+12``
bytes). One 16-byte access serves four such, but whether the run is 16-byte aligned
depends on ``axis_size``, known only at run time, so LLVM (whose LoadStoreVectorizer
merges accesses only where it knows their alignment) keeps them scalar: every warp-level
access touches 32 sectors of L2 instead of 4-8 (layer_norm's 177 us against torch's
62 on an H100, L2-bound).

Here, on the optimized module (ptx.py, between LLVM's O3 and NVPTX code generation), a
block whose global accesses (address space 1, non-volatile, non-atomic) through one
pointer cover a whole aligned 16-, 8- or 4-byte chunk (two or more elements) is versioned
on that alignment::

    %ok = icmp eq (ptrtoint %base & 15), 0
    br %ok, aligned, scalar
    aligned: the same instructions, each access's `align` raised to what %ok proves
    scalar:  the same instructions, as they were
    join:    a phi of each value the two define, named as the original; the block's rest

NVPTX code generation's LoadStoreVectorizer then merges the aligned copy's accesses into
``ld.global.v4``/``st.global.v4`` (or v2) where its alias analysis allows (across loads
of other buffers it knows apart: Metal's ``noalias`` scopes); the scalar copy is the
original code. Both copies compute the same values with the same side effects in the
same order: only the alignment the vectorizer may assume differs, and the branch proves
it. A region never spans a convergent operation (barrier, shuffle, vote), an atomic, a
fence, a volatile access or a call other than an LLVM intrinsic's, so no such operation
becomes conditional on the test. Where O3 sank the last access of a run into a block
shared with the edge path (SimplifyCFG's sinking: softmax's fourth load, rms's fourth
store), that small block is first duplicated into the run's block (tail duplication,
only where it completes a chunk and the block's values are used nowhere else).

A region's branch may diverge within a warp only where its threads' pointers differ in
alignment (MLX's rows: never within one row), and both sides join before whatever follows.
Kernels without such runs are left as they are (the module is not reparsed).
"""

import collections
import re
from typing import Dict, List, Optional, Set, Tuple

from ...reflection.ir_model import LOCAL, NAME, Block, Phi, blocks, callee, defined_name, edit_function_bodies, renamed, \
    result_type, substitute, used_names

__all__ = ["vector_accesses"]

_SIZES = {"i8": 1, "i16": 2, "half": 2, "bfloat": 2, "i32": 4, "float": 4, "i64": 8, "double": 8}
_WIDTHS = (16, 8, 4)  # bytes of one vector access (NVPTX: at most 128 bits)
_SCALAR = "|".join(_SIZES)
_N = f"%{NAME}"
_LOAD = re.compile(rf"^\s*({_N}) = load ({_SCALAR}), ptr addrspace\(1\) ({_N}), align (\d+)(?:, !.*)?$")
_STORE = re.compile(rf"^\s*store ({_SCALAR}) ([^,]+), ptr addrspace\(1\) ({_N}), align (\d+)(?:, !.*)?$")
_GEP = re.compile(rf"^\s*({_N}) = getelementptr (?:(?:inbounds|nuw|nusw) )*({_SCALAR}), ptr addrspace\(1\) ({_N}), "
                  rf"(i64|i32) ({_N}|-?\d+)(?:, !.*)?$")
_EXTEND = re.compile(rf"^\s*({_N}) = (sext|zext)(?: nneg)? (i\d+) ({_N}) to i64(?:, !.*)?$")
_ADD = re.compile(rf"^\s*({_N}) = (?:add(?: nuw)?(?: nsw)?|or disjoint) i64 ({_N}), (-?\d+)(?:, !.*)?$")
_NARROW_ADD = re.compile(rf"^\s*({_N}) = ((?:add|or)(?: nuw| nsw| disjoint)*) (i\d+) ({_N}), (-?\d+)(?:, !.*)?$")
_PURE = re.compile(rf"^\s*{_N} = (?:getelementptr|sext|zext|trunc|add|sub|or|and|xor|shl|mul|bitcast|addrspacecast)"
                   r" (?!.*\b(?:call|load)\b)")
_BRANCH = re.compile(rf"^\s*br label ({_N})$")
_UNSAFE = re.compile(r"\b(?:atomicrmw|cmpxchg|fence|volatile|atomic|asm|va_arg|landingpad|invoke|callbr|alloca)\b")
# NVVM intrinsics that synchronize, communicate or order (convergent ones are also refused
# by their attribute): belt and braces.
_COLLECTIVE = re.compile(r"llvm\.nvvm\.(?:barrier|bar\.|shfl|vote|activemask|match|redux|fence|membar|atomic|atom|red\."
                         r"|elect|cp\.async|mbarrier|wgmma|mma|ldmatrix|stmatrix|griddepcontrol|cluster|setmaxnreg"
                         r"|ldu|ldg|tcgen05|bulk|prefetch)")
_UNSAFE_QUICK = re.compile(r"call |atomic|cmpxchg|fence|volatile|asm|va_arg|landingpad|invoke|alloca")
_MAX_REGION = 600  # lines of one versioned region (each is copied twice)
_MAX_TAIL = 64  # lines of a block duplicated into its predecessor
_MAX_EDITS = 64  # versioned regions and duplicated blocks per function


def vector_accesses(text: str) -> str:
    """`text` (an optimized NVVM module) with aligned runs of global accesses versioned as
    above; `text` itself where there are none."""
    if text.count("addrspace(1)") < 2:
        return text
    convergent_groups = set(re.findall(r"^attributes (#\d+) = \{[^\n]*\bconvergent\b", text, re.M))
    # Functions declared convergent (by an attribute group or inline): calls of them are never copied.
    declared = re.finditer(r"^(?:declare|define) [^\n]*?@([-\w$.]+)\([^\n]*\)([^\n]*)$", text, re.M)
    convergent = {m.group(1) for m in declared
                  if "convergent" in m.group(2) or set(re.findall(r"#\d+", m.group(2))) & convergent_groups}
    changed = False
    counter = [0]

    def edit(body: List[str]) -> List[str]:
        nonlocal changed
        edited = _Function(body, convergent, convergent_groups, counter).edit()
        if edited is None:
            return body
        changed = True
        return edited
    edited = edit_function_bodies(text, edit)
    return edited if changed else text


def _alignment(width: int, offset: int) -> int:
    """The alignment of base + offset where base is `width`-aligned."""
    rest = offset % width
    return width if rest == 0 else rest & -rest


class _Function:
    def __init__(self, body: List[str], convergent: Set[str], convergent_groups: Set[str], counter: List[int]):
        self.body = body
        self.convergent = convergent
        self.convergent_groups = convergent_groups
        self.counter = counter
        self.edits = 0

    # --- parsing and indexes ----------------------------------------------------------------

    @staticmethod
    def _parse(body: List[str]) -> Optional[List[Block]]:
        """The body's blocks (blank lines dropped); None for an entry block without a label
        or a line that is neither a label nor an instruction: left alone."""
        found = list(blocks([line for line in body if line.strip()]).values())
        if not found or found[0].label is None or any(not line.startswith(" ") for b in found for line in b.lines):
            return None
        return found

    def _index(self, blocks: List[Block]) -> None:
        """Where the values of `blocks` are defined (name -> line, name -> (block, index))."""
        for block in blocks:
            for i, line in enumerate(block.lines):
                name = defined_name(line)
                if name:
                    self.defs[name] = line
                    self.where[name] = (block.name, i)
        self._addresses = {}

    def _unsafe(self, line: str) -> bool:
        """Whether `line` may not be copied under a new condition (nor accesses merged across it)."""
        if not _UNSAFE_QUICK.search(line):
            return False
        if "call " not in line:
            return bool(_UNSAFE.search(line))
        text = line.strip()
        if _UNSAFE.search(text):
            return True
        name = callee(text)
        if name is None:
            return True
        if name in self.convergent or not name.startswith("llvm.") or _COLLECTIVE.match(name):
            return True
        groups = text.rsplit(")", 1)[-1]
        return "#" in groups and bool(set(re.findall(r"#\d+", groups)) & self.convergent_groups)

    def _address(self, pointer: str) -> Tuple[object, int]:
        """(key, byte offset): `pointer` is the address `key` stands for plus the offset."""
        found = self._addresses.get(pointer)
        if found is None:
            found = (pointer, 0)
            gep = _GEP.match(self.defs.get(pointer, ""))
            if gep:
                size = _SIZES[gep.group(2)]
                key, offset = self._address(gep.group(3))
                index = gep.group(5)
                if index[0] != "%":
                    found = (key, offset + int(index) * size)
                else:
                    term, constant = self._index_term(index, gep.group(4))
                    found = (("gep", key, size, term), offset + constant * size)
            self._addresses[pointer] = found
        return found

    def _index_term(self, value: str, width: str) -> Tuple[object, int]:
        """(term, constant): index `value` (of type `width`) is term + constant."""
        if width != "i64":
            return ("sext", width, value), 0
        line = self.defs.get(value, "")
        add = _ADD.match(line)
        if add:
            term, constant = self._index_term(add.group(2), "i64")
            return term, constant + int(add.group(3))
        extend = _EXTEND.match(line)
        if extend:
            kind, narrow_width, inner = extend.group(2), extend.group(3), extend.group(4)
            constant = 0
            # zext (x + c) = zext x + c where the narrow add cannot wrap unsigned (nuw, or an
            # or of disjoint bits), sext likewise where it cannot wrap signed (nsw, disjoint).
            while True:
                narrow = _NARROW_ADD.match(self.defs.get(inner, ""))
                if not narrow or narrow.group(3) != narrow_width or int(narrow.group(5)) < 0:
                    break
                flags = narrow.group(2)
                if not ("disjoint" in flags or ("nuw" if kind == "zext" else "nsw") in flags):
                    break
                inner, constant = narrow.group(4), constant + int(narrow.group(5))
            return (kind, narrow_width, inner), constant
        return value, 0

    def _accesses(self, lines: List[str]):
        """The global scalar accesses of `lines` in segments (the accesses between two lines
        that may not be copied), each access (index, kind, type, pointer, key, offset)."""
        segments, current = [], []
        if not any("addrspace(1) %" in line for line in lines):
            return segments
        for i, line in enumerate(lines):
            global_access = "addrspace(1) %" in line
            load = _LOAD.match(line) if global_access and " load " in line else None
            store = _STORE.match(line) if global_access and not load and "store " in line else None
            if load or store:
                kind, kind_type, pointer = ("load", load.group(2), load.group(3)) if load else \
                    ("store", store.group(1), store.group(3))
                key, offset = self._address(pointer)
                current.append((i, kind, kind_type, pointer, key, offset))
            elif self._unsafe(line):
                if current:
                    segments.append(current)
                current = []
        if current:
            segments.append(current)
        return segments

    @staticmethod
    def _widths(accesses) -> Dict[object, Tuple[int, int]]:
        """key -> (the widest chunk width some run of its accesses covers whole, the number of
        accesses in such chunks)."""
        groups = collections.defaultdict(set)
        for _, kind, kind_type, _, key, offset in accesses:
            groups[(kind, kind_type, key)].add(offset)
        chosen: Dict[object, Tuple[int, int]] = {}
        for (kind, kind_type, key), offsets in groups.items():
            if len(offsets) < 2:
                continue
            size = _SIZES[kind_type]
            for width in _WIDTHS:
                if width < 2 * size:
                    continue
                whole = [o for o in offsets if o % width == 0 and all(o + j * size in offsets
                                                                       for j in range(1, width // size))]
                if whole:
                    old = chosen.get(key, (0, 0))
                    chosen[key] = (max(old[0], width), old[1] + len(whole) * (width // size))
                    break
        return chosen

    def _covered(self, lines: List[str]) -> int:
        return sum(count for segment in self._accesses(lines) for _, count in self._widths(segment).values())

    # --- editing ----------------------------------------------------------------------------

    def edit(self) -> Optional[List[str]]:
        """The edited body; None where nothing changed."""
        blocks = self._parse(self.body)
        if blocks is None or sum(1 for line in self.body if "addrspace(1) %" in line) < 2:
            return None
        self.blocks = blocks
        self.defs: Dict[str, str] = {}
        self.where: Dict[str, Tuple[str, int]] = {}
        self._index(self.blocks)
        self.accesses = accesses = {block.name: self._accesses(block.lines) for block in self.blocks}
        changed = self._duplicate_tails(accesses)
        if not changed and not any(self._widths(segment) for segments in accesses.values() for segment in segments):
            return None
        position = 0
        while position < len(self.blocks) and self.edits < _MAX_EDITS:
            if self._version(position):
                changed = True
                position += 3  # past the two copies, to the join block (the rest of this one)
            else:
                position += 1
        if not changed:
            return None
        out: List[str] = []
        for n, block in enumerate(self.blocks):
            out += ([""] if n else []) + [f"{block.name}:"] + block.lines
        return out

    def _duplicate_tails(self, accesses) -> bool:
        by_name = {block.name: block for block in self.blocks}
        predecessors = collections.defaultdict(list)
        for block in self.blocks:
            for name in block.successors():
                predecessors[name].append(block.name)
        changed = False
        for block in self.blocks:
            while self.edits < _MAX_EDITS and accesses[block.name]:
                branch = _BRANCH.match(block.lines[-1])
                target = by_name.get(branch.group(1)[1:]) if branch else None
                if (target is None or target is block or target is self.blocks[0] or not accesses[target.name]
                        or len(target.lines) > _MAX_TAIL or len(predecessors[target.name]) < 2
                        or not _bases(accesses[block.name]) & _bases(accesses[target.name])
                        or not self._duplicate_tail(block, target, predecessors)):
                    break
                accesses[block.name] = self._accesses(block.lines)
                changed = True
        return changed

    def _duplicate_tail(self, block: Block, target: Block, predecessors) -> bool:
        """Copies `target` (what `block` branches to) into `block`, where that completes a chunk
        and the target's values are used only in it and in its successors' phis."""
        successors = target.successors()
        if (target.name in successors or len(set(successors)) != len(successors)
                or any(self._unsafe(line) for line in target.lines)):
            return False
        phis = target.phis()
        body = target.lines[len(phis):]
        if any(" = phi " in line for line in body):
            return False
        values: Dict[str, str] = {}  # the target's phi -> its value coming from `block`
        for line in phis:
            parsed = _phi(line)
            incoming = [value for value, label in parsed[2] if label == f"%{block.name}"] if parsed else []
            if len(incoming) != 1:
                return False
            values[parsed[0]] = incoming[0]
        defined = {name for name in map(defined_name, target.lines) if name}
        self.counter[0] += 1
        renames = {name: renamed(name, f"tm.t{self.counter[0]}") for name in defined if name not in values}
        renames.update(values)
        copied = [substitute(line, renames) for line in body]
        saved = self.defs
        self.defs = dict(self.defs)
        for line in copied:
            name = defined_name(line)
            if name:
                self.defs[name] = line
        self._addresses = {}
        gain = self._covered(block.lines[:-1] + copied) > self._covered(block.lines)
        self.defs, self._addresses = saved, {}
        if not gain:
            return False
        # The target's values may be used only in it and in its successors' phis, coming from it.
        by_name = {b.name: b for b in self.blocks}
        for other in self.blocks:
            joined = "\n".join(other.lines)
            if other is target or not any(name in joined for name in defined):
                continue
            for line in other.lines:
                if not defined.intersection(used_names(line)):
                    continue
                parsed = _phi(line) if other.name in successors else None
                if parsed is None or any(label != f"%{target.name}" and set(LOCAL.findall(value)) & defined
                                         for value, label in parsed[2]):
                    return False
        if any(_phi(line) is None for name in successors for line in by_name[name].lines if " = phi " in line):
            return False
        block.lines = block.lines[:-1] + copied
        target.lines = [_phi_without(line, f"%{block.name}") for line in phis] + body
        for name in successors:
            other = by_name[name]
            other.lines = [_phi_with(line, f"%{target.name}", f"%{block.name}", renames) if " = phi " in line
                           else line for line in other.lines]
            predecessors[name].append(block.name)
        predecessors[target.name].remove(block.name)
        self.edits += 1
        self._index([block, target])
        self.accesses[target.name] = self._accesses(target.lines)
        return True

    def _version(self, position: int) -> bool:
        """Versions the first region of block `position` that has an aligned chunk; the rest of
        the block goes to the join block (versioned in turn when the loop reaches it)."""
        block = self.blocks[position]
        segments = self.accesses.get(block.name)
        for segment in self._accesses(block.lines) if segments is None else segments:
            widths = {key: width for key, (width, _) in self._widths(segment).items()}
            while widths:
                chosen = [a for a in segment if a[4] in widths]
                start, end = chosen[0][0], chosen[-1][0]
                checks = {}
                for key in widths:
                    # A pointer to the run known before the region, or one whose address
                    # arithmetic can be computed again there (a store's, computed late).
                    first = next(a for a in chosen if a[4] == key)
                    for _, _, _, pointer, access_key, offset in chosen:
                        if access_key == key and self._hoisted(pointer, block.name, start, [], {}) == pointer:
                            checks[key] = (pointer, offset)
                            break
                    else:
                        if self._hoisted(first[3], block.name, start, [], {}) is not None:
                            checks[key] = (first[3], first[5])
                dropped = [key for key in widths if key not in checks]
                if not dropped:
                    break
                for key in dropped:
                    del widths[key]
            if not widths or end - start > _MAX_REGION:
                continue
            if self._split(block, position, start, end, widths, checks, chosen):
                return True
        return False

    def _hoisted(self, value: str, block: str, start: int, lines: List[str], names: Dict[str, str],
                 tag: str = "", depth: int = 0) -> Optional[str]:
        """`value`, or where the block computes it at or after line `start`, the name of a copy
        of its (pure, non-trapping) computation appended to `lines` (before the region); None
        where it cannot be copied."""
        where = self.where.get(value)
        if where is None or where[0] != block or where[1] < start:
            return value
        if value in names:
            return names[value]
        line = self.defs[value]
        if depth > 12 or not _PURE.match(line):
            return None
        renames = {}
        for token in set(LOCAL.findall(line.split(" = ", 1)[1])):
            found = self._hoisted(token, block, start, lines, names, tag, depth + 1)
            if found is None:
                return None
            renames[token] = found
        names[value] = renames[value] = renamed(value, f"{tag}h")
        lines.append(substitute(line, renames))
        return names[value]

    def _split(self, block: Block, position: int, start: int, end: int, widths, checks, chosen) -> bool:
        region = block.lines[start:end + 1]
        defined = [name for name in map(defined_name, region) if name]
        # Every value the region defines is a phi of the join, in the same order: later code
        # uses them by their names, and numbered values stay numbered in sequence (the copies'
        # values are named). Unused phis generate no code.
        types = [(name, result_type(self.defs[name])) for name in defined]
        if any(kind is None for _, kind in types):
            return False
        successors = set(block.successors())
        if any(_phi(line) is None for other in self.blocks if other.name in successors
               for line in other.lines if " = phi " in line):
            return False
        self.counter[0] += 1
        tag = f"tm.v{self.counter[0]}"
        check: List[str] = []
        parts = []
        hoisted: Dict[str, str] = {}
        for n, (key, (pointer, offset)) in enumerate(checks.items()):
            width = widths[key]
            pointer = self._hoisted(pointer, block.name, start, check, hoisted, tag)
            check.append(f"  %{tag}.i{n} = ptrtoint ptr addrspace(1) {pointer} to i64")
            value = f"%{tag}.i{n}"
            if offset % width:
                check.append(f"  %{tag}.d{n} = add i64 {value}, {-(offset % width)}")
                value = f"%{tag}.d{n}"
            check.append(f"  %{tag}.m{n} = and i64 {value}, {width - 1}")
            parts.append(f"%{tag}.m{n}")
        combined = parts[0]
        for n, part in enumerate(parts[1:], 1):
            check.append(f"  %{tag}.c{n} = or i64 {combined}, {part}")
            combined = f"%{tag}.c{n}"
        # Frozen: a poison address (UB in the original only if its access runs) branches anyhow.
        check += [f"  %{tag}.f = freeze i64 {combined}", f"  %{tag}.ok = icmp eq i64 %{tag}.f, 0",
                  f"  br i1 %{tag}.ok, label %{tag}.aligned, label %{tag}.scalar"]
        aligned_names = {name: renamed(name, f"{tag}a") for name in defined}
        scalar_names = {name: renamed(name, f"{tag}s") for name in defined}
        raised = {index: _alignment(widths[key], offset) for index, _, _, _, key, offset in chosen}
        aligned = []
        for index, line in enumerate(region, start):
            line = substitute(line, aligned_names)
            if index in raised:
                line = re.sub(r", align (\d+)", lambda m: f", align {max(int(m.group(1)), raised[index])}", line,
                              count=1)
            aligned.append(line)
        scalar = [substitute(line, scalar_names) for line in region]
        join = [f"  {name} = phi {kind} [ {aligned_names[name]}, %{tag}.aligned ], "
                f"[ {scalar_names[name]}, %{tag}.scalar ]" for name, kind in types]
        rest = block.lines[end + 1:]
        block.lines = block.lines[:start] + check
        added = [Block(f"{tag}.aligned", f"{tag}.aligned:", aligned + [f"  br label %{tag}.join"]),
                 Block(f"{tag}.scalar", f"{tag}.scalar:", scalar + [f"  br label %{tag}.join"]),
                 Block(f"{tag}.join", f"{tag}.join:", join + rest)]
        self.blocks[position + 1:position + 1] = added
        # Phis that came from the block now come from the join, which ends with its terminator.
        for other in self.blocks:
            if other.name in successors:
                other.lines = [_phi_retargeted(line, f"%{block.name}", f"%{tag}.join") if " = phi " in line else line
                               for line in other.lines]
        self.edits += 1
        self._index([block] + added)
        self.accesses.pop(block.name, None)
        return True


def _bases(segments) -> Set[str]:
    """The pointers the accesses' addresses are computed from."""
    found = set()
    for segment in segments:
        for access in segment:
            key = access[4]
            while isinstance(key, tuple):
                key = key[1]
            found.add(key)
    return found


def _phi(line: str):
    """(name, head, [(value, label)]) of a phi line; None where not read exactly."""
    found = Phi.read(line)
    return None if found is None else (found.name, found.head, found.entries)


def _phi_without(line: str, label: str) -> str:
    found = Phi.read(line)
    return Phi(found.name, found.head, [(v, lab) for v, lab in found.entries if lab != label]).text()


def _phi_with(line: str, source: str, copy: str, renames: Dict[str, str]) -> str:
    """A successor's phi with an entry for `copy` (the block that took a copy of `source`)."""
    found = Phi.read(line)
    if found is None:
        return line
    added = [(substitute(v, renames), copy) for v, lab in found.entries if lab == source]
    return Phi(found.name, found.head, found.entries + added).text()


def _phi_retargeted(line: str, old: str, new: str) -> str:
    found = Phi.read(line)
    if found is None:
        return line
    return Phi(found.name, found.head, [(v, new if lab == old else lab) for v, lab in found.entries]).text()
