"""One ``rlkernel validate`` run: model, rollout(s), replays, layer check, baseline -> a report document.

The CLI (:func:`rlkernel.cli.cmd_validate`) parses flags into a :class:`ValidateConfig`, calls
:func:`run` with a progress display and writes the document with :mod:`rlkernel.validate.report`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from rlkernel.validate import models
from rlkernel.validate.generate import make_prompts, record_rollout
from rlkernel.validate.layers import compare_layers
from rlkernel.validate.record import Record, load_record, save_record
from rlkernel.validate.replay import replay

__all__ = ["DTYPES", "Progress", "Step", "ValidateConfig", "run"]

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class Step:
    """One finished stage of a run, as the progress display counts it (``op``/``case``, ``failed``)."""

    op: str
    case: str
    failed: bool
    detail: str = ""


class Progress(Protocol):
    """What :func:`run` reports to: ``rlkernel.conformance.progress.StreamProgress`` fits."""

    def start(self, total: int) -> None: ...

    def update(self, record: Step) -> None: ...

    def finish(self) -> None: ...


class _Silent:
    def start(self, total: int) -> None:
        pass

    def update(self, record: Step) -> None:
        pass

    def finish(self) -> None:
        pass


@dataclass
class ValidateConfig:
    """The settings of a run (the CLI flags; docs/validate.md).

    Attributes
    ----------
    config : str
        A named random configuration (:data:`rlkernel.validate.models.CONFIGS`), unless ``checkpoint``.
    checkpoint : str, optional
        A Hugging Face checkpoint directory (config.json + safetensors), read from disk.
    num_prompts, group_size : int
        Prompts, and completions per prompt (``SamplingParams.n``: a GRPO group).
    prompt_len : (int, int)
        Prompt lengths are uniform in ``[MIN, MAX]``.
    max_tokens : int
        Completion tokens per sample at most.
    temperature, top_k, top_p : float, int, float
    stop_token_ids : tuple of int
    seed : int
        Weights (random configs), prompts, sampling seeds (prompt ``i`` gets ``seed * 1_000_003 + i``),
        packing orders.
    device : str, optional
        Default: cuda when available, else cpu.
    dtype : str
        The model dtype: bfloat16 or float16.
    engine_batch : list of int
        The engine's ``max_num_seqs``; one rollout per value, each replayed (and all must agree).
    train_micro_batch : list of int
        Trainer micro-batch sizes (sequences per forward); each replay packs in a shuffled order.
    baseline : str
        ``transformers``, ``none`` or ``auto`` (transformers when it is installed).
    baseline_dtype : str, optional
        The transformers model's dtype (default: ``dtype``); float32 is allowed.
    layers : bool
        Run the layer-by-layer check on the first ``layers_sequences`` samples.
    record, replay : str, optional
        Write the (first) rollout to a record file; or replay a record instead of generating.
    save_checkpoint : str, optional
        Write the model as a Hugging Face checkpoint directory (random configs are written nowhere otherwise).
    block_size, enforce_eager, max_num_batched_tokens : engine settings.
    warmup : bool, optional
        Untimed warm-up before each timed stage (default: on any device but the CPU).
    """

    config: str = "tiny"
    checkpoint: str | None = None
    num_prompts: int = 8
    group_size: int = 4
    prompt_len: tuple[int, int] = (4, 24)
    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    seed: int = 0
    device: str | None = None
    dtype: str = "bfloat16"
    engine_batch: list[int] = field(default_factory=lambda: [8])
    train_micro_batch: list[int] = field(default_factory=lambda: [1, 3, 8])
    baseline: str = "auto"
    baseline_dtype: str | None = None
    layers: bool = False
    layers_sequences: int = 4
    record: str | None = None
    replay: str | None = None
    save_checkpoint: str | None = None
    block_size: int = 16
    enforce_eager: bool = False
    max_num_batched_tokens: int = 2048
    warmup: bool | None = None

    def check(self) -> None:
        """Raise ``ValueError`` for settings that cannot run (with the flag to fix)."""
        ints = {"--num-prompts": self.num_prompts, "--group-size": self.group_size, "--max-tokens": self.max_tokens,
                "--layers-sequences": self.layers_sequences, "--block-size": self.block_size}
        for flag, value in ints.items():
            if value < 1:
                raise ValueError(f"validate: {flag} = {value}; expected an int >= 1")
        for flag, values in (("--engine-batch", self.engine_batch), ("--train-micro-batch", self.train_micro_batch)):
            if not values or any(v < 1 for v in values):
                raise ValueError(f"validate: {flag} = {values}; expected one or more ints >= 1")
        lo, hi = self.prompt_len
        if not 1 <= lo <= hi:
            raise ValueError(f"validate: --prompt-len {lo}:{hi}; expected MIN:MAX with 1 <= MIN <= MAX")
        if self.dtype not in ("bfloat16", "float16"):
            raise ValueError(f"validate: --dtype {self.dtype}; rlkernel's model runs bfloat16 or float16")
        if self.baseline_dtype is not None and self.baseline_dtype not in DTYPES:
            raise ValueError(f"validate: --baseline-dtype {self.baseline_dtype}; expected one of {sorted(DTYPES)}")
        if self.baseline not in ("transformers", "none", "auto"):
            raise ValueError(f"validate: --baseline {self.baseline}; expected transformers, none or auto")
        if self.record and self.replay:
            raise ValueError("validate: --record and --replay together; a replay generates nothing to record")


def _device(name: str | None) -> torch.device:
    return torch.device(name) if name else torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _sampling(cfg: ValidateConfig, prompts: int) -> list[Any]:
    from rlkernel.rollout import SamplingParams

    return [SamplingParams(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, max_tokens=cfg.max_tokens,
                           stop_token_ids=tuple(cfg.stop_token_ids), n=cfg.group_size, seed=cfg.seed * 1_000_003 + i)
            for i in range(prompts)]


def _baseline_wanted(cfg: ValidateConfig) -> bool:
    if cfg.baseline == "none":
        return False
    if cfg.baseline == "transformers":
        from rlkernel.validate.baseline import _transformers

        _transformers()  # raises ImportError with the install hint
        return True
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def run(cfg: ValidateConfig, progress: Progress | None = None, command: list[str] | None = None) -> dict[str, Any]:
    """Run every stage ``cfg`` asks for and return the report document (:mod:`rlkernel.validate.report`).

    Raises
    ------
    ValueError
        Bad settings, or (:class:`~rlkernel.validate.record.HashMismatch`) a replayed record made
        with another model.
    ImportError
        ``baseline="transformers"`` without transformers installed.
    """
    cfg.check()
    progress = progress or _Silent()
    device = _device(cfg.device)
    dtype = DTYPES[cfg.dtype]
    warmup = cfg.warmup if cfg.warmup is not None else device.type != "cpu"
    baseline = _baseline_wanted(cfg)
    record_in = load_record(cfg.replay) if cfg.replay else None
    rollouts = 0 if record_in is not None else len(cfg.engine_batch)
    total = 1 + max(rollouts, 1) * len(cfg.train_micro_batch) + rollouts + int(cfg.layers) + int(baseline)
    progress.start(total)

    def step(op: str, case: str, failed: bool, detail: str) -> None:
        progress.update(Step(op, case, failed, detail))

    doc: dict[str, Any] = {"settings": asdict(cfg), "device": str(device), "command": command}
    with torch.no_grad():
        start = time.perf_counter()
        model = models.build_model(cfg.config, cfg.checkpoint, cfg.seed, dtype, device)
        model_hash, config_hash = models.model_sha256(model), models.config_sha256(model.config)
        doc["model"] = {"source": cfg.checkpoint or f"random {cfg.config} (seed {cfg.seed})", "dtype": cfg.dtype,
                        "config": {k: v for k, v in vars(model.config).items() if k != "extra"},
                        "parameters": sum(p.numel() for p in model.parameters()),
                        "model_sha256": model_hash, "config_sha256": config_hash,
                        "seconds": time.perf_counter() - start}
        step("model", "build", False, f"{doc['model']['parameters']:,} parameters, sha256 {model_hash[:12]}")
        if cfg.save_checkpoint:
            from rlkernel.model import save_checkpoint

            save_checkpoint(model, cfg.save_checkpoint)

        records: list[tuple[str, Record]] = []
        if record_in is not None:
            record_in.check_model(model_hash, config_hash)
            records.append((f"replay of {Path(cfg.replay or '').name}", record_in))
            prompts, params = record_in.prompts, record_in.sampling_params
        else:
            lo, hi = cfg.prompt_len
            prompts = make_prompts(cfg.num_prompts, lo, hi, model.config.vocab_size, cfg.seed)
            sampling = _sampling(cfg, len(prompts))
            for eb in cfg.engine_batch:
                rec = record_rollout(model, prompts, sampling, model_sha256=model_hash, config_sha256=config_hash,
                                     engine_batch=eb, block_size=cfg.block_size, max_model_len=hi + cfg.max_tokens,
                                     max_num_batched_tokens=cfg.max_num_batched_tokens,
                                     enforce_eager=cfg.enforce_eager, warmup=warmup)
                rec.meta.update(model_source=doc["model"]["source"], command=command)  # how to rebuild the model
                records.append((f"engine batch {eb}", rec))
                tps = rec.meta["engine"]["tokens_per_s"]
                step("rollout", f"engine batch {eb}", False,
                     f"{len(rec.samples)} sequences, {rec.num_tokens} tokens, {tps:,.0f} tokens/s")
            params = records[0][1].sampling_params
            if cfg.record:
                save_record(records[0][1], cfg.record)
        doc["rollouts"] = [{"name": name, "sequences": len(r.samples), "tokens": r.num_tokens,
                            "logprobs_sha256": r.logprobs_sha256(), "tokens_sha256": r.tokens_sha256(),
                            "engine": r.meta.get("engine", {}),
                            "finish_reasons": {k: sum(s.finish_reason == k for s in r.samples)
                                               for k in sorted({s.finish_reason for s in r.samples})}}
                           for name, r in records]
        first = records[0][1]
        doc["hashes"] = {"logprobs_sha256": first.logprobs_sha256(), "tokens_sha256": first.tokens_sha256(),
                         "sequences": len(first.samples), "tokens": first.num_tokens}
        doc["engine_invariance"] = {
            "ok": len({(r["logprobs_sha256"], r["tokens_sha256"]) for r in doc["rollouts"]}) == 1,
            "compared": [r["name"] for r in doc["rollouts"]]}

        doc["replays"] = []
        for name, rec in records:
            for k, mb in enumerate(cfg.train_micro_batch):
                res = replay(model, rec, mb, order_seed=cfg.seed + k)
                doc["replays"].append({"rollout": name, **res.as_dict()})
                step("replay", f"{name}, micro-batch {mb}", res.mismatches > 0,
                     f"{res.mismatches} of {res.tokens} tokens mismatch, max |ratio-1| {res.ratio['max']:.3g}, "
                     f"{res.seconds:.3f} s")

        doc["layers"] = None
        if cfg.layers:
            samples = first.samples[:cfg.layers_sequences]
            seqs = [first.prompts[s.prompt_index] + s.token_ids for s in samples]
            plens = [len(first.prompts[s.prompt_index]) for s in samples]
            temp = first.temperature(samples[0]) if samples else 1.0
            report = compare_layers(model, seqs, plens, block_size=cfg.block_size, seed=cfg.seed,
                                    temperature=temp if temp > 0 else 1.0)
            doc["layers"] = report.as_dict()
            fd = report.first_difference
            step("layers", f"{len(seqs)} sequences", not report.ok,
                 f"all {len(report.ops)} ops equal" if fd is None else f"first difference: {fd.name}")

        doc["baseline"] = None
        if baseline:
            from rlkernel.validate.baseline import run_baseline

            bdtype = DTYPES[cfg.baseline_dtype or cfg.dtype]
            eb = max(cfg.engine_batch) if record_in is None else cfg.engine_batch[0]
            res_b = run_baseline(model, prompts, params, dtype=bdtype, engine_batch=eb,
                                 micro_batch_sizes=cfg.train_micro_batch, seed=cfg.seed, warmup=warmup)
            doc["baseline"] = {"name": "transformers", "engine_batch": eb, **res_b.as_dict()}
            worst = max((r["mismatches"] for r in res_b.replays), default=0)
            step("baseline", f"transformers {res_b.dtype}", False,
                 f"{worst} of {res_b.tokens} tokens mismatch, {res_b.tokens_per_s or 0:,.0f} tokens/s")
    progress.finish()
    doc["timing"] = _timing(doc)
    mism = sum(r["mismatches"] for r in doc["replays"])
    layers_ok = doc["layers"] is None or doc["layers"]["ok"]
    doc["ok"] = mism == 0 and doc["engine_invariance"]["ok"] and layers_ok
    doc["summary"] = {"mismatches": mism, "tokens_compared": sum(r["tokens"] for r in doc["replays"]),
                      "max_abs_ratio_minus_1": max((r["ratio"]["max"] for r in doc["replays"]), default=0.0),
                      "engine_invariance": doc["engine_invariance"]["ok"], "layers_ok": layers_ok,
                      "baseline_mismatches": None if doc["baseline"] is None else
                      max(r["mismatches"] for r in doc["baseline"]["replays"])}
    return doc


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _timing(doc: dict[str, Any]) -> dict[str, Any]:
    """Ours next to the baseline: rollout tokens/s and trainer-forward seconds, with ratios (ours / baseline)."""
    base = doc["baseline"]
    out: dict[str, Any] = {"rollout": [], "trainer": []}
    for r in doc["rollouts"]:
        tps = r["engine"].get("tokens_per_s")
        same = base is not None and r["engine"].get("max_num_seqs") == base["engine_batch"]
        b = base["tokens_per_s"] if same and base else None
        out["rollout"].append({"rollout": r["name"], "tokens_per_s": tps, "baseline_tokens_per_s": b,
                               "ratio": _ratio(tps, b)})
    first = doc["rollouts"][0]["name"] if doc["rollouts"] else None
    base_by_mb: dict[int, float] = {r["micro_batch_size"]: r["seconds"] for r in (base or {}).get("replays", [])}
    for r in doc["replays"]:
        if r["rollout"] != first:
            continue
        b = base_by_mb.get(r["micro_batch_size"])
        out["trainer"].append({"micro_batch_size": r["micro_batch_size"], "seconds": r["seconds"],
                               "baseline_seconds": b, "ratio": _ratio(r["seconds"], b)})
    return out

