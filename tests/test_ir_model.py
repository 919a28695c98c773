"""The IR model (torch_metallib/reflection/ir_model.py): the one reader of function bodies.

* On every fixture kernel and on the lowering's own output for MLX kernels, its blocks,
  control-flow graph, phis, opcodes and result types are LLVM's own (llvmlite's reader, after naming
  every block).
* Quoted labels and names, switches over several lines, phis: read once, the same way.
* The vector-access rewrite, which had a reader of its own, now versions a run whose
  values or blocks are quoted (before: a block quoted left the function alone, a value
  quoted was defined twice, which LLVM refused).
"""

import pathlib
import re

import llvmlite.binding as llvm
import pytest

from torch_metallib.reflection import ir_model
from torch_metallib.backends.cpu.bounds_checks import instrument_accesses
from torch_metallib.backends.cpu.jit import lowered_ir
from torch_metallib.backends.cuda.lowering import lower as cuda_lower
from torch_metallib.backends.cuda.ptx import air_text
from torch_metallib.backends.cuda.vector_accesses import vector_accesses

FIXTURES = sorted((pathlib.Path(__file__).parent / "fixtures").rglob("*.ll"))


def _named(text: str) -> llvm.ModuleRef:
    """`text` parsed, every block and value given a name (so both readers can name them)."""
    llvm.initialize_native_target()
    module = llvm.parse_assembly(text)
    manager = llvm.create_new_module_pass_manager()
    manager.add_instruction_namer_pass()
    manager.run(module, llvm.create_pass_builder(llvm.Target.from_default_triple().create_target_machine(),
                                                 llvm.create_pipeline_tuning_options()))
    return module


def _agrees_with_llvm(text: str) -> None:
    """The model reads `text`'s functions, blocks, successors, phis, opcodes and result types
    as LLVM does."""
    module = _named(text)
    lines = str(module).split("\n")
    read = {f.name: f for f in ir_model.functions(lines)}
    defined = [f for f in module.functions if not f.is_declaration]
    assert sorted(read) == sorted(f.name for f in defined)
    for function in defined:
        found = ir_model.blocks(read[function.name].body)
        graph = ir_model.successors(found)
        assert list(found) == [b.name for b in function.blocks]
        for block in function.blocks:
            instructions = list(block.instructions)
            targets = [op.name for op in instructions[-1].operands if str(op.type) == "label"]
            assert sorted(graph[block.name]) == sorted(targets), (function.name, block.name)
            phis = [i for i in instructions if i.opcode == "phi"]
            assert [ir_model.defined_name(line) for line in found[block.name].phis()] == [f"%{p.name}" for p in phis]
            texts = found[block.name].instructions()
            assert [ir_model.opcode(text) for text in texts] == [i.opcode for i in instructions], block.name
            for text, instruction in zip(texts, instructions):
                kind = ir_model.result_type(text)  # None where the text does not tell (the rewrite then stops)
                assert kind is None or kind == str(instruction.type), text


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_fixture_kernels_read_as_llvm_reads_them(path):
    _agrees_with_llvm(path.read_text())


@pytest.mark.parametrize("name", ["rmsfloat32", "rms_loopedfloat16", "vv_Addfloat32"])
def test_lowered_kernels_read_as_llvm_reads_them(mlx_lib, name):
    """The lowering's own output (CUDA's NVVM IR, the CPU's cooperative host IR) of MLX kernels."""
    function = mlx_lib[name]
    nvvm, _ = cuda_lower(air_text(function), function.name, function.arguments, {}, "k", "")
    _agrees_with_llvm(nvvm)
    _agrees_with_llvm(lowered_ir(function, {}, "s", cooperative=True))


_QUOTED = """
define i32 @f(i32 %n, ptr %p) {
entry:
  %"first value" = add i32 %n, 1
  switch i32 %n, label %"the end" [
    i32 0, label %"loop body"
    i32 1, label %other
  ]

"loop body":                                      ; preds = %"loop body", %entry
  %"i.x" = phi i32 [ 0, %entry ], [ %"next one", %"loop body" ]
  %"next one" = add nsw i32 %"i.x", %"first value"
  %done = icmp sgt i32 %"next one", 10
  br i1 %done, label %"the end", label %"loop body"

other:
  %v = load <4 x float>, ptr %p, align 16
  br label %"the end"

"the end":
  %r = phi i32 [ %"next one", %"loop body" ], [ 7, %other ], [ %n, %entry ]
  ret i32 %r
}
"""


