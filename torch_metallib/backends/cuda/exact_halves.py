"""Answers matrix_products.py's tensor-core question once O3 has run: is each float operand
of a simdgroup-matrix product a half (or bfloat) value converted to float?

``@tm.cuda.exact.f16(float %v)`` (``.bf16``) becomes true where %v is, after optimization,
``fpext half`` (``fpext bfloat``), a float constant that type holds exactly, or a select or
phi of such values; false otherwise. MLX's steel GEMMs load half or bfloat tiles into float
fragments, so theirs become true and the products run on tensor cores; a float GEMM's
become false, and its FMA path is all that remains after the clean-up passes.
"""

import re
import struct
from typing import Dict, FrozenSet

import llvmlite.binding as llvm

from .matrix_products import EXACT_MARKER, TENSOR_CORE_TYPES

__all__ = ["answer_exact_questions", "has_exact_questions"]

_KINDS = {kind: half for half, kind in TENSOR_CORE_TYPES.items()}  # f16 -> half
_QUESTION = re.compile(r"^(\s*)(%[-\w$.]+) = (?:tail )?call (?:noundef )?i1 @" + re.escape(EXACT_MARKER)
                       + r"\.(\w+)\(float (?:noundef )?([^,)]+)\)[^\n]*$", re.M)
_DEFINITION = re.compile(r"^\s*(%[-\w$.]+) = ([^\n]*)$", re.M)
_OPERAND = r"(%[-\w$.]+|[-+\w.]+)"


def has_exact_questions(text: str) -> bool:
    return f"@{EXACT_MARKER}." in text


def _constant_exact(literal: str, half: str) -> bool:
    """Whether float constant `literal` (LLVM's decimal or 64-bit hex spelling) is a `half` value."""
    try:
        value = struct.unpack("<d", bytes.fromhex(literal[2:])[::-1])[0] if literal.startswith("0x") else float(literal)
    except ValueError:
        return False
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    if half == "bfloat":
        return bits & 0xFFFF == 0
    try:
        return struct.unpack("<e", struct.pack("<e", value))[0] == value or value != value
    except OverflowError:
        return False


def _exact(operand: str, half: str, definitions: Dict[str, str], path: FrozenSet[str] = frozenset()) -> bool:
    """Whether `operand` is a `half` value; `path`: the selects and phis being asked about
    (a cycle through them adds no value the other inputs do not: a loop phi)."""
    if not operand.startswith("%"):
        return _constant_exact(operand, half)
    if operand in path:
        return True
    path = path | {operand}
    definition = definitions.get(operand, "")
    if re.match(rf"fpext {half} ", definition):
        return True
    select = re.fullmatch(rf"select (?:[\w ]+ )?i1 [^,]+, float {_OPERAND}, float {_OPERAND}", definition)
    if select:
        return all(_exact(v, half, definitions, path) for v in select.groups())
    if definition.startswith("phi ") and re.match(r"phi (?:[\w ]+ )?float ", definition):
        incoming = re.findall(r"\[ " + _OPERAND + r", %[-\w$.]+ \]", definition)
        return bool(incoming) and all(_exact(v, half, definitions, path) for v in incoming)
    return False


def answer_exact_questions(text: str) -> str:
    """`text` (an optimized module) with every tensor-core question answered as a constant."""
    functions = re.split(r"(?m)^(?=define )", text)
    for index, body in enumerate(functions):
        if not has_exact_questions(body) or not body.startswith("define "):
            continue
        definitions = {name: rest for name, rest in _DEFINITION.findall(body)}
        def answer(match, definitions=definitions):
            indent, name, kind, operand = match.groups()
            exact = _exact(operand.strip(), _KINDS[kind], definitions)
            return f"{indent}{name} = or i1 {'true' if exact else 'false'}, false"
        functions[index] = _QUESTION.sub(answer, body)
    text = "".join(functions)
    return re.sub(rf"(?m)^declare [^\n]*@{re.escape(EXACT_MARKER)}\.\w+\([^\n]*\n", "", text)


def clean_up(module, builder) -> None:
    """Folds the answered questions: the untaken path of each product goes."""
    passes = llvm.create_new_function_pass_manager()
    for add in (passes.add_sccp_pass, passes.add_simplify_cfg_pass, passes.add_instruction_combine_pass,
                passes.add_aggressive_dce_pass, passes.add_simplify_cfg_pass):
        add()
    for function in module.functions:
        if not function.is_declaration:
            passes.run(function, builder)
