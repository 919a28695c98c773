"""PyTorch's elementwise kernel templates (c10/metal/indexing.h), called as its host code calls them.

A kernel name reads ``<op>_<variant>_<dtypes>``: ``add_dense_float_float`` (output, input
types), ``add_strided_cast_float`` (the functor's type; inputs of any type), ``sin_dense_castout_ilp_half``
(input type; output of any type). The operands' order is their binding order: ``input``,
``other`` / ``broadcast`` / ``scalar``, and ``*_rhs`` / ``*_lhs`` swap the two. Variants:

* dense: one element per thread; with a ``numel`` (``_ilp4``, unary dense) four per thread.
* strided: sizes and per-tensor strides in bytes over a ``void*``; a linear thread index, or
  for unary ops a 2-D grid whose x is the first dimension.
* cast / castout: inputs or output of another dtype, named by ``c10::ScalarType`` codes
  (``sizes_types``: element sizes then codes; ``ndim_types``: ndim then codes).
* broadcast: the second operand repeats every ``broadcast_numel`` elements; scalar: one element.
"""

import re
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from .buffers import bindable, untouched, zeroed_between_sentinels
from .compare import mismatch
from .dtypes import METAL_DTYPES, SCALAR_TYPE_CODES, is_complex, is_integral, wide
from .inputs import generator, values
from .references import BINARY, UNARY, Reference

_VARIANT_WORDS = {"dense", "strided", "scalar", "lhs", "rhs", "cast", "castout", "ilp", "ilp4", "broadcast"}
_DATA = ("input", "other", "broadcast", "scalar")
N = 1003                    # not a multiple of 4: the last thread of a 4-per-thread kernel is partial
SHAPE = (7, 11, 13)         # strided kernels: 1,001 elements, every tensor in its own layout
BROADCAST = 17              # 1,003 = 59 * 17


@dataclass
class Parsed:
    op: str
    variant: Tuple[str, ...]
    dtypes: Tuple[torch.dtype, ...]


def parse(name: str) -> Optional[Parsed]:
    """Split a kernel name whose op has a reference; None for other kernels."""
    for op in sorted(list(UNARY) + list(BINARY), key=len, reverse=True):
        if not (name.startswith(op + "_dense") or name.startswith(op + "_strided")):
            continue
        # The struct type a parameterized template names (``..._ELUBackwardParams_float``).
        words = [w for w in name[len(op) + 1:].split("_") if w != "ELUBackwardParams"]
        variant = []
        while words and words[0] in _VARIANT_WORDS:
            variant.append(words.pop(0))
        if not words or any(w not in METAL_DTYPES for w in words):
            return None
        return Parsed(op, tuple(variant), tuple(METAL_DTYPES[w] for w in words))
    return None


def result_dtypes(names) -> Dict[Tuple[str, torch.dtype], torch.dtype]:
    """(op, functor type) -> result type, from the plain dense kernels' names (``op_dense_O_I``)."""
    table = {}
    for name in names:
        parsed = parse(name)
        if parsed and parsed.variant == ("dense",) and len(parsed.dtypes) >= 2:
            table[(parsed.op, parsed.dtypes[1])] = parsed.dtypes[0]
    return table


# A second dtype the functor's type converts from exactly: what cast kernels are fed.
_CAST_PARTNER = {
    torch.float32: torch.int16, torch.float16: torch.int8, torch.bfloat16: torch.int8,
    torch.int64: torch.int32, torch.int32: torch.int16, torch.int16: torch.int8,
    torch.int8: torch.bool, torch.uint8: torch.bool, torch.bool: torch.bool,
    torch.complex64: torch.float32, torch.complex32: torch.float16,
    torch.uint16: torch.uint8, torch.uint32: torch.uint8, torch.uint64: torch.uint8,
}
# An output dtype other than the result's, for castout kernels.
_CASTOUT = {
    torch.float32: torch.float16, torch.float16: torch.float32, torch.bfloat16: torch.float32,
    torch.int64: torch.int32, torch.int32: torch.int64, torch.int16: torch.int32,
    torch.int8: torch.int32, torch.uint8: torch.int32, torch.bool: torch.uint8,
    torch.complex64: torch.complex64, torch.complex32: torch.complex64,
    torch.uint16: torch.int32, torch.uint32: torch.int64, torch.uint64: torch.int64,
}


