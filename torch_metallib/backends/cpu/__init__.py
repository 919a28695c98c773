"""The CPU backend: each kernel's AIR is lowered to host LLVM IR (``lowering`` with the
intrinsic definitions in ``intrinsics``, ``atomics``, ``collectives``, ``simdgroup_matrix``),
cooperative kernels become lane loops cut at their waits (``regions``) or, where those do
not apply, per-thread coroutines (``coroutine``, ``reconvergence``, ``matrix_batches``,
``private_arrays``), ``jit`` compiles and caches the result, and
``backend`` runs binding plans with the native runners in ``csrc/cpu/``."""
