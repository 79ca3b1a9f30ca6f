"""Hugging Face checkpoint directories: load (lazily, shard by shard, TP-sliced) and save.

A checkpoint directory holds ``config.json`` and either one ``model.safetensors`` or several
``model-0000i-of-0000n.safetensors`` listed by ``model.safetensors.index.json`` (its
``weight_map``: tensor name -> file). Loading opens one file at a time with
``safetensors.safe_open`` and reads one tensor at a time; each goes through the
``weight_loader`` of the parameter it belongs to (nano-vllm's ``utils/loader.py``), which
copies this tensor-parallel rank's slice. Saving writes exactly that format (sharded above
``max_shard_size``), so ``transformers.AutoModelForCausalLM.from_pretrained`` reads it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from rlkernel.model.config import Qwen3Config
from rlkernel.model.qwen3 import Qwen3ForCausalLM

__all__ = ["checkpoint_files", "iter_checkpoint", "load_checkpoint", "load_weights", "save_checkpoint",
           "state_dict_hf"]

logger = logging.getLogger(__name__)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
#: Tensors some checkpoints carry that hold no weights (recomputed buffers).
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)
_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def checkpoint_files(path: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint directory, in the index's order (or the single file).

    Raises
    ------
    FileNotFoundError
        Neither ``model.safetensors.index.json`` nor ``model.safetensors`` exists, or the index
        names a file that does not.
    """
    root = Path(path)
    index = root / INDEX_FILE
    if index.exists():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        files = [root / name for name in dict.fromkeys(weight_map.values())]
        missing = [str(f) for f in files if not f.exists()]
        if missing:
            raise FileNotFoundError(f"{index} names shard files that do not exist: {missing}")
        return files
    single = root / SINGLE_FILE
    if single.exists():
        return [single]
    raise FileNotFoundError(f"{root}: no {INDEX_FILE} and no {SINGLE_FILE}; expected a Hugging Face checkpoint "
                            f"directory saved with safetensors (save_pretrained(..., safe_serialization=True))")


