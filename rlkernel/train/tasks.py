"""Synthetic verifiable tasks for GRPO that need no download, and a portable weight init.

:class:`ReverseDigits`: the prompt is a short digit sequence followed by a separator; the
completion should be the digits reversed, then the end-of-sequence token. The reward is the
fraction of the target's positions the completion gets right (1.0 for an exact answer), so a
random policy already sees graded rewards and GRPO's group advantages are informative.

:func:`init_weights_` fills a model's parameters from a counter-based hash of (parameter
name, element index): integer arithmetic on the CPU, the same bits on every machine and torch
version (``torch.randn`` streams are not promised to stay the same across versions), then
copied to the parameters' device.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlkernel.model.loader import state_dict_hf
from rlkernel.model.qwen3 import Qwen3ForCausalLM

__all__ = ["ReverseDigits", "init_weights_", "task_config"]

_MASK32 = (1 << 32) - 1


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for x, c in [0, 2**32), without int64 overflow (16-bit halves)."""
    lo, hi = x & 0xFFFF, x >> 16
    return ((lo * c) + (((hi * c) & 0xFFFF) << 16)) & _MASK32


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser (a bijection of [0, 2**32))."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def _uniform(name: str, seed: int, numel: int) -> torch.Tensor:
    """float32 values ``(k - 2**23) / 2**23`` in [-1, 1), k a 24-bit hash of (seed, name, index)."""
    key = (zlib.crc32(name.encode()) ^ _mix_seed(seed)) & _MASK32
    idx = torch.arange(numel, dtype=torch.int64)
    x = _fmix32(((idx & _MASK32) ^ key) & _MASK32)
    x = _fmix32(x ^ ((idx >> 32) + 0x9E3779B9 & _MASK32))
    k = (x >> 8).to(torch.float32)  # 24 bits: exact in fp32
    return (k - 8388608.0) * (1.0 / 8388608.0)  # exact: a power-of-two scale


def _mix_seed(seed: int) -> int:
    return int(_fmix32(torch.tensor([seed & _MASK32], dtype=torch.int64))[0])


@torch.no_grad()
def init_weights_(model: Qwen3ForCausalLM, seed: int = 0, std: float = 0.02) -> Qwen3ForCausalLM:
    """Fill every weight deterministically: norm gains 1, other weights uniform with std ``std``.

    ``w = RN_dtype(RN32(u * RN32(std * sqrt(3))))``, ``u`` in [-1, 1) on a 2**-23 grid from a hash
    of (seed, Hugging Face tensor name, index in the whole tensor), loaded through the model's
    weight loaders: the same bits on every device, machine, torch version and tensor-parallel
    degree (under TP every rank calls it; the names and shapes are gathered).

    Parameters
    ----------
    model : Qwen3ForCausalLM
    seed : int
    std : float
        Standard deviation of the uniform weights.

    Returns
    -------
    The model.
    """
    amp = torch.tensor(std * 3.0 ** 0.5, dtype=torch.float64).to(torch.float32)
    weights = []
    for name, t in list(state_dict_hf(model)):
        if name.endswith("norm.weight"):
            w = torch.ones(t.shape, dtype=torch.float32)
        else:
            w = torch.mul(_uniform(name, seed, t.numel()).reshape(t.shape), amp)
        weights.append((name, w.to(t.dtype)))
    model.load_weights(weights)
    return model


#: Token ids of :class:`ReverseDigits`: 0 pad, 1 separator, 2 end of sequence, 3 + d for digit d.
PAD, SEP, EOS, DIGIT0 = 0, 1, 2, 3


def task_config(hidden_size: int = 64, num_layers: int = 2, vocab_size: int = 16) -> dict[str, object]:
    """A tiny Qwen3 config.json dict for :class:`ReverseDigits` (tied embeddings, as Qwen3-0.6B)."""
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
        "vocab_size": vocab_size, "hidden_size": hidden_size, "intermediate_size": hidden_size * 3 // 2,
        "num_hidden_layers": num_layers, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": hidden_size // 4, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "max_position_embeddings": 64, "tie_word_embeddings": True, "attention_bias": False,
        "torch_dtype": "bfloat16", "eos_token_id": EOS, "bos_token_id": SEP,
    }


@dataclass(frozen=True)
class ReverseDigits:
    """Reverse a digit sequence: ``d_1 .. d_k SEP`` -> ``d_k .. d_1 EOS``.

    Parameters
    ----------
    min_digits, max_digits : int
        Prompt length range (inclusive).
    seed : int
        Seeds the prompts (a hash of (seed, step, index)).
    """

    min_digits: int = 2
    max_digits: int = 4
    seed: int = 0

    def prompts(self, step: int, count: int) -> list[list[int]]:
        """``count`` prompts of step ``step``: token ids, the same on every machine."""
        out = []
        for i in range(count):
            h = _fmix32(torch.tensor([(self.seed * 1000003 + step * 7919 + i) & _MASK32], dtype=torch.int64))
            x = int(h[0])
            k = self.min_digits + x % (self.max_digits - self.min_digits + 1)
            digits = []
            for j in range(k):
                x = int(_fmix32(torch.tensor([x ^ (j + 1)], dtype=torch.int64))[0])
                digits.append(DIGIT0 + x % 10)
            out.append(digits + [SEP])
        return out

    @staticmethod
    def target(prompt: Sequence[int]) -> list[int]:
        """The right completion of ``prompt``."""
        return list(reversed(list(prompt[:-1]))) + [EOS]

    def reward(self, prompt: Sequence[int], completion: Sequence[int]) -> float:
        """Fraction of the target's positions the completion matches (1.0: exact, EOS included)."""
        target = self.target(prompt)
        hits = sum(1 for a, b in zip(completion, target) if a == b)
        return hits / len(target)

    def max_tokens(self) -> int:
        """Completion budget: the longest target."""
        return self.max_digits + 1
