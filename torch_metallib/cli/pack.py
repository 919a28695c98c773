"""`python -m torch_metallib pack MODULE... -o LIB.metallib`: a library from AIR modules
(``.air``/``.bc`` bitcode or ``.ll`` text), with what Apple's ``metallib`` tool derives from
them (reflection/pack_modules.py)."""

import os
import sys

from ..reflection.module_source import read_modules
from ..reflection.pack_modules import library_header
from ..container.pack import pack

__all__ = ["add_parser", "run"]


def _version(text: str) -> tuple:
    parts = text.split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"expected a version such as 14.0 or 1.2.7; got {text!r}")
    return tuple(int(p) for p in parts) + (0,) * (3 - len(parts))


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "pack", help="write a .metallib from AIR modules (.air, .bc, .ll), as Apple's metallib tool does",
        description="Write a .metallib holding the AIR modules' entry functions, in order (a module with "
                    "several is cut into one per function). Each function's name, type, AIR and Metal language versions and function constants "
                    "come from its metadata; the header's platform and version from the target triples.")
    parser.add_argument("modules", nargs="+", metavar="MODULE", help=".air/.bc bitcode or .ll IR text")
    parser.add_argument("-o", "--output", required=True, metavar="LIB.metallib", help="the library to write")
    parser.add_argument("--platform", help="override the platform (default: from the triples, e.g. macos)")
    parser.add_argument("--platform-version", type=_version, metavar="X.Y.Z",
                        help="override the header's OS version (default: the highest deployment target)")
    parser.add_argument("--file-version", type=_version, metavar="X.Y.Z",
                        help="override the file format version (default: Apple's for the target)")
    parser.set_defaults(run=run)


def run(args) -> int:
    try:
        read = [(path, source) for path in args.modules for source in read_modules(path)]
        sources = [source for _path, source in read]
        header = library_header(sources, platform=args.platform, platform_version=args.platform_version,
                                file_version=args.file_version)
        data = pack([source.function for source in sources], **header)
    except ValueError as error:  # pack's own errors (duplicate names, bad overrides) are ValueErrors
        raise SystemExit(f"error: {error}") from None
    with open(args.output, "wb") as file:
        file.write(data)
    for path, source in read:
        function = source.function
        constants = f", {len(function.function_constants)} function constants" if function.function_constants else ""
        print(f"{function.type} {function.name}: AIR {'.'.join(map(str, function.air_version))}, Metal "
              f"{'.'.join(map(str, function.language_version))}{constants} ({os.path.basename(path)})")
    _warn_if_metal_would_refuse(sources)
    version = ".".join(map(str, header["platform_version"]))
    print(f"wrote {args.output}: {len(sources)} functions, {header['platform']} {version}, "
          f"format {'.'.join(map(str, header['file_version']))}, {len(data)} bytes")
    return 0


def _warn_if_metal_would_refuse(sources) -> None:
    """The bitcode rules of `lint` that Metal's loader is known to enforce, on what was
    packed: IR text and modules cut from a larger one are written by llvmlite's LLVM (opaque
    pointers, newer attribute kinds), which Apple's reader is expected to refuse."""
    from ..lint import RULES, lint_bitcode

    rules = [rule for rule in RULES if rule.id in ("AIR001", "AIR002")]
    flagged = [source.function.name for source in sources
               if lint_bitcode(bytes(source.function.bitcode), source.function.name, rules=rules)]
    if flagged:
        print(f"warning: {len(flagged)} of {len(sources)} functions ({', '.join(flagged[:3])}"
              f"{', ...' if len(flagged) > 3 else ''}) are bitcode of a newer LLVM than Apple's reader "
              f"(opaque pointers or newer attributes), which Metal is expected to refuse. `python -m "
              f"torch_metallib lint` says what; write LLVM 14-era bitcode (as Metal.jl does) for a Mac",
              file=sys.stderr)
