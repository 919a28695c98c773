"""AIR's meaning, defined once for every backend (ARCHITECTURE.md, "Where new work goes").

What a Metal kernel's ``air.*`` intrinsics compute, as LLVM IR text: per-lane math and
conversions (``intrinsics``, ``lanes``, ``math_functions``), ``atomics``, the SIMD-group and
quad-group functions and barriers over an abstract SIMD-group exchange (``collectives``),
``simdgroup_matrix``, ``async_copies``, Metal 4's tensors (``private_tensors``,
``tensor_ops``); and the target-neutral edits of a kernel's module: function-constant
specialization (``function_constants``, ``constant_globals``), builtins as IR values
(``builtins``), retargeting and defining the intrinsics (``module``), integer division that
cannot trap (``integer_division``), exact bfloat rounding (``bfloat_rounding``), private
arrays' stray indices (``private_arrays``) and convergent waits (``convergence``), each reading
function bodies through ``reflection.ir_model``.

The backends spell it for their target: ``backends/cpu/`` for the host (lane loops,
coroutines, the runtime in ``csrc/cpu/``), ``backends/cuda/`` for NVPTX (warp shuffles,
libdevice). This package imports neither backend, and neither backend imports the other
(tests/test_backend_seam.py).
"""
