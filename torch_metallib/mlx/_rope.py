"""Rotary position embedding (rope.metal: rope_{dtype}), as MLX's ``fast.rope`` launches it.

MLX's conventions, handled here: the kernel takes log2(base), not base (it computes each
pair's frequency as exp2(-(i / (D/2)) * log2_base)); one thread rotates one pair of one
position for four heads, so the grid is (D/2, T, B * ceil(H/4)); positions start at a
per-batch offset (an int32 array with its stride); ``traditional`` rotates adjacent pairs
(x[2i], x[2i+1]), otherwise the two halves (x[i], x[i + D/2]). The function constant
``forward`` = False rotates the other way, which is the backward.

The kernel reads its input and output strides as arrays (``constant long (&)[3]``): the
(head, token, element) strides of the contiguous input and output, bound as a tuple of rules.
"""

from .. import ops
from ._launch import FLOATS

__all__ = ["define_rope"]

HEADS_PER_THREAD = 4


def define_rope(lib, ns: str) -> dict:
    size = ops.size
    strides = (size("x", 2) * size("x", 3), size("x", 3), 1)   # contiguous (B, H, T, D)

    def setup_context(ctx, inputs, output):
        _x, offset, scale, log2_base, traditional, forward = inputs
        ctx.save_for_backward(offset)
        ctx.arguments = (scale, log2_base, traditional, forward)

    def backward(ctx, grad):
        (offset,) = ctx.saved_tensors
        scale, log2_base, traditional, forward = ctx.arguments
        gx = rope(grad.contiguous(), offset, scale, log2_base, traditional, not forward)
        return gx, None, None, None, None, None

    rope = ops.define(
        f"{ns}::rope(Tensor x, Tensor offset, float scale, float log2_base, bool traditional, "
        f"bool forward) -> Tensor", lib, "rope_{dtype}", dtypes=FLOATS,
        bind={"in": "x", "strides": strides, "out_strides": strides, "offset_stride": 1, "n_head": size("x", 1),
              "base": "log2_base"},
        outputs={"out": ops.like("x")},
        constants={"forward": "forward", "traditional": "traditional", "hs_transpose": False},
        threads=(size("x", 3) // 2, size("x", 2), size("x", 0) * ops.cdiv(size("x", 1), HEADS_PER_THREAD)),
        require=[ops.dim("x") == 4, size("x", 3) % 2 == 0, size("x", 3) >= 2, ops.numel("x") < 2 ** 31,
                 ops.dim("offset") == 1, size("offset", 0) == size("x", 0)],
        backward=backward, setup_context=setup_context)
    return {"rope": rope}