def iter_checkpoint(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` of every tensor, opening one shard file at a time (CPU tensors)."""
    for file in checkpoint_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def _target(model: Qwen3ForCausalLM, name: str) -> tuple[str, str | int | None]:
    """The parameter name and shard id that the Hugging Face tensor ``name`` loads into."""
    for hf, (fused, shard_id) in model.packed_modules_mapping.items():
        if f".{hf}." in name:
            return name.replace(f".{hf}.", f".{fused}."), shard_id
    return name, None


def load_weights(model: Qwen3ForCausalLM, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Load Hugging Face-named tensors into ``model`` through each parameter's ``weight_loader``.

    Parameters
    ----------
    model : Qwen3ForCausalLM
    weights : iterable of (str, Tensor)
        Whole checkpoint tensors (any float dtype: cast to the model's with round-to-nearest-
        even) named as in Hugging Face (``model.layers.0.self_attn.q_proj.weight``).

    Raises
    ------
    ValueError
        A tensor name the model does not have, a tensor of the wrong shape, or, at the end,
        parameters that no tensor filled (names listed). With tied embeddings a
        ``lm_head.weight`` in the checkpoint is ignored (transformers does the same).
    """
    params = dict(model.named_parameters())
    loaded: set[tuple[str, str | int | None]] = set()
    unexpected: list[str] = []
    tied = model.config.tie_word_embeddings
    for name, tensor in weights:
        if name.endswith(_IGNORED_SUFFIXES) or (tied and name == "lm_head.weight"):
            continue
        target, shard_id = _target(model, name)
        param = params.get(target)
        if param is None:
            unexpected.append(name)
            continue
        loader = param.weight_loader  # type: ignore[attr-defined]
        try:
            if shard_id is None:
                loader(param, tensor)
            else:
                loader(param, tensor, shard_id)
        except ValueError as exc:
            raise ValueError(f"load_weights: {name}: {exc}") from exc
        loaded.add((target, shard_id))
    if unexpected:
        raise ValueError(f"load_weights: the checkpoint has tensors this Qwen3 model does not: {unexpected[:8]}"
                         f"{' ...' if len(unexpected) > 8 else ''} ({len(unexpected)} in all); is it a Qwen3 dense "
                         f"checkpoint matching config.json?")
    missing = [_hf_name(model, p, s) for p, param in params.items() for s in param.shard_ids  # type: ignore[attr-defined]
               if (p, s) not in loaded]
    if missing:
        raise ValueError(f"load_weights: no tensor for {missing[:8]}{' ...' if len(missing) > 8 else ''} "
                         f"({len(missing)} in all); the checkpoint is incomplete (or tie_word_embeddings in "
                         f"config.json is wrong)")


def load_checkpoint(path: str | Path, group: object = None, dtype: torch.dtype = torch.bfloat16,
                    device: torch.device | str | None = None) -> Qwen3ForCausalLM:
    """Build a :class:`Qwen3ForCausalLM` from a checkpoint directory's config.json and load its weights.

    Parameters
    ----------
    path : str or Path
        Directory with config.json and safetensors file(s). Read from disk only.
    group : ProcessGroup, optional
        Tensor-parallel group: each rank reads only what it needs into its shards.
    dtype : torch.dtype
        bfloat16 (default) or float16; checkpoint tensors are cast with round-to-nearest-even.
    device : torch.device or str, optional
    """
    model = Qwen3ForCausalLM(Qwen3Config.from_json(path), group, dtype, device)
    load_weights(model, iter_checkpoint(path))
    logger.info("rlkernel: loaded %s (tp rank %d of %d, %s)", path, model.tp_rank, model.tp_size, dtype)
    return model


def _hf_name(model: Qwen3ForCausalLM, param_name: str, shard_id: str | int | None) -> str:
    if shard_id is None:
        return param_name
    for hf, (fused, sid) in model.packed_modules_mapping.items():
        if sid == shard_id and f".{fused}." in param_name:
            return param_name.replace(f".{fused}.", f".{hf}.")
    raise KeyError(f"no Hugging Face name for {param_name} shard {shard_id!r}")


def state_dict_hf(model: Qwen3ForCausalLM) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield the model's weights as whole Hugging Face-named tensors (fused ones split again).

    Under tensor parallelism every rank must iterate it (each tensor is an all-gather); every
    rank gets every whole tensor.
    """
    for name, param in model.named_parameters():
        for shard_id, tensor in param.weight_gatherer(param).items():  # type: ignore[attr-defined]
            yield _hf_name(model, name, shard_id), tensor


def save_checkpoint(model: Qwen3ForCausalLM, path: str | Path, max_shard_size: int = 5 * 2**30) -> list[Path]:
    """Write ``model`` as a Hugging Face checkpoint directory (config.json + safetensors).

    Parameters
    ----------
    model : Qwen3ForCausalLM
        Under tensor parallelism call this on every rank (the shards are gathered); rank 0
        writes.
    path : str or Path
        Directory (created if needed).
    max_shard_size : int
        Bytes per safetensors file; above it the weights are split into
        ``model-0000i-of-0000n.safetensors`` files with ``model.safetensors.index.json``
        (transformers' layout). Default 5 GiB.

    Returns
    -------
    list of Path: the files written (empty on ranks other than 0).
    """
    if isinstance(max_shard_size, bool) or not isinstance(max_shard_size, int) or max_shard_size < 1:
        raise ValueError(f"save_checkpoint: max_shard_size = {max_shard_size!r}; expected a byte count >= 1")
    root = Path(path)
    writer = model.tp_rank == 0
    shards: list[dict[str, torch.Tensor]] = [{}]
    sizes = [0]
    for name, tensor in state_dict_hf(model):
        if not writer:
            continue
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and sizes[-1] + nbytes > max_shard_size:
            shards.append({})
            sizes.append(0)
        shards[-1][name] = tensor.detach().to("cpu").contiguous().clone()
        sizes[-1] += nbytes
    if not writer:
        return []
    root.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    config["dtype"] = config["torch_dtype"] = _DTYPES[model.dtype]  # transformers 5 and 4 spellings
    (root / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    metadata = {"format": "pt"}
    written = [root / "config.json"]
    if len(shards) == 1:
        save_file(shards[0], str(root / SINGLE_FILE), metadata=metadata)
        return [*written, root / SINGLE_FILE]
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(root / file), metadata=metadata)
        weight_map.update(dict.fromkeys(shard, file))
        written.append(root / file)
    index = {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}
    (root / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return [*written, root / INDEX_FILE]
