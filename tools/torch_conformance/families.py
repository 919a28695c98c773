"""Kernel -> family, and the harness that checks it."""

import re
import traceback
from typing import Tuple

import torch_metallib as tm

from . import (amp, attention, elementwise, embedding, index_reduce, indexing, matmul, normalization, norms, pointwise,
               pooling, prefill_attention, reductions, replication_pad, sampling, scans, searching, shape, sort_radix,
               sorting, vector_norms)
from .on_device import OnDevice

OUTCOMES = ("correct", "wrong", "refused", "crash", "hang", "not attempted", "harness error")
# Harnesses tried before the elementwise templates, each with parse(name) and check(function, device).
HARNESSES = (amp, attention, prefill_attention, vector_norms, reductions, scans, norms, normalization, sampling, shape,
             indexing, index_reduce, matmul, pointwise, replication_pad, pooling, embedding, sorting, sort_radix,
             searching)
_TYPE_WORDS = r"(bool|uchar|char|short|int|long|ushort|uint|ulong|half|float|bfloat|half2|float2)"


def family(name: str) -> str:
    """The op a kernel implements (``add`` for ``add_dense_cast_float_float``), else its name's
    stem without types and sizes."""
    parsed = elementwise.parse(name)
    if parsed is not None:
        return parsed.op
    scan = scans.parse(name)
    if scan is not None:
        return f"{scan.op}_{scan.scheme}"
    for harness in (sorting, sort_radix, searching):
        sort = harness.family(name)
        if sort is not None:
            return sort
    for harness in (shape, indexing, index_reduce, matmul, replication_pad, pooling, embedding, pointwise,
                    prefill_attention, vector_norms):
        parsed = harness.parse(name)
        if parsed is not None:
            return parsed[0]
    match = re.match(r"(.+?)_(dense|strided)_", name)
    if match:
        return match.group(1)
    return re.sub(rf"(_{_TYPE_WORDS}|_\d+\w*)+$", "", re.split(rf"_{_TYPE_WORDS}(_|$)", name)[0])


class Context:
    """What a worker keeps across kernels: the library and tables read from its names."""

    def __init__(self, library, device: str):
        self.library, self.device = library, device
        self.results = elementwise.result_dtypes(library.function_names)


def check(context: Context, name: str) -> Tuple[str, str]:
    function = context.library[name]
    try:
        for harness in HARNESSES:
            if harness.parse(name):
                if context.device in getattr(harness, "DEVICES", ("cpu",)):
                    return harness.check(function, context.device)
                # The harness builds CPU tensors: the kernel runs on the device with copies of them.
                return harness.check(OnDevice(function, context.device), "cpu")
        return elementwise.check(function, context.results, context.device)
    except elementwise.NoHarness as reason:
        return "not attempted", str(reason)
    except tm.TorchMetallibError as error:
        return "refused", f"{type(error).__name__}: {error}"
    except Exception:  # noqa: BLE001 - a harness bug is reported, never mistaken for a result
        return "harness error", traceback.format_exc()[-800:]
