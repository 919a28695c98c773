"""Deterministic inputs in each reference's domain."""

import zlib

import torch

from .dtypes import is_complex, is_integral


def generator(name: str) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(name.encode()))


def values(n: int, dtype: torch.dtype, domain: str, gen: torch.Generator, operand: int = 0) -> torch.Tensor:
    """`n` values of `dtype` in `domain` for operand `operand` (0 = lhs, 1 = rhs)."""
    if dtype == torch.bool:
        if operand == 1 and domain in ("nonzero_rhs", "positive"):
            return torch.ones(n, dtype=torch.bool)
        return torch.rand(n, generator=gen) < 0.5
    if is_integral(dtype):
        signed = dtype not in (torch.uint8, torch.uint16, torch.uint32, torch.uint64)
        low, high = (-20, 21) if signed else (0, 41)
        if domain == "positive" or (domain == "nonzero_rhs" and operand == 1):
            low, high = 1, 21
        if domain == "shift" and operand == 1:
            low, high = 0, 8 * torch.empty((), dtype=dtype).element_size()
        if domain == "polynomial" and operand == 1:
            low, high = 0, 9
        return torch.randint(low, high, (n,), generator=gen).to(dtype)
    if is_complex(dtype):
        parts = (torch.rand(n, 2, generator=gen, dtype=torch.float64) * 4 - 2)
        return torch.view_as_complex(parts).to(dtype)
    if domain == "positive" or (domain == "nonzero_rhs" and operand == 1):
        x = torch.rand(n, generator=gen, dtype=torch.float64) * 5 + 0.05
    elif domain == "unit" or (domain == "polynomial" and operand == 0):
        x = torch.rand(n, generator=gen, dtype=torch.float64) * 2 - 1
    elif domain == "polynomial":
        x = torch.randint(0, 9, (n,), generator=gen).double()
    else:
        x = torch.rand(n, generator=gen, dtype=torch.float64) * 8 - 4
        if domain == "any":
            x[:4] = torch.tensor([0.0, 1.0, -1.0, 0.5])[:n]
    return x.to(dtype)
