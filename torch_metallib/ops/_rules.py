"""Integer rules over an operator's arguments: grid sizes, output shapes, derived kernel
arguments and function constants.

A rule is written with Python operators, ``size("x", -1) // 4``, and is kept as postfix
tokens. The operator's native kernel evaluates the tokens on every call (no Python); the
fake kernel evaluates the same rule in Python on (possibly symbolic) sizes, so eager,
``torch.compile`` and export agree.
"""

import operator

import torch

from ..errors import TorchMetallibError

__all__ = ["Rule", "numel", "size", "stride", "dim", "arg", "present", "as_rule", "cdiv"]

# Token codes shared with csrc/ops/size_rule.h.
_CONSTANT, _NUMEL, _SIZE, _STRIDE, _DIM, _ARGUMENT, _PRESENT = 0, 1, 2, 3, 4, 5, 6
_READS = (_NUMEL, _SIZE, _STRIDE, _DIM, _ARGUMENT, _PRESENT)
_BINARY = {
    "+": (10, operator.add), "-": (11, operator.sub), "*": (12, operator.mul),
    "//": (13, operator.floordiv), "%": (14, operator.mod),
    "min": (15, lambda a, b: torch.sym_min(a, b)), "max": (16, lambda a, b: torch.sym_max(a, b)),
    "==": (17, operator.eq), "!=": (18, operator.ne), "<": (19, operator.lt), "<=": (20, operator.le),
    ">": (21, operator.gt), ">=": (22, operator.ge),
}
_BY_CODE = {code: function for code, function in _BINARY.values()}
_MAX_DEPTH = 16  # the native evaluator's stack


class Rule:
    """An int computed from the operator's arguments when it is called. Build rules with
    :func:`numel`, :func:`size`, :func:`stride`, :func:`dim`, :func:`arg`, ints and
    ``+ - * // %``, comparisons, :func:`cdiv`, ``Rule.min`` / ``Rule.max``."""

    __slots__ = ("_tokens", "_text", "_depth", "_operands")

    def __init__(self, tokens, text, depth, operands=None):
        self._tokens = tuple(tokens)  # (code, name or int, int)
        self._text = text
        self._depth = depth
        self._operands = operands     # (left, symbol, right) for a rule built from two

    # --- building ----------------------------------------------------------------------
    def _combine(self, other, symbol, swap=False):
        other = as_rule(other)
        left, right = (other, self) if swap else (self, other)
        depth = max(left._depth, right._depth + 1)
        if depth > _MAX_DEPTH:
            raise TorchMetallibError(f"rule {left._text} {symbol} {right._text} is nested too deeply "
                                     f"(at most {_MAX_DEPTH} levels)")
        return Rule(left._tokens + right._tokens + ((_BINARY[symbol][0], 0, 0),),
                    f"({left._text} {symbol} {right._text})", depth, (left, symbol, right))

    def __add__(self, other): return self._combine(other, "+")
    def __radd__(self, other): return self._combine(other, "+", swap=True)
    def __sub__(self, other): return self._combine(other, "-")
    def __rsub__(self, other): return self._combine(other, "-", swap=True)
    def __mul__(self, other): return self._combine(other, "*")
    def __rmul__(self, other): return self._combine(other, "*", swap=True)
    def __floordiv__(self, other): return self._combine(other, "//")
    def __rfloordiv__(self, other): return self._combine(other, "//", swap=True)
    def __mod__(self, other): return self._combine(other, "%")
    def __rmod__(self, other): return self._combine(other, "%", swap=True)
    def __eq__(self, other): return self._combine(other, "==")
    def __ne__(self, other): return self._combine(other, "!=")
    def __lt__(self, other): return self._combine(other, "<")
    def __le__(self, other): return self._combine(other, "<=")
    def __gt__(self, other): return self._combine(other, ">")
    def __ge__(self, other): return self._combine(other, ">=")
    __hash__ = None  # == builds a rule; rules are not dict keys

    def min(self, other):
        """The smaller of this rule and `other`."""
        return self._combine(other, "min")

    def max(self, other):
        """The larger of this rule and `other`."""
        return self._combine(other, "max")

    def __bool__(self):
        raise TypeError(f"rule {self._text} has no truth value until the operator is called; "
                        f"pass it as a value (e.g. constants={{'aligned': size('x', -1) % 4 == 0}})")

    def __repr__(self):
        return f"Rule({self._text})"

    @property
    def text(self) -> str:
        return self._text

    @property
    def operands(self):
        """(left, symbol, right) for a rule built from two rules, e.g. ``size("q", -1) == 64``;
        None for a number or a read of an argument."""
        return self._operands

    @property
    def names(self) -> set:
        """The argument names the rule reads."""
        return {a for code, a, _ in self._tokens if code in _READS}

    # --- using -------------------------------------------------------------------------
    def tokens(self, index_of) -> tuple:
        """(text, tokens) for the native kernel, argument names replaced by `index_of(name,
        reads)` (reads: "Tensor", "int" or "Tensor?")."""
        resolved = []
        for code, a, b in self._tokens:
            if code in _READS:
                a = index_of(a, "int" if code == _ARGUMENT else "Tensor?" if code == _PRESENT else "Tensor", self._text)
            resolved.append((code, a, b))
        return self._text, resolved

    def evaluate(self, values: dict):
        """The rule's value for arguments `values` (name -> tensor or number); works on
        symbolic sizes too."""
        stack = []
        for code, a, b in self._tokens:
            if code == _CONSTANT:
                stack.append(a)
            elif code == _NUMEL:
                stack.append(values[a].numel())
            elif code == _SIZE:
                stack.append(values[a].size(self._dimension(values[a], a, b)))
            elif code == _STRIDE:  # the kernel sees a contiguous copy
                stack.append(values[a].contiguous().stride(self._dimension(values[a], a, b)))
            elif code == _DIM:
                stack.append(values[a].dim())
            elif code == _ARGUMENT:
                stack.append(int(values[a]))
            elif code == _PRESENT:
                stack.append(int(values[a] is not None))
            else:
                right, left = stack.pop(), stack.pop()
                if code in (13, 14) and isinstance(right, int) and right == 0:
                    raise ZeroDivisionError(f"{self._text}: division by zero")
                result = _BY_CODE[code](left, right)
                if isinstance(result, bool):  # comparisons count as 0 / 1, as natively
                    result = int(result)
                elif isinstance(result, torch.SymBool):
                    result = torch.sym_ite(result, 1, 0)
                stack.append(result)
        return stack[0]

    def _dimension(self, tensor, name, dim):
        """`dim` of `tensor` made non-negative; IndexError worded as the native evaluator."""
        dims = tensor.dim()
        if not -dims <= dim < dims:
            raise IndexError(f"{self._text}: dimension {dim} is out of range for '{name}', which has {dims} dimensions")
        return dim + dims if dim < 0 else dim


