"""Simdgroup-matrix products that need none of each other's results as one exchange
(ARCHITECTURE.md, "Rules").

Every ``simdgroup_matrix_8x8_multiply_accumulate`` makes the SIMD-group's 32 lanes meet:
each lane suspends and is resumed once per product. MLX's GEMM tiles (steel) multiply a
TM x TN grid of fragments per k-step, with a loop nest that the kernel's compiler left
rolled; once LLVM unrolls it (``unroll``, given by the caller, runs only on modules with
these products) a k-block is one block holding its TM x TN products per k-step. This
pass gathers such a run into one call of
``tm.simdgroup_matrix_8x8.multiply_accumulate_batch.<sources>.<overload>``
(air/simdgroup_matrix.py), so the lanes meet once per k-block instead of once per product.
A product may take an earlier product of the run as its accumulator C (the next k-step
does), directly or through a shuffle that keeps the lane's elements 0 and 1 (Apple's
``thread_elements()``): `sources` lists, per product, ``c`` (its own C) or that product's
index, and the batch computes the products in order. A factor whose lane elements are an
earlier factor's of the run (MLX passes a fragment to a row of products, each through its own
shuffles) is staged once: its product's word names that factor (``a<k>``, ``b<k>``: factor
k = 3 * product + 0 for A, 1 for B) and the call passes poison for it.

Moving a product down its block to where the run ends is unobservable: a product reads
no memory and only the lanes that run the block run it, before or after the move. What
uses a product's result moves with it when it is a pure computation (vector shuffles,
arithmetic); anything else that needs a result ends the run before it, and so does any
call that could wait (every call but LLVM's own intrinsics and the memory-less
``simdgroup_barrier(mem_none)``, a no-op here).

In lane loops (`keep_accumulators`), a float accumulator that a loop passes from one run of
its batch to the next stays in memory: where a product's C is (the lane elements of) a phi
of the batch's own block, whose value from the loop's back edge is the D of a product of
the same batch that accumulates onto that C, the product reads C from its SIMD-group's kept
area (``k<j>`` in its word, ``kept<area>`` in the name) and the batch leaves product j's D
there. The loop's first C is written there on the edge into the loop (``KEEP_PREFIX``), so
lanes neither read D back nor stage C on every k-step. The batch's block runs once per
iteration, so the area holds the previous iteration's D when the batch runs again; the
elements are the same floats the lanes would have staged (float accumulators only).
"""

import itertools
import re
from typing import Callable, Dict, Iterator, List, Optional, Set, Tuple

from ...reflection.ir_model import DEFINITION, LOCAL, NAME, blocks, edit_function_bodies, opcode, split_operands
from ...air.simdgroup_matrix import BATCH_PREFIX, KEEP_PREFIX, _chain_start

__all__ = ["batch_matrix_products", "BATCH_PREFIX", "MAX_BATCH"]

MAX_BATCH = 32  # products per exchange: staged in 768 bytes each, per SIMD-group and phase

_PRODUCT = re.compile(rf"^\s*(%{NAME}) = (?:tail )?call (<64 x \w+>) "
                      r"@air\.simdgroup_matrix_8x8_multiply_accumulate\.([\w.]+)\((.*)\)(?: #\d+)?$")
