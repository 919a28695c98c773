"""Float 8x8 simdgroup products on tensor cores where their operands are half or bfloat.

MLX's steel GEMM loads its A and B fragments from half (or bfloat) threadgroup tiles into
float simdgroup matrices: each product multiplies values that are exactly half (bfloat)
numbers. matrix_products.py calls PLACEHOLDER for each float product; once LLVM has
optimized the kernel (fragments out of memory, in registers), each call whose A and B
elements are both ``fpext`` from half (or both from bfloat) becomes one ``mma.sync
m16n8k8`` with float accumulation (the products exact, the sums in the tensor core's
order: what the f16/bf16 path promises), every other call the exact path (24 shuffles, 16
fused multiply-adds in k order, bit for bit the CPU's). The tensor-core path needs the
lanes relabelled (lane_relabeling.py: A, C and D then already sit where mma.sync wants
them; B's column pairs take two shuffles, or come transposed by ldmatrix where the
fragments are read from a tile as fragment_matrices.py recognises) and the whole warp
present: it checks both at run time, per warp, and takes the exact path otherwise (one
call per run of products). f32 products never use TF32; a run of them whose fragments come
from tiles, in a kernel whose lanes are not relabelled, reads its operands there
(tile_reads.py).
"""

import re
from typing import Dict, List, Tuple

from .fragment_matrices import DECLARATIONS, check_lines, chunks, fragment_source, ldmatrix_lines, movable, reload_lines
from .matrix_products import PLACEHOLDER, exact_product_lines
from .tile_reads import ROLES, arguments as tile_arguments, check_lines as tile_check_lines, float_fragment, run_definition, struct_lines

__all__ = ["tensor_core_products", "exact_products"]

_CALL = re.compile(r"call <2 x float> @" + re.escape(PLACEHOLDER)
                   + r"\(<2 x float> (\S+), <2 x float> (\S+), <2 x float> (\S+), i1 (\S+)\)")
_DEFINED = re.compile(r"^\s*(%[-\w.$]+) = (.*)$", re.M)
_ASSIGNED = re.compile(r"^\s*(%[-\w.$]+) = ")
_MMA = {"half": "f16", "bfloat": "bf16"}
# The exact product where a tensor-core one finds part of its warp missing: called, not
# inlined, since launches of whole warps never run it and 32 inlined copies (24 shuffles, 16
# FMAs each) doubled the time LLVM and ptxas spend on steel GEMM and raised its registers.
_COLD = PLACEHOLDER + ".cold"
_NEEDED = ["declare float @llvm.fma.f32(float, float, float)", "declare i32 @llvm.nvvm.activemask()",
           "declare i32 @llvm.nvvm.read.ptx.sreg.laneid()",
           "declare i32 @llvm.nvvm.shfl.sync.idx.i32(i32, i32, i32, i32)"]


def _halves(value: str, defined: Dict[str, str]):
    """(kind, source) where each element of <2 x float> `value` is an fpext from half or
    bfloat (kind): source is the <2 x kind> value converted, or its two scalars; else None."""
    line = defined.get(value, "")
    vector = re.match(r"fpext <2 x (half|bfloat)> (\S+) to <2 x float>$", line)
    if vector:
        return vector.group(1), vector.group(2)
    scalars = []
    for slot in (1, 0):
        inserted = re.match(r"insertelement <2 x float> (\S+), float (\S+), i(?:32|64) (\d)$", line)
        if not inserted or int(inserted.group(3)) != slot:
            return None
        scalar = re.match(r"fpext (half|bfloat) (\S+) to float$", defined.get(inserted.group(2), ""))
        if not scalar:
            return None
        scalars.insert(0, scalar.groups())
        line = defined.get(inserted.group(1), "") if slot == 1 else ""
    if scalars[0][0] != scalars[1][0]:
        return None
    return scalars[0][0], (scalars[0][1], scalars[1][1])


