"""Public ``embedding``: the token-embedding row gather (contract ``embedding`` v1)."""

from __future__ import annotations

import torch

from rlkernel import _validate as v
from rlkernel import dispatch, grads

__all__ = ["embedding"]


class EmbeddingFunction(torch.autograd.Function):
    """Autograd for :func:`embedding`: ``dW[v] = RN32(exact sum of fp32(dY[t]) over the tokens t with id v)``.

    Each token's gradient row is one term of its id's row (:func:`rlkernel.grads.weight_grad`
    with the ids as the scatter index, contract ``exact_sum``): no floating-point addition, so
    the gradient is the same whatever the order, batch, micro-batching or repeats of tokens.
    """

    @staticmethod
    def forward(ctx, flat, weight):  # type: ignore[no-untyped-def,override]
        ctx.save_for_backward(flat)
        ctx.weight = weight
        return dispatch.call("embedding", weight.device, ids=flat, weight=weight.detach())

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def,override]
        (flat,) = ctx.saved_tensors
        return None, grads.weight_grad(ctx.weight, grad.to(torch.float32), index=flat)


def _range_error(op: str, ids: torch.Tensor, flat: torch.Tensor, i: int, vocab: int) -> ValueError:
    """The error for the id at flat index ``i`` of ``ids`` (outside ``[0, vocab)``)."""
    where = tuple(int(c) for c in torch.unravel_index(torch.tensor(i), ids.shape)) if ids.dim() else ()
    return ValueError(f"{op}: ids holds {int(flat[i])} at index {where}; expected 0 <= id < V = {vocab} "
                      f"(the number of rows of weight). Negative ids are not wrapped; check the tokenizer's "
                      f"vocabulary size against the embedding table")


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Gather rows of an embedding table, bit for bit.

    ``out[..., :] = weight[ids[...], :]``

    Parameters
    ----------
    ids : Tensor, int64 or int32, [*]
        Token ids in ``[0, V)``; any shape (0-d and empty included), any layout.
    weight : Tensor, float32, bfloat16 or float16, [V, H]

    Returns
    -------
    Tensor, weight.dtype, [*, H]

    Raises
    ------
    TypeError
        ids not int64/int32, weight not a float32/bfloat16/float16 tensor.
    ValueError
        weight not 2-D, or an id outside ``[0, V)`` (the message names the first one and V;
        negative ids are not wrapped).

    Bitwise semantics
    -----------------
    No arithmetic: each output row holds the bits of its weight row (-0, subnormals and
    infinities unchanged), every NaN replaced by the canonical NaN of the dtype (P8). Each row
    depends only on its own id: invariant to batch composition, order and repeats.

    Backward (weight only): ``dW[v]`` is the exact sum of the fp32 gradient rows of the tokens
    with id ``v``, rounded once (contract ``exact_sum``; torch's scatter-add uses float atomics
    whose order varies). With :class:`rlkernel.grads.ExactGradients` the rounding waits for the
    whole global batch.

    Contract: ``embedding``, version 1.
    """
    op = "embedding"
    ids = v.tensor(op, "ids", ids)
    weight = v.tensor(op, "weight", weight)
    v.dtype(op, "ids", ids, (torch.int64, torch.int32))
    v.dtype(op, "weight", weight, v.FLOATS)
    v.ndim(op, "weight", weight, 2, "[V, H] (vocabulary, hidden)")
    device = v.same_device(op, [("ids", ids), ("weight", weight)])
    vocab, hidden = weight.shape
    flat = ids.reshape(ids.numel())
    # Triton kernels check the ids themselves (no host sync); elsewhere the host checks them, except
    # under a CUDA-graph capture, which cannot read ids on the host
    in_kernel = getattr(dispatch.select(op, device).kernel(op), "checks_ids", False)
    if flat.numel() and not in_kernel and not v.capturing(device):
        bad = (flat < 0) | (flat >= vocab)
        if bool(bad.any()):
            raise _range_error(op, ids, flat, int(bad.nonzero()[0, 0]), vocab)
    flat = flat.to(torch.int64)  # kernels receive int64 ids
    try:
        if weight.requires_grad and torch.is_grad_enabled():
            out = EmbeddingFunction.apply(flat, weight)
        else:
            out = dispatch.call(op, device, ids=flat, weight=weight)
    except v.IdOutOfRange as exc:
        raise _range_error(op, ids, flat, exc.index, vocab) from None
    return out.reshape(*ids.shape, hidden)
