"""Call fuzzing: hypothesis generates calls to real kernels of the reference corpus
with random argument kinds, dtypes, sizes, storage offsets, strides, scalars, ``threads``
and ``group_size``, checked or not, and asserts that every call either raises one of the
project's exceptions or leaves every tensor exactly as a torch reference computed from the
same storage says (the kernel's own indexing, elements past the grid untouched).

A call that would read or write outside the memory it binds is made only in checked
execution, where it must raise KernelMemoryError (or be refused before running, as an
empty tensor is); a crash kills this process, which is why
tests/test_call_fuzzing.py runs it as a child. A call with nothing wrong must succeed.

Usage: python tools/fuzz_calls.py METALLIB [--examples N] [--seed S]
Prints one JSON line of counts (calls made, results checked, exceptions by type).
"""

import argparse
import collections
import json
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List

import torch
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import torch_metallib as tm

# Values a float* argument refuses; a written one also refuses values (inline bytes) and a
# leaf that requires grad (as torch refuses in-place writes to one).
BAD_KINDS = ("float64", "int32", "float16", "numpy", "sparse", "none", "meta")
BAD_FOR_WRITTEN = ("python float", "list", "grad leaf")


@dataclass
class Buffer:
    """A float32 storage and the view of it a call binds (offset and length in elements)."""
    storage: torch.Tensor
    offset: int
    length: int

    def bound(self) -> torch.Tensor:
        return self.storage.as_strided((self.length,), (1,), self.offset)

    def reachable(self) -> int:  # elements from the bound address to the end of the storage
        return self.storage.numel() - self.offset


@dataclass
class Call:
    kernel: str
    args: list
    kwargs: dict
    buffers: List[Buffer]
    reference: Callable[[List[torch.Tensor]], List[torch.Tensor]]
    in_bounds: bool
    written: int  # the argument the kernel writes
    bad: List[str] = field(default_factory=list)  # what makes the call wrong (expects an exception)


def _buffers(draw, needs: List[int]) -> List[Buffer]:
    """One float32 buffer per entry of `needs` (elements the call reaches from the bound
    address): mostly enough of them, behind a random storage offset; sometimes fewer."""
    out = []
    for need in needs:
        offset = draw(st.integers(0, 8))
        if draw(st.integers(0, 4)) == 0:  # too short (possibly empty)
            size = offset + draw(st.integers(0, max(need - 1, 0)))
        else:
            size = offset + need + draw(st.integers(0, 8))
        out.append(Buffer(torch.randn(size), offset, size - offset))
    return out


def _replace_kind(draw, call: Call) -> None:
    """Sometimes put a value no backend binds where a float tensor belongs."""
    if draw(st.integers(0, 3)) != 0:
        return
    slot = draw(st.sampled_from([i for i, a in enumerate(call.args) if isinstance(a, torch.Tensor)]))
    kind = draw(st.sampled_from(BAD_KINDS + (BAD_FOR_WRITTEN if slot == call.written else ())))
    original = call.args[slot]
    values = {
        "float64": lambda: original.double(), "int32": lambda: original.int(), "float16": lambda: original.half(),
        "numpy": lambda: original.numpy(), "sparse": lambda: original.to_sparse(), "python float": lambda: 1.5,
        "list": lambda: original.tolist(), "none": lambda: None, "meta": lambda: original.to("meta"),
        "grad leaf": lambda: original.detach().clone().requires_grad_(),
    }
    call.args[slot] = values[kind]()
    call.bad.append(f"argument {slot} is {kind}")


@st.composite
def elementwise_add(draw) -> Call:
    """vv_Addfloat32(a, b, c): c[i] = a[i] + b[i] for every thread i of a 1-D grid."""
    threads = draw(st.one_of(st.integers(1, 128), st.sampled_from([10**6, 2**33])))
    a, b, c = _buffers(draw, [min(threads, 128)] * 3)
    in_bounds = threads <= min(x.reachable() for x in (a, b, c))

    def reference(storages):
        out = storages[2].clone()
        out[c.offset:c.offset + threads] = (storages[0][a.offset:a.offset + threads]
                                            + storages[1][b.offset:b.offset + threads])
        return [storages[0], storages[1], out]

    call = Call("vv_Addfloat32", [a.bound(), b.bound(), c.bound()], {"threads": threads}, [a, b, c],
                reference, in_bounds, written=2)
    if threads >= 2**32:
        call.bad.append("a grid beyond Metal's limits")
    return call