def _origin(value: str, defined: Dict[str, str]) -> str:
    """'half' or 'bfloat' where each element of <2 x float> `value` is an fpext from that
    type, else ''."""
    found = _halves(value, defined)
    return found[0] if found else ""


def _packed(value: str, defined: Dict[str, str], name: str) -> List[str]:
    """Lines leaving i32 %`name`: the two halves (bfloats) `value` was converted from."""
    kind, source = _halves(value, defined)
    if isinstance(source, str):
        return [f"%{name} = bitcast <2 x {kind}> {source} to i32"]
    return [f"%{name}.v0 = insertelement <2 x {kind}> poison, {kind} {source[0]}, i32 0",
            f"%{name}.v = insertelement <2 x {kind}> %{name}.v0, {kind} {source[1]}, i32 1",
            f"%{name} = bitcast <2 x {kind}> %{name}.v to i32"]


_LINE = re.compile(r"^  (%[-\w.$]+) = (?:tail )?call <2 x float> @" + re.escape(PLACEHOLDER)
                   + r"\(<2 x float> (\S+), <2 x float> (\S+), <2 x float> (\S+), i1 (\S+)\)(?: #\d+)?$")


def _batched(lines: List[str], defined: Dict[str, str], definitions: List[str], checks: Dict[str, str]) -> List[str]:
    """`lines` with each run of consecutive tensor-core products (same kind, same lanes flag,
    none reading another's result) as one call: B's fragment converted once, products that
    share B paired into one m16n8k8 (rows 8-15 the second's), one whole-warp test per run;
    fragments read by ldmatrix where fragment_matrices.py finds their form; runs of float
    products read from their tiles where tile_reads.py finds theirs (`checks`: each base
    used, with its role for tile reads, -> the name of its run-time check)."""
    positions = {match.group(1): n for n, match in enumerate(map(_ASSIGNED.match, lines)) if match}
    out: List[str] = []
    k = 0
    while k < len(lines):
        end = k
        while end < len(lines) and _LINE.match(lines[end]):
            end += 1
        if end == k:
            out.append(lines[k])
            k += 1
            continue
        calls = [_LINE.match(line).groups() for line in lines[k:end]]
        kinds = {_origin(c[1], defined) if _origin(c[1], defined) == _origin(c[2], defined) else "" for c in calls}
        results = {c[0] for c in calls}
        operands = {v for c in calls for v in c[1:5]}
        kind = kinds.pop() if len(kinds) == 1 else ""
        flags = {c[4] for c in calls}
        if kind and len(flags) == 1 and flags != {"false"} and not results & operands:
            sources = [_matrix_sources([c[i] for c in calls], kind, defined, lines, k, positions) for i in (1, 2)]
            out += _run_call(len(definitions), kind, calls, defined, definitions, sources, checks)
        elif not kind and flags == {"false"} and not results & operands \
                and (tiles := _tile_sources(calls, defined, lines, k, positions)):
            out += _tile_run_call(len(definitions), calls, tiles, definitions, checks)
        else:
            out += lines[k:end]
        k = end
    return out


def _tile_sources(calls, defined: Dict[str, str], lines: List[str], at: int, positions: Dict[str, int]):
    """For "a" and "b", the (base, offset) of each distinct fragment of a run of float
    products where every one can be read from its tile at line `at` (tile_reads.py), else None."""
    found = {}
    for role, column in (("a", 1), ("b", 2)):
        found[role] = []
        for value in dict.fromkeys(c[column] for c in calls):
            source = float_fragment(value, defined)
            if source is None or source[1] % ROLES[role] or not movable(source[2], lines, at, positions):
                return None
            found[role].append(source[:2])
    return found


