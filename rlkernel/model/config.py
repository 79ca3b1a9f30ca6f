"""Qwen3 dense configuration, read from (and written back to) a Hugging Face ``config.json``."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = ["Qwen3Config"]

#: Keys this dataclass reads; the rest of config.json is kept in ``extra`` and written back.
_READ = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
         "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_parameters", "rope_scaling",
         "tie_word_embeddings", "max_position_embeddings", "attention_bias", "hidden_act", "use_sliding_window",
         "model_type"}


@dataclass(frozen=True)
class Qwen3Config:
    """The Qwen3 dense architecture's sizes (Hugging Face ``Qwen3Config`` field names and defaults).

    Attributes
    ----------
    vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads : int
    num_key_value_heads : int
        KV heads (GQA); defaults to ``num_attention_heads`` in config.json.
    head_dim : int
        Defaults to ``hidden_size // num_attention_heads`` in config.json (Qwen3 sets it: 128).
    rms_norm_eps : float
    rope_theta : float
        Read from ``rope_theta`` (transformers 4) or ``rope_parameters["rope_theta"]`` (5).
    tie_word_embeddings : bool
        The LM head shares the embedding table.
    max_position_embeddings : int
    attention_bias : bool
        Bias on q/k/v/o (False for Qwen3).
    extra : dict
        Every other key of config.json, written back unchanged by :meth:`to_dict`.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    attention_bias: bool = False
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.type == "int":
                value = getattr(self, f.name)
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"Qwen3Config: {f.name} = {value!r}; expected an int >= 1")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"Qwen3Config: num_attention_heads = {self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads = {self.num_key_value_heads}; grouped-query attention needs "
                             f"each KV head to serve the same number of query heads")
        if self.head_dim % 2:
            raise ValueError(f"Qwen3Config: head_dim = {self.head_dim}; expected an even value (rotate-half RoPE)")
        for name in ("rms_norm_eps", "rope_theta"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0 or (name == "rope_theta" and value == 0):
                raise ValueError(f"Qwen3Config: {name} = {value!r}; expected a finite positive value")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Qwen3Config:
        """Parse a config.json dictionary; unsupported variants raise with the reason.

        Raises
        ------
        ValueError
            Not a Qwen3 dense config (``model_type``), an activation other than SiLU, RoPE
            scaling (YaRN, linear, dynamic: the ``rope`` contract has plain RoPE only), sliding
            window attention, or missing sizes.
        """
        model_type = d.get("model_type", "qwen3")
        if model_type != "qwen3":
            raise ValueError(f"Qwen3Config: model_type = {model_type!r}; expected 'qwen3' (the Qwen3 dense family; "
                             f"MoE and other architectures are not implemented)")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"Qwen3Config: hidden_act = {d['hidden_act']!r}; expected 'silu' (SwiGLU)")
        if d.get("use_sliding_window"):
            raise ValueError("Qwen3Config: use_sliding_window is true; sliding-window attention is not implemented "
                             "(the attention contract is full causal attention)")
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"Qwen3Config: rope type {rope_type!r} ({rope}); only plain RoPE ('default') is "
                             f"implemented by the rope contract. Remove rope_scaling to run at the native context")
        theta = d.get("rope_theta", rope.get("rope_theta", 10000.0))
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if k not in d]
        if missing:
            raise ValueError(f"Qwen3Config: config.json lacks {missing}; expected a Hugging Face Qwen3 config")
        heads = d["num_attention_heads"]
        return cls(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"], num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)), rope_theta=float(theta),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            max_position_embeddings=d.get("max_position_embeddings", 32768),
            attention_bias=bool(d.get("attention_bias", False)),
            extra={k: v for k, v in d.items() if k not in _READ},
        )

    @classmethod
    def from_json(cls, path: str | Path) -> Qwen3Config:
        """Read ``path`` (a config.json, or a checkpoint directory holding one)."""
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        if not p.exists():
            raise FileNotFoundError(f"Qwen3Config: {p} does not exist; expected a Hugging Face checkpoint directory "
                                    f"with config.json")
        return cls.from_dict(json.loads(p.read_text()))

    def to_dict(self) -> dict[str, Any]:
        """config.json contents that transformers' ``Qwen3Config`` (4.x and 5.x) reads back."""
        d = {k: v for k, v in asdict(self).items() if k != "extra"}
        out: dict[str, Any] = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
                               "use_sliding_window": False, **self.extra, **d}
        out["rope_scaling"] = None
        return out
