"""torch_metallib.ops.define: metallib kernels as torch.library operators.

* Registration errors: each mistake is refused with an OpDefinitionError naming the kernel
  and argument and saying how to fix it, and nothing is registered (the same name defines
  fine once fixed); a definition's mistakes are all listed in one error.
* Rules: the native evaluator (eager calls) and the Python one (meta / fake tensors,
  Rule.evaluate) agree, Python's floor division and modulo included; rule errors at call.
* The documentation's example operators (tests/_ops_examples.py) pass torch.library.opcheck, export
  and compile with dynamic shapes.
* Preconditions (require=): refused calls in eager, meta, autograd and compiled calls, each
  naming the precondition and the values found; nothing written.
* Debug CPU schedules (cpu_schedule and TORCH_METALLIB_CPU_SCHEDULE) reach the operators.

Every operator defined here lives in namespace tm_define_tests, one name per test (an
operator cannot be defined twice in a process).
"""

import dataclasses
import json
import operator
import os
import subprocess
import sys
from typing import Optional, Tuple

import pytest
import torch
import torch._dynamo.testing

import torch_metallib as tm
from _ops_define import F32, GROUP, GROUPS, NS, define_left_neighbour, left_neighbours, ramp
from torch_metallib import ops

SIGMOID = "v_Sigmoid{dtype}{dtype}"  # (in, out, size): size unused


# --- helpers -------------------------------------------------------------------------------

def registered(qualname: str) -> bool:
    """Whether torch knows operator `qualname` ("ns::name") at all."""
    namespace, name = qualname.split("::")
    return hasattr(getattr(torch.ops, namespace), name.split(".")[0])


def has_cpu_kernel(qualname: str) -> bool:
    return registered(qualname) and torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "CPU")


def sigmoid_options(**overrides) -> dict:
    """ops.define options of a working elementwise sigmoid on float32 (schema: Tensor x)."""
    options = dict(dtypes=F32, bind={"in": "x", "size": ops.numel("x")}, outputs={"out": ops.like("x")},
                   threads=ops.numel("x"))
    options.update(overrides)
    return options


def rms_options(**overrides) -> dict:
    options = dict(dtypes=F32, bind={"axis_size": ops.size("x", -1), "w_stride": 1},
                   outputs={"out": ops.like("x")}, threads=ops.numel("x"))
    options.update(overrides)
    return options


def scale_options(**overrides) -> dict:
    """function_constant_scale(in, out, bias [use_bias]; constant float alpha)."""
    options = dict(dtypes=F32, bind={"in": "x"}, outputs={"out": ops.like("x")},
                   constants={"use_bias": False, "alpha": 2.0}, threads=ops.numel("x"))
    options.update(overrides)
    return options