def _tile_run_call(run: int, calls, tiles, definitions: List[str], checks: Dict) -> List[str]:
    """The lines replacing one run of float products whose fragments each lane reads from
    their tiles (tiles: _tile_sources); its function into `definitions`."""
    values = {role: list(dict.fromkeys(c[column] for c in calls)) for role, column in (("a", 1), ("b", 2))}
    shape = [(values["a"].index(c[1]), values["b"].index(c[2])) for c in calls]
    groups, fragments, arguments = [], {"a": [], "b": []}, []
    for role in ("a", "b"):
        index: Dict[str, int] = {}
        for base, offset in tiles[role]:
            if base not in index:
                index[base] = len(index)
                groups.append((role, index[base]))
                arguments += tile_arguments(role, checks.setdefault((base, role), f"tmr{len(checks)}"), base)
            fragments[role].append((index[base], offset))
    arguments += [f"<2 x float> {c[3]}" for c in calls]
    struct = "{ " + ", ".join(["<2 x float>"] * len(calls)) + " }"
    name = f"tm.cuda.products.float.{run}"
    exact_run = _exact_run(len(values["a"]), len(values["b"]), shape)
    if exact_run[1] not in definitions:
        definitions.append(exact_run[1])
    definitions.append(run_definition(name, groups, fragments, shape, struct, exact_run[0]))
    return ([f"%tr{run} = call {struct} @{name}({', '.join(arguments)})"]
            + [f"{c[0]} = extractvalue {struct} %tr{run}, {n}" for n, c in enumerate(calls)])


def _checked(lines: List[str], checks: Dict[str, str]) -> List[str]:
    """`lines` with each base's run-time check (fragment_matrices.check_lines; for a (base,
    role) key, tile_reads.check_lines) after the definition of the base, in the function
    that uses it."""
    for key, name in checks.items():
        base = key if isinstance(key, str) else key[0]
        made = check_lines(base, name) if isinstance(key, str) else tile_check_lines(*key, name)
        use = next(n for n, line in enumerate(lines) if f"%{name}.ok" in line)
        start = max(n for n in range(use + 1) if lines[n].startswith("define "))
        at = next(n for n in range(start, len(lines)) if lines[n].startswith(f"  {base} = "))
        lines[at + 1:at + 1] = ["  " + line for line in made]
    return lines


def _matrix_sources(values: List[str], kind: str, defined: Dict[str, str], lines: List[str], at: int,
                    positions: Dict[str, int]):
    """(base, offset) of each distinct fragment of `values` where every one can be read by
    ldmatrix at line `at` (fragment_matrices.py), else None."""
    found = []
    for value in dict.fromkeys(values):
        source = fragment_source(_halves(value, defined)[1], kind, defined)
        if source is None or not movable(source[2], lines, at, positions):
            return None
        found.append(source[:2])
    return found


def _run_call(run: int, kind: str, calls, defined: Dict[str, str], definitions: List[str], sources,
              checks: Dict[str, str]) -> List[str]:
    """The lines replacing one run of products (_batched); its function into `definitions`.
    sources: for A and for B, the (base, offset) of each fragment where ldmatrix reads them."""
    a_values = list(dict.fromkeys(c[1] for c in calls))
    b_values = list(dict.fromkeys(c[2] for c in calls))
    lines: List[str] = []
    arguments: List[str] = []
    groups = []  # (operand, fragment indices, offsets) of each ldmatrix
    for operand, values, found in (("a", a_values, sources[0]), ("b", b_values, sources[1])):
        if found is None:
            for i, value in enumerate(values):
                lines += _packed(value, defined, f"tc{run}.p{operand}{i}")
            arguments += [f"i32 %tc{run}.p{operand}{i}" for i in range(len(values))]
            arguments += [f"<2 x float> {v}" for v in values]
            continue
        for indices in chunks(found):
            base = found[indices[0]][0]
            check = checks.setdefault(base, f"tcm{len(checks)}")
            arguments += [f"i32 %{check}.row", f"i1 %{check}.ok", f"ptr addrspace(3) {base}"]
            groups.append((operand, indices, [found[i][1] for i in indices]))
    arguments += [f"<2 x float> {c[3]}" for c in calls] + [f"i1 {calls[0][4]}"]
    struct = "{ " + ", ".join(["<2 x float>"] * len(calls)) + " }"
    name = f"tm.cuda.products.{kind}.{run}"
    lines.append(f"%tc{run} = call {struct} @{name}({', '.join(arguments)})")
    lines += [f"{c[0]} = extractvalue {struct} %tc{run}, {n}" for n, c in enumerate(calls)]
    shape = [(a_values.index(c[1]), b_values.index(c[2])) for c in calls]
    read = [sources[0] is not None, sources[1] is not None]
    exact_run = _exact_run(len(a_values), len(b_values), shape)
    if exact_run[1] not in definitions:
        definitions.append(exact_run[1])
    definitions.append(_run_definition(name, kind, len(a_values), len(b_values), shape, struct, read, groups,
                                       exact_run))
    return lines