class NoHarness(Exception):
    """The kernel's shape is not one this harness knows: reported as not attempted."""


def _strided_view(flat: torch.Tensor, order: Tuple[int, int, int]) -> torch.Tensor:
    """`flat`'s SHAPE[0]*SHAPE[1]*SHAPE[2] values laid out with dimensions permuted by `order`."""
    permuted = tuple(SHAPE[i] for i in order)
    inverse = [order.index(i) for i in range(3)]
    return flat.reshape(permuted).permute(*inverse)


def _torch_result(ref: Reference, dtype: torch.dtype) -> Optional[torch.dtype]:
    """The result type torch gives `ref` on `dtype` (floats stay, integers become float32 for
    float functions): for a library subset that lacks the plain dense sibling's name."""
    sample = torch.ones(2, dtype=torch.complex64 if dtype == torch.complex32 else dtype)
    try:
        alpha = () if ref.alpha is None else (ref.alpha,)
        result = ref.fn(*([sample] * ref.arity), *alpha).dtype
    except (RuntimeError, NotImplementedError, TypeError):
        return None
    return torch.complex32 if dtype == torch.complex32 and result == torch.complex64 else result


def _opmath(result: torch.dtype):
    """The dtype PyTorch's functors compute `result` in (opmath_t), or None for integers."""
    if is_complex(result):
        return torch.complex64
    if result.is_floating_point:
        return torch.float32
    return None


def _evaluate(ref: Reference, operands, alpha, result: torch.dtype, widen) -> Optional[torch.Tensor]:
    """The reference over `operands` converted by `widen` (a dtype -> dtype function: to the
    wide types, or to one precision): integer operands become floating where the result is
    floating (as the functors convert them) or where `widen` is a float precision (an integer
    result of a float functor); bools stay bools where the result is a bool (logical, not
    bitwise, meaning). None where torch has no kernel at that precision."""
    converted = []
    for t in operands:
        if t.dtype == torch.bool and result == torch.bool:
            converted.append(t)
        elif is_integral(t.dtype) and (result.is_floating_point or is_complex(result)
                                       or widen(torch.float32) == torch.float32):
            converted.append(t.to(widen(torch.float32)))
        else:
            converted.append(t.to(widen(t.dtype)))
    try:
        return ref.fn(*converted, *alpha)
    except (RuntimeError, NotImplementedError):
        pass
    if is_complex(result) and any(t.dtype.is_floating_point for t in converted):
        try:  # a real operand of a complex functor (lerp's cast variants): as a complex value
            return ref.fn(*[t.to(widen(torch.complex64)) if t.dtype.is_floating_point else t
                            for t in converted], *alpha)
        except (RuntimeError, NotImplementedError):
            pass
    # torch has no such kernel for bools or integers (sub, div, silu on bools and ints):
    # the functor's arithmetic on their values, in int64 or float64.
    if any(t.dtype == torch.bool or is_integral(t.dtype) for t in operands):
        try:
            retry = [t.to(torch.int64) if t.dtype == torch.bool else t for t in converted]
            return ref.fn(*retry, *alpha)
        except (RuntimeError, NotImplementedError):
            try:
                floating = widen(torch.float32)
                return ref.fn(*[t.to(floating) if not is_complex(t.dtype) else t for t in converted], *alpha)
            except (RuntimeError, NotImplementedError):
                pass
    if widen is wide:
        raise NoHarness(f"torch has no {ref.fn} for {[t.dtype for t in operands]}")
    return None  # torch has no kernel at this precision: the float64 reference alone


