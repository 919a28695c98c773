"""`python -m torch_metallib inspect`: a header summary, a per-function table and, for
``--function`` / ``--all``, the reflection read from the AIR bitcode."""

import argparse
import json

from . import program_name
from .inspect_reflection import print_failure_summary, print_reflection, reflect_all, reflection_record
from ..library.library import load

__all__ = ["add_parser"]


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "inspect", help="show a .metallib's header and functions",
        description="Show a .metallib's header and a table of its functions.")
    parser.add_argument("file", help="path of the .metallib")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--function", metavar="NAME",
                       help="show only this function, in detail: signature and argument table")
    which.add_argument("--all", action="store_true",
                       help="reflect every function (progress on stderr) and summarize failures; "
                            "exit status 1 if any failed")
    parser.add_argument("--jobs", type=_positive, default=1, metavar="N",
                        help="with --all: reflect in N worker processes (default 1)")
    parser.add_argument("--json", action="store_true",
                        help="print machine-readable JSON (with the reflection for --function/--all)")
    parser.add_argument("--verify", action="store_true",
                        help="also check every module wrapper and SHA-256 hash")
    parser.set_defaults(run=run)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of processes, got {text!r}")
    return int(text)


def header_record(lib) -> dict:
    return {
        "nbytes": lib.nbytes,
        "file_version": list(lib.file_version),
        "file_type": lib.file_type,
        "platform": lib.platform,
        "platform_version": list(lib.platform_version),
        "uuid": str(lib.uuid) if lib.uuid else None,
        "function_count": len(lib),
        "unknown_tags": [list(tag) for tag in lib.unknown_tags],
    }


def function_record(function, detail: bool) -> dict:
    record = {
        "name": function.name,
        "type": function.type,
        "air_version": list(function.air_version) if function.air_version else None,
        "language_version": list(function.language_version) if function.language_version else None,
        "hash": function.hash,
        "module_size": function.module_size,
        "declared_constants": [vars(c) for c in function.declared_constants],
    }
    if detail:
        record["bitcode_size"] = function.bitcode.nbytes
        record["tags"] = [
            {"tag": tag, "offset": offset, "size": len(payload)}
            for tag, offset, payload in function.tags
        ]
    return record


def run(args) -> int:
    lib = load(args.file, verify=args.verify)
    if args.all:
        return _run_all(lib, args)
    if args.function and args.function not in lib:
        raise KeyError(lib._missing_message(
            args.function, f"Run `{program_name()} inspect {args.file}` to list them."))
    names = [args.function] if args.function else lib.function_names
    functions = [function_record(lib[name], detail=bool(args.function)) for name in names]
    if args.json:
        if args.function:
            functions[0]["reflection"] = reflection_record(lib[args.function])
        print(json.dumps({"header": header_record(lib), "functions": functions}, indent=2))
    else:
        print_text(header_record(lib), functions)
        if args.function:
            print_reflection(lib[args.function])
    return 0


def _run_all(lib, args) -> int:
    records, failures = reflect_all(lib, path=args.file, jobs=args.jobs, records=args.json)
    if args.json:
        functions = [dict(function_record(lib[name], detail=False), reflection=records[name])
                     for name in lib.function_names]
        print(json.dumps({"header": header_record(lib), "functions": functions,
                          "failures": failures}, indent=2))
    else:
        print_failure_summary(failures, len(lib))
    return 1 if failures else 0


def _version(value) -> str:
    return ".".join(map(str, value)) if value else "-"


def print_text(header: dict, functions: list) -> None:
    print(f"file:      {header['nbytes']:,} bytes, format {_version(header['file_version'])}, "
          f"{header['file_type']}")
    print(f"platform:  {header['platform']} {_version(header['platform_version'])}")
    print(f"uuid:      {header['uuid'] or '-'}")
    print(f"functions: {header['function_count']}")
    for place, tag, offset, size in header["unknown_tags"]:
        print(f"unknown tag {tag} ({size} bytes) in {place} at byte {offset}: kept as is")
    width = max([len("name")] + [len(f["name"]) for f in functions])
    print()
    print(f"{'name':<{width}}  {'type':<12} {'AIR':>4} {'MSL':>4}  {'hash':<12} {'module':>9}  constants")
    for f in functions:
        constants = ", ".join(f"{c['name']}:{c['type']}@{c['index']}" for c in f["declared_constants"])
        print(f"{f['name']:<{width}}  {f['type']:<12} {_version(f['air_version']):>4} "
              f"{_version(f['language_version']):>4}  {f['hash'][:12]:<12} "
              f"{f['module_size']:>9,}  {constants or '-'}")
        for tag in f.get("tags", []):
            print(f"    tag {tag['tag']} at byte {tag['offset']}, {tag['size']} bytes")
        if "bitcode_size" in f:
            print(f"    bitcode: {f['bitcode_size']:,} bytes")