def _run_definition(name: str, kind: str, a_count: int, b_count: int, shape, struct: str, read, groups,
                    exact_run) -> str:
    """The function of one run: shape[n] = (A index, B index) of product n; read[0] (read[1]):
    A's (B's) fragments come by ldmatrix, in `groups` (_run_call), else packed by the caller;
    `exact_run`: (name, definition) of its exact products (_exact_run)."""
    mma = _MMA[kind]
    parameters, go, matrices, reloads = [], ["%whole", "%relabel"], [], []
    for operand, count, by_ldmatrix in (("a", a_count, read[0]), ("b", b_count, read[1])):
        if not by_ldmatrix:  # in _run_call's order
            parameters += [f"i32 %p{operand}{i}" for i in range(count)]
            parameters += [f"<2 x float> %{operand}{i}" for i in range(count)]
        parameters += [f"{t} %{n}{g}" for g, group in enumerate(groups) if group[0] == operand
                       for t, n in (("i32", "row"), ("i1", "ok"), ("ptr addrspace(3)", "base"))]
    for g, (operand, indices, offsets) in enumerate(groups):
        go.append(f"%ok{g}")
        matrices += ldmatrix_lines(f"%row{g}", offsets, operand == "b", f"lm{g}")
        for q, i in enumerate(indices):
            matrices.append(f"%{'pa' if operand == 'a' else 'bf'}{i} = or i32 %lm{g}.{q}, 0")
            reloads += reload_lines(f"%base{g}", offsets[q], kind, f"{operand}{i}")
    parameters += [f"<2 x float> %c{n}" for n in range(len(shape))] + ["i1 %relabel"]
    lines = ["%all = call i32 @llvm.nvvm.activemask()", "%whole = icmp eq i32 %all, -1"]
    for n in range(1, len(go)):
        lines.append(f"%go{n} = and i1 {go[n - 1] if n == 1 else f'%go{n - 1}'}, {go[n]}")
    lines += [f"br i1 %go{len(go) - 1}, label %mma, label %exact", "mma:"] + matrices
    lines += ["%l = call i32 @llvm.nvvm.read.ptx.sreg.laneid()", "%g = lshr i32 %l, 2", "%t = and i32 %l, 3",
              # B[2t][g] and B[2t+1][g]: in the pairs of lanes 8t + g/2 and 8t + 4 + g/2, half g&1.
              "%t8 = shl i32 %t, 3", "%g2 = lshr i32 %g, 1", "%src0 = or i32 %t8, %g2", "%src1 = add i32 %src0, 4",
              "%odd = and i32 %g, 1", "%shift = shl i32 %odd, 4"]
    for j in range(b_count if not read[1] else 0):
        lines += [f"%s0.{j} = call i32 @llvm.nvvm.shfl.sync.idx.i32(i32 -1, i32 %pb{j}, i32 %src0, i32 31)",
                  f"%s1.{j} = call i32 @llvm.nvvm.shfl.sync.idx.i32(i32 -1, i32 %pb{j}, i32 %src1, i32 31)",
                  f"%e0.{j} = lshr i32 %s0.{j}, %shift", f"%lo.{j} = and i32 %e0.{j}, 65535",
                  f"%e1.{j} = lshr i32 %s1.{j}, %shift", f"%hi.{j} = shl i32 %e1.{j}, 16",
                  f"%bf{j} = or i32 %lo.{j}, %hi.{j}"]
    pairs, waiting = [], {}
    for n, (_, j) in enumerate(shape):  # products sharing B, two by two in order
        if j in waiting:
            pairs.append((waiting.pop(j), n))
        else:
            waiting[j] = n
    pairs += [(n, None) for n in waiting.values()]
    made = {}
    for m, (p, q) in enumerate(pairs):
        lines += [f"%cp{m}.{e} = extractelement <2 x float> %c{p}, i32 {e}" for e in (0, 1)]
        if q is not None:
            lines += [f"%cq{m}.{e} = extractelement <2 x float> %c{q}, i32 {e}" for e in (0, 1)]
        high = f"%pa{shape[q][0]}" if q is not None else "0"
        cq = [f"float %cq{m}.0", f"float %cq{m}.1"] if q is not None else ["float 0.0", "float 0.0"]
        lines += [f'%d{m} = call {{ float, float, float, float }} asm sideeffect "mma.sync.aligned.m16n8k8.row.col.'
                  f'f32.{mma}.{mma}.f32 {{$0,$1,$2,$3}}, {{$4,$5}}, {{$6}}, {{$7,$8,$9,$10}};", '
                  f'"=f,=f,=f,=f,r,r,r,f,f,f,f"(i32 %pa{shape[p][0]}, i32 {high}, i32 %bf{shape[p][1]}, '
                  f"float %cp{m}.0, float %cp{m}.1, {', '.join(cq)}) convergent nounwind"]
        for half, n in ((0, p), (1, q)):
            if n is None:
                continue
            lines += [f"%m{m}.{half}.{e} = extractvalue {{ float, float, float, float }} %d{m}, {2 * half + e}"
                      for e in (0, 1)]
            lines += [f"%r{n}.0 = insertelement <2 x float> poison, float %m{m}.{half}.0, i32 0",
                      f"%r{n} = insertelement <2 x float> %r{n}.0, float %m{m}.{half}.1, i32 1"]
            made[n] = f"%r{n}"
    lines += struct_lines(struct, [made[n] for n in range(len(shape))], "sm") + ["br label %done", "exact:"] + reloads
    # The exact products: one call for the run, so that nothing the loop keeps in registers
    # lives across it (a call per product raised steel GEMM's registers from 64 to 96).
    operands = ([f"<2 x float> %c{n}" for n in range(len(shape))] + [f"<2 x float> %a{i}" for i in range(a_count)]
                + [f"<2 x float> %b{j}" for j in range(b_count)])
    lines.append(f"%se = call {struct} @{exact_run[0]}({', '.join(operands)}, i1 %relabel)")
    lines += ["br label %done", "done:", f"%r = phi {struct} [ %sm, %mma ], [ %se, %exact ]", f"ret {struct} %r"]
    body = "\n  ".join(lines)
    return (f"define internal {struct} @{name}({', '.join(parameters)}) alwaysinline convergent nounwind "
            f"{{\nentry:\n  {body}\n}}")


