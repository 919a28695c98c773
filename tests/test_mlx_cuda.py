"""torch_metallib.mlx's operators on an NVIDIA GPU: every public function run on ``cuda``
tensors against the same call on the CPU backend (which tests/test_mlx_ops.py checks against
torch), forward and, where the operator has a backward kernel, gradients. Marked ``cuda``;
skipped without a GPU.

The two backends run the same kernels with the same float32 accumulation, but the GPU's
fused multiply-adds and libdevice's math differ from the CPU's in the last bits, so results
agree within a few ulps of the storage type (sums of hundreds of terms within their order's
rounding), not bit for bit."""

import pytest
import torch

from torch_metallib import mlx

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                                                   reason="needs an NVIDIA GPU (CUDA)")]

FLOATS = [torch.float32, torch.float16, torch.bfloat16]
NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
# (rtol, atol): a few ulps of the type; float32 also covers a sum's order over K = 256.
TOLERANCES = {torch.float32: (2e-5, 2e-5), torch.float16: (4e-3, 1e-3), torch.bfloat16: (3e-2, 1e-2)}
dtypes = pytest.mark.parametrize("dtype", FLOATS, ids=NAMES.get)


def _data(shape, dtype, seed=0, scale=1.0):
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def _same(cpu: torch.Tensor, gpu: torch.Tensor, what: str):
    assert gpu.device.type == "cuda", what
    assert gpu.shape == cpu.shape and gpu.dtype == cpu.dtype, what
    rtol, atol = TOLERANCES.get(cpu.dtype, (0, 0))
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def _both(fn, *tensors, grad=False):
    """fn on CPU copies and on CUDA copies of `tensors`; with grad, also the gradients of
    sum(out * g) for one fixed g."""
    cpu = [t.clone().requires_grad_(grad and t.is_floating_point()) for t in tensors]
    gpu = [t.cuda().requires_grad_(grad and t.is_floating_point()) for t in tensors]
    out_cpu, out_gpu = fn(*cpu), fn(*gpu)
    torch.cuda.synchronize()
    grads = []
    if grad:
        g = _data(out_cpu.shape, out_cpu.dtype, seed=99)
        grads_cpu = torch.autograd.grad(out_cpu, [t for t in cpu if t.requires_grad], g)
        grads_gpu = torch.autograd.grad(out_gpu, [t for t in gpu if t.requires_grad], g.cuda())
        grads = list(zip(grads_cpu, grads_gpu))
    return out_cpu.detach(), out_gpu.detach(), grads


@dtypes
@pytest.mark.parametrize("n", [256, 4200], ids=["block", "looped"])
@pytest.mark.parametrize("name", ["rms_norm", "layer_norm"])
def test_norms(defined, dtype, n, name):
    fn = getattr(mlx, name)
    cpu, gpu, grads = _both(lambda x, w: fn(x, w), _data((6, n), dtype), _data((n,), dtype, seed=1), grad=True)
    _same(cpu, gpu, name)
    for i, (gc, gg) in enumerate(grads):
        # Weight gradients sum over the rows in another order on each backend.
        _same(gc, gg, f"{name} gradient {i}")


@dtypes
@pytest.mark.parametrize("traditional", [False, True])
def test_rope(defined, dtype, traditional):
    cpu, gpu, _ = _both(lambda x: mlx.rope(x, 3, traditional=traditional), _data((2, 5, 7, 32), dtype))
    _same(cpu, gpu, "rope")


@dtypes
@pytest.mark.parametrize("n", [100, 5000], ids=["block", "looped"])
@pytest.mark.parametrize("name", ["softmax", "logsumexp"])
def test_row_reductions(defined, dtype, n, name):
    cpu, gpu, _ = _both(getattr(mlx, name), _data((5, n), dtype, scale=3.0))
    _same(cpu, gpu, name)


@dtypes
@pytest.mark.parametrize("causal", [False, True])
def test_decoding_attention(defined, dtype, causal):
    q, k, v = _data((2, 8, 1, 64), dtype), _data((2, 2, 37, 64), dtype, 1), _data((2, 2, 37, 64), dtype, 2)
    cpu, gpu, _ = _both(lambda q, k, v: mlx.scaled_dot_product_attention(q, k, v, causal=causal), q, k, v)
    _same(cpu, gpu, "sdpa_vector")


