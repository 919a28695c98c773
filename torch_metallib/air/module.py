"""A printed AIR module made a target's: its triple and datalayout, its definitions internal
(and inlined into the target's entry), and each ``air.*`` declaration replaced by the
target's definition (docs/formats.md: the module is edited as text; llvmlite has no
IR-editing API).
"""

import re
from typing import Callable, List, Optional, Tuple

from .intrinsics import parse_declaration
from .target import Target
from .tensor_ops import TENSOR_OP_PREFIX
from ..errors import UnsupportedKernelError

__all__ = ["retarget", "internalize", "define_intrinsics", "EXTERNALLY_DEFINED"]

Define = Callable[[str, str, List[str]], Optional[Tuple[str, List[str]]]]


def retarget(text: str, triple: str, datalayout: str) -> str:
    text = re.sub(r"^target datalayout = .*$", f'target datalayout = "{datalayout}"', text, count=1, flags=re.M)
    return re.sub(r"^target triple = .*$", f'target triple = "{triple}"', text, count=1, flags=re.M)


def internalize(text: str, kernel: str, cooperative: bool) -> str:
    text = re.sub(r"^define (?:(?:weak_odr|linkonce_odr|weak|linkonce|external|dso_local|available_externally) )*"
                  r"(?!internal |private )", "define internal ", text, flags=re.M)
    text = text.replace(' "no-builtins"', "")
    # The kernel is inlined into the launcher's thread loop (so it can vectorize); a
    # cooperative kernel's thread entry needs every wait inlined into it (_cpu_coroutine).
    if cooperative:  # Metal has no recursion, so everything inlines once these are gone
        text = re.sub(r"^attributes #\d+ = \{.*\}$", lambda m: re.sub(r"\b(?:noinline|optnone) ", "", m.group(0)),
                      text, flags=re.M)
    name = r"[-\w$.]+" if cooperative else re.escape(kernel)
    return re.sub(rf"^(define internal [^\n]*@{name}\([^\n]*?)( #\d+)?( section \"[^\"]*\")? \{{$",
                  r"\1 alwaysinline\2\3 {", text, count=0 if cooperative else 1, flags=re.M)


# The section of a declaration whose body Metal's driver links in (MetalPerformancePrimitives'
# tensor operations): not an air.* intrinsic, but just as much a function the backend must supply.
EXTERNALLY_DEFINED = 'section "air.externally_defined"'


def define_intrinsics(text: str, kernel: str, define: Define, backend: str, target: Target) -> str:
    """`text` with each ``air.*`` declaration replaced by `define`'s definition (a backend's:
    cpu_definition, cuda_definition), and what they call that `target` supplies declared;
    UnsupportedKernelError naming what `backend` cannot run."""
    declared = set(re.findall(r"^declare [^\n]*?@([-\w$.]+)\(", text, re.M))
    extra, unsupported, external = [], [], []
    def replace(match):
        parsed = parse_declaration(match.group(0))
        if parsed is None or not parsed[1].startswith(("air.", "tm.", TENSOR_OP_PREFIX)):
            if parsed is not None and EXTERNALLY_DEFINED in match.group(0):
                external.append(parsed[1])
            return match.group(0)
        made = define(*parsed)
        if made is None:
            (external if EXTERNALLY_DEFINED in match.group(0) else unsupported).append(parsed[1])
            return match.group(0)
        definition, needs = made
        for line in needs:
            name = re.search(r"@([-\w$.]+)(?:\(| = )", line).group(1)  # a function, or a constant it reads
            if name not in declared:
                declared.add(name)
                extra.append(line)
        return definition
    text = re.sub(r"^declare [^\n]*$", replace, text, flags=re.M)
    extra += target.declarations(text, declared)
    if unsupported or external:
        missing = [f"{backend} has no implementation of {', '.join(sorted(set(unsupported)))}"] if unsupported else []
        if external:  # Metal 4's MetalPerformancePrimitives tensor operations (matmul2d...)
            missing.append(f"it calls functions that Metal's driver supplies (section air.externally_defined), "
                           f"which {backend} does not implement: {', '.join(sorted(set(external)))}")
        raise UnsupportedKernelError(f"{kernel}: {'; '.join(missing)}. "
                                     f"Run it on a Mac with MPS tensors, or report the intrinsic")
    return text + "\n" + "\n".join(extra) + "\n"