def _exact_run(a_count: int, b_count: int, shape) -> Tuple[str, str]:
    """(name, definition) of the exact products of a run of `shape` (_run_definition): C
    values, then A's and B's, in; the D values out. The operands go through a local array,
    read as each product needs them: few values live across its calls (ptxas reads every
    parameter at once, which raised steel GEMM's registers from 72 to 96)."""
    name = f"{PLACEHOLDER}.run.{a_count}.{b_count}." + ".".join(f"{i}_{j}" for i, j in shape)
    struct = "{ " + ", ".join(["<2 x float>"] * len(shape)) + " }"
    operands = ([f"%c{n}" for n in range(len(shape))] + [f"%a{i}" for i in range(a_count)]
                + [f"%b{j}" for j in range(b_count)])
    array = f"[{len(operands)} x <2 x float>]"
    lines = [f"%buf = alloca {array}, align 8"]
    for k, value in enumerate(operands):
        lines += [f"%slot{k} = getelementptr {array}, ptr %buf, i32 0, i32 {k}",
                  f"store volatile <2 x float> {value}, ptr %slot{k}, align 8"]
    for n, (i, j) in enumerate(shape):
        slots = {"c": n, "a": len(shape) + i, "b": len(shape) + a_count + j}
        lines += [f"%{o}{n}.v = load volatile <2 x float>, ptr %slot{k}, align 8" for o, k in slots.items()]
        lines.append(f"%x{n} = call <2 x float> @{_COLD}(<2 x float> %a{n}.v, <2 x float> %b{n}.v, "
                     f"<2 x float> %c{n}.v, i1 %relabel)")
    lines += struct_lines(struct, [f"%x{n}" for n in range(len(shape))], "s") + [f"ret {struct} %s"]
    body = "\n  ".join(lines)
    return name, (f"define internal {struct} @{name}({', '.join('<2 x float> ' + v for v in operands)}, "
                  f"i1 %relabel) noinline convergent nounwind {{\n  {body}\n}}")


