"""What checked execution costs: kernels run with every memory access bounds-checked
(``checked=True``) against the same kernels unchecked, in the same run.

Usage: python benchmarks/checked.py [--repeat N]

Kernels from the reference corpus ``mlx.metallib``: the elementwise add
(``vv_Addfloat32``, 2**22 floats), the threadgroup softmax (``block_softmax_float32``,
512 rows of 4,096) and a steel GEMM (``steel_gemm_fused_nn_float32_float32_bm32_bn32_bk16_wm2_wn2``,
256 x 256 x 256). Both variants are compiled before timing; calls alternate (the
_timing.interleaved helper), and each result is checked against the unchecked one once.
Prints medians in milliseconds and the ratio checked / unchecked (the target is at
most 3x on elementwise and softmax kernels; the script reports it and never fails on it).
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import torch_metallib as tm  # noqa: E402
from torch_metallib.cache.corpus import mlx_metallib_path  # noqa: E402
from _timing import interleaved  # noqa: E402


def cases(lib):
    g = torch.Generator().manual_seed(0)
    a, b, c = torch.randn(2**22, generator=g), torch.randn(2**22, generator=g), torch.empty(2**22)
    yield "vv_Addfloat32 (2**22)", lambda checked: (lib.vv_Addfloat32(a, b, c, checked=checked), c)[1]
    x, y = torch.randn(512, 4096, generator=g), torch.empty(512, 4096)
    yield "block_softmax_float32 (512 x 4096)", lambda checked: (lib.block_softmax_float32(
        x, y, 4096, threads=(512 * 1024, 1, 1), group_size=(1024, 1, 1), checked=checked), y)[1]
    from _mlx_matmul import _pack_struct  # the GEMM's params struct, from reflection
    fn = lib["steel_gemm_fused_nn_float32_float32_bm32_bn32_bk16_wm2_wn2"]
    n = 256
    m1, m2, d = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g), torch.empty(n, n)
    params = _pack_struct(fn, "params", M=n, N=n, K=n, lda=n, ldb=n, ldd=n, tiles_n=n // 32, tiles_m=n // 32,
                          batch_stride_a=n * n, batch_stride_b=n * n, batch_stride_d=n * n, swizzle_log=0,
                          gemm_k_iterations_aligned=n // 16, batch_ndim=1)
    constants = {"has_batch": False, "use_out_source": False, "do_axpby": False, "align_M": True, "align_N": True,
                 "align_K": True}
    yield f"{fn.name} ({n}^3)", lambda checked: (fn(A=m1, B=m2, D=d, params=params, constants=constants,
                                                   threads=(n // 32 * 32, n // 32 * 2, 2), group_size=(32, 2, 2),
                                                   checked=checked), d)[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args(argv)
    lib = tm.load(mlx_metallib_path())
    print(f"torch threads: {torch.get_num_threads()}, {args.repeat} interleaved repeats, medians")
    print(f"{'kernel':72} {'unchecked ms':>12} {'checked ms':>11} {'ratio':>6}")
    for name, run in cases(lib):
        expected, got = run(False).clone(), run(True).clone()
        if not torch.equal(expected, got):
            print(f"{name}: checked result differs from the unchecked one", file=sys.stderr)
            return 1
        times = interleaved({"unchecked": lambda: run(False), "checked": lambda: run(True)}, args.repeat)["median_ms"]
        print(f"{name:72} {times['unchecked']:>12.2f} {times['checked']:>11.2f} "
              f"{times['checked'] / times['unchecked']:>5.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