_VECTOR = re.compile(r"<\d+ x \w+>")
# A shuffle whose lane elements (0 and 1) are its first operand's: a fragment passed on.
_KEEPS_FRAGMENT = re.compile(rf"^\s*(%{NAME}) = shufflevector <64 x \w+> (%{NAME}), .*<64 x i32> <i32 0, i32 1[,>]")
# Its second operand, which supplies none of the lane's elements (MLX passes the previous
# k-step's fragment there, a loop-carried value lane loops would keep for nothing).
_OTHER_ELEMENTS = re.compile(rf"(= shufflevector <64 x \w+> %{NAME}, )(<64 x \w+>) %{NAME}(, <64 x i32> <i32 0, i32 1[,>])")
# A shuffle whose lane elements are a pair's: a fragment built from the lane's two elements.
_WIDENS_PAIR = re.compile(rf"^\s*(%{NAME}) = shufflevector <2 x \w+> (%{NAME}), .*<64 x i32> <i32 0, i32 1[,>]")
# A shuffle of a fragment's lane elements (0 and 1) to a pair: the pair the lane holds.
_NARROWS_PAIR = re.compile(rf"^\s*(%{NAME}) = shufflevector <64 x \w+> (%{NAME}), <64 x \w+> \S+, <2 x i32> <i32 0, i32 1>$")
_BATCH_CALL = re.compile(rf"^(\s*(%{NAME}) = call (\{{[^}}]*\}}) @){re.escape(BATCH_PREFIX)}\.(\w+)\.([\w.]+)\((.*)\)$")
_PHI_INCOMING = re.compile(rf"\[ ([^\[\]]+), %({NAME}) \]")
_EXTRACT = re.compile(rf"^\s*%{NAME} = extractvalue \{{[^}}]*\}} (%{NAME}), (\d+)$")  # (the aggregate, the index)
# Instructions without side effects whose operands are values: they can move down a block.
_PURE = {"extractelement", "insertelement", "shufflevector", "extractvalue", "insertvalue", "bitcast",
         "fneg", "fadd", "fsub", "fmul", "fdiv", "frem", "add", "sub", "mul", "and", "or", "xor", "shl",
         "lshr", "ashr", "icmp", "fcmp", "select", "getelementptr", "trunc", "zext", "sext", "fptrunc",
         "fpext", "fptoui", "fptosi", "uitofp", "sitofp", "ptrtoint", "inttoptr", "addrspacecast", "freeze"}
_HARMLESS_CALL = re.compile(r"call void @air\.simdgroup\.barrier\(i32 0,|call [^@]*@llvm\.(?!coro)")


class _Run:
    """Products gathered in one block so far, and the pure lines that wait for them."""

    def __init__(self):
        # (result, type, overload, the batch call's args, the product's own args)
        self.products: List[Tuple[str, str, str, List[str], List[str]]] = []
        self.sources: List[str] = []  # per product: "c" (its own C) or the product whose D is its C
        self.deferred: List[str] = []
        self.results: Set[str] = set()  # the products' results and what the deferred lines define
        self.fragments: Dict[str, int] = {}  # value -> product whose D's lane elements it holds
        self.factors: Dict[str, int] = {}  # lane elements (lane_elements) -> the factor staging them

    def add(self, result: str, ret: str, overload: str, args: List[str], source: Optional[int],
            lane_elements: Callable[[str], str]) -> None:
        word, own = "c" if source is None else str(source), args
        if source is not None:  # C is computed in the batch: the call passes none
            args = args[:2] + [f"{_VECTOR.match(args[2]).group(0)} poison"]
        for index, letter in enumerate("ab"):
            value = args[index].split(" ")[-1]
            if not value.startswith("%"):
                continue
            key = lane_elements(value)
            if key in self.factors:  # staged already: the call passes none
                word += f"{letter}{self.factors[key]}"
                args = args[:index] + [f"{_VECTOR.match(args[index]).group(0)} poison"] + args[index + 1:]
            else:
                self.factors[key] = 3 * len(self.products) + index
        self.products.append((result, ret, overload, args, own))
        self.sources.append(word)
        self.fragments[result] = len(self.products) - 1
        self.results.add(result)

    def defer(self, line: str, defined: str) -> None:
        self.deferred.append(line)
        self.results.add(defined)
        shuffle = _KEEPS_FRAGMENT.match(line)
        if shuffle and shuffle.group(2) in self.fragments:
            self.fragments[defined] = self.fragments[shuffle.group(2)]

    def emit(self, out: List[str], numbers: Iterator[int], declarations: Dict[str, str]) -> None:
        if len(self.products) == 1:  # called alone: its own operands (a factor it shares is its own)
            result, ret, overload, _, args = self.products[0]
            out.append(f"  {result} = call {ret} @air.simdgroup_matrix_8x8_multiply_accumulate.{overload}"
                       f"({', '.join(args)})")
        elif self.products:
            ret, overload = self.products[0][1], self.products[0][2]
            count = len(self.products)
            name = f"{BATCH_PREFIX}.{'_'.join(self.sources)}.{overload}"
            struct = "{ " + ", ".join([ret] * count) + " }"
            batch = f"%tm.batch.{next(numbers)}"
            out.append(f"  {batch} = call {struct} @{name}({', '.join(a for p in self.products for a in p[3])})")
            out += [f"  {result} = extractvalue {struct} {batch}, {i}" for i, (result, *_) in enumerate(self.products)]
            types = ", ".join(_VECTOR.match(a).group(0) for p in self.products for a in p[3])
            declarations[name] = f"declare {struct} @{name}({types})"
        out += self.deferred
        self.__init__()