def tensor_core_products(text: str) -> str:
    """`text` (an optimized module) with PLACEHOLDER defined: runs of tensor-core products
    batched (_batched), every other call a tensor-core product where its A and B are half
    (bfloat) values, else the exact one; `text` itself where it has no such call."""
    if f"@{PLACEHOLDER}(" not in text:
        return text
    defined = {name: rest.split(", !")[0].strip() for name, rest in _DEFINED.findall(text)}
    definitions: List[str] = []
    checks: Dict[str, str] = {}
    text = "\n".join(_checked(_batched(text.split("\n"), defined, definitions, checks), checks))
    if checks:
        declared = set(re.findall(r"^declare [^\n]*?@([-\w$.]+)\(", text, re.M))
        definitions += [d for d in DECLARATIONS if re.search(r"@([-\w$.]+)\(", d).group(1) not in declared]
    used = set()

    def route(match) -> str:
        a, b = _origin(match.group(1), defined), _origin(match.group(2), defined)
        # Lanes not relabelled (i1 false: the kernel's other SIMD-group functions) never reach tensor cores.
        kind = a if a and a == b and match.group(4) != "false" else "exact"
        used.add(kind)
        return match.group(0).replace(f"@{PLACEHOLDER}(", f"@{PLACEHOLDER}.{kind}(", 1)

    text = _CALL.sub(route, text)
    definitions += [_tensor_core(kind) for kind in sorted(used - {"exact"})]
    if definitions:
        definitions.append(_exact(_COLD, "noinline"))
    return exact_products(text, definitions)


def exact_products(text: str, definitions: List[str] = ()) -> str:
    """`text` with PLACEHOLDER's remaining calls the exact product (inlined), and `definitions`
    (the tensor-core products') added. Lowering calls it where no product can reach tensor
    cores (the lanes are not relabelled: no half or bfloat value, or other SIMD-group
    functions): such kernels then skip the second optimization tensor_core_products needs."""
    text = re.sub(r"^declare [^\n]*@" + re.escape(PLACEHOLDER) + r"\([^\n]*\n", "", text, flags=re.M)
    # Operands _CALL does not read (constants with spaces): the exact product.
    text = text.replace(f"@{PLACEHOLDER}(", f"@{PLACEHOLDER}.exact(")
    declared = set(re.findall(r"^declare [^\n]*?@([-\w$.]+)\(", text, re.M))
    needed = [d for d in _NEEDED if re.search(r"@([-\w$.]+)\(", d).group(1) not in declared]
    return text + "\n" + "\n".join(list(definitions) + [_exact(f"{PLACEHOLDER}.exact", "alwaysinline")] + needed) + "\n"


def _elements(prefix: str = "") -> List[str]:
    return [f"%{prefix}f{operand}{k} = extractelement <2 x float> %{operand}, i32 {k}" for operand in "abc" for k in (0, 1)]


