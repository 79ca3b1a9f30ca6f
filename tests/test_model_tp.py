"""Tensor parallelism of the Qwen3 model over real torch.distributed (gloo) processes on the CPU.

One spawn of four processes. Each rank loads the same tiny checkpoint (8 query / 4 KV heads, so
TP = 4 keeps grouped-query attention) without a group (TP = 1), with a one-rank group, with its
pair's group (TP = 2) and with the world (TP = 4), and checks on bytes that

* the trainer's log-probs (``packed_logprobs``, micro-batched) equal the TP = 1 bits;
* a sampled rollout (chunked prefill + decode over the paged cache, vocabulary-parallel logits
  for ``sample`` and log-probs through the sharded ``token_logprobs``) draws the same tokens
  with the same log-probs as at TP = 1, and those equal the trainer's;
* the rollout engine (``rlkernel.rollout.LLM``: continuous batching, chunked prefill, n samples,
  top-k) gives the TP = 1 engine's tokens and log-prob bits;
* a TP = 2 model saves (gathered shards) exactly the checkpoint it loaded;
* the exact float collectives keep -0, NaN and the owner's bits.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_group import run_in_gloo_group
from qwen3_tiny import (
    assert_same_bits,
    forward_only_one_thread,
    random_weights,
    rollout,
    tiny_config,
    write_checkpoint,
)
from safetensors import safe_open

from rlkernel.model import Qwen3Config, Qwen3ForCausalLM, load_checkpoint, save_checkpoint
from rlkernel.nn.parallel import combine_owned, max_fp32
from rlkernel.rl import packed_logprobs
from rlkernel.rollout import LLM, SamplingParams

CONFIG = tiny_config(num_attention_heads=8, num_key_value_heads=4, head_dim=8)
PROMPT_LENS = [4, 1, 6]
TOTAL_LENS = [7, 4, 8]


def _sequences() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    seqs = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (6, 9, 2, 7, 13)]
    cu = torch.tensor([0, *torch.tensor([len(s) for s in seqs]).cumsum(0).tolist()], dtype=torch.int32)
    return torch.tensor(sum(seqs, []), dtype=torch.int64), cu


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(6)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in PROMPT_LENS]


def _read(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint directory, read with safetensors directly."""
    out = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            out.update({name: f.get_tensor(name) for name in f.keys()})
    return out


def _check_collectives(rank: int, world: int, group: object) -> None:
    owned = torch.zeros(4, 3, dtype=torch.bfloat16)
    values = torch.tensor([-0.0, float("nan"), 1e-40, -2.5], dtype=torch.bfloat16)
    owned[rank % 4] = values[rank % 4]  # row r is owned by rank r (rows past the world size stay +0)
    got = combine_owned(owned, group)
    for r in range(4):
        expected = values[r].expand(3) if r < world else torch.zeros(3, dtype=torch.bfloat16)
        assert_same_bits(expected.contiguous(), got[r].contiguous(), f"combine_owned row {r} world {world}")
    x = torch.tensor([-1.0, -0.0, float(rank), -5.0 + rank], dtype=torch.float32)
    if rank == world - 1:
        x[0] = float("nan")
    m = max_fp32(x, group)
    assert int(m[0:1].view(torch.int32)) == 0x7FC00000  # NaN propagates, canonical
    assert int(m[1:2].view(torch.int32)) == 0  # max(-0, ..., -0) is +0 (R5)
    assert m[2].item() == world - 1 and m[3].item() == -5.0 + world - 1


def _engine(model: Qwen3ForCausalLM) -> list:
    """The rollout engine on two prompts: sampled (n = 2, top-k) and greedy, small token budget."""
    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (6, 2)]
    params = [SamplingParams(temperature=0.9, top_k=30, max_tokens=3, n=2, seed=1),
              SamplingParams(temperature=0.0, max_tokens=2)]
    return LLM(model, num_blocks=16, block_size=4, max_num_seqs=2, max_num_batched_tokens=4).generate(prompts, params)


