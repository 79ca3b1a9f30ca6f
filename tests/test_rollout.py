"""The rollout engine (``rlkernel.rollout``) on a tiny Qwen3: its log-probs are the trainer's bits.

Every comparison is on bytes. The trainer side is ``rlkernel.rl.packed_logprobs`` over prompt +
completion; the engine runs with different ``max_num_seqs`` (1 = each request alone), token
budgets (chunked prefill), block sizes, tiny caches (preemption and recomputation) and orders,
and must draw the same tokens with the same log-probs every time.
"""

from __future__ import annotations

import pytest
import torch
from qwen3_tiny import assert_same_bits, forward_only_one_thread, random_weights, tiny_config, write_checkpoint

from rlkernel.model import load_checkpoint
from rlkernel.rl import packed_logprobs
from rlkernel.rollout import LLM, RolloutOutput, SamplingParams, sample_seed

PROMPT_LENS = [7, 2, 12]
#: GRPO groups of 4, a mix of temperatures, top-k and top-p, greedy.
PARAMS = [
    SamplingParams(temperature=1.0, max_tokens=4, n=4, seed=11),
    SamplingParams(temperature=0.7, top_k=20, max_tokens=3, n=4, seed=12),
    SamplingParams(temperature=0.7, top_p=0.9, top_k=50, max_tokens=4, n=4, seed=13),
]


@pytest.fixture(autouse=True)
def _forward_only():
    with forward_only_one_thread():
        yield


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    config = tiny_config()
    return load_checkpoint(write_checkpoint(tmp_path_factory.mktemp("qwen3"), config, random_weights(config, seed=0)))


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in PROMPT_LENS]


def _trainer_logprobs(model, outs: list[RolloutOutput], temperature: float) -> list[torch.Tensor]:
    """packed_logprobs of every prompt + completion at ``temperature``, one packed forward; each
    output's completion positions."""
    seqs = [o.prompt_token_ids + o.token_ids for o in outs]
    cu = [0]
    for s in seqs:
        cu.append(cu[-1] + len(s))
    with torch.no_grad():
        lp = packed_logprobs(model, torch.tensor(sum(seqs, []), dtype=torch.int64),
                             torch.tensor(cu, dtype=torch.int32), temperature=temperature)
    return [lp[cu[b] + len(o.prompt_token_ids):cu[b + 1]] for b, o in enumerate(outs)]


def assert_trainer_bits(model, outs: list[RolloutOutput], params: list[SamplingParams]) -> None:
    groups: dict[float, list[RolloutOutput]] = {}
    for o in outs:
        groups.setdefault(params[o.prompt_index].logprob_temperature, []).append(o)
    for temperature, group in groups.items():
        for o, expected in zip(group, _trainer_logprobs(model, group, temperature)):
            assert_same_bits(expected, o.logprobs, f"prompt {o.prompt_index} sample {o.sample_index} "
                                                   f"(T = {temperature}): trainer vs rollout log-probs")


def assert_same_outputs(expected: list[RolloutOutput], actual: list[RolloutOutput], what: str) -> None:
    assert len(expected) == len(actual), what
    for e, a in zip(expected, actual):
        where = f"{what}: prompt {e.prompt_index} sample {e.sample_index}"
        assert (a.prompt_index, a.sample_index, a.seed) == (e.prompt_index, e.sample_index, e.seed), where
        assert a.token_ids == e.token_ids, f"{where}: tokens {a.token_ids} != {e.token_ids}"
        assert a.finish_reason == e.finish_reason, where
        assert_same_bits(e.logprobs, a.logprobs, f"{where}: log-probs")


@pytest.fixture(scope="module")
def baseline(model, prompts) -> list[RolloutOutput]:
    """Everything in one batch, whole prompts, a roomy cache."""
    with forward_only_one_thread():
        llm = LLM(model, num_blocks=64, block_size=4, max_num_seqs=16)
        llm.model_runner.check = True  # validate every step's metadata on the host
        return llm.generate(prompts, PARAMS)


def test_outputs_in_order_with_their_seeds(baseline, prompts) -> None:
    assert [(o.prompt_index, o.sample_index) for o in baseline] == [(i, j) for i in range(3) for j in range(4)]
    for o in baseline:
        sp = PARAMS[o.prompt_index]
        assert o.prompt_token_ids == prompts[o.prompt_index]
        assert o.seed == sample_seed(sp.seed, o.sample_index)
        assert len(o.token_ids) == sp.max_tokens and o.finish_reason == "length"
        assert o.logprobs.dtype == torch.float32 and o.logprobs.device.type == "cpu"
        assert o.logprobs.shape == (len(o.token_ids),)
    assert len({o.seed for o in baseline}) == len(baseline)
    group = [o.token_ids for o in baseline if o.prompt_index == 0]
    assert len({tuple(t) for t in group}) > 1, "the 4 samples of a group drew the same tokens"


def test_rollout_logprobs_equal_trainer_bits(model, baseline) -> None:
    assert_trainer_bits(model, baseline, PARAMS)


@pytest.mark.parametrize("max_num_seqs, max_num_batched_tokens, block_size", [
    (1, 2048, 16), (3, 5, 3), (8, 3, 1)], ids=["one-by-one", "batch3-chunked5-block3", "batch8-chunked3-block1"])
def test_batching_and_chunking_do_not_change_a_bit(model, prompts, baseline, max_num_seqs, max_num_batched_tokens,
                                                   block_size) -> None:
    llm = LLM(model, num_blocks=160, block_size=block_size, max_num_seqs=max_num_seqs,
              max_num_batched_tokens=max_num_batched_tokens)
    outs = llm.generate(prompts, PARAMS)
    assert_same_outputs(baseline, outs, f"max_num_seqs {max_num_seqs}, budget {max_num_batched_tokens}")
    if max_num_batched_tokens < max(PROMPT_LENS):
        assert llm.stats["steps"] > sum(p.max_tokens for p in PARAMS)  # prompts were chunked


def test_greedy_logprobs_at_temperature_one(model, prompts) -> None:
    params = [SamplingParams(temperature=0.0, max_tokens=3, n=2)]
    outs = LLM(model, num_blocks=32, block_size=4).generate(prompts[:1], params)
    assert outs[0].token_ids == outs[1].token_ids  # greedy: the seed does not matter
    assert_trainer_bits(model, outs, params)
