"""The CPU backend: each kernel's AIR is lowered to host LLVM IR (``lowering`` with AIR's
intrinsic definitions from ``torch_metallib.air``, their waits spelled by ``target``),
cooperative kernels become lane loops cut at their waits (``regions``) or, where those do
not apply, per-thread coroutines (``coroutine``, ``reconvergence``, ``matrix_batches``),
checked kernels check every access (``bounds_checks``), ``jit`` compiles and caches the
result, and ``backend`` runs binding plans with the native runners in ``csrc/cpu/``."""