def test_quoted_labels_switches_and_phis():
    llvm.parse_assembly(_QUOTED).verify()  # valid IR, as LLVM prints it
    body = next(ir_model.functions(_QUOTED.split("\n"))).body
    found = ir_model.blocks(body)
    assert list(found) == ["entry", '"loop body"', "other", '"the end"']
    assert ir_model.successors(found) == {"entry": ['"the end"', '"loop body"', "other"],
                                          '"loop body"': ['"the end"', '"loop body"'],
                                          "other": ['"the end"'], '"the end"': []}
    assert found["entry"].terminator()[0].strip().startswith("switch ")
    phi = ir_model.Phi.read(found['"loop body"'].phis()[0])
    assert phi.name == '%"i.x"' and phi.entries == [("0", "%entry"), ('%"next one"', '%"loop body"')]
    assert phi.text() == found['"loop body"'].phis()[0]
    moved = ir_model.retarget_phis(found['"the end"'].lines, {"loop body": "x", '"loop body"': "tail"})
    assert "[ %\"next one\", %tail ]" in moved[0] and "[ 7, %other ]" in moved[0]
    assert ir_model.used_names(found['"loop body"'].lines[1]) == ['%"next one"', '%"i.x"', '%"first value"']
    copy = {name: ir_model.renamed(name, "tm.c") for name in ('%"next one"', "%done")}
    assert ir_model.substitute(found['"loop body"'].lines[2], copy) == \
        '  %tm.c.done = icmp sgt i32 %"tm.c.next one", 10'


@pytest.mark.parametrize("line, kind", [
    ('  %"a b" = add nsw i32 %x, 1', "i32"),
    ("  %c = icmp ult <4 x i32> %a, %b", "<4 x i1>"),
    ("  %g = getelementptr inbounds i8, ptr addrspace(1) %p, i64 4", "ptr addrspace(1)"),
    ("  %t = tail call float @llvm.fma.f32(float %a, float %b, float %c)", "float"),
    ("  %v = load <4 x float>, ptr %p, align 16", "<4 x float>"),
    ("  %s = sext i32 %i to i64", "i64"),
    ("  %e = extractelement <4 x half> %v, i64 0", "half"),
    ("  %agg = insertvalue { i32, i32 } undef, i32 1, 0", None),
    ("  call void @g()", None),
])
def test_result_types(line, kind):
    assert ir_model.result_type(line) == kind


def test_edit_function_bodies_sees_every_body_once():
    text = _QUOTED + _QUOTED.replace("@f(", "@g(")
    seen = []
    assert ir_model.edit_function_bodies(text, lambda body: seen.append(body) or body) == text
    assert len(seen) == 2 and seen[0] == seen[1]


_RUN = """
define void @k(ptr addrspace(1) %x, ptr addrspace(1) %y) {
entry:
  br label %LABEL

LABEL:
  %a0 = load float, ptr addrspace(1) %x, align 4
  %1 = getelementptr inbounds i8, ptr addrspace(1) %x, i64 4
  %a1 = load float, ptr addrspace(1) %1, align 4
  store float %a0, ptr addrspace(1) %y, align 4
  %"sum a" = fadd float %a0, %a1
  %2 = getelementptr inbounds i8, ptr addrspace(1) %y, i64 4
  store float %"sum a", ptr addrspace(1) %2, align 4
  ret void
}
"""


@pytest.mark.parametrize("label", ["run", '"the run"'])
def test_runs_with_quoted_labels_and_values_are_versioned(label):
    """Quoted labels and values are the model's names like any other: the run is versioned
    (two 8-byte chunks), each copy defines its own values, and LLVM accepts the result.
    (The rewrite's own reader left a function with a quoted label alone, and copied a
    quoted value's definition into both copies unrenamed, which LLVM refused.)"""
    text = _RUN.replace("LABEL", label)
    versioned = vector_accesses(text)
    assert versioned != text
    llvm.parse_assembly(versioned).verify()
    aligned = versioned[versioned.index(".aligned:"):versioned.index(".scalar:")]
    assert re.findall(r", align (\d+)", aligned) == ["8", "4", "8", "4"]
    assert '%"tm.v1a.sum a" = fadd float' in aligned
    assert '%"sum a" = phi float [ %"tm.v1a.sum a", %tm.v1.aligned ], [ %"tm.v1s.sum a", %tm.v1.scalar ]' in versioned


