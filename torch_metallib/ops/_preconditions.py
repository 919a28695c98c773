"""Preconditions of an operator, ``define(..., require=[...])``: comparisons of rules that
every call must satisfy, such as ``ops.size("q", -1) == 64`` for a kernel built for one head
dimension. They are checked before anything runs: in eager calls by a Python kernel in
front of the native one, in the fake (meta) kernel on concrete sizes as in eager, and on
symbolic sizes with ``torch._check_with``, which ``torch.compile`` turns into a guard or a
runtime assertion instead of a graph break.
"""

import operator

import torch

from ..errors import DispatchError, KernelArgumentError, OpDefinitionError
from ._rules import Rule

__all__ = ["Precondition"]

_COMPARISONS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
                ">": operator.gt, ">=": operator.ge}
_ARITHMETIC = ("+", "-", "*", "//", "%")  # bind tighter than comparisons: no parentheses needed


def _written(rule: Rule) -> str:
    """`rule`'s text as it would be written as one side of a comparison."""
    operands = rule.operands
    return rule.text[1:-1] if operands is not None and operands[1] in _ARITHMETIC else rule.text


def _reads(rule: Rule) -> list:
    """The argument reads in `rule` (size(q, -1), numel(x), k...), each once, left to right."""
    if rule.operands is None:
        return [rule] if rule.names else []
    left, _, right = rule.operands
    found = _reads(left)
    return found + [r for r in _reads(right) if r.text not in {f.text for f in found}]


def _shown(value) -> str:
    """A value for a message: an int, or a symbolic size's example value where it has one."""
    if isinstance(value, torch.SymInt):
        hint = value.node.hint
        return str(value) if hint is None else str(int(hint))
    return str(int(value))


class Precondition:
    """One entry of ``require``: a comparison of rules, checked on every call."""

    __slots__ = ("rule", "left", "symbol", "right", "text")

    def __init__(self, rule, where: str):
        operands = rule.operands if isinstance(rule, Rule) else None
        if operands is None or operands[1] not in _COMPARISONS:
            shown = rule.text if isinstance(rule, Rule) else repr(rule)
            raise OpDefinitionError(f"{where}: expected a comparison of rules (==, !=, <, <=, >, >= between ops "
                                    f"rules or ints), got {shown}; write e.g. ops.size('q', -1) == 64")
        self.rule = rule
        self.left, self.symbol, self.right = operands
        self.text = f"{_written(self.left)} {self.symbol} {_written(self.right)}"

    def check(self, qualname: str, values: dict) -> None:
        """Raises KernelArgumentError naming the operator, this precondition and the values
        found if it does not hold for arguments `values` (name -> value); on symbolic sizes
        the check becomes torch's guard or runtime assertion."""
        try:
            left, right = self.left.evaluate(values), self.right.evaluate(values)
        except (ZeroDivisionError, IndexError) as error:  # as the rules of outputs and the grid
            raise DispatchError(f"{qualname}: {error}") from None
        holds = _COMPARISONS[self.symbol](left, right)
        if holds is True:
            return
        if holds is False:
            raise KernelArgumentError(self._refusal(qualname, values, left, right))
        torch._check_with(KernelArgumentError, holds, lambda: self._refusal(qualname, values, left, right))

    def _refusal(self, qualname, values, left, right) -> str:
        sides = [(side, value) for side, value in ((self.left, left), (self.right, right)) if side.names]
        reads = _reads(self.rule)
        if len(sides) == 1 and sides[0][0].operands is None:
            found = _shown(sides[0][1])
        else:
            shown = [(read.text, _shown(read.evaluate(values))) for read in reads]
            shown += [(_written(side), _shown(value)) for side, value in sides if side.operands is not None]
            found = ", ".join(f"{text} = {value}" for text, value in shown)
        return (f"{qualname}: a precondition does not hold; expected {self.text}, got {found}. Pass arguments "
                f"that meet it: the operator's kernels are built for those (define(..., require=[...]))")
