"""``rlkernel.ops.sample``: bitwise-reproducible next-token sampling (contract ``sample`` v1)."""

from __future__ import annotations

import numbers

import numpy as np
import torch

from rlkernel import _validate as v
from rlkernel import dispatch

#: Largest vocabulary: the exact top-p arithmetic needs V * 2**40 * 2**24 / 2**24 < 2**63.
MAX_VOCAB = 1 << 18


def _per_row(op: str, name: str, value: object, b: int, device: torch.device, dtype: torch.dtype,
             kind: str) -> torch.Tensor:
    """A [B] tensor of ``dtype`` from a tensor (checked) or a Python scalar (broadcast)."""
    if isinstance(value, torch.Tensor):
        # a position may be int32 like any id; a seed is a 64-bit pattern, so it must be int64
        v.dtype(op, name, value, (dtype, torch.int32) if name == "position" else (dtype,))
        if tuple(value.shape) != (b,):
            raise ValueError(f"{op}: {name} has shape {tuple(value.shape)}; expected [B] = [{b}] (one value per "
                             f"row of logits) or a Python {kind} for every row")
        if value.device != device:
            raise ValueError(f"{op}: {name} is on {value.device} but logits is on {device}; move all inputs to "
                             f"one device")
        return v.contiguous(value.to(dtype))
    if isinstance(value, bool) or not isinstance(value, numbers.Integral if dtype == torch.int64 else numbers.Real):
        raise TypeError(f"{op}: {name} must be a {str(dtype).replace('torch.', '')} tensor [B] or a Python {kind}, "
                        f"got {type(value).__name__}")
    if dtype == torch.int64:
        return torch.full((b,), int(value), dtype=dtype, device=device)  # type: ignore[call-overload]
    number = float(value)  # rounded once to fp32 (RNE) by torch.full
    if number > 0 and float(torch.tensor(number, dtype=torch.float32)) == 0:
        raise ValueError(f"{op}: {name} = {number!r} rounds to 0 in fp32; pass 0 explicitly or a value >= 1.4e-45")
    return torch.full((b,), number, dtype=dtype, device=device)


#: per parameter: the condition a valid value meets, as the text of the error
_EXPECTED = {"temperature": "a finite value >= 0 (0 = greedy)", "top_k": "an integer >= 0 (0 = off)",
             "top_p": "a value >= 0 (>= 1 = off)", "position": "a token position >= 0"}


def _check_scalar(op: str, name: str, value: object) -> None:
    """A Python scalar parameter checked on the host (no device work)."""
    number = float(value)  # type: ignore[arg-type]
    if not (number >= 0) or (name == "temperature" and number == float("inf")):
        raise ValueError(f"{op}: {name} = {value!r}; expected {_EXPECTED[name]}")