def test_checked_kernels_check_accesses_whatever_their_values_are_named():
    """bounds_checks reads names through the model: a load whose value is quoted is checked
    like any other (its own pattern of bare names skipped it, unchecked)."""
    text = """define void @k(ptr addrspace(1) %p) {
entry:
  %"a b" = load float, ptr addrspace(1) %p, align 4
  %c = load float, ptr addrspace(1) %p, align 4
  ret void
}
"""
    instrumented, _ = instrument_accesses(text, "k")
    assert instrumented.count("call ptr addrspace(1) @tm.check.1(") == 2
    assert '%"a b" = load float, ptr addrspace(1) %tm.chk1, align 4' in instrumented


def _with_quoted_kernel(name: str) -> str:
    """vector_add_float's fixture with its kernel renamed `name` (printed quoted) and its
    addition moved into a helper, also quoted, that calls an intrinsic declaration."""
    text = (pathlib.Path(__file__).parent / "fixtures" / "vector_add_float.ll").read_text()
    text = text.replace("@vector_add_float(", f'@"{name}"(').replace("ptr @vector_add_float,", f'ptr @"{name}",')
    text = text.replace("  %10 = fadd float %7, %9", '  %10 = call float @"add two.floats"(float %7, float %9)')
    return text + """
define internal float @"add two.floats"(float %a, float %b) {
  %s = call float @air.fast_fmax.f32(float %a, float %b)
  ret float %s
}

declare float @air.fast_fmax.f32(float, float)
"""


def test_functions_with_quoted_names_are_found_by_name():
    """A function whose name LLVM prints quoted (``@"vector add.float"``) is found by its
    name, bare or as printed, and what it reaches through a quoted helper is reached (the
    lookup compared the printed name, quotes and all, and found nothing)."""
    text = _with_quoted_kernel("vector add.float")
    llvm.parse_assembly(text).verify()
    lines = text.split("\n")
    for name in ("vector add.float", '"vector add.float"'):
        found = ir_model.function(lines, name)
        assert found is not None and found.header.startswith('define weak_odr void @"vector add.float"(')
        assert len(found.parameters()) == 4
    assert ir_model.function(lines, "add two.floats").body[0].endswith("@air.fast_fmax.f32(float %a, float %b)")
    assert ir_model.reachable(lines, ["vector add.float"]) == {"vector add.float", "add two.floats",
                                                               "air.fast_fmax.f32"}
    assert ir_model.unquoted('"say \\22hi\\22"') == 'say "hi"'  # LLVM escapes a quote in a name


@pytest.mark.parametrize("name, inside_quotes", [("vector add.float", "vector add.float"),
                                                  ('say "max"', "say \\22max\\22"),
                                                  ("max\u00b7two", "max\\C2\\B7two")])
def test_kernels_with_quoted_names_run_on_the_cpu_and_lower_for_cuda(name, inside_quotes):
    """A kernel whose name is not a bare LLVM identifier runs on the CPU backend and lowers
    for CUDA: the entries the backends wrap around it call it by its name as LLVM prints it
    (they wrote ``call void @vector add.float(`` and LLVM refused the module)."""
    import torch

    import torch_metallib as tm
    from torch_metallib.backends.cuda.ptx import kernel_ptx, ptxas_path, run_ptxas

    llvm.initialize_native_target()
    library = tm.load(tm.pack_modules([llvm.parse_assembly(_with_quoted_kernel(inside_quotes))]))
    assert library.function_names == (name,)
    kernel = library[name]
    a, b = torch.randn(100, generator=torch.Generator().manual_seed(3)), torch.randn(100)
    out = torch.empty(100)
    kernel(a, b, out, threads=100)
    assert torch.equal(out, torch.maximum(a, b))
    ptx = kernel_ptx(kernel, {}, "quoted")
    assert ".entry __tm_cuda_quoted(" in ptx
    if ptxas_path() is not None:
        result = run_ptxas(ptx, "sm_80")
        assert result.returncode == 0, result.stderr[:1000]
