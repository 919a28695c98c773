"""csrc/mps's Objective-C against Apple's API as PyObjC records it.

For each method csrc/mps sends (uses.py) and each method the simulated Metal.h declares
(declarations.py), the declaration it resolves to in the simulated headers gives the
types the code was compiled with; those must be Apple's:

1. Where PyObjC's binaries hold the protocol (macho_protocols.py): the selector must be
   reachable from the receiver's protocol in Apple's protocol tree, and the whole method
   encoding (return, self, _cmd, every argument, const-ness) must equal Apple's.
2. Else, where PyObjC's metadata has the method (protocol methods by selector; class
   methods by class): return and argument types as far as the metadata gives them
   (qualifiers aside: PyObjC keeps const, in and out apart).
3. Else the method must be listed in UNRECORDED, with the reason: methods PyObjC learns from
   the runtime on a Mac and so records nowhere. A listed method that is no longer used is
   a finding too, so the list cannot go stale.

Also compared: the classes used are named in PyObjC's metadata (or listed in
UNRECORDED_CLASSES); Metal.h's enum constants (values), its C functions (encodings) and the
fields of the structs its methods take (MTLSize). The C functions of libdispatch are not
Metal or Foundation and are not checked.
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from . import encodings

__all__ = ["UNRECORDED", "UNRECORDED_CLASSES", "Check", "Report", "compare"]

# Methods csrc/mps uses that PyObjC records nowhere (it asks the Objective-C runtime on a
# Mac), "-[Class selector]" -> why. They are not checked against Apple here.
UNRECORDED = {
    "+[NSObject alloc]": "NSObject's own class methods; PyObjC's metadata has none of them",
    "-[NSObject init]": "as alloc",
    "-[NSError localizedDescription]": "returns an object and takes nothing: nothing for PyObjC's metadata to add",
    "-[MTLFunctionConstantValues setConstantValue:type:atIndex:]":
        "PyObjC has no metadata for MTLFunctionConstantValues (a class; its methods come from the runtime)",
    # Setters of object-typed properties of descriptor classes: nothing for metadata to add, so PyObjC
    # records none; Apple documents each (macOS 11+ for the archive ones).
    "-[MTLComputePipelineDescriptor setComputeFunction:]": "property computeFunction (id<MTLFunction>), documented",
    "-[MTLComputePipelineDescriptor setBinaryArchives:]":
        "property binaryArchives (NSArray<id<MTLBinaryArchive>>*, nullable), documented",
    "-[MTLBinaryArchiveDescriptor setUrl:]": "property url (NSURL*), documented; PyObjC has no metadata for the class",
    "+[NSURL fileURLWithPath:]": "takes and returns objects: nothing for metadata to add (fileURLWithPath:isDirectory: "
                                 "is recorded, for its BOOL)",
    "+[NSArray arrayWithObject:]": "takes and returns objects: nothing for metadata to add",
}

# Classes csrc/mps or Metal.h names that PyObjC's metadata does not mention -> why.
UNRECORDED_CLASSES = {
    "MTLFunctionConstantValues": "PyObjC needs no metadata for it (see its method above)",
    "MTLBinaryArchiveDescriptor": "PyObjC needs no metadata for it (see its property above)",
    "MTLComputePipelineReflection": "named only as the type of an out-argument we pass as null; its name is in "
                                    "PyObjC's Metal module",
}


@dataclass
class Check:
    method: str              # "-[<MTLComputeCommandEncoder> setBuffer:offset:atIndex:]", "+[NSString ...]"
    ours: str                # our encoding (offsets dropped), e.g. "v@:@QQ"
    apple: str = ""          # Apple's, as far as recorded
    source: str = ""         # "protocol table" (exact), "metadata" (types given), "unrecorded"
    used_at: List[str] = field(default_factory=list)
    problem: str = ""


@dataclass
class Report:
    checks: List[Check] = field(default_factory=list)
    findings: List[str] = field(default_factory=list)
    counts: Dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.findings


def _apple_chain(record, protocol: str) -> Tuple[List[str], bool]:
    """`protocol` and its ancestors in Apple's tree (breadth first); whether every one of
    them is in PyObjC's binaries (only then is "not found" an answer)."""
    order, complete, queue = [], True, [protocol]
    while queue:
        name = queue.pop(0)
        if name in order:
            continue
        order.append(name)
        if name in record.protocols:
            queue += record.protocols[name].parents
        else:
            complete = False
    return order, complete


def _apple_protocol_encoding(record, protocol: str, kind: str, selector: str) -> Tuple[Optional[str], bool]:
    """Apple's encoding of `selector` as `protocol` has it (inherited too), and whether
    the answer is final (every ancestor known)."""
    chain, complete = _apple_chain(record, protocol)
    for name in chain:
        method = record.protocols.get(name)
        if method and (kind, selector) in method.methods:
            return method.methods[(kind, selector)], True
    return None, complete


