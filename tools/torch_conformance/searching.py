"""PyTorch's searchsorted kernels (Bucketization.metal, host code Bucketization.mm):
``searchsorted_<T>_<int|long>[_sorter]``, against torch.searchsorted.

Arguments: ``data_in, data_bd, data_out, long idim_in, long idim_bd, long numel_in, long
right, long is_1d_boundaries[, long* data_sort]``. Each thread handles elements tid, tid +
tptg.x, ... of the input (flattened); with N-d boundaries, input row ``tid / idim_in``
searches boundaries row ``tid / idim_in * idim_bd``; ``data_sort`` holds, per boundaries
row, the row-relative argsort (torch's ``sorter``). Lower bound is ``!(b >= v)``, upper
``!(b > v)``: torch's. Inputs have no NaN (their place in an unsorted comparison is not
torch's contract). The grid covers every element once: groups of 256 threads.
"""

import re
from typing import Optional, Tuple

import torch

from .dtypes import METAL_DTYPES
from .inputs import generator
from .sorting import Buffer

_NAME = re.compile(r"^searchsorted_(float|half|bfloat|char|uchar|short|int|long)_(int|long)(_sorter)?$")


def parse(name: str):
    m = _NAME.match(name)
    return ("searchsorted",) + m.groups() if m else None


def family(name: str) -> Optional[str]:
    return "searchsorted" if _NAME.match(name) else None


def _values(dtype, n, gen):
    if dtype.is_floating_point:
        return (torch.randint(-16, 17, (n,), generator=gen).double() / 4).to(dtype)
    low = 0 if dtype == torch.uint8 else -30
    return torch.randint(low, 31, (n,), generator=gen).to(dtype)


def _run(function, dtype, out_dtype, sorter, case, gen) -> Optional[str]:
    rows, idim_bd, idim_in, one_d, right = case
    bd = _values(dtype, (1 if one_d else rows) * idim_bd, gen).view(-1, idim_bd)
    if sorter:
        order = torch.argsort(bd.double(), dim=1, stable=True)
    else:
        bd = bd.sort(dim=1).values
        order = None
    x = _values(dtype, rows * idim_in, gen).view(rows, idim_in)
    out = Buffer(out_dtype, rows, idim_in)
    n = x.numel()
    args = [x.contiguous(), bd.contiguous(), out.tensor, idim_in, idim_bd, n, int(right), int(one_d)]
    if sorter:
        args.append(order.contiguous())
    threads = -(-n // 256) * 256
    function(*args, threads=threads, group_size=256)
    if not out.untouched():
        return "wrote outside its output"
    ref_bd = bd.expand(rows, idim_bd) if one_d else bd
    ref_sorter = order.expand(rows, idim_bd) if (sorter and one_d) else order
    expected = torch.searchsorted(ref_bd.double().contiguous(), x.double(), right=right,
                                  sorter=None if ref_sorter is None else ref_sorter.contiguous())
    bad = (out.tensor.to(torch.int64) != expected).nonzero()
    if len(bad):
        r, c = bad[0].tolist()
        return (f"{len(bad)} of {n} differ; first [{r}, {c}] value {x[r, c].item()!r}: got "
                f"{int(out.tensor[r, c])}, expected {int(expected[r, c])}")
    return None


def check(function, device: str) -> Tuple[str, str]:
    _, tname, oname, sorter = parse(function.name)
    gen = generator(function.name)
    cases = [(1, 1, 7, True, False), (3, 17, 300, True, True), (4, 33, 70, False, False),
             (2, 100, 600, False, True), (5, 0, 3, False, False)]
    for case in cases:
        if case[1] == 0:
            continue  # an empty boundaries row: pos 0 for all, but torch refuses it
        problem = _run(function, METAL_DTYPES[tname], METAL_DTYPES[oname], bool(sorter), case, gen)
        if problem:
            return "wrong", f"rows {case[0]} boundaries {case[1]} inputs {case[2]} {'1-d' if case[3] else 'n-d'} right={case[4]}: {problem}"
    return "correct", ""