def _batch_block(lines: List[str], numbers: Iterator[int], declarations: Dict[str, str]) -> List[str]:
    out: List[str] = []
    run = _Run()
    pairs: Dict[str, str] = {}  # fragment -> the value its lane elements come from, through shuffles

    def lane_elements(value: str) -> str:
        return pairs.get(value, value)

    for line in lines:
        line = _OTHER_ELEMENTS.sub(r"\1\2 poison\3", line)  # elements no lane holds: poison
        kept = _KEEPS_FRAGMENT.match(line) or _WIDENS_PAIR.match(line)
        if kept:
            pairs[kept.group(1)] = lane_elements(kept.group(2))
        product = _PRODUCT.match(line)
        defines = DEFINITION.match(line)
        uses = set(LOCAL.findall(line[defines.end():] if defines else line))
        depends = bool(uses & run.results)
        if product:
            args = split_operands(product.group(4))
            accumulator = set(LOCAL.findall(args[2])) & run.results
            source = run.fragments.get(args[2].split(" ")[-1]) if accumulator else None
            factors_depend = bool(set(LOCAL.findall(args[0] + " " + args[1])) & run.results)
            same = not run.products or run.products[0][2] == product.group(3)
            if factors_depend or (accumulator and source is None) or not same or len(run.products) == MAX_BATCH:
                run.emit(out, numbers, declarations)
                source = None
            run.add(product.group(1), product.group(2), product.group(3), args, source, lane_elements)
            continue
        code = opcode(line) or ""
        if depends and code in _PURE:
            run.defer(line, defines.group(1))
            continue
        if depends or (code == "call" and not _HARMLESS_CALL.search(line)) or code in (
                "br", "switch", "ret", "unreachable", "indirectbr", "resume", "invoke", "callbr"):
            run.emit(out, numbers, declarations)
        out.append(line)
    run.emit(out, numbers, declarations)
    return out


def _batch_body(body: List[str], numbers: Iterator[int], declarations: Dict[str, str], areas: Optional[Iterator[int]]) -> List[str]:
    out: List[str] = []
    for block in blocks(body).values():
        out += ([block.label] if block.label is not None else []) + _batch_block(block.lines, numbers, declarations)
    return out if areas is None else _keep_accumulators(out, areas, declarations)


def _keep_accumulators(body: List[str], areas: Iterator[int], declarations: Dict[str, str]) -> List[str]:
    """`body` with the accumulators its loops pass from a batch to the same batch kept in
    memory (the module's docstring)."""
    if not any("@" + BATCH_PREFIX in line for line in body):
        return body
    found = blocks(body)
    defined = {m.group(1): line for line in body for m in [DEFINITION.match(line)] if m}
    edits: Dict[str, str] = {}  # a batch's call (each defines a value of its own) -> its replacement
    entering: Dict[str, List[str]] = {}  # block -> keep calls before its terminator
    for block in found.values():
        for line in block.lines:
            call = "@" + BATCH_PREFIX in line and _BATCH_CALL.match(line)
            kept = call and _kept_products(block, call, found, defined)
            if not kept:
                continue
            words, args = call.group(4).split("_"), split_operands(call.group(6))
            area = next(areas)
            for slot, (m, (j, initial, type_name, enter)) in enumerate(sorted(kept.items())):
                words[m] = f"k{j}{words[m][1:]}"
                args[3 * m + 2] = "<64 x float> poison"
                keep = f"{KEEP_PREFIX}.{area}.{slot}.{len(kept)}"
                entering.setdefault(enter, []).append(f"  call void @{keep}({type_name} {initial})")
                declarations[keep] = f"declare void @{keep}({type_name})"
            old, name = f"{BATCH_PREFIX}.{call.group(4)}.{call.group(5)}", f"{BATCH_PREFIX}.{'_'.join(words)}.kept{area}.{call.group(5)}"
            declarations[name] = declarations[old].replace(f"@{old}(", f"@{name}(")
            edits[line] = f"{call.group(1)}{name}({', '.join(args)})"
    out: List[str] = []
    for block in found.values():
        lines = [edits.get(line, line) for line in block.lines]
        end = _terminator(lines)
        out += ([block.label] if block.label is not None else []) + lines[:end] + entering.get(block.name, []) + lines[end:]
    return out


