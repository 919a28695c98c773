"""One definition per intrinsic: the vector forms of AIR's per-lane functions and their
half and bfloat forms are built from the float scalar definition, so that no variant can
compute differently from it.

- A vector form (``air.sqrt.v2f16``) applies the scalar form to each lane: LLVM's vector
  math intrinsics on ``<N x half>`` are expanded by the host backend in ways that are not
  always exact (NaN for finite inputs was seen), and per lane there is one code path.
- A half or bfloat scalar form is computed in float and rounded once to the result type,
  as Metal does; a precise float transcendental function in double, rounded once.
"""

from typing import Callable, List, Optional, Tuple

__all__ = ["element_type", "lanewise", "via_wider"]

Made = Optional[Tuple[str, List[str]]]


def _width(type_name: str) -> Optional[int]:
    return int(type_name[1:type_name.index(" ")]) if type_name.startswith("<") else None


def element_type(type_name: str) -> str:
    """The element type of an LLVM vector type (``<4 x half>`` -> ``half``), else the type."""
    return type_name[type_name.rindex(" ") + 1:-1] if type_name.startswith("<") else type_name


def lanewise(ret: str, name: str, params: List[str], symbol: str, scalar: Callable[..., Made]) -> Made:
    """`symbol` for vector form `name`: each lane through ``scalar(ret, name, params,
    symbol)``'s definition of the element types (None if it has none)."""
    width = next(w for w in map(_width, [ret, *params]) if w)
    helper = f"{symbol}.lane"
    made = scalar(element_type(ret), name, [element_type(p) for p in params], helper)
    if made is None:
        return None
    definition, needs = made
    lines = []
    result = "poison"
    for lane in range(width):
        operands = []
        for index, param in enumerate(params):
            if _width(param):
                lines.append(f"%a{index}.{lane} = extractelement {param} %a{index}, i32 {lane}")
                operands.append(f"{element_type(param)} %a{index}.{lane}")
            else:
                operands.append(f"{param} %a{index}")
        if ret == "void":
            lines.append(f"call void @{helper}({', '.join(operands)})")
            continue
        lines += [f"%r.{lane} = call {element_type(ret)} @{helper}({', '.join(operands)})",
                  f"%v.{lane} = insertelement {ret} {result}, {element_type(ret)} %r.{lane}, i32 {lane}"]
        result = f"%v.{lane}"
    signature = ", ".join(f"{t} %a{i}" for i, t in enumerate(params))
    body = "\n  ".join(lines + ["ret void" if ret == "void" else f"ret {ret} {result}"])
    return f"define internal {ret} @{symbol}({signature}) alwaysinline {{\n  {body}\n}}", needs + [definition]


def via_wider(ret: str, name: str, params: List[str], symbol: str, scalar: Callable[..., Made],
              narrow=("half", "bfloat"), wide: str = "float") -> Made:
    """`symbol` for a scalar form on `narrow` types: those operands extended to `wide`, the
    `wide` definition applied, the result rounded once (half and bfloat in float; precise
    float functions in double, which rounds them correctly but in rare ties)."""
    helper = f"{symbol}.{wide}"
    made = scalar(wide if ret in narrow else ret, name, [wide if p in narrow else p for p in params], helper)
    if made is None:
        return None
    definition, needs = made
    lines, operands = [], []
    for index, param in enumerate(params):
        if param in narrow:
            lines.append(f"%w{index} = fpext {param} %a{index} to {wide}")
            operands.append(f"{wide} %w{index}")
        else:
            operands.append(f"{param} %a{index}")
    result = wide if ret in narrow else ret
    lines.append(f"%r.w = call {result} @{helper}({', '.join(operands)})")
    lines.append(f"%r = fptrunc {wide} %r.w to {ret}" if ret in narrow else f"%r = bitcast {ret} %r.w to {ret}")
    signature = ", ".join(f"{t} %a{i}" for i, t in enumerate(params))
    body = "\n  ".join(lines + [f"ret {ret} %r"])
    return f"define internal {ret} @{symbol}({signature}) alwaysinline {{\n  {body}\n}}", needs + [definition]
