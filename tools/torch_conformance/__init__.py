"""PyTorch's own Metal kernels as a conformance suite for the CPU and CUDA backends.

Each kernel of the two metallibs in torch's macOS wheel is called the way PyTorch's host
code calls it (arguments from the kernel's reflection and its template in PyTorch's Metal
source) and its output is compared with torch's own CPU ops. Run it with
``python -m tools.torch_conformance --help``.
"""
