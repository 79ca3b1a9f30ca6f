"""The models ``rlkernel validate`` runs: named random configurations, checkpoints, and their hashes.

A random model is a function of (configuration, seed) only: every tensor is drawn on the CPU
from one ``torch.Generator`` in a fixed order (Hugging Face names, transformers' order) and cast
to the model dtype with round-to-nearest-even, so a CPU run and a GPU run of the same
configuration and seed hold the same weights (and :func:`model_sha256` says so).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import torch

from rlkernel.model import Qwen3Config, Qwen3ForCausalLM, load_checkpoint, state_dict_hf

__all__ = ["CONFIGS", "build_model", "config_sha256", "hf_shapes", "model_sha256", "random_model",
           "random_weights"]

#: Named random configurations: config.json fields plus ``init_std`` (std of the weight matrices).
CONFIGS: dict[str, dict[str, object]] = {
    # 2 layers, hidden 64, 4 query heads / 2 KV heads of 16, vocabulary 512: a CPU run in seconds.
    "tiny": {
        "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "max_position_embeddings": 4096, "tie_word_embeddings": False,
        "init_std": 0.2,
    },
    # Qwen3-0.6B's shapes (hidden 1024, 28 layers, GQA 16/8 of 128, SwiGLU 3072, tied 151936 vocabulary).
    "qwen3-0.6b": {
        "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "max_position_embeddings": 40960, "tie_word_embeddings": True,
        "init_std": 0.02,
    },
}

_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def hf_shapes(config: Qwen3Config) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Hugging Face Qwen3 checkpoint of ``config`` with its shape, in transformers' order."""
    h, i, d, v = config.hidden_size, config.intermediate_size, config.head_dim, config.vocab_size
    hq, hkv = config.num_attention_heads, config.num_key_value_heads
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
    for n in range(config.num_hidden_layers):
        p = f"model.layers.{n}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (hq * d, h),
            p + "self_attn.k_proj.weight": (hkv * d, h),
            p + "self_attn.v_proj.weight": (hkv * d, h),
            p + "self_attn.o_proj.weight": (h, hq * d),
            p + "self_attn.q_norm.weight": (d,),
            p + "self_attn.k_norm.weight": (d,),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        })
        if config.attention_bias:
            shapes.update({p + f"self_attn.{x}_proj.bias": s for x, s in
                           (("q", (hq * d,)), ("k", (hkv * d,)), ("v", (hkv * d,)), ("o", (h,)))})
    shapes["model.norm.weight"] = (h,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, h)
    return shapes


def random_weights(config: Qwen3Config, seed: int, std: float,
                   dtype: torch.dtype = torch.bfloat16) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)``: weights ``N(0, std)``, norm gains ``1 + N(0, 0.2)``, drawn in fp32 on the CPU.

    One generator seeded with ``seed`` draws every tensor in :func:`hf_shapes` order, then each is
    cast to ``dtype`` (round-to-nearest-even): the values depend on (config, seed, std, dtype) only.
    """
    g = torch.Generator().manual_seed(seed)
    for name, shape in hf_shapes(config).items():
        t = torch.randn(shape, generator=g, dtype=torch.float32)
        yield name, (1 + 0.2 * t if name.endswith("norm.weight") else std * t).to(dtype)


def random_model(name: str, seed: int, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str | None = None) -> Qwen3ForCausalLM:
    """A :class:`Qwen3ForCausalLM` of the named configuration (:data:`CONFIGS`) with random weights from ``seed``.

    Raises
    ------
    ValueError
        ``name`` is not in :data:`CONFIGS`.
    """
    if name not in CONFIGS:
        raise ValueError(f"validate: unknown config {name!r}; expected one of {sorted(CONFIGS)} or a checkpoint "
                         f"directory (--checkpoint DIR)")
    fields = dict(CONFIGS[name])
    std = float(fields.pop("init_std"))  # type: ignore[arg-type]
    config = Qwen3Config.from_dict({"model_type": "qwen3", **fields})
    model = Qwen3ForCausalLM(config, dtype=dtype, device=device)
    model.load_weights(random_weights(config, seed, std, dtype))
    return model.eval()


def build_model(config: str = "tiny", checkpoint: str | Path | None = None, seed: int = 0,
                dtype: torch.dtype = torch.bfloat16, device: torch.device | str | None = None) -> Qwen3ForCausalLM:
    """The model under validation: a checkpoint directory (read from disk only) or a random named config."""
    if checkpoint is not None:
        return load_checkpoint(checkpoint, dtype=dtype, device=device).eval()
    return random_model(config, seed, dtype, device)


def _bytes(t: torch.Tensor) -> bytes:
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes()


def model_sha256(model: Qwen3ForCausalLM) -> str:
    """SHA-256 over the weights: for each Hugging Face-named tensor, by name, ``name dtype shape`` then its bytes.

    Fused parameters are split back into their Hugging Face tensors (:func:`state_dict_hf`), so
    the hash of a model equals the hash of the checkpoint it was loaded from, whatever the
    fusing. A tied LM head is counted once (as the embedding). Bytes are the tensors' native
    little-endian storage in the model dtype: the same weights in another dtype hash differently.
    """
    h = hashlib.sha256()
    for name, tensor in sorted(state_dict_hf(model), key=lambda item: item[0]):
        dtype = _DTYPE_NAMES.get(tensor.dtype, str(tensor.dtype))
        h.update(f"{name}\0{dtype}\0{list(tensor.shape)}\0".encode())
        h.update(_bytes(tensor))
    return h.hexdigest()


def config_sha256(config: Qwen3Config) -> str:
    """SHA-256 of the architecture fields (``json.dumps(..., sort_keys=True)``), without ``extra``.

    Only what changes the computation is hashed: keys that :class:`Qwen3Config` keeps in
    ``extra`` (``torch_dtype``, ``transformers_version``, token ids) do not.
    """
    fields = {k: v for k, v in asdict(config).items() if k != "extra"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