def as_rule(value) -> Rule:
    """`value` as a rule: a Rule, or an int (bools count as 0 / 1)."""
    if isinstance(value, Rule):
        return value
    if isinstance(value, int):
        if not -2**63 <= value < 2**63:
            raise TorchMetallibError(f"rule constant {value} does not fit 64 bits")
        return Rule(((_CONSTANT, int(value), 0),), str(int(value)), 1)
    raise TorchMetallibError(f"expected a rule or an int, got {value!r} ({type(value).__name__})")


def _check_name(name):
    if not isinstance(name, str) or not name:
        raise TorchMetallibError(f"expected an argument name, got {name!r}")
    return name


def numel(name: str) -> Rule:
    """The number of elements of tensor argument `name`."""
    return Rule(((_NUMEL, _check_name(name), 0),), f"numel({name})", 1)


def size(name: str, dim: int) -> Rule:
    """``tensor.size(dim)`` of tensor argument `name` (negative dims count from the end)."""
    return Rule(((_SIZE, _check_name(name), int(dim)),), f"size({name}, {dim})", 1)


def stride(name: str, dim: int) -> Rule:
    """The stride of dimension `dim` of tensor argument `name`, as the kernel sees it: the
    operator passes tensors contiguous."""
    return Rule(((_STRIDE, _check_name(name), int(dim)),), f"stride({name}, {dim})", 1)


def dim(name: str) -> Rule:
    """The number of dimensions of tensor argument `name`."""
    return Rule(((_DIM, _check_name(name), 0),), f"dim({name})", 1)


def arg(name: str) -> Rule:
    """The value of int or bool argument `name`."""
    return Rule(((_ARGUMENT, _check_name(name), 0),), name, 1)


def present(name: str) -> Rule:
    """1 if optional tensor argument `name` (``Tensor?``) is given, else 0; e.g. for a
    function constant that guards a kernel argument."""
    return Rule(((_PRESENT, _check_name(name), 0),), f"present({name})", 1)


def cdiv(a, b) -> Rule:
    """Ceiling division ``(a + b - 1) // b`` for positive b."""
    return (as_rule(a) + as_rule(b) - 1) // b
