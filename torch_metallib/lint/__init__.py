"""``lint``: checks AIR modules against what Apple's tools write and Metal is known to enforce,
so compilers that write AIR themselves learn on Linux what would break on a Mac
(docs/lint.md lists the rules and their evidence)."""

from .run import RULES, Finding, lint_bitcode, lint_path

__all__ = ["RULES", "Finding", "lint_bitcode", "lint_path"]
