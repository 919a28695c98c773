"""Integer division that cannot trap: x / 0 is x and x % 0 is 0; INT_MIN / -1 wraps to
INT_MIN and INT_MIN % -1 is 0.

Metal leaves integer division by zero undefined and Apple GPUs do not trap, so a kernel
given a zero divisor (MLX's int Divide, Remainder, FloorDivide, DivMod on user data) runs on
a Mac; on x86-64 the same ``sdiv``/``udiv``/``srem``/``urem`` raises SIGFPE and kills the
Python process, as INT_MIN / -1 does. So each division by a value that is not a constant
gets its divisor replaced by 1 where it is 0 (or -1 under INT_MIN, signed): the results
above, deterministic, and the quotient of every other pair unchanged.
"""

import itertools
import re

from ..reflection.ir_model import NAME

__all__ = ["guard_integer_division"]

_DIVISION = re.compile(rf"^(\s*)(%{NAME}) = (sdiv|udiv|srem|urem)( exact)? (i\d+|<\d+ x i\d+>) ([^,]+), (%{NAME})\s*$",
                       re.M)


def guard_integer_division(text: str) -> str:
    counter = itertools.count()

    def guard(match) -> str:
        indent, result, op, exact, type_name, dividend, divisor = match.groups()
        vector = re.fullmatch(r"<(\d+) x i(\d+)>", type_name)
        lanes, width = (int(vector.group(1)), int(vector.group(2))) if vector else (1, int(type_name[1:]))
        flags = f"<{lanes} x i1>" if vector else "i1"

        def constant(value: int) -> str:
            return "<" + ", ".join([f"i{width} {value}"] * lanes) + ">" if vector else str(value)

        n = next(counter)
        lines = [f"%tm.div{n}.zero = icmp eq {type_name} {divisor}, {constant(0)}"]
        bad = f"%tm.div{n}.zero"
        if op in ("sdiv", "srem"):
            lines += [f"%tm.div{n}.min = icmp eq {type_name} {dividend}, {constant(-(1 << (width - 1)))}",
                      f"%tm.div{n}.neg = icmp eq {type_name} {divisor}, {constant(-1)}",
                      f"%tm.div{n}.wraps = and {flags} %tm.div{n}.min, %tm.div{n}.neg",
                      f"%tm.div{n}.bad = or {flags} %tm.div{n}.zero, %tm.div{n}.wraps"]
            bad = f"%tm.div{n}.bad"
        lines += [f"%tm.div{n} = select {flags} {bad}, {type_name} {constant(1)}, {type_name} {divisor}",
                  f"{result} = {op}{exact or ''} {type_name} {dividend}, %tm.div{n}"]
        return "\n".join(indent + line for line in lines)

    return _DIVISION.sub(guard, text)
