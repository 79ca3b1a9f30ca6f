"""A recorded rollout: prompts, sampled completions, their log-probs, sampling parameters and model hashes.

File format (one ``.safetensors`` file, version 1; docs/validate.md)
--------------------------------------------------------------------
Tensors (CPU, little-endian):

=====================  =======  ===============  ==============================================
name                   dtype    shape            meaning
=====================  =======  ===============  ==============================================
``prompt_tokens``      int64    [sum P_i]        every prompt's token ids, concatenated
``prompt_offsets``     int64    [P + 1]          prompt ``i`` is ``prompt_tokens[o[i]:o[i+1]]``
``completion_tokens``  int64    [sum C_j]        every sampled completion, in output order
``completion_offsets`` int64    [N + 1]          completion ``j`` is ``completion_tokens[o[j]:o[j+1]]``
``logprobs``           float32  [sum C_j]        the rollout's log-prob of each completion token
``prompt_index``       int64    [N]              which prompt completion ``j`` continues
``sample_index``       int64    [N]              its index within the prompt's group (0 .. n-1)
=====================  =======  ===============  ==============================================

The safetensors header's ``__metadata__`` holds ``format = "pt"`` and ``rlkernel.validate``, a
JSON document: ``format`` (``"rlkernel-rollout-record"``), ``version`` (1), ``model_sha256`` and
``config_sha256`` (:mod:`rlkernel.validate.models`), ``config`` (the architecture fields),
``dtype``, ``sampling_params`` (one object per prompt: the :class:`SamplingParams` fields),
``seeds`` and ``finish_reasons`` (one per completion), ``logprobs_sha256``, ``engine`` (the
rollout engine's settings and statistics), ``device``, ``created``, ``commit`` and, from the CLI,
``model_source`` and ``command`` (how to rebuild the model for a replay).
"""

from __future__ import annotations

import datetime
import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from rlkernel.environment import git_commit

__all__ = ["FORMAT", "VERSION", "HashMismatch", "Record", "Sample", "load_record", "logprobs_sha256",
           "save_record", "tokens_sha256"]

FORMAT = "rlkernel-rollout-record"
VERSION = 1
_META_KEY = "rlkernel.validate"


class HashMismatch(ValueError):
    """A record was made with other weights or another configuration than the model it is checked against."""


@dataclass
class Sample:
    """One sampled completion of a recorded rollout.

    Attributes
    ----------
    prompt_index, sample_index : int
        The prompt it continues and its place in that prompt's group of ``n``.
    token_ids : list of int
        The completion (sampled tokens, a stop token included).
    logprobs : Tensor, float32, [len(token_ids)], CPU
        The rollout's log-prob of each completion token (temperature-scaled full distribution).
    finish_reason : str
        ``"stop"`` or ``"length"``.
    seed : int
        The sampling seed the engine used for it.
    """

    prompt_index: int
    sample_index: int
    token_ids: list[int]
    logprobs: torch.Tensor
    finish_reason: str
    seed: int


@dataclass
class Record:
    """A recorded rollout (see the module docstring for the file format).

    Attributes
    ----------
    prompts : list of list of int
    samples : list of Sample
        In the engine's output order (prompt 0's samples, then prompt 1's, ...).
    sampling_params : list of dict
        One per prompt: temperature, top_k, top_p, max_tokens, stop_token_ids, n, seed, ignore_eos.
    model_sha256, config_sha256 : str
    config : dict
        The architecture fields of :class:`~rlkernel.model.Qwen3Config`.
    dtype : str
        The model dtype (``"bfloat16"``, ``"float16"``).
    meta : dict
        Where and how it was made: ``engine`` (settings and statistics), ``device``, ``created``, ``commit``,
        ``model_source``, ``command``.
    """

    prompts: list[list[int]]
    samples: list[Sample]
    sampling_params: list[dict[str, Any]]
    model_sha256: str
    config_sha256: str
    config: dict[str, Any]
    dtype: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        """Completion tokens (the tokens with a rollout log-prob)."""
        return sum(len(s.token_ids) for s in self.samples)

    def temperature(self, sample: Sample) -> float:
        return float(self.sampling_params[sample.prompt_index]["temperature"])

    def sequences(self) -> list[list[int]]:
        """Each sample's whole sequence, prompt + completion."""
        return [self.prompts[s.prompt_index] + s.token_ids for s in self.samples]

    def logprobs_sha256(self) -> str:
        return logprobs_sha256([s.logprobs for s in self.samples])

    def tokens_sha256(self) -> str:
        return tokens_sha256([s.token_ids for s in self.samples])

    def check_model(self, model_hash: str, config_hash: str) -> None:
        """Raise :class:`HashMismatch` unless the record was made with this model and configuration."""
        wrong = [f"{what}: record {mine[:16]}..., model {theirs[:16]}..."
                 for what, mine, theirs in (("config_sha256", self.config_sha256, config_hash),
                                            ("model_sha256", self.model_sha256, model_hash)) if mine != theirs]
        if wrong:
            raise HashMismatch("validate: the record was made with another model; " + "; ".join(wrong) + ". Replay "
                               "it with the checkpoint, dtype (and for random configs, --config and --seed) it was "
                               "recorded with (its metadata has config, dtype and the command)")


