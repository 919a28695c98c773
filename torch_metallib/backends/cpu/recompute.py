"""Values a lane loop computes again in each region that uses them instead of keeping them
in the context across a wait (regions.py): those the kernel's entry block computes from the
launch alone (arguments, sizes, the threadgroup's index, constant buffers), once per region
run before its loop, and cheap functions of the thread's index and those, per lane.

Kept, such a value costs a store per thread at the first marker and a load per lane in every
region after it; most kernels keep their buffers' addresses, sizes and lane and SIMD-group
indices so. Computing a launch value again is safe where the entry block computed it: every
thread ran that block before any wait, with the same operands (the launch does not change
while it runs; a kernel does not write its constant buffers), so a division there did not
trap and will not.
"""

import re
from dataclasses import dataclass
from typing import Dict, List, Set, Tuple

from ...reflection.ir_model import LOCAL, NAME, opcode, substitute

__all__ = ["Recomputable", "recomputable", "recompute", "slot_value"]

_DEFINITION = re.compile(rf"^\s*(%{NAME}) = (.*)$")
_RELOAD = re.compile(rf"^load [^,]+, ptr (%{NAME})\.reg2mem(?:, align \d+)?$")  # reg2mem's reload of a value
_LOAD_FROM = re.compile(rf"^load [^,]+, ptr (addrspace\(\d+\) )?(%{NAME})(?:, align \d+)?(?:, !.*)?$")
_PURE = {"add", "sub", "mul", "shl", "lshr", "ashr", "and", "or", "xor", "udiv", "sdiv", "urem", "srem",
         "icmp", "select", "zext", "sext", "trunc", "getelementptr", "addrspacecast", "bitcast", "ptrtoint",
         "inttoptr", "freeze"}
_CHEAP = _PURE - {"udiv", "sdiv", "urem", "srem"}  # per lane: a division costs more than a load
_PURE_CALL = re.compile(r"call \S+ @llvm\.(?:umin|umax|smin|smax|abs)\.i\d+\(")
_LAUNCH = {"%args", "%dims", "%g32"}  # the lane-loop entry's parameters but the thread's index
_RUNTIME_MEMORY = {"%args", "%dims"}  # the runtime's arrays: the same through the launch
THREAD = "%t32"
MAX_LANE_STEPS = 3  # per lane: at most this many instructions for one value


@dataclass
class Recomputable:
    line: str  # its definition (reg2mem's reloads replaced by the values they reload)
    uniform: bool  # the same for every lane of the launch: computed before the region's loop
    operands: List[str]  # the recomputable values it uses


def recomputable(entry: List[str], others: List[str]) -> Dict[str, Recomputable]:
    """The values that a region may compute again (reg2mem's output): name -> how. From the
    kernel's entry block `entry`, values of the launch and cheap functions of the thread's
    index; from the lines of the other blocks `others`, values of the launch computed without
    a division or a load (which might trap where that block's guard does not hold)."""
    found: Dict[str, Recomputable] = {}
    steps: Dict[str, int] = {}
    aliases: Dict[str, str] = {}
    runtime_addresses = set(_RUNTIME_MEMORY)
    for line in entry:
        _classify(line, found, steps, aliases, runtime_addresses, True)
    while any([_classify(line, found, steps, aliases, runtime_addresses, False) for line in others]):
        pass  # a block's value may use one of a block printed after it
    return found


def _classify(line: str, found: Dict[str, Recomputable], steps: Dict[str, int], aliases: Dict[str, str],
              runtime_addresses: Set[str], entry: bool) -> bool:
    """Adds the value `line` defines to `found` if it is recomputable (see recomputable);
    whether it added it or an alias."""
    match = _DEFINITION.match(line)
    if not match or match.group(1) in found or match.group(1) in aliases:
        return False
    name, rest = match.groups()
    reload = rest.startswith("load ") and _RELOAD.match(rest)
    if reload:  # reg2mem stores an entry block's value once, before any reload
        if reload.group(1) not in found:
            return False
        aliases[name] = reload.group(1)
        return True
    op = opcode(line)
    rest = substitute(rest, aliases)
    operands = LOCAL.findall(rest)
    if op == "load":
        source = entry and " volatile " not in rest and " atomic " not in rest and _LOAD_FROM.match(rest)
        # The runtime's arrays, or a constant buffer (address space 2).
        if not source or (source.group(2) not in runtime_addresses and source.group(1) != "addrspace(2) "):
            return False
    elif op not in (_PURE if entry else _CHEAP) and not (op == "call" and _PURE_CALL.search(rest)):
        return False
    if entry and op == "getelementptr" and operands and operands[0] in runtime_addresses:
        runtime_addresses.add(name)
    launch = [o for o in operands if o not in _LAUNCH]
    if all(o in found and found[o].uniform for o in launch):
        found[name] = Recomputable(f"  {name} = {rest}", True, launch)
        return True
    cheap = op in _CHEAP or op == "call"  # not a load of a lane's own address
    if not entry or not cheap or any(o != THREAD and o not in found for o in launch):
        return False
    cost = 1 + sum(steps.get(o, 0) for o in launch)
    if cost > MAX_LANE_STEPS:
        return False
    found[name] = Recomputable(f"  {name} = {rest}", False, [o for o in launch if o != THREAD])
    steps[name] = cost
    return True


def recompute(names: List[str], found: Dict[str, Recomputable],
              suffix: str) -> Tuple[List[str], List[str], Dict[str, str]]:
    """(lines before a region's loop, lines per lane, name -> its new name) defining each of
    `names` (and what they use) again as ``<name><suffix>``."""
    renames: Dict[str, str] = {}
    before: List[str] = []
    per_lane: List[str] = []

    def define(name: str) -> None:
        if name in renames:
            return
        value = found[name]
        for operand in value.operands:
            define(operand)
        renames[name] = f"{name}{suffix}" if not name.startswith('%"') else f'{name[:-1]}{suffix}"'
        (before if value.uniform else per_lane).append(substitute(value.line, renames))

    for name in names:
        define(name)
    return before, per_lane, renames


def slot_value(slot: str, found: Dict[str, Recomputable]) -> str:
    """The recomputable value reg2mem's slot `slot` holds, or ''."""
    value = slot[:-len(".reg2mem")] if slot.endswith(".reg2mem") else ""
    return value if value in found else ""