def _check_model(path: Path, group: object, label: str, reference: dict) -> None:
    model = load_checkpoint(path, group=group)
    outs = _engine(model)
    assert [o.token_ids for o in outs] == [o.token_ids for o in reference["engine"]], f"{label}: engine tokens"
    for o, e in zip(outs, reference["engine"]):
        assert_same_bits(e.logprobs, o.logprobs, f"{label}: engine log-probs of request {o.request_id}")
    ids, cu = _sequences()
    trainer = packed_logprobs(model, ids, cu, micro_batch_size=3)
    assert_same_bits(reference["trainer"], trainer, f"{label}: trainer log-probs")
    logps, tokens = rollout(model, _prompts(), PROMPT_LENS, TOTAL_LENS, max_batch=2, chunk=3, block_size=2,
                            num_blocks=24, seed=1)
    assert tokens == reference["tokens"], f"{label}: sampled other tokens"
    for b, lp in enumerate(logps):
        assert_same_bits(reference["rollout"][b], lp, f"{label}: rollout log-probs of sequence {b}")


def _body(rank: int, world: int, path: str, out: str) -> None:
    with forward_only_one_thread():
        singles = [dist.new_group([r]) for r in range(world)]
        pairs = [dist.new_group([r, r + 1]) for r in range(0, world, 2)]
        path_ = Path(path)
        one = load_checkpoint(path_)
        ids, cu = _sequences()
        logps, tokens = rollout(one, _prompts(), PROMPT_LENS, TOTAL_LENS, max_batch=3, chunk=None,
                                block_size=4, num_blocks=16, seed=0)
        reference = {"trainer": packed_logprobs(one, ids, cu), "rollout": logps, "tokens": tokens,
                     "engine": _engine(one)}
        ids_g = torch.tensor(sum(tokens, []), dtype=torch.int64)
        cu_g = torch.tensor([0, *torch.tensor(TOTAL_LENS).cumsum(0).tolist()], dtype=torch.int32)
        replay = packed_logprobs(one, ids_g, cu_g)
        for b in range(len(tokens)):
            assert_same_bits(replay[int(cu_g[b]) + 1:int(cu_g[b + 1])], logps[b], f"TP1 replay {b}")

        _check_model(path_, singles[rank], "one-rank group", reference)
        for size, group in ((2, pairs[rank // 2]), (world, dist.group.WORLD)):
            _check_collectives(dist.get_rank(group), size, group)
            _check_model(path_, group, f"TP={size}", reference)

        model = load_checkpoint(path_, group=pairs[rank // 2])
        target = Path(out) / f"pair{rank // 2}"
        written = save_checkpoint(model, target, max_shard_size=32 * 1024)
        assert bool(written) == (dist.get_rank(pairs[rank // 2]) == 0)
        dist.barrier()
        original, saved = _read(path_), _read(target)
        assert set(saved) == set(original)
        for name, t in original.items():
            assert_same_bits(t, saved[name], f"TP=2 save of {name}")

        with pytest.raises(ValueError, match="num_key_value_heads = 2 is not divisible by the TP degree 4"):
            Qwen3ForCausalLM(Qwen3Config.from_dict(tiny_config()), group=dist.group.WORLD)


def _worker(rank: int, world: int, init_file: str, path: str, out: str) -> None:
    run_in_gloo_group(rank, world, init_file, _body, rank, world, path, out, timeout_s=120)


def test_model_tp1_tp2_tp4_same_bits() -> None:
    """One spawn of 4 gloo processes: TP = 1 (no group, one-rank group), 2 (pairs) and 4 (world)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = write_checkpoint(Path(tmp) / "ckpt", CONFIG, random_weights(CONFIG, seed=3))
        mp.spawn(_worker, args=(4, os.path.join(tmp, "init"), str(path), tmp), nprocs=4, join=True)
