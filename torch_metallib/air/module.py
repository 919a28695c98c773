"""A printed AIR module made a target's: its triple and datalayout, its definitions internal
(and inlined into the target's entry), and each ``air.*`` declaration replaced by the
target's definition (docs/formats.md: the module is edited as text; llvmlite has no
IR-editing API).
"""

import re
from typing import Callable, List, Optional, Sequence, Tuple

from .intrinsics import parse_declaration
from ..reflection.ir_model import reachable
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


def _trap(ret: str, name: str, params: List[str]) -> str:
    signature = ", ".join(f"{t} %a{i}" for i, t in enumerate(params))
    return f"define internal {ret} @{name}({signature}) {{\n  call void @llvm.trap()\n  unreachable\n}}"


def define_intrinsics(text: str, kernel: str, define: Define, backend: str, target: Target,
                      roots: Sequence[str] = ()) -> str:
    """`text` with each ``air.*`` declaration replaced by `define`'s definition (a backend's:
    cpu_definition, cuda_definition), and what they call that `target` supplies declared;
    UnsupportedKernelError naming what `backend` cannot run of what `kernel` (and `roots`:
    the constructors it runs) can call. A declaration nothing reaches (compilers such as
    Mojo's leave some in every module) becomes a definition that traps."""
    declared = set(re.findall(r"^declare [^\n]*?@([-\w$.]+)\(", text, re.M))
    called = reachable(text.split("\n"), [kernel, *roots])
    extra, unsupported, external = [], [], []
    def replace(match):
        parsed = parse_declaration(match.group(0))
        ours = parsed is not None and parsed[1].startswith(("air.", "tm.", TENSOR_OP_PREFIX))
        if not ours and (parsed is None or EXTERNALLY_DEFINED not in match.group(0)):
            return match.group(0)
        if parsed[1] not in called:  # not defined: a definition may need what the kernel does not (a wait)
            made = _trap(*parsed), ["declare void @llvm.trap()"]
        else:
            made = define(*parsed) if ours else None
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