def _receiver(receiver: Optional[str]) -> Tuple[str, List[str]]:
    """("protocol"|"class"|"any", names) of a receiver's static type."""
    if receiver is None or receiver in ("id", "instancetype"):
        return "any", []
    receiver = receiver.replace("const ", "").strip()
    if receiver.startswith("id<"):
        return "protocol", [name.strip() for name in receiver[3:-1].split(",")]
    return "class", [receiver.rstrip("* ").strip()]


def _compare_metadata(ours: List[str], entry: dict) -> Tuple[str, str]:
    """(Apple's encoding as far as the metadata gives it, a problem or "")."""
    apple = [entry.get("retval", {}).get("type", "?"), "@", ":"]
    apple += [entry.get("arguments", {}).get(index + 2, {}).get("type", "?") for index in range(len(ours) - 3)]
    extra = [index for index in entry.get("arguments", {}) if index - 2 >= len(ours) - 3]
    if extra:
        return "".join(apple), f"Apple's method takes more arguments (metadata names argument {max(extra) - 2})"
    for position, (mine, theirs) in enumerate(zip(ours, apple)):
        if theirs != "?" and encodings.comparable(mine, False) != encodings.comparable(theirs, False):
            what = "return type" if position == 0 else f"argument {position - 3}"
            return "".join(apple), f"{what}: ours {mine}, Apple's {theirs}"
    return "".join(apple), ""


class _Comparer:
    def __init__(self, declarations, record):
        self.declarations, self.record = declarations, record
        self.checks: Dict[str, Check] = {}
        self.findings: List[str] = []

    def method(self, receiver_kind: str, names: List[str], kind: str, selector: str, where: str) -> None:
        """One method as sent to (or declared by) a receiver of protocol/class `names`."""
        decl = None
        for name in names or [None]:
            containers = [self.declarations.container(name, receiver_kind)] if name else \
                list(self.declarations.containers.values())
            for container in containers:
                decl = container and self.declarations.lookup(container, kind, selector)
                if decl:
                    break
            if decl:
                break
        label = f"{kind}[{names[0] if names else 'id'} {selector}]"
        if decl is None:
            self.findings.append(f"{where}: {label} is declared nowhere in the simulated headers (clang warns "
                                 f"'method not found'; Apple's headers would decide on a Mac)")
            return
        key = decl.key
        check = self.checks.get(key)
        if check is None:
            check = self.checks[key] = self._check(decl, key)
            if check.problem:
                self.findings.append(f"{key}: {check.problem}")
        if where and where not in check.used_at:
            check.used_at.append(where)
        # The receiver's own protocol must have it in Apple's tree, where the tree is known.
        if receiver_kind == "protocol":
            for name in names:
                if name in self.record.protocols and name != decl.container:
                    found, final = _apple_protocol_encoding(self.record, name, kind, selector)
                    if found is None and final:
                        self.findings.append(f"{where}: {label}: Apple's {name} (and its parents "
                                             f"{', '.join(_apple_chain(self.record, name)[0][1:])}) has no {selector}")

    def _check(self, decl, key: str) -> Check:
        try:
            ours = encodings.split(encodings.method_encoding(decl, self.declarations))
        except ValueError as error:
            return Check(key, "?", problem=str(error))
        check = Check(key, "".join(ours))
        owner = self.declarations.container(decl.container, decl.container_kind)
        if owner.kind == "protocol" and decl.container in self.record.protocols:
            found, final = _apple_protocol_encoding(self.record, decl.container, decl.kind, decl.selector)
            if found is not None:
                apple = encodings.split(found)
                check.apple, check.source = "".join(apple), "protocol table"
                if [encodings.comparable(t) for t in ours] != [encodings.comparable(t) for t in apple]:
                    check.problem = (f"ours {check.ours}, Apple's {check.apple} "
                                     f"(PyObjC's {decl.container} protocol table)")
                return check
            if final:
                check.source, check.problem = "protocol table", f"Apple's {decl.container} has no {decl.selector}"
                return check
        entry = None
        if owner.kind == "protocol":
            entry = self.record.protocol_method(decl.selector)
        else:
            classes = [decl.container]
            while classes[-1] and self.declarations.container(classes[-1], "class") and \
                    self.declarations.container(classes[-1], "class").superclass:
                classes.append(self.declarations.container(classes[-1], "class").superclass)
            entry = next((self.record.methods[(name, decl.selector)] for name in classes
                          if (name, decl.selector) in self.record.methods), None)
        if entry is not None:
            check.source = "metadata"
            check.apple, check.problem = _compare_metadata(ours, entry)
            return check
        check.source = "unrecorded"
        if key not in UNRECORDED:
            check.problem = (f"not in PyObjC's {'protocol tables or ' if owner.kind == 'protocol' else ''}metadata: "
                             f"renamed, or not Apple's? (if PyObjC only lacks it, list it in UNRECORDED with the "
                             f"reason)")
        return check