def logprobs_sha256(logprobs: list[torch.Tensor]) -> str:
    """SHA-256 of the float32 log-probs, concatenated in order (little-endian bytes)."""
    h = hashlib.sha256()
    for t in logprobs:
        h.update(t.detach().to("cpu", torch.float32).contiguous().view(torch.int32).numpy().astype("<i4").tobytes())
    return h.hexdigest()


def tokens_sha256(tokens: list[list[int]]) -> str:
    """SHA-256 of the token ids (int64 little-endian), one sequence after another with its length first."""
    h = hashlib.sha256()
    for ids in tokens:
        h.update(torch.tensor([len(ids), *ids], dtype=torch.int64).numpy().astype("<i8").tobytes())
    return h.hexdigest()


def _offsets(lengths: list[int]) -> torch.Tensor:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int64)


def _cat(lists: list[list[int]]) -> torch.Tensor:
    return torch.tensor([t for ids in lists for t in ids], dtype=torch.int64)


def save_record(record: Record, path: str | Path) -> Path:
    """Write ``record`` to ``path`` (one safetensors file; format in the module docstring)."""
    samples = record.samples
    tensors = {
        "prompt_tokens": _cat(record.prompts),
        "prompt_offsets": _offsets([len(p) for p in record.prompts]),
        "completion_tokens": _cat([s.token_ids for s in samples]),
        "completion_offsets": _offsets([len(s.token_ids) for s in samples]),
        "logprobs": torch.cat([s.logprobs.to("cpu", torch.float32) for s in samples]) if samples
        else torch.zeros(0, dtype=torch.float32),
        "prompt_index": torch.tensor([s.prompt_index for s in samples], dtype=torch.int64),
        "sample_index": torch.tensor([s.sample_index for s in samples], dtype=torch.int64),
    }
    meta = {
        "format": FORMAT, "version": VERSION, "model_sha256": record.model_sha256,
        "config_sha256": record.config_sha256, "config": record.config, "dtype": record.dtype,
        "sampling_params": record.sampling_params, "seeds": [s.seed for s in samples],
        "finish_reasons": [s.finish_reason for s in samples], "logprobs_sha256": record.logprobs_sha256(),
        "tokens_sha256": record.tokens_sha256(), **record.meta,
    }
    meta.setdefault("created", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    meta.setdefault("commit", git_commit())
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"format": "pt", _META_KEY: json.dumps(meta)})
    return path


def load_record(path: str | Path) -> Record:
    """Read a record written by :func:`save_record`.

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    ValueError
        Not a record file (no ``rlkernel.validate`` metadata), another format version, or
        inconsistent tensors (offsets that do not match, a log-prob count other than the token
        count, a ``logprobs_sha256`` that the stored log-probs do not have).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"validate: record {path} does not exist")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            header = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except Exception as exc:  # safetensors raises its own error types for a file that is not safetensors
        raise ValueError(f"validate: {path} is not a safetensors file ({type(exc).__name__}: {exc})") from exc
    if _META_KEY not in header:
        raise ValueError(f"validate: {path} has no {_META_KEY!r} metadata; expected a record written by "
                         f"`rlkernel validate --record FILE` (rlkernel.validate.save_record)")
    meta = json.loads(header[_META_KEY])
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ValueError(f"validate: {path} is format {meta.get('format')!r} version {meta.get('version')!r}; this "
                         f"rlkernel reads {FORMAT!r} version {VERSION}")
    p_off = tensors["prompt_offsets"].tolist()
    c_off = tensors["completion_offsets"].tolist()
    prompt_tokens = tensors["prompt_tokens"].tolist()
    completion_tokens = tensors["completion_tokens"].tolist()
    logprobs = tensors["logprobs"]
    n = len(c_off) - 1
    if p_off[-1] != len(prompt_tokens) or c_off[-1] != len(completion_tokens) or \
            logprobs.shape[0] != len(completion_tokens) or len(meta["seeds"]) != n or \
            tensors["prompt_index"].shape[0] != n:
        raise ValueError(f"validate: {path} is inconsistent: offsets, tokens, log-probs and per-completion metadata "
                         f"do not match; the file is damaged")
    prompts = [prompt_tokens[p_off[i]:p_off[i + 1]] for i in range(len(p_off) - 1)]
    samples = [Sample(int(tensors["prompt_index"][j]), int(tensors["sample_index"][j]),
                      completion_tokens[c_off[j]:c_off[j + 1]], logprobs[c_off[j]:c_off[j + 1]].clone(),
                      meta["finish_reasons"][j], int(meta["seeds"][j])) for j in range(n)]
    known = {"format", "version", "model_sha256", "config_sha256", "config", "dtype", "sampling_params", "seeds",
             "finish_reasons", "logprobs_sha256", "tokens_sha256"}
    record = Record(prompts, samples, meta["sampling_params"], meta["model_sha256"], meta["config_sha256"],
                    meta["config"], meta["dtype"], {k: v for k, v in meta.items() if k not in known})
    if record.logprobs_sha256() != meta["logprobs_sha256"]:
        raise ValueError(f"validate: {path}: the stored log-probs do not hash to the recorded logprobs_sha256; "
                         f"the file is damaged")
    return record


def sampling_dict(params: Any) -> dict[str, Any]:
    """The fields of a ``SamplingParams`` (a dataclass, or any object with those attributes) as JSON values."""
    try:
        d = asdict(params)
    except TypeError:
        d = {k: getattr(params, k) for k in ("temperature", "top_k", "top_p", "max_tokens", "stop_token_ids", "n",
                                             "seed", "ignore_eos") if hasattr(params, k)}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}
