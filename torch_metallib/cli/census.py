"""`python -m torch_metallib census`: every ``air.*`` intrinsic the kernels of one or more
libraries can call (and every function Metal's driver supplies, section
``air.externally_defined``: Metal 4's tensor operations), each type variant apart (scalar or vector width, element type, address
space), with how many kernels and libraries use it and whether the CPU backend implements
it. ``--fail-on-missing`` makes an unimplemented variant exit 1 (CI runs it this way).

A kernel counts for a variant when its body, or a function it reaches, calls it
(``ir_model.reachable``): the rule reflection lists intrinsics by and a backend refuses a
kernel by. A declaration nothing reaches (compilers leave some in every module) is not
counted: no backend is asked to define it."""

import json
import pathlib
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

from ..errors import TorchMetallibError

__all__ = ["add_parser", "census", "Variant"]


@dataclass
class Variant:
    name: str
    ret: str
    params: Tuple[str, ...]
    implemented: bool
    kernels: int = 0
    libraries: set = field(default_factory=set)
    example: str = ""

    @property
    def shape(self) -> str:
        """scalar / vector N, the element type and the address spaces, e.g. 'v2 half'."""
        types = [self.ret, *self.params]
        vector = next((re.match(r"<(\d+) x (\w+)>", t) for t in types if t.startswith("<")), None)
        element = vector.group(2) if vector else next((t for t in types if t not in ("void", "ptr")
                                                       and not t.startswith("ptr")), "void")
        spaces = sorted({int(m) for t in types for m in re.findall(r"addrspace\((\d+)\)", t)})
        text = f"v{vector.group(1)} {element}" if vector else f"scalar {element}"
        return text + ("".join(f" addrspace({s})" for s in spaces))

    def record(self) -> dict:
        return {"name": self.name, "returns": self.ret, "parameters": list(self.params), "shape": self.shape,
                "cpu": self.implemented, "kernels": self.kernels, "libraries": len(self.libraries),
                "example": self.example}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "census", help="list the air.* intrinsics a library's kernels use and what implements them",
        description="List every air.* intrinsic variant (and driver-supplied function) the "
                    "compute kernels of the given libraries (files or folders of .metallib) "
                    "can call, and whether the CPU backend implements it.")
    parser.add_argument("paths", nargs="+", help=".metallib files or folders holding them")
    parser.add_argument("--json", metavar="FILE", help="also write the census as JSON to FILE")
    parser.add_argument("--fail-on-missing", action="store_true",
                        help="exit status 1 if any variant is not implemented")
    parser.set_defaults(run=run)


def _files(paths: List[str]) -> List[pathlib.Path]:
    files = []
    for text in paths:
        path = pathlib.Path(text)
        if path.is_dir():
            files += sorted(path.rglob("*.metallib"))
        elif path.exists():
            files.append(path)
        else:
            raise FileNotFoundError(f"no such file or folder: {text}")
    return files


def census(paths: List[str], progress=None) -> dict:
    """{"variants": [Variant], "libraries": n, "kernels": n, "skipped": {kind: n}, "errors": [...]}."""
    import llvmlite.binding as llvm

    from ..air.intrinsics import parse_declaration
    from ..air.module import EXTERNALLY_DEFINED
    from ..backends.cpu.lowering import cpu_implements
    from ..library.library import load
    from ..reflection.bitcode import parse_bitcode
    from ..reflection.ir_model import reachable

    variants: Dict[tuple, Variant] = {}
    skipped, errors, kernels = defaultdict(int), [], 0
    files = _files(paths)
    context = llvm.create_context()
    try:
        for number, path in enumerate(files, 1):
            if progress:
                progress(f"[{number}/{len(files)}] {path.name}")
            try:
                lib = load(path)
            except TorchMetallibError as error:
                errors.append(f"{path}: {error}")
                continue
            for name in lib.function_names:
                function = lib[name]
                if function.type != "kernel":
                    skipped[function.type] += 1
                    continue
                try:
                    module = parse_bitcode(name, function.bitcode, context)
                except TorchMetallibError as error:
                    errors.append(f"{path.name}: {error}")
                    continue
                kernels += 1
                try:
                    called = _called(module, name, reachable)
                    for declared in module.functions:
                        if not declared.is_declaration or declared.name not in called:
                            continue
                        line = next(line for line in str(declared).splitlines() if line.startswith("declare"))
                        if not (declared.name.startswith("air.") or EXTERNALLY_DEFINED in line):
                            continue
                        ret, intrinsic, params = parse_declaration(line)
                        key = (intrinsic, ret, tuple(params))
                        if key not in variants:
                            variants[key] = Variant(intrinsic, ret, tuple(params),
                                                    cpu_implements(ret, intrinsic, list(params)))
                        variant = variants[key]
                        variant.kernels += 1
                        variant.libraries.add(str(path))
                        variant.example = variant.example or f"{path.name}:{name}"
                finally:
                    module.close()
    finally:
        context.close()
    ordered = sorted(variants.values(), key=lambda v: (v.name, v.ret, v.params))
    return {"variants": ordered, "libraries": len(files) - len(errors), "kernels": kernels,
            "skipped": dict(skipped), "errors": errors}


def _called(module, kernel: str, reachable) -> set:
    """What `kernel` reaches in `module`, read from its definitions and global variables
    alone (what ``reachable`` follows): printing the whole module, metadata included, took
    most of the census's time."""
    lines = [line for found in module.functions if not found.is_declaration for line in str(found).split("\n")]
    return reachable(lines + [str(variable) for variable in module.global_variables], [kernel])


def print_table(result: dict, out=sys.stdout) -> None:
    variants = result["variants"]
    width = max([len(v.name) for v in variants] + [9])
    print(f"{'intrinsic':{width}}  {'shape':28} {'kernels':>7} {'libs':>4}  cpu", file=out)
    for v in variants:
        print(f"{v.name:{width}}  {v.shape:28} {v.kernels:>7} {len(v.libraries):>4}  "
              f"{'yes' if v.implemented else 'MISSING'}", file=out)
    missing = [v for v in variants if not v.implemented]
    families = {re.sub(r"\.(v\d+)?[ifu](1|8|16|32|64)$|\.(v\d+)?bf16$", "", v.name) for v in variants}
    print(f"\n{len(variants)} variants of {len(families)} intrinsics in {result['kernels']} kernels of "
          f"{result['libraries']} libraries: {len(variants) - len(missing)} implemented by the CPU backend, "
          f"{len(missing)} missing", file=out)
    if result["skipped"]:
        print("not compute kernels, skipped: " + ", ".join(f"{n} {k}" for k, n in sorted(result["skipped"].items())),
              file=out)
    for error in result["errors"]:
        print(f"could not read: {error}", file=out)


def run(args) -> int:
    result = census(args.paths, progress=lambda text: print(text, file=sys.stderr, flush=True))
    print_table(result)
    if args.json:
        record = {key: value for key, value in result.items() if key != "variants"}
        record["variants"] = [v.record() for v in result["variants"]]
        pathlib.Path(args.json).write_text(json.dumps(record, indent=1))
    missing = [v for v in result["variants"] if not v.implemented]
    return 1 if args.fail_on_missing and (missing or result["errors"]) else 0