def group_sum_options(**overrides) -> dict:
    """threadgroup_sum_float(in, out, threadgroup float* scratch): out[group] = its sum."""
    options = dict(dtypes=F32, bind={"in": "x"}, outputs={"out": ops.empty((ops.numel("x") // GROUP,), "x")},
                   threads=ops.numel("x"), group_size=GROUP, threadgroup_memory={0: GROUP * 4})
    options.update(overrides)
    return options


@pytest.fixture(scope="module")
def libraries(mlx_lib, fixture_metallib) -> dict:
    return {"mlx": mlx_lib, "fixtures": tm.load(fixture_metallib)}


# --- registration errors -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Refused:
    id: str
    schema: str        # "{op}" stands for tm_define_tests::refused_<id>, "{name}" for refused_<id>
    library: str       # "mlx" or "fixtures"
    kernel: object
    options: dict
    fragments: Tuple[str, ...]

    @property
    def name(self) -> str:
        return f"refused_{self.id}"

    @property
    def qualname(self) -> str:
        return f"{NS}::{self.name}"

    def fill(self, text: str) -> str:
        return text.replace("{op}", self.qualname).replace("{name}", self.name)

    def define(self, libraries, name: Optional[str] = None, **overrides):
        schema = self.fill(self.schema)
        if name is not None:
            schema = schema.replace(self.qualname, f"{NS}::{name}")
        return ops.define(schema, libraries[self.library], self.kernel, **{**self.options, **overrides})


REFUSED = [
    # schema
    Refused("unparsable_schema", "{op}(Tensor x -> Tensor", "mlx", SIGMOID, sigmoid_options(),
            ("schema '{op}(Tensor x -> Tensor' does not parse",)),
    Refused("no_namespace", "{name}(Tensor x) -> Tensor", "mlx", SIGMOID, sigmoid_options(),
            ("name the operator with its namespace", "e.g. 'mylib::{name}'")),
    Refused("int_list_argument", "{op}(Tensor x, int[] dims) -> Tensor", "mlx", SIGMOID, sigmoid_options(),
            ("{op}: argument 'dims' has type List[int]", "take Tensor, Tensor?, float, int and bool arguments")),
    Refused("str_argument", "{op}(Tensor x, str mode) -> Tensor", "mlx", SIGMOID, sigmoid_options(),
            ("{op}: argument 'mode' has type str", "take Tensor, Tensor?, float, int and bool arguments")),
    Refused("alias_return", "{op}(Tensor(a) x) -> Tensor(a)", "mlx", SIGMOID, sigmoid_options(),
            ("{op}: returns Tensor (an alias)", "return new tensors", "Tensor(a!) arguments and return nothing")),
    # kernels
    Refused("kernel_not_in_library", "{op}(Tensor x) -> Tensor", "mlx", "v_Sigmoidfloat32float33", sigmoid_options(),
            ("{op}: the library has no function 'v_Sigmoidfloat32float33'", "did you mean v_Sigmoidfloat32float32")),
    Refused("template_without_dtypes", "{op}(Tensor x) -> Tensor", "mlx", SIGMOID, sigmoid_options(dtypes=None),
            ("kernel template 'v_Sigmoid{dtype}{dtype}' needs dtypes=[...]",)),
    Refused("kernel_for_another_dtype", "{op}(Tensor x) -> Tensor", "mlx",
            {torch.float16: "v_Sigmoidfloat32float32"}, sigmoid_options(dtypes=None),
            ("{op} (torch.float16 kernel v_Sigmoidfloat32float32)", "'x' is torch.float16 for this kernel",
             "kernel argument 'in' (buffer(0), float) holds torch.float32")),
    # bind
    Refused("bind_key_not_a_kernel_argument", "{op}(Tensor x) -> Tensor", "mlx", SIGMOID,
            sigmoid_options(bind={"input": "x", "size": ops.numel("x")}),
            ("{op} (torch.float32 kernel v_Sigmoidfloat32float32)", "bind names kernel argument 'input'",
             "its arguments are: in, out, size")),
    Refused("bind_value_not_a_schema_argument", "{op}(Tensor x) -> Tensor", "mlx", SIGMOID,
            sigmoid_options(bind={"in": "y", "size": ops.numel("x")}),
            ("{op}: bind['in'] names 'y', which is not an argument of the schema", "expected one of: x")),
    Refused("kernel_argument_without_source", "{op}(Tensor x, Tensor w) -> Tensor", "mlx", "rms{dtype}",
            rms_options(),
            ("{op} (torch.float32 kernel rmsfloat32)", "kernel argument 'eps' (buffer(3), float) has no value",
             "name a schema argument or output 'eps'", "bind={'eps': ...}")),
    Refused("float_to_integer_argument", "{op}(Tensor x, Tensor w, float eps, float n) -> Tensor", "mlx",
            "rms{dtype}", rms_options(bind={"axis_size": "n", "w_stride": 1}),
            ("rmsfloat32", "kernel argument 'axis_size' (buffer(4), uint) holds uint values", "'n' (float) is a float")),
    Refused("number_to_written_buffer", "{op}(Tensor x) -> ()", "mlx", SIGMOID,
            sigmoid_options(bind={"in": "x", "out": 0.0, "size": 0}, outputs={}),
            ("v_Sigmoidfloat32float32", "the kernel writes kernel argument 'out' (buffer(1), float)",
             "bind a tensor (an output or a Tensor(a!) argument), not 0.0")),
    Refused("written_argument_not_mutable", "{op}(Tensor x, Tensor y) -> ()", "mlx", SIGMOID,
            sigmoid_options(bind={"in": "x", "out": "y", "size": 0}, outputs={}),
            ("the kernel writes kernel argument 'out' (buffer(1), float), which is bound to 'y'",
             "the schema does not mark 'y' as mutated", "declare it Tensor(a!) y or bind an output")),
    # outputs
    Refused("output_to_read_only_argument", "{op}(Tensor x, Tensor(a!) y) -> Tensor", "mlx", SIGMOID,
            sigmoid_options(bind={"in": "res", "out": "y", "size": 0}, outputs={"res": ops.like("x")}),
            ("output 'res' is bound to kernel argument 'in' (buffer(0), float), which the kernel only reads",
             "bind outputs to device buffers the kernel writes")),
    Refused("output_bound_to_nothing_written", "{op}(Tensor x) -> (Tensor, Tensor)", "mlx", SIGMOID,
            sigmoid_options(outputs={"out": ops.like("x"), "extra": ops.like("x")}),
            ("output 'extra' is bound to no argument the kernel writes", "returned uninitialized",
             "bind={<kernel argument>: 'extra'}")),
    Refused("mutable_argument_not_written", "{op}(Tensor x, Tensor(a!) y) -> Tensor", "mlx", SIGMOID,
            sigmoid_options(),
            ("v_Sigmoidfloat32float32", "the schema marks 'y' as mutated (Tensor(a!))",
             "no argument the kernel writes is bound to it")),
    Refused("fewer_outputs_than_returns", "{op}(Tensor x) -> (Tensor, Tensor)", "mlx", SIGMOID, sigmoid_options(),
            ("{op}: the schema returns 2 tensors", "give one allocation rule for each", "(got 1: out)")),
    Refused("outputs_without_returns", "{op}(Tensor x) -> ()", "mlx", SIGMOID, sigmoid_options(),
            ("{op}: the schema returns 0 tensors", "(got 1: out)")),
    Refused("output_dtype_not_accepted", "{op}(Tensor x) -> Tensor", "mlx", SIGMOID,
            sigmoid_options(outputs={"out": ops.like("x", dtype=torch.int32)}),
            ("output 'out' is torch.int32", "kernel argument 'out' (buffer(1), float) holds torch.float32")),
    # function constants
    Refused("missing_function_constant", "{op}(Tensor x) -> Tensor", "fixtures", "function_constant_scale",
            scale_options(constants={"use_bias": False}),
            ("(torch.float32 kernel function_constant_scale)", "the kernel needs function constants alpha",
             "pass constants={name: value or ops rule}")),
    Refused("unknown_function_constant", "{op}(Tensor x) -> Tensor", "fixtures", "function_constant_scale",
            scale_options(constants={"use_bias": False, "alpha": 2.0, "beta": 1}),
            ("function_constant_scale", "constants names 'beta'", "the kernel declares use_bias, alpha")),
    # grid and threadgroup memory
    Refused("threads_missing", "{op}(Tensor x) -> Tensor", "mlx", SIGMOID, sigmoid_options(threads=None),
            ("{op}: threads is required", "threads=ops.numel('x')")),
    Refused("threadgroup_memory_missing", "{op}(Tensor x) -> Tensor", "fixtures", "threadgroup_sum_float",
            group_sum_options(threadgroup_memory=None),
            ("threadgroup_sum_float", "kernel argument 'scratch' (threadgroup(0), float) needs its size",
             "threadgroup_memory={0: <bytes or ops rule>}")),
    Refused("threadgroup_memory_unknown_binding", "{op}(Tensor x) -> Tensor", "fixtures", "threadgroup_sum_float",
            group_sum_options(threadgroup_memory={1: GROUP * 4}),
            ("threadgroup_memory names threadgroup(1)", "the kernel takes 0 (scratch)")),
    # dispatch and rules
    Refused("dispatch_names_a_float", "{op}(Tensor x, float eps) -> Tensor", "mlx", SIGMOID,
            sigmoid_options(dispatch="eps"), ("{op}: dispatch names 'eps', which is not a Tensor argument",)),
    Refused("dispatch_names_an_optional_tensor", "{op}(Tensor x, Tensor? y) -> Tensor", "mlx", SIGMOID,
            sigmoid_options(dispatch="y"), ("{op}: dispatch names 'y', which is not a Tensor argument",)),
    Refused("rule_reads_sizes_of_a_float", "{op}(Tensor x, float eps) -> Tensor", "mlx", SIGMOID,
            sigmoid_options(threads=ops.size("eps", 0)),
            ("{op}: rule size(eps, 0) reads 'eps' as Tensor, but it is a float",)),
    Refused("rule_reads_a_tensor_as_int", "{op}(Tensor x) -> Tensor", "mlx", SIGMOID,
            sigmoid_options(bind={"in": "x", "size": ops.arg("x")}),
            ("{op}: rule x reads 'x' as int or bool, but it is a Tensor",)),
    Refused("rule_names_an_unknown_argument", "{op}(Tensor x) -> Tensor", "mlx", SIGMOID,
            sigmoid_options(threads=ops.numel("z")),
            ("{op}: rule numel(z) names 'z', which is not an argument of the schema", "expected one of: x")),
    # preconditions
    Refused("require_not_a_comparison", "{op}(Tensor x) -> Tensor", "mlx", SIGMOID,
            sigmoid_options(require=[ops.size("x", 0) > 1, ops.size("x", 0) % 4]),
            ("{op}: require[1]: expected a comparison of rules", "got (size(x, 0) % 4)",
             "write e.g. ops.size('q', -1) == 64")),
    Refused("require_a_bool", "{op}(Tensor x) -> Tensor", "mlx", SIGMOID, sigmoid_options(require=[64 == 64]),
            ("{op}: require[0]: expected a comparison of rules", "got True")),
    Refused("require_reads_an_unknown_argument", "{op}(Tensor x) -> Tensor", "mlx", SIGMOID,
            sigmoid_options(require=[ops.size("q", -1) == 64]),
            ("{op}: rule (size(q, -1) == 64) names 'q', which is not an argument of the schema",)),
]


@pytest.mark.parametrize("case", REFUSED, ids=lambda c: c.id)
def test_define_refuses(libraries, case):
    with pytest.raises(tm.OpDefinitionError) as raised:
        case.define(libraries)
    message = str(raised.value)
    for fragment in case.fragments:
        assert case.fill(fragment) in message, f"{fragment!r} not in {message!r}"
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, tm.TorchMetallibError)
    assert not registered(case.qualname), "a refused definition left the operator behind"


def test_define_reports_every_problem_in_one_error(libraries):
    """Three unrelated mistakes give one OpDefinitionError listing all three, each item the
    message it would raise alone; nothing is registered, and once fixed the name defines."""
    qualname = f"{NS}::three_problems"
    mistakes = scale_options(bind={"in": "y"}, constants={"use_bias": False}, threads=None)
    with pytest.raises(tm.OpDefinitionError) as raised:
        ops.define(f"{qualname}(Tensor x) -> Tensor", libraries["fixtures"], "function_constant_scale", **mistakes)
    assert str(raised.value).splitlines() == [
        f"{qualname}: 3 problems, nothing is registered:",
        f"  1. {qualname}: threads is required, got none; give the grid as an ops rule, e.g. threads=ops.numel('x')",
        f"  2. {qualname} (torch.float32 kernel function_constant_scale): the kernel needs function constants alpha, "
        f"got use_bias; pass constants={{name: value or ops rule}}",
        f"  3. {qualname}: bind['in'] names 'y', which is not an argument of the schema; expected one of: x",
    ]
    assert not registered(qualname)
    _check_scale(ops.define(f"{qualname}(Tensor x) -> Tensor", libraries["fixtures"], "function_constant_scale",
                            **scale_options()))


def test_a_problem_of_every_kernel_is_listed_once(libraries):
    """The same mistake for each dtype's kernel is one problem naming every kernel."""
    qualname = f"{NS}::eps_unbound"
    with pytest.raises(tm.OpDefinitionError) as raised:
        ops.define(f"{qualname}(Tensor x, Tensor w) -> Tensor", libraries["mlx"], "rms{dtype}",
                   **rms_options(dtypes=[torch.float32, torch.float16, torch.bfloat16]))
    assert str(raised.value) == (
        f"{qualname} (torch.float32 kernel rmsfloat32; torch.float16 kernel rmsfloat16; torch.bfloat16 kernel "
        f"rmsbfloat16): kernel argument 'eps' (buffer(3), float) has no value: name a schema argument or output "
        f"'eps', or map it with bind={{'eps': ...}} (an argument or output name, an ops rule or a number)")


def _check_sigmoid(op):
    x = torch.randn(100, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(op(x), torch.sigmoid(x), rtol=0, atol=1e-6)


def _check_scale(op):
    x = torch.randn(50, generator=torch.Generator().manual_seed(2))
    assert torch.equal(op(x), x * 2)


def _check_group_sum(op):
    x = torch.randint(-1000, 1000, (GROUPS * GROUP,), generator=torch.Generator().manual_seed(3)).float()
    assert torch.equal(op(x), x.view(GROUPS, GROUP).sum(1))


# case id -> (the options that fix it, a check of the fixed operator)
FIXES = {
    "bind_key_not_a_kernel_argument": (dict(bind={"in": "x", "size": ops.numel("x")}), _check_sigmoid),
    "missing_function_constant": (dict(constants={"use_bias": False, "alpha": 2.0}), _check_scale),
    "threadgroup_memory_missing": (dict(threadgroup_memory={0: GROUP * 4}), _check_group_sum),
}


@pytest.mark.parametrize("case", [c for c in REFUSED if c.id in FIXES], ids=lambda c: c.id)
def test_refused_name_defines_once_fixed(libraries, case):
    name = f"fixed_{case.id}"
    with pytest.raises(tm.OpDefinitionError):
        case.define(libraries, name=name)
    assert not registered(f"{NS}::{name}")
    fix, check = FIXES[case.id]
    op = case.define(libraries, name=name, **fix)
    assert op.name == f"{NS}::{name}" and has_cpu_kernel(op.name)
    check(getattr(getattr(torch.ops, NS), name))
    check(op)


def test_defining_an_example_op_twice_is_refused_and_keeps_the_first(mlx_lib, mlx_ops):
    with pytest.raises(tm.OpDefinitionError, match="tm_examples::sigmoid is already defined by torch_metallib.ops "
                                                   "in this process"):
        ops.define("tm_examples::sigmoid(Tensor x) -> Tensor", mlx_lib, SIGMOID, **sigmoid_options())
    x = torch.randn(64, generator=torch.Generator().manual_seed(4))
    assert torch.allclose(torch.ops.tm_examples.sigmoid(x), torch.sigmoid(x), rtol=0, atol=1e-6)


def test_defining_over_a_torch_library_op_is_refused(mlx_lib):
    qualname = f"{NS}::taken"
    other = torch.library.Library(NS, "FRAGMENT")
    try:
        other.define("taken(Tensor x) -> Tensor")
        with pytest.raises(tm.OpDefinitionError) as raised:
            ops.define(f"{qualname}(Tensor x) -> Tensor", mlx_lib, SIGMOID, **sigmoid_options())
        assert f"{qualname}: torch.library refused the schema" in str(raised.value)
        assert registered(qualname) and not has_cpu_kernel(qualname)
    finally:
        other._destroy()


def test_backward_on_a_mutating_op_is_refused_before_anything_is_registered(mlx_lib):
    qualname = f"{NS}::mutating_with_backward"
    options = dict(dtypes=F32, bind={"in": "x", "out": "x", "size": 0}, threads=ops.numel("x"))
    with pytest.raises(tm.OpDefinitionError, match=f"{qualname}.*backward"):
        ops.define(f"{qualname}(Tensor(a!) x) -> ()", mlx_lib, SIGMOID, backward=lambda ctx, grad: grad, **options)
    assert not registered(qualname)
    op = ops.define(f"{qualname}(Tensor(a!) x) -> ()", mlx_lib, SIGMOID, **options)
    x = torch.randn(32)
    expected = torch.sigmoid(x)
    op(x)
    assert torch.allclose(x, expected, rtol=0, atol=1e-6)


# --- rules ---------------------------------------------------------------------------------

N, K = ops.size("x", 0), ops.arg("k")

# (rule, the same computed on Python ints from (x, k, b)); all >= 0 on the samples below so
# they can be output extents. Negative dividends and divisors exercise floor semantics.
RULES = [
    ((N - 7) // 3 + 10, lambda x, k, b: (len(x) - 7) // 3 + 10),
    ((N - 7) % 3, lambda x, k, b: (len(x) - 7) % 3),
    (K // 3 + 10, lambda x, k, b: k // 3 + 10),
    (K // -4 + 10, lambda x, k, b: k // -4 + 10),
    (K % -4 + 4, lambda x, k, b: k % -4 + 4),
    ((17 - N) // K + 20, lambda x, k, b: (17 - len(x)) // k + 20),
    ((17 - N) % K + 20, lambda x, k, b: (17 - len(x)) % k + 20),
    ((N > K) + (N == K) * 2 + (K != 3) * 4 + (N <= K) * 8 + (K < 0) * 16 + (N >= 2) * 32,
     lambda x, k, b: (len(x) > k) + (len(x) == k) * 2 + (k != 3) * 4 + (len(x) <= k) * 8 + (k < 0) * 16
     + (len(x) >= 2) * 32),
    (N.min(K).max(-3) + 3, lambda x, k, b: max(min(len(x), k), -3) + 3),
    (ops.cdiv(N, 4), lambda x, k, b: -(-len(x) // 4)),
    (ops.stride("x", 0), lambda x, k, b: x.contiguous().stride(0)),  # the kernel sees a contiguous copy
    (ops.dim("x"), lambda x, k, b: x.dim()),
    (ops.numel("x") // ops.size("x", -1), lambda x, k, b: len(x)),
    (ops.present("b"), lambda x, k, b: int(b is not None)),
]
# (rows of x, k, whether b is given); x is (rows, 3), transposed (not contiguous) when it has rows
RULE_SAMPLES = [(0, -7, False), (2, -1, True), (5, 5, False), (8, 3, True), (13, -4, False), (30, 7, True)]


def rule_inputs(rows, k, with_b, device="cpu"):
    x = torch.zeros(3, rows).t() if rows else torch.zeros(0, 3)
    return x.to(device), k, (torch.zeros(2, device=device) if with_b else None)


@pytest.fixture(scope="module")
def rules_op(mlx_lib):
    """Output shape (0, *RULES): empty, so no kernel needs to run (threads=0), while its
    shape records every rule's value."""
    return ops.define(f"{NS}::rules(Tensor x, int k, Tensor? b=None) -> Tensor", mlx_lib, SIGMOID, dtypes=F32,
                      bind={"in": "x", "size": 0}, outputs={"out": ops.empty([0] + [r for r, _ in RULES], "x")},
                      threads=0)


@pytest.mark.parametrize("rows, k, with_b", RULE_SAMPLES)
def test_native_and_python_rules_agree(rules_op, rows, k, with_b):
    x, k, b = rule_inputs(rows, k, with_b)
    expected = [0] + [reference(x, k, b) for _, reference in RULES]
    assert [0] + [rule.evaluate({"x": x, "k": k, "b": b}) for rule, _ in RULES] == expected
    assert list(rules_op(x, k, b).shape) == expected                                   # native
    assert list(rules_op(*rule_inputs(rows, k, with_b, device="meta")).shape) == expected  # fake (Python)


@pytest.mark.slow
def test_rules_on_symbolic_sizes_agree_with_native(rules_op):
    compiled = torch.compile(rules_op, fullgraph=True, dynamic=True)
    for rows, k, with_b in RULE_SAMPLES[2:5]:
        inputs = rule_inputs(rows, k, with_b)
        assert compiled(*inputs).shape == rules_op(*inputs).shape


# Right-nested so each step deepens the rule by one: 15 steps on a leaf make the native
# evaluator's full stack of 16. min/max steps keep the depth.
CHAIN = [("+", 1), ("*", 3), ("-", 1000), ("//", 10**6), ("max", -10**6), ("//", -5000), ("%", 7), ("-", 10),
         ("*", -7), ("min", 10**7), ("%", 1000), ("//", -9999), ("+", 3), ("%", -100), ("-", 10**5), ("*", 2),
         ("+", 200)]
PYTHON = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv, "%": operator.mod}


def chained(leaf, value):
    """(rule, its value on Python ints, depth steps) for CHAIN applied to `leaf` = `value`."""
    rule, steps = leaf, 0
    for symbol, constant in CHAIN:
        if symbol in ("min", "max"):
            rule, value = getattr(rule, symbol)(constant), (min if symbol == "min" else max)(value, constant)
        else:
            rule, value = PYTHON[symbol](constant, rule), PYTHON[symbol](constant, value)
            steps += 1
    return rule, value, steps


def test_deepest_rule_evaluates_natively(mlx_lib):
    rule, value, steps = chained(ops.size("x", 0), 5)
    assert steps == 15 and value > 0
    op = ops.define(f"{NS}::deep_rule(Tensor x) -> Tensor", mlx_lib, SIGMOID, dtypes=F32, bind={"in": "x", "size": 0},
                    outputs={"out": ops.empty((0, rule), "x")}, threads=0)
    x = torch.zeros(5)
    assert rule.evaluate({"x": x}) == value
    assert op(x).shape == (0, value)
    assert op(x.to("meta")).shape == (0, value)


def test_too_deep_rule_is_refused():
    rule, _, _ = chained(ops.size("x", 0), 5)
    with pytest.raises(tm.TorchMetallibError, match=r"is nested too deeply \(at most 16 levels\)"):
        1 + rule
    assert (rule + 1).text.endswith(" + 1)")  # on the left it does not deepen


@pytest.mark.parametrize("use", [
    lambda r: bool(r),
    lambda r: 1 if r else 0,
    lambda r: min(r, ops.size("x", 1)),  # the builtin compares; Rule.min builds a rule
    lambda r: r in [ops.numel("x")],
], ids=["bool", "if", "builtin_min", "in"])
def test_rule_has_no_truth_value(use):
    with pytest.raises(TypeError) as raised:
        use(ops.size("x", 0) > 3)
    message = str(raised.value)
    assert "has no truth value until the operator is called" in message
    assert "pass it as a value" in message and "constants={'aligned': size('x', -1) % 4 == 0}" in message


@pytest.fixture(scope="module")
def shape_errors_op(mlx_lib):
    """Output shape (numel(x) // k - m, size(x, -1))."""
    return ops.define(f"{NS}::shape_errors(Tensor x, int k, int m) -> Tensor", mlx_lib, SIGMOID, dtypes=F32,
                      bind={"in": "x", "size": 0},
                      outputs={"out": ops.empty((ops.numel("x") // ops.arg("k") - ops.arg("m"), ops.size("x", -1)),
                                                "x")},
                      threads=0)


SHAPE_ERRORS = {  # id -> (x shape, k, m, message after "tm_define_tests::shape_errors: ")
    "division_by_zero": ((2, 3), 0, 0, "((numel(x) // k) - m): division by zero"),
    "dim_out_of_range": ((), 1, 0, "size(x, -1): dimension -1 is out of range for 'x', which has 0 dimensions"),
    "negative_extent": ((2, 3), 1, 10, "output shape: ((numel(x) // k) - m) is -4, below 0"),
}


@pytest.mark.parametrize("error", SHAPE_ERRORS)
def test_output_rule_errors_at_call(shape_errors_op, error):
    shape, k, m, message = SHAPE_ERRORS[error]
    with pytest.raises(tm.DispatchError) as raised:
        shape_errors_op(torch.zeros(shape), k, m)
    assert str(raised.value) == f"{NS}::shape_errors: {message}"
    assert shape_errors_op(torch.zeros(2, 3), 2, 1).shape == (2, 3)


@pytest.mark.parametrize("error", SHAPE_ERRORS)
def test_output_rule_errors_on_meta_tensors_match_eager(shape_errors_op, error):
    shape, k, m, message = SHAPE_ERRORS[error]
    with pytest.raises(tm.DispatchError) as raised:
        shape_errors_op(torch.zeros(shape, device="meta"), k, m)
    assert message in str(raised.value)


def test_rule_errors_in_bindings_and_grid_at_call(mlx_lib):
    op = ops.define(f"{NS}::bind_errors(Tensor x, int k) -> Tensor", mlx_lib, SIGMOID, dtypes=F32,
                    bind={"in": "x", "size": ops.size("x", 1)}, outputs={"out": ops.like("x")},
                    threads=ops.numel("x") // ops.arg("k"))
    with pytest.raises(tm.DispatchError) as raised:
        op(torch.zeros(4), 1)
    assert str(raised.value) == (f"{NS}::bind_errors: size(x, 1): dimension 1 is out of range for 'x', "
                                 f"which has 1 dimensions")
    with pytest.raises(tm.DispatchError) as raised:
        op(torch.zeros(4, 2), 0)
    assert str(raised.value) == f"{NS}::bind_errors: (numel(x) // k): division by zero"
    x = torch.randn(4, 2)
    assert torch.allclose(op(x, 1), torch.sigmoid(x), rtol=0, atol=1e-6)


def test_comparison_extent_under_dynamic_compile(mlx_lib):
    op = ops.define(f"{NS}::comparison_extent(Tensor x) -> Tensor", mlx_lib, SIGMOID, dtypes=F32,
                    bind={"in": "x", "size": 0}, outputs={"out": ops.empty((0, ops.size("x", 0) > 5), "x")},
                    threads=0)
    assert op(torch.zeros(3)).shape == (0, 0) and op(torch.zeros(8)).shape == (0, 1)
    assert op(torch.zeros(8, device="meta")).shape == (0, 1)
    compiled = torch.compile(op, fullgraph=True, dynamic=True)
    for n in (3, 8):
        assert compiled(torch.zeros(n)).shape == op(torch.zeros(n)).shape


# --- preconditions -------------------------------------------------------------------------

PRECONDITION_FAILS = "a precondition does not hold; expected"
PASS_SUCH = ". Pass arguments that meet it: the operator's kernels are built for those (define(..., require=[...]))"


@pytest.fixture(scope="module")
def required_ops(mlx_lib) -> dict:
    """sigmoid, functional and in place, on rows of a multiple of 4 elements, at most 2-D."""
    require = [ops.size("x", -1) % 4 == 0, ops.dim("x") <= 2]
    return {
        "sigmoid": ops.define(f"{NS}::required(Tensor x) -> Tensor", mlx_lib, SIGMOID, require=require,
                              **sigmoid_options()),
        "sigmoid_": ops.define(f"{NS}::required_(Tensor(a!) x) -> ()", mlx_lib, SIGMOID, require=require,
                               dtypes=F32, bind={"in": "x", "out": "x", "size": 0}, threads=ops.numel("x")),
    }


@pytest.mark.parametrize("shape, found", [
    ((3, 6), "size(x, -1) % 4 == 0, got size(x, -1) = 6, size(x, -1) % 4 = 2"),
    ((2, 2, 4), "dim(x) <= 2, got 3"),
], ids=["size", "dim"])
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_precondition_refuses_the_call_before_anything_runs(required_ops, shape, found, device):
    x = torch.randn(shape, device=device)
    expected = f"{NS}::required: {PRECONDITION_FAILS} {found}{PASS_SUCH}"
    with pytest.raises(tm.KernelArgumentError) as raised:
        required_ops["sigmoid"](x)
    assert str(raised.value) == expected
    with pytest.raises(tm.KernelArgumentError):  # through the autograd kernel too
        required_ops["sigmoid"](x.clone().requires_grad_())
    before = x.clone()
    with pytest.raises(tm.KernelArgumentError) as raised:
        required_ops["sigmoid_"](x)
    assert str(raised.value) == expected.replace("::required:", "::required_:")
    if device == "cpu":
        assert torch.equal(x, before), "a refused call wrote its argument"


def test_preconditions_that_hold_let_the_kernel_run(required_ops):
    x = _randn(3, 8, seed=70)
    assert torch.allclose(required_ops["sigmoid"](x), torch.sigmoid(x), rtol=0, atol=1e-6)
    expected = torch.sigmoid(x)
    required_ops["sigmoid_"](x)
    assert torch.allclose(x, expected, rtol=0, atol=1e-6)
    assert required_ops["sigmoid"](torch.zeros(5, 4, device="meta")).shape == (5, 4)
    result = torch.library.opcheck(required_ops["sigmoid"].op, (_randn(2, 12, seed=71),), test_utils=OPCHECK_TESTS)
    assert result == {test: "SUCCESS" for test in OPCHECK_TESTS}


def test_a_precondition_between_two_rules_names_both_values(mlx_lib):
    op = ops.define(f"{NS}::same_rows(Tensor x, Tensor y) -> Tensor", mlx_lib, SIGMOID,
                    require=[ops.size("x", 0) == ops.size("y", 0)], **sigmoid_options())
    x = torch.randn(3)
    with pytest.raises(tm.KernelArgumentError) as raised:
        op(x, torch.randn(4))
    assert str(raised.value) == (f"{NS}::same_rows: {PRECONDITION_FAILS} size(x, 0) == size(y, 0), got "
                                 f"size(x, 0) = 3, size(y, 0) = 4{PASS_SUCH}")
    assert torch.allclose(op(x, torch.randn(3)), torch.sigmoid(x), rtol=0, atol=1e-6)


def test_preconditions_under_dynamic_compile(required_ops):
    """On symbolic sizes a precondition is a guard: calls that meet it compile once and run
    without a graph break; one that does not is refused with the same KernelArgumentError."""
    torch._dynamo.reset()
    op = required_ops["sigmoid"]
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(lambda t: op(t) * 2, fullgraph=True, dynamic=True, backend=counter)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for seed, shape in enumerate([(3, 8), (5, 12), (2, 16)]):
            x = _randn(*shape, seed=72 + seed)
            assert torch.equal(compiled(x), op(x) * 2)
    assert counter.frame_count == 1
    with pytest.raises(Exception) as raised:
        compiled(_randn(3, 6, seed=75))
    chain = [raised.value]  # dynamo's error, caused by the fake kernel's
    while chain[-1].__cause__ or chain[-1].__context__:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    refusals = [str(e) for e in chain if isinstance(e, tm.KernelArgumentError)]
    assert refusals == [f"{NS}::required: {PRECONDITION_FAILS} size(x, -1) % 4 == 0, got size(x, -1) = 6, "
                        f"size(x, -1) % 4 = 2{PASS_SUCH}"], [type(e) for e in chain]
    torch._dynamo.reset()


# --- the example operators: opcheck, autograd, export, compile -------------------------------

def _randn(*shape, seed, grad=False):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).requires_grad_(grad)


# qualified name -> (args, kwargs) samples; inputs require grad where the op is differentiable
OPCHECK_SAMPLES = {
    "tm_examples::sigmoid": [lambda: ((_randn(3, 33, seed=1, grad=True),), {})],
    "tm_examples::sigmoid_": [lambda: ((_randn(3, 33, seed=2),), {})],
    "tm_examples::sigmoid.out": [lambda: ((_randn(3, 33, seed=3),), {"out": torch.empty(3, 33)})],
    "tm_examples::softmax": [lambda: ((_randn(4, 100, seed=4),), {})],
    "tm_examples::rms_norm": [lambda: ((_randn(4, 100, seed=5, grad=True), _randn(100, seed=6, grad=True), 1e-5), {})],
    "tm_examples::rms_norm_backward": [
        lambda: ((_randn(4, 100, seed=7), _randn(100, seed=8), _randn(4, 100, seed=9), 1e-5), {})],
    "tm_fixtures::scale": [lambda: ((_randn(40, seed=10), _randn(40, seed=11), 1.5), {}),
                           lambda: ((_randn(40, seed=12), None, 0.5), {})],
}
OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.fixture(scope="module")
def example_ops(mlx_ops, fixture_ops) -> dict:
    return {op.name: op for op in [*mlx_ops.values(), *fixture_ops.values()]}


def test_every_example_op_has_an_opcheck_sample(example_ops):
    assert set(example_ops) == set(OPCHECK_SAMPLES)


@pytest.mark.parametrize("name", OPCHECK_SAMPLES)
def test_opcheck(example_ops, name):
    for sample in OPCHECK_SAMPLES[name]:
        args, kwargs = sample()
        result = torch.library.opcheck(example_ops[name].op, args, kwargs, test_utils=OPCHECK_TESTS)
        assert result == {test: "SUCCESS" for test in OPCHECK_TESTS}


def test_backward_matches_torch(mlx_ops):
    x = _randn(4, 100, seed=20, grad=True)
    w = _randn(100, seed=21, grad=True)
    grad = _randn(4, 100, seed=22)
    y = mlx_ops["rms_norm"](mlx_ops["sigmoid"](x), w, 1e-5)
    gx, gw = torch.autograd.grad(y, (x, w), grad)
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    s = torch.sigmoid(xr)
    yr = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * wr
    gxr, gwr = torch.autograd.grad(yr, (xr, wr), grad.double())
    assert (y.double() - yr).abs().max() < 5e-6
    assert (gx.double() - gxr).abs().max() < 5e-6
    assert (gw.double() - gwr).abs().max() < 5e-6


class _Block(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.w = torch.nn.Parameter(_randn(width, seed=30))

    def forward(self, x):
        examples = torch.ops.tm_examples
        return examples.sigmoid(examples.rms_norm(examples.softmax(x), self.w, 1e-5))


def test_export(mlx_ops):
    module, x = _Block(64), _randn(4, 64, seed=31)
    ep = torch.export.export(module, (x,), dynamic_shapes={"x": {0: torch.export.Dim("rows")}})
    targets = [node.target for node in ep.graph.nodes if node.op == "call_function"]
    examples = torch.ops.tm_examples
    assert targets == [examples.softmax.default, examples.rms_norm.default, examples.sigmoid.default]
    with torch.no_grad():
        assert torch.equal(ep.module()(x), module(x))
        other = _randn(9, 64, seed=32)
        assert torch.equal(ep.module()(other), module(other))


def test_compile_dynamic(mlx_ops):
    examples = torch.ops.tm_examples

    def fn(x, w):
        y = examples.rms_norm(examples.softmax(x), w, 1e-5)
        examples.sigmoid_(y)
        out = torch.empty_like(y)
        examples.sigmoid.out(y, out=out)
        return examples.sigmoid(out) * 2

    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend=counter)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for seed, shape in enumerate([(4, 64), (9, 200)]):
            x, w = _randn(*shape, seed=40 + seed), _randn(shape[-1], seed=50 + seed)
            assert torch.equal(compiled(x, w), fn(x, w))
    assert counter.frame_count == 1


# --- CPU schedules ---------------------------------------------------------------------------

def test_debug_schedules_give_parallel_results(mlx_ops):
    x, w = _randn(5, 1000, seed=60), _randn(1000, seed=61)
    examples = torch.ops.tm_examples

    def run():
        return examples.softmax(x), examples.rms_norm(x, w, 1e-5), examples.sigmoid(x)

    parallel = run()
    assert (parallel[0].double() - torch.softmax(x.double(), -1)).abs().max() <= 2e-6
    for mode, seed in [("sequential", 0), ("permuted", 0), ("permuted", 12345)]:
        with tm.cpu_schedule(mode, seed):
            for got, expected in zip(run(), parallel):
                assert torch.equal(got, expected), (mode, seed)


@pytest.fixture(scope="module")
def left_neighbour():
    return define_left_neighbour(f"{NS}::left_neighbour")


def test_permuted_schedule_reaches_the_operator(left_neighbour):
    x = ramp()
    expected = left_neighbours(x)
    assert torch.equal(left_neighbour(x), expected)
    with tm.cpu_schedule("sequential"):
        assert torch.equal(left_neighbour(x), expected)
    kernel = left_neighbour.kernels[torch.float32]
    runs = {}
    for seed in (1, 2):
        with tm.cpu_schedule("permuted", seed=seed):
            runs[seed] = left_neighbour(x)
            assert torch.equal(left_neighbour(x), runs[seed]), "same seed, same result"
            direct = torch.empty_like(x)
            kernel(x, direct, threads=x.numel(), group_size=GROUP, threadgroup_memory={0: GROUP * 4})
            assert torch.equal(runs[seed], direct), "the operator runs as a direct call does"
        wrong = runs[seed] != expected
        assert wrong.sum() > GROUP, "permuted order exposes the missing barrier"
        assert set(runs[seed][wrong].tolist()) == {0.0}
    assert not torch.equal(runs[1], runs[2])
    assert torch.equal(left_neighbour(x), expected), "parallel again outside the block"


_CHILD = """
import json, sys, torch, torch_metallib as tm
from _ops_examples import define_mlx_examples
from _ops_define import NS, define_left_neighbour, ramp
define_mlx_examples(tm.load(sys.argv[1]))
x = torch.randn(3, 4096, generator=torch.Generator().manual_seed(0))
softmax_error = (torch.ops.tm_examples.softmax(x).double() - torch.softmax(x.double(), -1)).abs().max().item()
left = define_left_neighbour(NS + "::left_neighbour")(ramp())
print(json.dumps({"softmax_error": softmax_error, "left": left.tolist()}))
"""


def test_environment_schedule_reaches_the_operator(mlx_path, left_neighbour):
    env = dict(os.environ, TORCH_METALLIB_CPU_SCHEDULE="permuted:3")
    child = subprocess.run([sys.executable, "-c", _CHILD, mlx_path], env=env, capture_output=True, text=True,
                           cwd=os.path.dirname(__file__), timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert result["softmax_error"] <= 2e-6
    x = ramp()
    with tm.cpu_schedule("permuted", seed=3):
        here = left_neighbour(x)
    assert not torch.equal(here, left_neighbours(x))
    assert result["left"] == here.tolist()