@st.composite
def strided_add(draw) -> Call:
    """g2_Addfloat32(a, b, c, a_strides, b_strides) over a (W, H) grid: c[x + W*y] = a[x*sa1 +
    y*sa0] + b[x*sb1 + y*sb0]."""
    width, height = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    strides = [[draw(st.integers(0, 16)), draw(st.integers(0, 4))] for _ in range(2)]
    if draw(st.integers(0, 9)) == 0:
        strides[0][0] = 10**9
    def last(s):
        return (height - 1) * s[0] + (width - 1) * s[1]

    a, b, c = _buffers(draw, [min(last(strides[0]) + 1, 256), last(strides[1]) + 1, width * height])

    in_bounds = (last(strides[0]) < a.reachable() and last(strides[1]) < b.reachable()
                 and width * height <= c.reachable())

    def reference(storages):
        out = storages[2].clone()
        y, x = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
        values = [storages[i][buf.offset + y * s[0] + x * s[1]] for i, (buf, s) in enumerate(zip((a, b), strides))]
        out[c.offset:c.offset + width * height] = (values[0] + values[1]).reshape(-1)
        return [storages[0], storages[1], out]

    return Call("g2_Addfloat32", [a.bound(), b.bound(), c.bound(), strides[0], strides[1]],
                {"threads": (width, height)}, [a, b, c], reference, in_bounds, written=2)


@st.composite
def block_softmax(draw) -> Call:
    """block_softmax_float32(in, out, axis_size): one threadgroup per row, softmax over
    axis_size elements (4 per thread)."""
    group = draw(st.sampled_from([32, 64, 128, 256, 1024]))
    rows = draw(st.integers(1, 4))
    axis = draw(st.integers(1, min(group * 4, 200)))
    x, y = _buffers(draw, [rows * axis] * 2)
    in_bounds = rows * axis <= min(x.reachable(), y.reachable())

    def reference(storages):
        out = storages[1].clone()
        rows_in = storages[0][x.offset:x.offset + rows * axis].reshape(rows, axis)
        out[y.offset:y.offset + rows * axis] = torch.softmax(rows_in.double(), dim=1).float().reshape(-1)
        return [storages[0], out]

    return Call("block_softmax_float32", [x.bound(), y.bound(), axis],
                {"threads": (rows * group, 1, 1), "group_size": (group, 1, 1)}, [x, y], reference, in_bounds, written=1)


@st.composite
def calls(draw) -> Call:
    call = draw(st.one_of(elementwise_add(), strided_add(), block_softmax()))
    _replace_kind(draw, call)
    call.kwargs["checked"] = True if not call.in_bounds else draw(st.booleans())
    return call


def check(lib, call: Call, counts: collections.Counter) -> None:
    before = [b.storage.clone() for b in call.buffers]
    try:
        getattr(lib, call.kernel)(*call.args, **call.kwargs)
    except tm.TorchMetallibError as error:
        counts[type(error).__name__] += 1
        if not call.bad and call.in_bounds:
            raise AssertionError(f"{call.kernel}: a correct call raised {error!r}") from error
        if not call.bad and not isinstance(error, (tm.KernelMemoryError, tm.DispatchError)):
            raise AssertionError(f"{call.kernel}: out of bounds, expected KernelMemoryError (or a refusal "
                                 f"before running), got {error!r}") from error
        return
    except Exception as error:  # noqa: BLE001 - anything else is a finding
        raise AssertionError(f"{call.kernel}: foreign exception {error!r} for {call.bad or 'a correct call'}") from error
    if call.bad:
        raise AssertionError(f"{call.kernel}: no exception although {call.bad}")
    if not call.in_bounds:
        raise AssertionError(f"{call.kernel}: out of bounds in checked execution, but nothing raised")
    expected = call.reference(before)
    for index, (buffer, want) in enumerate(zip(call.buffers, expected)):
        torch.testing.assert_close(buffer.storage, want, rtol=2e-6, atol=1e-6,
                                   msg=lambda m: f"{call.kernel}: buffer {index} differs: {m}")
    counts["results equal to the reference"] += 1


def run(path: str, examples: int, fuzz_seed: int) -> Dict[str, int]:
    lib = tm.load(path)
    counts = collections.Counter()

    @seed(fuzz_seed)
    @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(calls())
    def fuzz(call):
        counts["calls"] += 1
        check(lib, call, counts)

    fuzz()
    return dict(counts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metallib")
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    print(json.dumps(run(args.metallib, args.examples, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
