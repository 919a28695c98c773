"""Struct and array arguments of operators, and tensors bound to arguments of a known size.

* ``ops.struct``: MLX's steel GEMM (``constant GEMMParams* params``, 72 bytes) as an operator
  whose params are rules over the shapes: one operator right for several shapes, eager and
  under ``torch.compile(fullgraph=True)``, against ``torch.mm``. Fields from float and int
  arguments, ``defaults``, nested structs and array fields (the struct_arg_axpy fixture with
  its metadata edited, the bytes laid out the same).
* A tuple of rules for an array reference: MLX's rope (``constant int64_t (&strides)[3]``)
  against a float64 rotary embedding.
* Definition errors: every field problem listed in the one OpDefinitionError.
* A tensor bound to a struct, an array reference or a ``constant T&`` must hold the bytes in
  its own view: a 64-byte slice of a 72-byte params tensor is refused in kernel calls and
  operators (before this check, the slice's storage was counted and the call ran).
"""

import math
import re

import pytest
import torch

import torch_metallib as tm
from _mlx_matmul import _pack_struct
from conftest import FIXTURES
from torch_metallib import ops

NS = "tm_struct_tests"
S = ops.size
F32 = [torch.float32]
TILE = (32, 32, 16, 2, 2)  # bm, bn, bk, wm, wn
GEMM = "steel_gemm_fused_nn_{dtype}_{dtype}_bm32_bn32_bk16_wm2_wn2"
GEMM_CONSTANTS = dict(has_batch=False, use_out_source=False, do_axpby=False)