def _terminator(lines: List[str]) -> int:
    """The index of a block's last instruction (its terminator)."""
    return max(i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith(";"))


def _kept_products(block, call, found, defined: Dict[str, str]) -> Dict[int, Tuple[int, str, str, str]]:
    """Product m -> (j, the loop's first C, its type, the block entering the loop) for each
    product of the batch `call` in `block` whose C is a phi of `block` that the loop's back
    edge feeds from product j's D, j accumulating onto m's C (the module's docstring)."""
    phis = {DEFINITION.match(line).group(1): line for line in block.phis()}
    words, args = call.group(4).split("_"), split_operands(call.group(6))
    if not phis or call.group(3) != "{ " + ", ".join(["<64 x float>"] * len(words)) + " }":
        return {}

    def root(value: str, patterns) -> str:  # the value whose lane elements `value` holds
        while value in defined:
            match = next((m for p in patterns for m in [p.match(defined[value])] if m), None)
            if not match:
                break
            value = match.group(2)
        return value

    sources = [None if w[0] in "ck" else int(re.match(r"\d+", w).group(0)) for w in words]
    kept: Dict[int, Tuple[int, str, str, str]] = {}
    for m, word in enumerate(words):
        phi = word.startswith("c") and phis.get(root(args[3 * m + 2].split(" ")[-1], (_KEEPS_FRAGMENT, _WIDENS_PAIR)))
        incoming = phi and _PHI_INCOMING.findall(phi)
        type_name = phi and phi.split(" = phi ")[1].split(" [")[0]
        if not incoming or len(incoming) != 2 or type_name not in ("<2 x float>", "<64 x float>"):
            continue
        for (back, _), (initial, enter) in (incoming, incoming[::-1]):
            if enter not in found and enter.isdigit() and "" in found:
                enter = ""  # the entry block, printed without its label (numbered ones have theirs)
            result = defined.get(root(back, (_KEEPS_FRAGMENT, _NARROWS_PAIR)), "")
            extract = _EXTRACT.match(result)
            extract = extract if extract and extract.group(1) == call.group(2) else None
            # The keep call goes before the entering block's branch (not into a switch's cases).
            branch = enter in found and enter != block.name and found[enter].lines[_terminator(found[enter].lines)].lstrip().startswith("br ")
            if extract and branch and _chain_start(sources, int(extract.group(2))) == m:
                kept[m] = (int(extract.group(2)), initial, type_name, enter)
                break
    return kept


def batch_matrix_products(text: str, unroll: Callable[[str], str], keep_accumulators: bool = False) -> str:
    """`text` with runs of independent products batched; the module is first unrolled
    with `unroll` if it has products at all. `keep_accumulators` (lane loops): loops keep
    their float accumulators in memory between runs of a batch."""
    if "@air.simdgroup_matrix_8x8_multiply_accumulate." not in text:
        return text
    text = unroll(text)
    numbers = itertools.count()  # names the batches' results
    areas = itertools.count() if keep_accumulators else None
    declarations: Dict[str, str] = {}
    text = edit_function_bodies(text, lambda body: _batch_body(body, numbers, declarations, areas))
    return text + "\n" + "\n".join(declarations.values()) + "\n"
