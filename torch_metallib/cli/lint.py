"""`python -m torch_metallib lint LIB|MODULE... [--json]`: AIR modules checked against what
Apple's tools write and Metal is known to enforce (torch_metallib/lint/, docs/lint.md).
Exit status 1 when any finding is an error."""

import json

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "lint", help="check AIR modules (or every function of a .metallib) for what would break on a Mac",
        description="Check AIR modules (.air/.bc bitcode, .ll text, or every function module of a .metallib) "
                    "against the rules Apple's compiler follows and Metal is known to enforce: typed-pointer "
                    "bitcode without constructs newer than LLVM 14, versions and triple, module flags, entry "
                    "functions and argument metadata. Exit status 1 if any finding is an error.")
    parser.add_argument("paths", nargs="+", metavar="LIB|MODULE", help=".metallib, .air/.bc bitcode or .ll IR text")
    parser.add_argument("--json", action="store_true", help="print the findings as one JSON object")
    parser.add_argument("--rules", action="store_true", help="list the rules first (id, severity, title)")
    parser.set_defaults(run=run)


def run(args) -> int:
    from ..lint.run import RULES, exit_status, lint_path

    findings = [finding for path in args.paths for finding in lint_path(path)]
    status = exit_status(findings)
    errors = sum(f.severity == "error" for f in findings)
    if args.json:
        print(json.dumps({"findings": [f.as_dict() for f in findings], "errors": errors,
                          "warnings": len(findings) - errors, "status": status}, indent=1))
        return status
    if args.rules:
        for rule in RULES:
            print(f"{rule.id} {rule.severity:7} {rule.title}")
    for finding in findings:
        print(f"{finding.where}: {finding.severity} {finding.rule}: {finding.message}")
    print(f"{len(args.paths)} input(s): {errors} error(s), {len(findings) - errors} warning(s)")
    return status