def gemm_params(M, N, K, **overrides):
    """GEMMParams of a row-major (M, K) @ (K, N) product, as MLX's steel_matmul fills them."""
    bm, bn, bk, _, _ = TILE
    fields = dict(M=M, N=N, K=K, lda=K, ldb=N, ldd=N, tiles_n=ops.cdiv(N, bn), tiles_m=ops.cdiv(M, bm),
                  batch_stride_a=M * K, batch_stride_b=K * N, batch_stride_d=M * N, swizzle_log=0,
                  gemm_k_iterations_aligned=K // bk, batch_ndim=1)
    fields.update(overrides)
    return ops.struct(**fields)


def gemm_options(M=S("a", 0), N=S("b", 1), K=S("a", 1), **overrides):
    """A steel GEMM operator's define options: out = a @ b for row-major a and b, launched
    as MLX launches it (tests/_mlx_matmul.py): (tiles_n, tiles_m, 1) groups of (32, wn, wm)."""
    bm, bn, bk, wm, wn = TILE
    options = dict(
        dtypes=[torch.float32, torch.float16], bind={"A": "a", "B": "b", "D": "out", "params": gemm_params(M, N, K)},
        outputs={"out": ops.empty((M, N), "a")},
        constants=dict(GEMM_CONSTANTS, align_M=M % bm == 0, align_N=N % bn == 0, align_K=K % bk == 0),
        threads=(ops.cdiv(N, bn) * 32, ops.cdiv(M, bm) * wn, wm), group_size=(32, wn, wm))
    options.update(overrides)
    return options


def data(shape, seed, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def assert_product(out, a, b):
    exact = a.double() @ b.double()
    tolerance = 1e-5 if a.dtype == torch.float32 else 1e-2
    assert out.shape == exact.shape and out.dtype == a.dtype
    torch.testing.assert_close(out.double(), exact, atol=tolerance * a.shape[1], rtol=tolerance)


@pytest.fixture(scope="module")
def mm(mlx_lib):
    return ops.define(f"{NS}::mm(Tensor a, Tensor b) -> Tensor", mlx_lib, GEMM, **gemm_options())


# --- ops.struct on MLX's steel GEMM ----------------------------------------------------------

# Several shapes through one operator: params packed per call (N=256 params used for N=512
# would leave half of D unwritten); aligned and ragged tiles alike.
SHAPES = [(64, 48, 256), (70, 33, 512), (32, 32, 32), (5, 100, 7)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gemm_params_from_shapes_match_torch_mm_for_every_shape(mm, dtype):
    for i, (m, k, n) in enumerate(SHAPES):
        a, b = data((m, k), i, dtype), data((k, n), 10 + i, dtype)
        assert_product(mm(a, b), a, b)


def test_gemm_params_under_torch_compile(mm, fresh_dynamo):
    compiled = torch.compile(mm, fullgraph=True)
    for i, (m, k, n) in enumerate(SHAPES[:2]):
        a, b = data((m, k), i), data((k, n), 10 + i)
        out = compiled(a, b)
        assert_product(out, a, b)
        assert torch.equal(out, mm(a, b))


def test_gemm_on_meta_tensors_has_the_rules_shape(mm):
    out = mm(torch.empty(70, 33, device="meta"), torch.empty(33, 512, device="meta"))
    assert out.shape == (70, 512) and out.device.type == "meta"


def test_struct_fields_from_arguments_and_defaults(mlx_lib):
    """Fields bound to an int argument, numbers and `defaults`: ldd is the output's row
    stride, given as an argument (an output wider than N: its padding stays untouched)."""
    M, N, K = S("a", 0), S("b", 1), S("a", 1)
    bm, bn, bk, wm, wn = TILE
    params = ops.struct(M=M, N=N, K=K, lda=K, ldb=N, ldd="ldd", tiles_n=ops.cdiv(N, bn), tiles_m=ops.cdiv(M, bm),
                        gemm_k_iterations_aligned=K // bk, batch_ndim=1, defaults=0)
    mm_into = ops.define(f"{NS}::mm_into(Tensor a, Tensor b, Tensor(a!) d, int ldd) -> ()", mlx_lib, GEMM,
                         **gemm_options(bind={"A": "a", "B": "b", "D": "d", "params": params}, outputs={}))
    a, b = data((40, 20), 1), data((20, 24), 2)
    d = torch.full((40, 30), -7.0)
    mm_into(a, b, d, 30)
    assert_product(d[:, :24], a, b)
    assert bool((d[:, 24:] == -7.0).all())


def test_a_field_value_that_does_not_fit_is_refused_at_call(mlx_lib):
    """M is an int: a rule whose value is past int's range is refused before anything runs."""
    params = gemm_params(ops.arg("rows") * 2 ** 32, S("b", 1), S("a", 1))
    wide = ops.define(f"{NS}::mm_huge_m(Tensor a, Tensor b, int rows) -> Tensor", mlx_lib, GEMM,
                      **gemm_options(bind={"A": "a", "B": "b", "D": "out", "params": params}, dtypes=F32))
    with pytest.raises(tm.KernelArgumentError, match=re.escape("params.M (int): expected an integer that fits int, "
                                                               "got 4294967296, out of range, from rule (rows * "
                                                               "4294967296). Pass arguments for which it fits")):
        wide(data((4, 4), 0), data((4, 4), 1), 1)


# --- array references: MLX's rope -----------------------------------------------------------

def rotary_reference(x, offset, scale, base):
    """MLX's rope (forward, not traditional, every feature rotated) in float64."""
    half = x.shape[-1] // 2
    inverse = base ** (-torch.arange(half, dtype=torch.float64) / half)
    theta = (scale * (offset + torch.arange(x.shape[-2], dtype=torch.float64)))[:, None] * inverse[None, :]
    x1, x2 = x[..., :half].double(), x[..., half:].double()
    return torch.cat([x1 * theta.cos() - x2 * theta.sin(), x1 * theta.sin() + x2 * theta.cos()], -1)


@pytest.fixture(scope="module")
def rope(mlx_lib):
    # rope(in, out, offset, scale, constant int64_t (&strides)[3], (&out_strides)[3],
    #      offset_stride, n_head, base [[buffer(10)]]); grid (D / 2, T, B * ceil(heads / 4))
    return ops.define(
        f"{NS}::rope(Tensor x, Tensor offset, float scale, float log2_base) -> Tensor", mlx_lib, "rope_{dtype}",
        dtypes=F32,
        bind={"in": "x", "base": "log2_base", "strides": (S("x", -2) * S("x", -1), S("x", -1), 1),
              "out_strides": [S("x", -2) * S("x", -1), S("x", -1), 1], "offset_stride": 0, "n_head": S("x", 1)},
        outputs={"out": ops.like("x")}, constants=dict(forward=True, traditional=False, hs_transpose=False),
        threads=(S("x", -1) // 2, S("x", -2), S("x", 0) * ops.cdiv(S("x", 1), 4)))


def test_rope_strides_from_a_tuple_of_rules(rope):
    for i, shape in enumerate([(1, 4, 8, 16), (2, 6, 5, 32), (3, 1, 7, 8)]):
        x = data(shape, i)
        out = rope(x, torch.tensor([3], dtype=torch.int32), 0.5, math.log2(10000.0))
        torch.testing.assert_close(out.double(), rotary_reference(x, 3, 0.5, 10000.0), atol=2e-6, rtol=1e-5)


# --- nested structs and array fields (struct_arg_axpy's metadata edited) ---------------------

def edited_axpy(fields: str, extra: str = "") -> tm.Library:
    """struct_arg_axpy (y += p.alpha * x for i < p.n; Params is a float then a uint) with
    its struct metadata !21 replaced by `fields` (the same bytes, described otherwise)."""
    import llvmlite.binding as llvm
    text = (FIXTURES / "struct_arg_axpy.ll").read_text()
    line = next(l for l in text.splitlines() if l.startswith("!21 = "))
    text = text.replace(line, f"!21 = !{{{fields}}}\n{extra}")
    bitcode = llvm.parse_assembly(text, context=llvm.create_context()).as_bitcode()
    return tm.load(tm.pack([tm.FunctionSource("struct_arg_axpy", bitcode)]))


def run_axpy(op, n=None):
    x, y = data((8,), 0), data((8,), 1)
    expected = y.clone()
    count = 8 if n is None else n
    expected[:count] += 2.5 * x[:count]
    op(x, y, 2.5)
    torch.testing.assert_close(y, expected)


def test_nested_struct(fixtures_lib):
    lib = edited_axpy('i32 0, i32 4, i32 0, !"float", !"alpha", !"air.struct_type_info", !90, i32 4, i32 4, i32 0, '
                      '!"Count", !"count"', '!90 = !{i32 0, i32 4, i32 0, !"uint", !"n"}')
    assert [f.name for f in lib["struct_arg_axpy"].arguments[2].struct_fields[1].fields] == ["n"]
    op = ops.define(f"{NS}::axpy_nested(Tensor x, Tensor(a!) y, float alpha) -> ()", lib, "struct_arg_axpy",
                    dtypes=F32, bind={"p": ops.struct(alpha="alpha", count=ops.struct(n=ops.numel("x") - 3))},
                    threads=ops.numel("x"))
    run_axpy(op, n=5)


def test_array_field(fixtures_lib):
    lib = edited_axpy('i32 0, i32 4, i32 0, !"float", !"alpha", i32 4, i32 4, i32 1, !"uint", !"n"')
    op = ops.define(f"{NS}::axpy_array_field(Tensor x, Tensor(a!) y, float alpha) -> ()", lib, "struct_arg_axpy",
                    dtypes=F32, bind={"p": ops.struct(alpha="alpha", n=(ops.numel("x"),))}, threads=ops.numel("x"))
    run_axpy(op)


def test_struct_of_the_fixture_with_defaults(fixtures_lib):
    op = ops.define(f"{NS}::axpy_defaults(Tensor x, Tensor(a!) y, float alpha) -> ()", fixtures_lib,
                    "struct_arg_axpy", dtypes=F32, bind={"p": ops.struct(alpha="alpha", defaults=6)},
                    threads=ops.numel("x"))
    run_axpy(op, n=6)


# --- definition errors ------------------------------------------------------------------------

def refusal(library, name, schema_tail, kernel, **options) -> str:
    with pytest.raises(tm.OpDefinitionError) as error:
        ops.define(f"{NS}::{name}{schema_tail}", library, kernel, **options)
    assert not hasattr(getattr(torch.ops, NS), name), "a refused definition registered the operator"
    return str(error.value)


def test_every_field_problem_is_listed_in_one_error(fixtures_lib):
    message = refusal(fixtures_lib, "axpy_bad_fields", "(Tensor x, Tensor(a!) y, float alpha) -> ()",
                      "struct_arg_axpy", dtypes=F32, threads=ops.numel("x"),
                      bind={"p": ops.struct(alpah=1.0, n="alpha")})
    assert message.startswith(f"{NS}::axpy_bad_fields: 3 problems, nothing is registered:"), message
    for fragment in [
        "bind['p'] gives field 'alpah', which Params does not have; its fields are: alpha, n. Did you mean 'alpha'?",
        "bind['p'] lacks fields alpha of Params; expected a value for each field (alpha, n)",
        "ops.struct(..., defaults=0)",
        "bind['p.n'] holds uint values; 'alpha' is a float",
    ]:
        assert fragment in message, (fragment, message)


@pytest.mark.parametrize("bind, fragments", [
    ({"p": ops.struct(alpha=1.0, n=-1)}, ["bind['p.n'] (uint): expected an integer that fits uint, got -1"]),
    ({"p": ops.struct(alpha=1.0, n=1.5)}, ["bind['p.n'] (uint): expected an integer", "got the float 1.5"]),
    ({"p": ops.struct(alpha=1.0, n="x")}, ["bind['p.n'] (uint) names 'x', a Tensor",
                                             "take float, int and bool arguments"]),
    ({"p": ops.struct(alpha=1.0, n="nope")}, ["bind['p.n'] names 'nope', which is not an argument of the schema"]),
    ({"p": ops.struct(alpha=1.0, n=(1, 2))}, ["bind['p.n'] (uint): expected an ops rule, a number or the name"]),
    ({"p": ops.struct(alpha=1.0, n=S("alpha", 0))}, ["rule size(alpha, 0) reads 'alpha' as Tensor, but it is a float"]),
    ({"p": (1, 2)}, ["bind['p'] is a struct (Params); expected ops.struct(...) with its fields alpha, n, got (1, 2)"]),
    ({"p": ops.struct(alpha=1.0, n=1), "x": ops.struct(a=1)},
     ["bind['x'] is ops.struct(...), but kernel argument 'x' has type float, which is not a struct"]),
    ({"p": ops.struct(alpha=1.0, n=1), "y": (1, 2)},
     ["the kernel writes kernel argument 'y' (buffer(1), float)", "bind a tensor", "not a tuple"]),
], ids=["negative_uint", "float_for_uint", "tensor_argument", "unknown_argument", "tuple_for_scalar",
        "rule_reads_a_float", "tuple_for_struct", "struct_for_a_float_pointer", "struct_for_a_written_pointer"])
def test_field_problems(fixtures_lib, bind, fragments, request):
    name = "axpy_refused_" + request.node.callspec.id
    message = refusal(fixtures_lib, name, "(Tensor x, Tensor(a!) y, float alpha) -> ()", "struct_arg_axpy",
                      dtypes=F32, threads=ops.numel("x"), bind=bind)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert message.startswith(f"{NS}::{name}")


def test_array_reference_of_the_wrong_length_is_refused(mlx_lib):
    message = refusal(mlx_lib, "rope_short_strides", "(Tensor x, Tensor offset, float scale, float b) -> Tensor",
                      "rope_{dtype}", dtypes=F32,
                      bind={"in": "x", "base": "b", "strides": (S("x", -1), 1), "out_strides": (1, 1, 1, 1),
                            "offset_stride": (0,), "n_head": S("x", 1)},
                      outputs={"out": ops.like("x")}, constants=dict(forward=True, traditional=False,
                                                                     hs_transpose=False),
                      threads=S("x", -1) // 2)
    assert "3 problems" in message, message
    assert "bind['strides'] is an array of 3; expected a tuple or list of 3 values, got 2 values" in message
    assert "bind['out_strides'] is an array of 3; expected a tuple or list of 3 values, got 4 values" in message
    assert "kernel argument 'offset_stride' (long&) holds one value; bind a rule or a number, not a tuple" in message


def test_gemm_struct_missing_fields_names_them_for_each_dtype_once(mlx_lib):
    options = gemm_options()
    options["bind"] = dict(options["bind"], params=ops.struct(M=S("a", 0), N=S("b", 1), K=S("a", 1)))
    message = refusal(mlx_lib, "mm_missing_fields", "(Tensor a, Tensor b) -> Tensor", GEMM, **options)
    assert ("(torch.float32 kernel steel_gemm_fused_nn_float32_float32_bm32_bn32_bk16_wm2_wn2; torch.float16 kernel "
            "steel_gemm_fused_nn_float16_float16_bm32_bn32_bk16_wm2_wn2): bind['params'] lacks fields lda, ldb, ldd, "
            "tiles_n, tiles_m, batch_stride_a, batch_stride_b, batch_stride_d, swizzle_log, "
            "gemm_k_iterations_aligned, batch_ndim of mlx::steel::GEMMParams") in message, message


def test_rule_errors_in_fields_are_raised_in_eager_and_fake_alike(mlx_lib):
    op = ops.define(f"{NS}::mm_bad_dim(Tensor a, Tensor b) -> Tensor", mlx_lib, GEMM,
                    **gemm_options(bind={"A": "a", "B": "b", "D": "out",
                                         "params": gemm_params(S("a", 0), S("b", 1), S("a", 1), swizzle_log=S("a", 2))}))
    for device in ("cpu", "meta"):
        with pytest.raises(tm.DispatchError, match=re.escape("size(a, 2): dimension 2 is out of range for 'a'")):
            op(torch.zeros(4, 4, device=device), torch.zeros(4, 4, device=device))


# --- tensors bound to arguments of a known size: their view must hold the bytes ---------------

def packed_gemm_params(fn, m, n, k):
    bm, bn, bk, _, _ = TILE
    return _pack_struct(fn, "params", M=m, N=n, K=k, lda=k, ldb=n, ldd=n, tiles_n=-(-n // bn), tiles_m=-(-m // bm),
                        batch_stride_a=m * k, batch_stride_b=k * n, batch_stride_d=m * n, swizzle_log=0,
                        gemm_k_iterations_aligned=k // bk, batch_ndim=1)


def gemm_call(fn, a, b, params):
    m, n = a.shape[0], b.shape[1]
    bm, bn, bk, wm, wn = TILE
    d = torch.zeros(m, n)
    constants = dict(GEMM_CONSTANTS, align_M=m % bm == 0, align_N=n % bn == 0, align_K=a.shape[1] % bk == 0)
    fn(A=a, B=b, D=d, params=params, constants=constants, threads=(-(-n // bn) * 32, -(-m // bm) * wn, wm),
       group_size=(32, wn, wm))
    return d


def params_tensor(fn, m, n, k, tail=0):
    """The packed params as a uint8 tensor, `tail` more bytes after them in its storage."""
    return torch.frombuffer(bytearray(packed_gemm_params(fn, m, n, k) + bytes(tail)), dtype=torch.uint8)


def test_a_slice_shorter_than_the_struct_is_refused_in_a_kernel_call(mlx_lib):
    fn = mlx_lib[GEMM.format(dtype="float32")]
    a, b = data((32, 32), 0), data((32, 32), 1)
    params = params_tensor(fn, 32, 32, 32)
    assert params.numel() == 72
    with pytest.raises(tm.DispatchError) as error:
        gemm_call(fn, a, b, params[:64])
    assert str(error.value) == (
        f"{fn.name}: argument 4 'params' (buffer(4), constant mlx::steel::GEMMParams*): expected at least 72 bytes, "
        "got a tensor with 64 bytes (64 elements of 1 byte; its storage holds 72 from its first element, but they "
        "are not the view's). Pass a tensor whose own elements hold all 72 bytes")
    # The whole struct in a view of a larger storage is fine, and so is the struct itself.
    for whole in (params, params_tensor(fn, 32, 32, 32, tail=16)[:72], params.view(torch.int32)):
        assert_product(gemm_call(fn, a, b, whole), a, b)


def test_a_slice_shorter_than_a_reference_is_refused(fixtures_lib):
    """constant Params& p (8 bytes): a one-float slice of a two-float tensor."""
    x, y = data((4,), 0), torch.zeros(4)
    p = torch.tensor([2.0, 0.0])
    p.view(torch.int32)[1] = 4
    refusal = re.escape("argument 2 'p' (buffer(2), constant Params&): expected at least 8 bytes, got a tensor with "
                        "4 bytes (1 element of 4 bytes; its storage holds 8 from its first element")
    with pytest.raises(tm.DispatchError, match=refusal):
        fixtures_lib.struct_arg_axpy(x, y, p[:1])
    assert bool((y == 0).all())
    fixtures_lib.struct_arg_axpy(x, y, p)
    torch.testing.assert_close(y, 2.0 * x)
    with pytest.raises(tm.DispatchError, match=refusal):  # calls after the first are bound natively: refused too
        fixtures_lib.struct_arg_axpy(x, y, p[:1])
    torch.testing.assert_close(y, 2.0 * x)


def test_a_slice_shorter_than_the_struct_is_refused_by_an_operator(mlx_lib):
    op = ops.define(f"{NS}::mm_tensor_params(Tensor a, Tensor b, Tensor params) -> Tensor", mlx_lib, GEMM,
                    **gemm_options(bind={"A": "a", "B": "b", "D": "out", "params": "params"}, dtypes=F32))
    fn = mlx_lib[GEMM.format(dtype="float32")]
    a, b = data((32, 32), 0), data((32, 32), 1)
    params = params_tensor(fn, 32, 32, 32)
    with pytest.raises(tm.DispatchError, match=re.escape(f"{NS}::mm_tensor_params: {fn.name}: argument 4 'params' "
                                                         "(buffer(4), constant mlx::steel::GEMMParams*): expected at "
                                                         "least 72 bytes, got a tensor with 64 bytes")):
        op(a, b, params[:64])
    assert_product(op(a, b, params), a, b)
