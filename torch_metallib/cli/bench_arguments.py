"""Arguments `bench` passes to a kernel it times, made from the kernel's reflection alone:
a zero tensor of the argument's element type per pointer argument, and 1 for each value
passed by reference (``constant uint& size``). Zeros keep any index a kernel reads in
range; the grid is the first tensor's size, so a kernel that reads one element per thread
stays inside its buffers."""

import torch

from ..errors import UnsupportedKernelError

__all__ = ["arguments_for"]

DTYPES = {"float": torch.float32, "half": torch.float16, "bfloat": torch.bfloat16, "int": torch.int32,
          "uint": torch.int32, "short": torch.int16, "ushort": torch.int16, "char": torch.int8,
          "uchar": torch.uint8, "bool": torch.bool, "long": torch.int64, "ulong": torch.int64}


def arguments_for(function, elements: int, device: str = "cpu") -> list:
    """Positional arguments for `function`, in binding order.

    Raises:
        UnsupportedKernelError: an argument the bench cannot make up (a struct, an argument
            buffer, threadgroup memory, function constants): name another kernel with --kernel.
    """
    if function.function_constants:
        raise UnsupportedKernelError(f"{function.name}: declares function constants, which bench cannot choose; "
                                     f"pick a kernel without them with --kernel")
    out = []
    for argument in function.buffers:
        element = argument.type_name
        if argument.kind != "buffer" or element not in DTYPES:
            raise UnsupportedKernelError(
                f"{function.name}: argument '{argument.name}' ({argument.kind}, {element}) cannot be made up from "
                f"reflection; pick a kernel whose arguments are scalar buffers with --kernel")
        by_value = argument.buffer_size is not None and argument.buffer_size == argument.type_size
        out.append(1 if by_value else torch.zeros(elements, dtype=DTYPES[element], device=device))
    return out