def _exact_body() -> List[str]:
    return _elements() + exact_product_lines() + [
        "%e.0 = insertelement <2 x float> poison, float %d0.7, i32 0",
        "%e = insertelement <2 x float> %e.0, float %d1.7, i32 1"]


def _exact(name: str, inlining: str) -> str:
    body = "\n  ".join(_exact_body() + ["ret <2 x float> %e"])
    return (f"define internal <2 x float> @{name}(<2 x float> %a, <2 x float> %b, <2 x float> %c, "
            f"i1 %relabel) {inlining} convergent nounwind {{\n  {body}\n}}")


def _tensor_core(kind: str) -> str:
    """One m16n8k8 (rows 8-15 of A zero, D's rows 0-7 kept) where the whole warp runs
    relabelled, else the exact product."""
    mma = _MMA[kind]
    lines = ["%all = call i32 @llvm.nvvm.activemask()", "%whole = icmp eq i32 %all, -1",
             "%go = and i1 %whole, %relabel", "br i1 %go, label %mma, label %exact", "mma:",
             f"%ah = fptrunc <2 x float> %a to <2 x {kind}>", f"%ai = bitcast <2 x {kind}> %ah to i32",
             f"%bh = fptrunc <2 x float> %b to <2 x {kind}>", f"%bi = bitcast <2 x {kind}> %bh to i32",
             "%l = call i32 @llvm.nvvm.read.ptx.sreg.laneid()", "%g = lshr i32 %l, 2", "%t = and i32 %l, 3",
             # B[2t][g] and B[2t+1][g]: in the pairs of lanes 8t + g/2 and 8t + 4 + g/2, half g&1.
             "%t8 = shl i32 %t, 3", "%g2 = lshr i32 %g, 1", "%src0 = or i32 %t8, %g2", "%src1 = add i32 %src0, 4",
             "%s0 = call i32 @llvm.nvvm.shfl.sync.idx.i32(i32 -1, i32 %bi, i32 %src0, i32 31)",
             "%s1 = call i32 @llvm.nvvm.shfl.sync.idx.i32(i32 -1, i32 %bi, i32 %src1, i32 31)",
             "%odd = and i32 %g, 1", "%shift = shl i32 %odd, 4", "%e0 = lshr i32 %s0, %shift",
             "%lo = and i32 %e0, 65535", "%e1 = lshr i32 %s1, %shift", "%hi = shl i32 %e1, 16", "%bf = or i32 %lo, %hi",
             "%c0 = extractelement <2 x float> %c, i32 0", "%c1 = extractelement <2 x float> %c, i32 1",
             f'%d = call {{ float, float, float, float }} asm sideeffect "mma.sync.aligned.m16n8k8.row.col.f32.{mma}.'
             f'{mma}.f32 {{$0,$1,$2,$3}}, {{$4,$5}}, {{$6}}, {{$7,$8,$9,$10}};", "=f,=f,=f,=f,r,r,r,f,f,f,f"'
             "(i32 %ai, i32 0, i32 %bf, float %c0, float %c1, float 0.0, float 0.0) convergent nounwind",
             "%m0 = extractvalue { float, float, float, float } %d, 0",
             "%m1 = extractvalue { float, float, float, float } %d, 1",
             "%m.0 = insertelement <2 x float> poison, float %m0, i32 0",
             "%m = insertelement <2 x float> %m.0, float %m1, i32 1", "br label %done", "exact:"]
    lines += [f"%e = call <2 x float> @{_COLD}(<2 x float> %a, <2 x float> %b, <2 x float> %c, i1 %relabel)",
              "br label %done", "done:", "%r = phi <2 x float> [ %m, %mma ], [ %e, %exact ]", "ret <2 x float> %r"]
    body = "\n  ".join(lines)
    return (f"define internal <2 x float> @{PLACEHOLDER}.{kind}(<2 x float> %a, <2 x float> %b, <2 x float> %c, "
            f"i1 %relabel) alwaysinline convergent nounwind {{\nentry:\n  {body}\n}}")
