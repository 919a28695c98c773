"""The workloads ``bench --scenario`` times from a fresh process to their first result:
what a model's start-up asks of torch_metallib, many distinct MLX kernels each called for
the first time.

Each scenario is ``prepare(device) -> run``: ``prepare`` makes the inputs and weights with
torch alone (a model's weights come from disk; nothing here compiles), ``run()`` is the
timed work and returns the tensor whose values are the first result.
"""

__all__ = ["SCENARIOS", "DESCRIPTIONS"]

DIM, HEADS, KV_HEADS, HIDDEN, VOCAB = 256, 4, 2, 512, 1024
HEAD = DIM // HEADS  # 64: a head dimension both attention kernels have
PROMPT = 32          # > 8 queries: steel attention; a whole GEMM tile of rows: the aligned GEMM


def _weights(device: str) -> dict:
    import torch

    g = torch.Generator().manual_seed(0)
    shapes = {"wq": (DIM, HEADS * HEAD), "wk": (DIM, KV_HEADS * HEAD), "wv": (DIM, KV_HEADS * HEAD),
              "wo": (HEADS * HEAD, DIM), "w1": (DIM, HIDDEN), "w3": (DIM, HIDDEN), "w2": (HIDDEN, DIM)}
    p = {name: torch.randn(shape, generator=g) * DIM ** -0.5 for name, shape in shapes.items()}
    p["attention_norm"] = 1 + 0.1 * torch.randn(DIM, generator=g)
    p["ffn_norm"] = 1 + 0.1 * torch.randn(DIM, generator=g)
    p["norm"] = 1 + 0.1 * torch.randn(DIM, generator=g)
    p["head"] = torch.randn(VOCAB, DIM, generator=g) * DIM ** -0.5
    p["prompt"] = torch.randn(1, PROMPT, DIM, generator=g)
    p["token"] = torch.randn(1, 1, DIM, generator=g)
    return {name: tensor.to(device) for name, tensor in p.items()}


def _block(mlx, p, x, offset=0, cache=None):
    """One pre-norm LLaMA block (docs/guide/mlx.md): RMS norm, rope, grouped-query causal
    attention and the projections from MLX's kernels, SiLU from torch."""
    import torch
    import torch.nn.functional as F

    def linear(h, w):
        return mlx.matmul(h.reshape(-1, h.shape[-1]), w).view(*h.shape[:-1], w.shape[1])

    b, t, _ = x.shape
    h = mlx.rms_norm(x, p["attention_norm"], 1e-5)
    q = linear(h, p["wq"]).view(b, t, HEADS, HEAD).transpose(1, 2)
    k = linear(h, p["wk"]).view(b, t, KV_HEADS, HEAD).transpose(1, 2)
    v = linear(h, p["wv"]).view(b, t, KV_HEADS, HEAD).transpose(1, 2)
    q, k = mlx.rope(q, offset), mlx.rope(k, offset)
    if cache is not None:
        k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
    a = mlx.scaled_dot_product_attention(q, k, v, causal=True).transpose(1, 2).reshape(b, t, DIM)
    x = x + linear(a, p["wo"])
    h = mlx.rms_norm(x, p["ffn_norm"], 1e-5)
    return x + linear(F.silu(linear(h, p["w1"])) * linear(h, p["w3"]), p["w2"]), (k, v)


def llama_block(device: str):
    """The prompt through one block (steel attention, aligned GEMMs), one decoding step
    (sdpa_vector, one-row GEMMs), then the final norm, a 4-bit quantized output head and
    the softmax over the vocabulary: the next token's probabilities."""
    from torch_metallib import mlx

    p = _weights(device)
    p["head"] = mlx.quantize(p["head"], group_size=64, bits=4)  # torch code: compiles nothing

    def run():
        _, cache = _block(mlx, p, p["prompt"])
        y, _ = _block(mlx, p, p["token"], offset=PROMPT, cache=cache)
        h = mlx.rms_norm(y[:, -1], p["norm"], 1e-5)
        return mlx.softmax(mlx.quantized_matmul(h, *p["head"]))

    return run


def llama_norms(device: str):
    """The block's row kernels alone (RMS norm, rope, softmax): three small kernels, quick
    to compile, for checking the measurement itself."""
    from torch_metallib import mlx

    p = _weights(device)

    def run():
        h = mlx.rms_norm(p["prompt"], p["attention_norm"], 1e-5)
        q = mlx.rope(h.view(1, PROMPT, HEADS, HEAD).transpose(1, 2))
        return mlx.softmax(q)

    return run


SCENARIOS = {"llama-block": llama_block, "llama-norms": llama_norms}
DESCRIPTIONS = {name: " ".join(function.__doc__.split()) for name, function in SCENARIOS.items()}