class ElementwiseCall:
    """Arguments, grid and reference for one elementwise kernel."""

    def __init__(self, function, parsed: Parsed, results: Dict, device: str):
        self.function, self.parsed, self.device = function, parsed, device
        self.reference: Reference = UNARY.get(parsed.op) or BINARY[parsed.op]
        buffers = [a for a in function.arguments if a.kind == "buffer"]
        self.buffers = {a.name: a for a in buffers}
        self.data = [a.name for a in buffers if a.name in _DATA]
        if len(self.data) != self.reference.arity:
            raise NoHarness(f"expected {self.reference.arity} operands, found {self.data}")
        self.variant = set(parsed.variant)
        self.cast_in = "cast" in self.variant
        self.strided = "strided" in self.variant
        named_result = "castout" not in self.variant and len(parsed.dtypes) >= 2
        t = parsed.dtypes[1] if named_result else parsed.dtypes[0]
        self.functor_type = t
        result = parsed.dtypes[0] if named_result else results.get((parsed.op, t)) or _torch_result(self.reference, t)
        if result is None:
            raise NoHarness(f"no plain dense sibling names the result type of {parsed.op} on {t}")
        self.result_dtype = result
        self.out_dtype = _CASTOUT[result] if "castout" in self.variant else result
        self.gen = generator(function.name)

    def operand_dtype(self, position: int) -> torch.dtype:
        if self.cast_in and position == 1:
            return _CAST_PARTNER[self.functor_type]
        return self.functor_type

    def run(self):
        """(actual output, wide reference, margins intact) after calling the kernel."""
        strided, ref = self.strided, self.reference
        numel = 1001 if strided else N
        kwargs, operands_wide = {}, []
        orders = [(2, 1, 0), (0, 1, 2), (1, 0, 2), (2, 0, 1)]
        for position, name in enumerate(self.data):
            dtype = self.operand_dtype(position)
            count = numel
            if name == "broadcast":
                count = BROADCAST
            elif name == "scalar":
                count = 1
            # Series and recurrences are compared away from their poles (0, -1, ...).
            domain = "smooth" if ref.domain == "any" and ref.tolerance == "special" else ref.domain
            flat = values(count, dtype, domain, self.gen, operand=position).to(self.device)
            if strided:
                view = _strided_view(flat, orders[position + 1])
                kwargs[name] = view
                operands_wide.append(view.cpu().flatten())
            else:
                kwargs[name] = flat
                repeat = numel // count
                operands_wide.append(flat.cpu().repeat(repeat))
        storage, out = zeroed_between_sentinels(numel, self.out_dtype, self.device, pad=64)
        if strided:
            out = _strided_view(out, orders[0])
        output_name = "output" if "output" in self.buffers else "out"
        kwargs[output_name] = out
        self._sizes_and_types(kwargs, out, numel)
        if ref.params is not None:
            kwargs["alpha"] = ref.params(self.functor_type, self.buffers["alpha"].type_size)
        elif ref.alpha is not None:
            if "alpha" not in self.buffers:
                raise NoHarness("the reference takes a scalar but the kernel has no `alpha`")
            # A complex functor takes its scalar as a (real, imaginary) pair.
            alpha = bool(ref.alpha) if self.functor_type == torch.bool else \
                ref.int_alpha if is_integral(self.functor_type) else ref.alpha
            kwargs["alpha"] = (alpha, 0) if is_complex(self.functor_type) else alpha
        threads = self._threads(numel)
        self.function(threads=threads, **{k: bindable(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})
        alpha = () if ref.alpha is None else (kwargs["alpha"],) if not is_complex(self.functor_type) else (ref.alpha,)
        expected = _evaluate(ref, operands_wide, alpha, self.result_dtype, wide)
        # The functor computes in opmath_t (float for half and bfloat): torch's own op at
        # that precision is the second reference.
        candidates = [expected]
        # Integer results of float functors (silu of an int) are computed in float too.
        for precision in (_opmath(self.result_dtype) or torch.float32, self.result_dtype):
            if precision.is_floating_point or is_complex(precision):
                candidates.append(_evaluate(ref, operands_wide, alpha, self.result_dtype,
                                            lambda t, p=precision: p if t.is_floating_point or is_complex(t)
                                            else wide(t)))
        actual = out.cpu().flatten()
        return actual, [c for c in candidates if c is not None], untouched(storage.cpu(), out)

    def _threads(self, numel: int):
        if "numel" in self.buffers or "size_outtype_numel" in self.buffers:
            return (numel + 3) // 4
        position = next((a for a in self.function.arguments if a.kind == "builtin"), None)
        if self.strided and position is not None and position.components == 2:
            dims = list(reversed(SHAPE))
            rest = 1
            for d in dims[1:]:
                rest *= d
            return (dims[0], rest)
        return numel

    def _sizes_and_types(self, kwargs, out, numel):
        """The packed sizes, strides, element sizes and ScalarType codes the variant takes."""
        data = [kwargs[name] for name in self.data]
        code = SCALAR_TYPE_CODES
        esize = [t.element_size() for t in data]
        codes = [code[t.dtype] for t in data]
        out_code, out_size = code[self.out_dtype], out.element_size()
        if self.strided:
            # Innermost dimension first, as the kernels decompose the thread index.
            dims = list(reversed(range(out.dim())))
            kwargs["sizes"] = [out.shape[d] for d in dims]
            kwargs["output_strides"] = [out.stride(d) * out_size for d in dims]
            for name, t in zip(self.data, data):
                kwargs[f"{name}_strides"] = [t.stride(d) * t.element_size() for d in dims]
        ndim = out.dim()
        packed = {
            "numel": numel,
            "size_outtype": (out_size, out_code),
            "size_outtype_numel": (out_size, out_code, numel),
            "ndim_outtype": (ndim, out_code),
            "broadcast_numel": BROADCAST,
            "ndim": (ndim, *codes, 0, 0)[:3] if self._vector("ndim") == 3 else ndim,
            "ndim_types": (ndim, *codes, 0, 0, 0)[:4],
            "sizes_types": (*esize, 0, 0)[:2] + (*codes, 0, 0)[:2] if len(esize) >= 1 else None,
        }
        for name in self.buffers:
            if name in packed and name not in kwargs:
                kwargs[name] = packed[name]

    def _vector(self, name: str) -> int:
        arg = self.buffers[name] if name in self.buffers else None
        match = re.search(r"(\d)$", arg.type_name) if arg is not None else None
        return int(match.group(1)) if match else 1


def check(function, results: Dict, device: str) -> Tuple[str, str]:
    """(outcome, detail) for one elementwise kernel; NoHarness when its shape is unknown.

    The output must match torch's op computed in float64, in the functor's opmath_t (float
    for half and bfloat), or in the result's own type (kernels that divide in half, as
    ``div_trunc_dense_broadcast_rhs_half_half``'s ``fdiv half`` does): each is what the
    kernel computes for some of PyTorch's variants, read from their AIR."""
    parsed = parse(function.name)
    if parsed is None:
        raise NoHarness("no reference for this op")
    call = ElementwiseCall(function, parsed, results, device)
    actual, references, intact = call.run()
    if not intact:
        return "wrong", "wrote outside its output"
    if call.reference.real_part_only:
        actual, references = actual.real, [r.real for r in references]
    if call.out_dtype != call.result_dtype:
        # The functor's result is rounded to its own type, then converted to the output's:
        # compared in the narrower of the two.
        narrow = min((call.result_dtype, call.out_dtype), key=lambda t: torch.finfo(t).bits
                     if t.is_floating_point else 64)
        actual, references = actual.to(narrow), [r.to(call.result_dtype) for r in references]
    tolerance = call.reference.tolerance
    if is_complex(call.result_dtype):
        # Complex products and quotients round several times; complex functions follow
        # textbook formulas (sqrt((|z| - x) / 2)) that cancel where torch's do not.
        tolerance = {"exact": "math", "math": "special"}.get(tolerance, tolerance)
    problems = [mismatch(actual, r, tolerance, half_complex=call.result_dtype == torch.complex32)
                for r in references]
    return ("correct", "") if None in problems else ("wrong", problems[0])
