"""FunctionConstant: a ``[[function_constant(i)]]`` a function declares."""

from dataclasses import dataclass

__all__ = ["FunctionConstant"]


@dataclass(frozen=True)
class FunctionConstant:
    """A Metal function constant, from ``!air.function_constants`` or the ``CNST`` tag.

    Attributes:
        name: the constant's name in the Metal source.
        type: its MTLDataType name, e.g. ``"bool"``, ``"int"``, ``"float"``.
        index: the ``[[function_constant(index)]]`` it is bound to.
        required: whether a value must be supplied when the pipeline is built.
    """

    name: str
    type: str
    index: int
    required: bool = True
