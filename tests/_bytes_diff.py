"""Readable failure messages for byte-exact comparisons."""


def first_difference(actual: bytes, expected: bytes, context: int = 16) -> str:
    """'' when equal, else a description of the first differing byte with hex context."""
    if actual == expected:
        return ""
    limit = min(len(actual), len(expected))
    at = next((i for i in range(limit) if actual[i] != expected[i]), limit)
    lo = max(0, at - context)
    return (
        f"lengths {len(actual)} vs {len(expected)}; first difference at byte {at}:\n"
        f"  actual   [{lo}:] {bytes(actual[lo:at + context]).hex(' ')}\n"
        f"  expected [{lo}:] {bytes(expected[lo:at + context]).hex(' ')}"
    )