def compare(uses, declarations, record, metal_header: str) -> Report:
    """`uses` (uses.Use, csrc/mps) and everything `metal_header` (the simulated Metal.h,
    a path) declares, against `record` (pyobjc.ApiRecord)."""
    comparer = _Comparer(declarations, record)
    for use in uses:
        if use.what == "send":
            receiver_kind, names = _receiver(use.receiver)
            comparer.method(receiver_kind, names, use.kind, use.name, use.where)
        elif use.what == "selector":
            comparer.method("any", [], "-", use.name, use.where)
    used = set(comparer.checks)
    for (kind, name), container in declarations.containers.items():
        if container.file == metal_header:
            for (method_kind, selector) in container.methods:
                comparer.method(kind, [name], method_kind, selector, "")
    findings = comparer.findings
    for key in sorted(set(UNRECORDED) - used):
        findings.append(f"UNRECORDED lists {key}, which csrc/mps no longer uses: remove it")
    classes = {_receiver(use.receiver)[1][0] for use in uses if use.what == "send" and
               _receiver(use.receiver)[0] == "class"}
    classes |= {name for (kind, name), container in declarations.containers.items()
                if kind == "class" and container.file == metal_header}
    for name in sorted(classes):
        if name not in record.classes and name not in UNRECORDED_CLASSES:
            findings.append(f"class {name} is not in PyObjC's metadata: renamed, or not Apple's? (if PyObjC only "
                            f"lacks it, list it in UNRECORDED_CLASSES with the reason)")
    for name in sorted(set(UNRECORDED_CLASSES) - classes):
        findings.append(f"UNRECORDED_CLASSES lists {name}, which is no longer used: remove it")
    _compare_enums(uses, declarations, record, metal_header, findings)
    _compare_functions(declarations, record, metal_header, findings)
    _compare_structs(declarations, record, findings)
    checks = sorted(comparer.checks.values(), key=lambda check: check.method)
    counts = {"methods used": len(used), "methods checked": len(checks), "classes": len(classes),
              "exact (protocol tables)": sum(c.source == "protocol table" for c in checks),
              "types (metadata)": sum(c.source == "metadata" for c in checks),
              "unrecorded (listed)": sum(c.source == "unrecorded" and not c.problem for c in checks)}
    return Report(checks, findings, counts)


def _compare_enums(uses, declarations, record, metal_header, findings) -> None:
    names = {name for name, (_, file) in declarations.enum_constants.items() if file == metal_header}
    names |= {use.name for use in uses if use.what == "enum" and use.name in declarations.enum_constants
              and declarations.enum_constants[use.name][1] == metal_header}
    for name in sorted(names):
        value = declarations.enum_constants[name][0]
        if name not in record.enums:
            findings.append(f"enum {name} is not in PyObjC's Metal metadata")
        elif record.enums[name] != value:
            findings.append(f"enum {name} is {value} here, {record.enums[name]} in Apple's Metal")


def _function_encoding(signature: str, declarations) -> str:
    returns, _, arguments = signature.partition("(")
    parameters = [a.strip() for a in arguments.rstrip(")").split(",") if a.strip() and a.strip() != "void"]
    return encodings.encode(returns.strip(), declarations) + "".join(
        encodings.encode(p, declarations) for p in parameters)


def _compare_functions(declarations, record, metal_header, findings) -> None:
    for name, (signature, file) in sorted(declarations.functions.items()):
        if file != metal_header:
            continue
        if name not in record.functions:
            findings.append(f"function {name} is not in PyObjC's Metal metadata")
            continue
        ours = [encodings.comparable(t, False) for t in encodings.split(_function_encoding(signature, declarations))]
        apple = [encodings.comparable(t, False) for t in encodings.split(record.functions[name])]
        if ours != apple:
            findings.append(f"function {name}: ours {''.join(ours)}, Apple's {record.functions[name]}")


def _compare_structs(declarations, record, findings) -> None:
    for name, (spelled, reference) in sorted(declarations.typedefs.items()):
        if reference not in declarations.records or name not in record.structs:
            continue
        apple_encoding, apple_fields = record.structs[name]
        fields = declarations.records[reference]
        ours = "{?=" + "".join(encodings.encode(t.sugared, declarations) for _, t in fields) + "}"
        if encodings.comparable(ours) != encodings.comparable(apple_encoding) or \
                [field_name for field_name, _ in fields] != apple_fields:
            findings.append(f"struct {name}: ours {ours} {[n for n, _ in fields]}, Apple's {apple_encoding} "
                            f"{apple_fields}")
