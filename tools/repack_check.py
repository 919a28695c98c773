"""The repack check: each function of an Apple-built library packed again from its module
alone (`tm.pack_modules`), every tag compared with what Apple's tool wrote.

    python tools/repack_check.py [LIBRARY.metallib ...] [--limit N] [--merged K]

Without paths it checks mlx.metallib, torch 2.13's two libraries and the public corpus (every
file in it is built by Apple's toolchain). Per library it prints the functions checked and, per
tag, how many match, differ, are Apple's only (not derived from a module) or ours only; the
header fields (format version, platform, platform version) too. The reference for a slice is
Apple's library cut to that slice (`Library.subset`: the same tags, OFFT laid out for it).
`--merged K` checks the cut instead: every K functions' modules linked into one module, packed
(cut into a module per function again), each function's CNST and argument table compared with
Apple's.
"""

import argparse
import collections
import glob
import os
import pathlib
import sys

import torch_metallib as tm

__all__ = ["repack_check", "merged_check", "default_libraries", "TAG_GROUPS"]

TAG_GROUPS = ("tags", "public_metadata", "private_metadata")
HEADER_FIELDS = ("file_version", "platform", "platform_version", "group_size_convention")


def repack_check(library: tm.Library, names=None) -> dict:
    """{"functions": n, "tags": {tag: Counter(match|differ|apple_only|ours_only)}, "header":
    {field: (apple, ours)}, "order": n functions whose function-list tag order differs,
    "examples": {(tag, outcome): function}}. The order compares the tags both lists hold."""
    names = list(library.function_names if names is None else names)
    reference = library if len(names) == len(library) else tm.load(library.subset(names))
    ours = tm.load(tm.pack_modules([bytes(library[name].module) for name in names]))
    tags = collections.defaultdict(collections.Counter)
    examples, order = {}, 0
    for name in names:
        apple, mine = reference[name], ours[name]
        for group in TAG_GROUPS:
            a = {tag: bytes(payload) for tag, _offset, payload in apple._record[group]}
            b = {tag: bytes(payload) for tag, _offset, payload in mine._record[group]}
            for tag in a.keys() | b.keys():
                outcome = ("match" if a.get(tag) == b.get(tag) else "apple_only" if tag not in b
                           else "ours_only" if tag not in a else "differ")
                tags[tag][outcome] += 1
                examples.setdefault((tag, outcome), name)
        shared = {t for t, _o, _p in apple.tags} & {t for t, _o, _p in mine.tags}
        order += [t for t, _o, _p in apple.tags if t in shared] != [t for t, _o, _p in mine.tags if t in shared]
    header = {field: (getattr(library, field), getattr(ours, field)) for field in HEADER_FIELDS}
    return {"functions": len(names), "tags": dict(tags), "header": header, "order": order, "examples": examples}


def merged_check(library: tm.Library, names, k: int) -> collections.Counter:
    """Counter of "CNST match|differ" and "arguments match|differ" over `names`, linked K at a
    time into one module and packed from it."""
    import llvmlite.binding as llvm

    counts = collections.Counter()
    names = list(names)
    for start in range(0, len(names), k):
        group = names[start:start + k]
        context = llvm.create_context()
        modules = [llvm.parse_bitcode(bytes(library[name].bitcode), context=context) for name in group]
        for module in modules[1:]:
            modules[0].link_in(module)
        ours = tm.load(tm.pack_modules([modules[0]]))
        for name in group:
            apple, mine = library[name], ours[name]
            counts["CNST " + ("match" if apple.declared_constants == mine.declared_constants else "differ")] += 1
            counts["arguments " + ("match" if apple.arguments == mine.arguments else "differ")] += 1
    return counts


def default_libraries() -> list:
    home = pathlib.Path.home() / ".cache/torch_metallib"
    corpus = pathlib.Path(os.environ.get("TORCH_METALLIB_CORPUS_DIR", home / "corpus"))
    public = pathlib.Path(os.environ.get("TM_PUBLIC_CORPUS", home / "public-corpus"))
    return (sorted(glob.glob(str(corpus / "mlx-metal-*/mlx.metallib"))) + sorted(glob.glob(str(corpus / "torch-*/*.metallib")))
            + sorted(glob.glob(str(public / "*.metallib"))))


def report(path: str, result: dict) -> str:
    lines = [f"{path}: {result['functions']} functions"]
    for tag, counts in sorted(result["tags"].items()):
        parts = ", ".join(f"{outcome} {counts[outcome]}" for outcome in ("match", "differ", "apple_only", "ours_only")
                          if counts[outcome])
        lines.append(f"  {tag}: {parts}")
    for field, (apple, ours) in result["header"].items():
        lines.append(f"  header {field}: {'match' if apple == ours else 'differ'} (Apple {apple}, ours {ours})")
    lines.append(f"  function-list tag order differs: {result['order']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="libraries (default: every Apple-built one in the caches)")
    parser.add_argument("--limit", type=int, help="check only every k-th function, about N per library")
    parser.add_argument("--merged", type=int, metavar="K", help="check the cut of K functions linked into one module")
    args = parser.parse_args(argv)
    paths = args.paths or default_libraries()
    if not paths:
        print("no libraries: run `python -m torch_metallib corpus` (and --torch) first", file=sys.stderr)
        return 1
    totals = collections.defaultdict(collections.Counter)
    functions = 0
    for path in paths:
        library = tm.load(path)
        names = library.function_names
        if args.limit and len(names) > args.limit:
            names = names[::-(-len(names) // args.limit)]
        if args.merged:
            counts = merged_check(library, names, args.merged)
            print(f"{path}: {len(names)} functions, {args.merged} per module: {dict(sorted(counts.items()))}", flush=True)
            continue
        result = repack_check(library, names)
        print(report(path, result), flush=True)
        functions += result["functions"]
        for tag, counts in result["tags"].items():
            totals[tag].update(counts)
    if args.merged:
        return 0
    print(report(f"all {len(paths)} libraries", {"functions": functions, "tags": totals, "header": {}, "order": "-"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
