"""Function-constant predicates the compiler derives (docs/formats.md, AIR).

An argument declared ``[[function_constant(use_bias)]]`` where ``use_bias`` is not itself a
function constant but an expression of them (``constant bool use_bias = fused_bias &&
!batched;``) names a predicate global, ``@__metal_implicit_fc_pred_N``, that the module's
``air.static_init`` functions compute from the constants' initializer globals. This module
reads that straight-line code back into a small expression, so the binding plan can tell,
for the constants of a call, whether the argument exists; an expression it cannot read
(branches, floating-point comparisons, memory it does not know) is None, and the argument
is then bound as if its predicate were true.

An expression is a nested list (JSON in the call record, evaluated by
csrc/dispatch/constant_predicate.cpp): ``["int", bits, value]``, ``["const", bits, index]``
(the constant's value, 0 when an optional one is not set), ``["defined", 1, index]``,
``[op, bits, a, b]`` for the integer binary operators, ``["icmp", bits, predicate, a, b]``,
``["select", bits, c, a, b]`` and ``[cast, bits, from_bits, a]`` for zext, sext and trunc;
``bits`` is the width of the result.
"""

import re
from typing import Dict, Optional

__all__ = ["derived_predicates"]

_BINARY = {"add", "sub", "mul", "udiv", "sdiv", "urem", "srem", "shl", "lshr", "ashr", "and", "or", "xor"}
_FLAGS = {"nuw", "nsw", "exact", "disjoint"}
_ASSIGN = re.compile(r"^\s*(%[\w.$-]+) = (.*)$")
_STORE = re.compile(r"^\s*store i(\d+) ([^,]+), ptr addrspace\(2\) @([\w.$\"-]+)")
_LOAD = re.compile(r"^load i(\d+), ptr addrspace\(2\) @([\w.$\"-]+)")
_CALL = re.compile(r"^(?:tail )?call (?:zeroext |signext )?i(\d+) @(air\.[\w.]+)\((.*)\)")
_GLOBAL_OPERAND = re.compile(r"@([\w.$\"-]+)\)?\s*$")
_MAX_DEPTH = 200


class _Unreadable(Exception):
    """The predicate's code is not the straight-line integer code read here."""


def derived_predicates(text, names: Dict[str, str], initializers: Dict[str, int]) -> Dict[str, Optional[list]]:
    """Predicate name -> expression (None if unreadable), for `names` (predicate name ->
    its global); `initializers`: initializer global -> function constant index."""
    if not names:
        return {}
    values, stores = {}, {}
    for body in text.bodies_in_section("air.static_init"):
        for line in body.splitlines():
            assigned = _ASSIGN.match(line)
            if assigned:
                values[assigned.group(1)] = assigned.group(2)
                continue
            stored = _STORE.match(line)
            if stored:
                stores[stored.group(3).strip('"')] = (int(stored.group(1)), stored.group(2).strip())
            elif line.strip().startswith(("br ", "switch ", "phi ")):
                return {name: None for name in names}  # not straight-line code
    reader = _Reader(values, stores, initializers)
    result = {}
    for name, global_name in names.items():
        try:
            result[name] = reader.stored(global_name, 0)
        except (_Unreadable, ValueError, IndexError):  # ValueError/IndexError: an operand list of another shape
            result[name] = None
    return result


class _Reader:
    def __init__(self, values: Dict[str, str], stores: Dict[str, tuple], initializers: Dict[str, int]):
        self.values, self.stores, self.initializers = values, stores, initializers

    def stored(self, global_name: str, depth: int) -> list:
        if global_name not in self.stores:
            raise _Unreadable(global_name)
        bits, operand = self.stores[global_name]
        return self.operand(operand, bits, depth + 1)

    def operand(self, operand: str, bits: int, depth: int) -> list:
        if depth > _MAX_DEPTH:
            raise _Unreadable("too deep")
        if operand in ("true", "false"):
            return ["int", bits, int(operand == "true")]
        if re.fullmatch(r"-?\d+", operand):
            return ["int", bits, int(operand) & ((1 << bits) - 1)]
        if operand in self.values:
            return self.instruction(self.values[operand], depth + 1)
        raise _Unreadable(operand)

    def instruction(self, code: str, depth: int) -> list:
        code = code.split(", !")[0]  # metadata attachments
        words = code.split(" ")
        opcode = words[0]
        if opcode in _BINARY:
            words = [w for w in words[1:] if w not in _FLAGS]
            bits = _bits(words[0])
            a, b = " ".join(words[1:]).split(", ")
            return [opcode, bits, self.operand(a, bits, depth), self.operand(b, bits, depth)]
        if opcode == "icmp":
            predicate, bits = words[1], _bits(words[2])
            a, b = " ".join(words[3:]).split(", ")
            return ["icmp", 1, predicate, self.operand(a, bits, depth), self.operand(b, bits, depth)]
        if opcode == "select":
            parts = " ".join(words[1:]).split(", ")
            condition, (type_a, a), (_, b) = parts[0].split(" ", 1)[1], parts[1].split(" ", 1), parts[2].split(" ", 1)
            bits = _bits(type_a)
            return ["select", bits, self.operand(condition, 1, depth), self.operand(a, bits, depth),
                    self.operand(b, bits, depth)]
        if opcode in ("zext", "sext", "trunc"):
            match = re.fullmatch(r"(?:nneg )?i(\d+) (\S+) to i(\d+)", " ".join(words[1:]))
            if not match:
                raise _Unreadable(code)
            source = int(match.group(1))
            return [opcode, int(match.group(3)), source, self.operand(match.group(2), source, depth)]
        loaded = _LOAD.match(code)
        if loaded:
            bits, global_name = int(loaded.group(1)), loaded.group(2).strip('"')
            if global_name in self.initializers:
                return ["const", bits, self.initializers[global_name]]
            return self.stored(global_name, depth)
        called = _CALL.match(code)
        if called:
            bits, callee, arguments = int(called.group(1)), called.group(2), called.group(3)
            if callee == "air.is_function_constant_defined":
                target = _GLOBAL_OPERAND.search(arguments)
                if target and target.group(1).strip('"') in self.initializers:
                    return ["defined", 1, self.initializers[target.group(1).strip('"')]]
            elif callee.startswith("air.normalize_function_constant_predicate.") and arguments.startswith(f"i{bits} "):
                value = self.operand(arguments.split(" ", 1)[1].strip(), bits, depth)
                return ["zext", bits, 1, ["icmp", 1, "ne", value, ["int", bits, 0]]]
        raise _Unreadable(code)


def _bits(type_name: str) -> int:
    if not re.fullmatch(r"i\d+", type_name) or int(type_name[1:]) > 64:
        raise _Unreadable(type_name)
    return int(type_name[1:])