@dtypes
@pytest.mark.parametrize("shape", [(64, 256, 64), (33, 100, 70)], ids=["aligned", "ragged"])
def test_matmul(defined, dtype, shape):
    m, k, n = shape
    cpu, gpu, grads = _both(mlx.matmul, _data((m, k), dtype), _data((k, n), dtype, 1), grad=dtype == torch.float32)
    _same(cpu, gpu, "matmul")
    for i, (gc, gg) in enumerate(grads):
        _same(gc, gg, f"matmul gradient {i}")


@dtypes
def test_batched_matmul_and_addmm(defined, dtype):
    a, b = _data((3, 40, 64), dtype), _data((3, 64, 24), dtype, 1)
    cpu, gpu, _ = _both(mlx.matmul, a, b)
    _same(cpu, gpu, "bmm")
    c = _data((24,), dtype, 2)
    cpu, gpu, _ = _both(lambda c, a, b: mlx.addmm(c, a, b, beta=0.5, alpha=2.0), c, a[0], b[0])
    _same(cpu, gpu, "addmm")


@dtypes
@pytest.mark.parametrize("mask", [None, "float", "bool"])
@pytest.mark.parametrize("causal", [False, True])
def test_prefill_attention(defined, dtype, mask, causal):
    """The steel attention kernels: 45 queries over 70 keys (ragged against its 32 x 16/32
    blocks), grouped-query heads, masks broadcast over the batch."""
    q, k, v = _data((2, 4, 45, 64), dtype), _data((2, 2, 70, 64), dtype, 1), _data((2, 2, 70, 64), dtype, 2)
    tensors = [q, k, v]
    if mask == "float":
        tensors.append(_data((1, 4, 45, 70), dtype, 3))
    elif mask == "bool":
        tensors.append(_data((1, 4, 45, 70), torch.float32, 3) > -1.0)

    def attend(q, k, v, m=None):
        return mlx.scaled_dot_product_attention(q, k, v, mask=m, causal=causal)
    cpu, gpu, _ = _both(attend, *tensors)
    _same(cpu, gpu, "steel attention")


@dtypes
@pytest.mark.parametrize("bits,group_size", [(4, 64), (8, 32), (4, 128)])
@pytest.mark.parametrize("rows,transpose", [(1, True), (3, True), (40, True), (40, False)],
                         ids=["qmv1", "qmv3", "qmm_t", "qmm_n"])
def test_quantized_matmul(defined, dtype, bits, group_size, rows, transpose):
    """Every quantized family the function picks from (qmv_fast, qmv, qmm_t, qmm_n)."""
    n, k = 128, 256
    w = _data((n, k) if transpose else (k, n), dtype, 1)
    w_q, scales, biases = mlx.quantize(w, group_size, bits)   # along w's last dimension

    def product(x, w_q, scales, biases):
        return mlx.quantized_matmul(x, w_q, scales, biases, transpose=transpose, group_size=group_size, bits=bits)
    cpu, gpu, _ = _both(product, _data((rows, k), dtype), w_q, scales, biases)
    _same(cpu, gpu, "quantized_matmul")



@dtypes
@pytest.mark.parametrize("bits", [4, 8])
def test_quantize_and_dequantize_on_the_gpu(dtype, bits):
    """mlx.quantize and dequantize (torch code) run on cuda tensors, in MLX's layout, and
    the round trip is within a quantization step of each group (test_mlx_quantized.py says
    why a step), plus the storage type's rounding of the scale and bias."""
    w = _data((64, 256), dtype, 7).cuda()
    w_q, scales, biases = mlx.quantize(w, 64, bits)
    assert (w_q.device.type, w_q.dtype, tuple(w_q.shape)) == ("cuda", torch.uint32, (64, 256 * bits // 32))
    assert tuple(scales.shape) == tuple(biases.shape) == (64, 4) and scales.dtype == dtype
    back = mlx.dequantize(w_q, scales, biases, 64, bits)
    step = scales.float().abs().repeat_interleave(64, -1)
    bound = step * (1 + 1e-5) + 2 * torch.finfo(dtype).eps * (w.float().abs() + step)
    assert bool(((back.float() - w.float()).abs() <= bound).all())