def _check_tensors(op: str, tensors: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The value checks of the tensor parameters with one device op and one host read; returns
    the values read (``name -> [B] array``).

    The bytes of every value ([B] each, contiguous; fp32 first, then int64) are concatenated on
    the device and copied to the host in one read: two device ops whatever the number of
    parameters (B 1 eager sampling is host-bound, ~10 us a device op). On the host every valid
    value is >= 0 (a NaN minimum fails) and a temperature is also below +inf; the per-parameter
    messages run only when something is wrong.
    """
    order = sorted(tensors, key=lambda name: tensors[name].dtype != torch.float32)  # stable: fp32 first
    # values only (detached: a temperature may require grad), as bytes: one cat for mixed dtypes
    raw = torch.cat([(t.detach() if (t := tensors[name]).requires_grad else t).view(torch.uint8)
                     for name in order]).cpu().numpy()
    host: dict[str, np.ndarray] = {}
    at = floats = 0
    for name in order:
        size = tensors[name].numel() * tensors[name].element_size()
        host[name] = raw[at:at + size].view(np.float32 if tensors[name].dtype == torch.float32 else np.int64)
        at += size
        if tensors[name].dtype == torch.float32:
            floats = at  # fp32 come first: their bytes end here
    fv, iv = raw[:floats].view(np.float32), raw[floats:].view(np.int64)
    if ((not fv.size or fv.min() >= 0) and (not iv.size or iv.min() >= 0)
            and ("temperature" not in host or host["temperature"].max() < np.inf)):
        return host
    for name in order:  # the first bad value, for the message
        values = host[name]
        good = np.asarray(values >= 0)  # NaN fails (top_p)
        if name == "temperature":
            good &= np.isfinite(values)
        if not good.all():
            first = int(np.argmin(good))
            raise ValueError(f"{op}: {name}[{first}] = {values[first].item()!r}; expected {_EXPECTED[name]}")
    return host


def _any_filtered(top_k: torch.Tensor | int, top_p: torch.Tensor | float, host: dict[str, np.ndarray],
                  vocab: int) -> bool:
    """Whether a row may have top-k (0 < k < V) or top-p (p < 1) on, from the Python scalars and the
    tensor values read by :func:`_check_tensors`; True when a tensor was not read (CUDA-graph
    capture). The backends take it as a launch hint only: a filtered row gets its exact token
    either way."""
    if isinstance(top_k, torch.Tensor):
        k = host.get("top_k")
        if k is None or bool(((k > 0) & (k < vocab)).any()):
            return True
    elif 0 < int(top_k) < vocab:
        return True
    if isinstance(top_p, torch.Tensor):
        p = host.get("top_p")
        return p is None or bool((p < 1).any())
    return float(top_p) < 1


def sample(logits: torch.Tensor, temperature: torch.Tensor | float, top_k: torch.Tensor | int,
           top_p: torch.Tensor | float, seed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """Sample one token per row: ``argmax_j (logits_j / T + g_j)`` over the top-k / top-p set.

    Greedy (``argmax logits``) where the temperature is 0. Otherwise Gumbel-max sampling
    from ``softmax(logits / T)`` restricted to the top-k tokens and, inside those, the
    smallest prefix (by probability) whose mass reaches ``top_p``; the noise is a function
    of (seed, position, token id) only, so a request gets the same token on every backend
    and in every batch.

    Parameters
    ----------
    logits : Tensor, float32 (bfloat16/float16 are upcast exactly), [B, V], V <= 2**18
    temperature : Tensor, float32, [B], or a Python float for every row
        >= 0 and finite; 0 = greedy (top_k and top_p are then ignored).
    top_k : Tensor, int64, [B], or a Python int
        >= 0; 0 (or >= V) = off.
    top_p : Tensor, float32, [B], or a Python float
        >= 0; >= 1 = off; 0 keeps only the most likely token.
    seed : Tensor, int64, [B]
        Per-request seed, read as a uint64 bit pattern (any int64 value).
    position : Tensor, int64 or int32, [B]
        Position of the token being drawn (>= 0): each position gets fresh noise.

    Returns
    -------
    Tensor, int64, [B]
        Token ids: not differentiable; computed without grad even when logits require grad.

    Raises
    ------
    TypeError
        A wrong dtype, or a parameter neither a tensor nor a Python number.
    ValueError
        Wrong shapes, mixed devices, V = 0 or V > 2**18, a negative or non-finite temperature
        (or a positive one that rounds to 0 in fp32), a negative top_k, a negative or NaN
        top_p, a negative position.

    Bitwise semantics
    -----------------
    Per row: ``z = logits ÷ T`` (IEEE fp32). A NaN in z gives its first index, else a +inf
    gives its first index, else all -inf gives 0. Rank by ``(-z, index)`` (-0 equals +0).
    Top-k keeps rank < k. Top-p: ``q_j = RNE(exp_c(z_j - max z) * 2**40)`` (int64),
    ``cum_before_j`` the exact sum of q over survivors ranked before j, ``P =
    floor(total * RNE(top_p * 2**24) / 2**24)`` in exact int64; keep rank 0 and every survivor
    with ``cum_before_j < P``. Noise: Philox4x32-10, key ``(seed lo, seed hi)``, counter
    ``(j >> 2, position lo, position hi, 0)``, word ``j & 3``; ``u = (2 (r >> 9) + 1) 2**-24``;
    ``g = -log_c(-log_c(u))``; token = R5 argmax of ``z_j + g_j`` over the kept set (ties to
    the lower index). Invariances: batch, permutation, repeat. Contract ``sample`` v1
    (``rlkernel.contracts.sample``).
    """
    op = "sample"
    v.tensor(op, "logits", logits)
    v.dtype(op, "logits", logits, v.FLOATS)
    v.ndim(op, "logits", logits, 2, "[B, V] (requests, vocabulary)")
    b, vocab = logits.shape
    if vocab < 1 or vocab > MAX_VOCAB:
        raise ValueError(f"{op}: logits has shape {tuple(logits.shape)}; expected 1 <= V <= {MAX_VOCAB} (2**18, "
                         f"the bound of the exact int64 top-p arithmetic). Sample from a vocabulary shard's "
                         f"candidates or reduce V")
    device = logits.device
    for name, t in (("seed", seed), ("position", position)):
        v.tensor(op, name, t)
    seed_t = _per_row(op, "seed", seed, b, device, torch.int64, "int")
    pos_t = _per_row(op, "position", position, b, device, torch.int64, "int")
    temp_t = _per_row(op, "temperature", temperature, b, device, torch.float32, "float")
    k_t = _per_row(op, "top_k", top_k, b, device, torch.int64, "int")
    p_t = _per_row(op, "top_p", top_p, b, device, torch.float32, "float")
    # Python scalars are checked on the host; the tensors' values with one host synchronisation (a
    # decode step pays it). A CUDA-graph capture cannot read them: the capturing caller vouches for
    # the values (rlkernel.rollout)
    given = {"temperature": (temperature, temp_t), "top_k": (top_k, k_t), "top_p": (top_p, p_t),
             "position": (position, pos_t)}
    for name, (value, _) in given.items():
        if not isinstance(value, torch.Tensor):
            _check_scalar(op, name, value)
    host: dict[str, np.ndarray] = {}
    if b and not v.capturing(device):
        host = _check_tensors(op, {name: t for name, (value, t) in given.items() if isinstance(value, torch.Tensor)})
    with torch.no_grad():  # integer token ids: nothing to differentiate, so inputs that require grad are fine
        return dispatch.call(op, device, logits=v.contiguous(logits), temperature=temp_t, top_k=k_t, top_p=p_t,
                             seed=seed_t, position=pos_t, filtered=_any_filtered(top_k, top_p, host, vocab))
