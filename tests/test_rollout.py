"""The rollout engine (``rlkernel.rollout``) on a tiny Qwen3: its log-probs are the trainer's bits.

Every comparison is on bytes. The trainer side is ``rlkernel.rl.packed_logprobs`` over prompt +
completion; the engine runs with different ``max_num_seqs`` (1 = each request alone), token
budgets (chunked prefill), block sizes, tiny caches (preemption and recomputation) and orders,
and must draw the same tokens with the same log-probs every time.
"""

from __future__ import annotations

import dataclasses

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
    device = model.lm_head.weight.device
    with torch.no_grad():
        lp = packed_logprobs(model, torch.tensor(sum(seqs, []), dtype=torch.int64, device=device),
                             torch.tensor(cu, dtype=torch.int32, device=device), temperature=temperature).cpu()
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


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3, 0.01])
def test_logprobs_of_logits_equal_token_logprobs(model, temperature) -> None:
    """The engine scores its samples from the sampling logits (one LM-head GEMM per step): the same
    bits as the trainer's token_logprobs on the hidden rows, also for outlier channels, an
    attention-sink-like row, rows that overflow at a tiny temperature, and NaN / inf rows."""
    head = model.lm_head
    v, h = head.weight.shape
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(9, h, generator=g)
    hidden[1, :3] *= 300.0  # outlier channels
    hidden[2] = 0.0
    hidden[2, 0] = 40.0  # one dominant direction: a near-one-hot distribution
    hidden[3] *= 1e4  # logits overflow to inf at a tiny temperature
    hidden[4, 5] = float("nan")
    hidden[5, 0] = float("inf")
    hidden[6] = 0.0  # all-equal logits
    hidden = hidden.to(head.weight.dtype)
    targets = torch.randint(0, v, (9,), generator=g)
    with torch.no_grad():
        want = model.logprobs(hidden, targets, temperature)
        got = model.logprobs_of_logits(model.compute_logits(hidden), targets, temperature)
    assert_same_bits(want, got, f"logprobs_of_logits at temperature {temperature}")


def test_logprobs_of_logits_refuses_bad_input(model) -> None:
    v = model.lm_head.weight.shape[0]
    logits, ids = torch.zeros(2, v), torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="temperature"):
        model.logprobs_of_logits(logits, ids, 0.0)
    with pytest.raises(ValueError, match=rf"span \[0, {v}\]"):
        model.logprobs_of_logits(logits, torch.tensor([0, v]), 1.0)
    with pytest.raises(ValueError, match="int64 \\[2\\]"):
        model.logprobs_of_logits(logits, ids[:1], 1.0)
    with pytest.raises(TypeError, match="float32"):
        model.logprobs_of_logits(logits.bfloat16(), ids, 1.0)


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


def test_preemption_and_recomputation_keep_the_bits(model, prompts, baseline) -> None:
    """A cache of 10 two-token blocks for 12 samples: running sequences are preempted (blocks freed)
    and recomputed from their prompt + completion so far, in chunks of at most 6 tokens."""
    llm = LLM(model, num_blocks=10, block_size=2, max_num_seqs=8, max_num_batched_tokens=6)
    outs = llm.generate(prompts, PARAMS)
    assert llm.stats["preemptions"] > 0
    assert_same_outputs(baseline, outs, "preempted")
    assert llm.block_manager.num_free_blocks == 10  # every block came back


def test_same_seed_same_tokens_whatever_the_other_requests(model, prompts, baseline) -> None:
    """Prompt 2's group among other requests, in another order, and each sample replayed alone from
    its reported seed (``SamplingParams(seed=out.seed, n=1)``)."""
    g = torch.Generator().manual_seed(5)
    others = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (9, 1)]
    other = SamplingParams(temperature=1.3, max_tokens=2, n=2)
    outs = LLM(model, num_blocks=64, block_size=8, max_num_seqs=5).generate(
        [others[0], prompts[2], others[1]], [other, PARAMS[2], other])
    group = [o for o in outs if o.prompt_index == 1]
    expected = [o for o in baseline if o.prompt_index == 2]
    for o in group:
        o.prompt_index = 2
    assert_same_outputs(expected, group, "prompt 2 among other requests")
    replay = [dataclasses.replace(PARAMS[2], seed=o.seed, n=1) for o in expected]
    outs = LLM(model, num_blocks=64, block_size=4).generate([prompts[2]] * 4, replay)
    for e, o in zip(expected, outs):
        assert o.seed == e.seed and o.token_ids == e.token_ids, f"replay of sample {e.sample_index}"
        assert_same_bits(e.logprobs, o.logprobs, f"replay of sample {e.sample_index}")


def test_engine_seeds_come_from_its_generator(model, prompts) -> None:
    params = SamplingParams(max_tokens=1, n=2)
    runs = [LLM(model, num_blocks=16, block_size=4, seed=s).generate(prompts[1:2], params) for s in (0, 0, 1)]
    assert [o.seed for o in runs[0]] == [o.seed for o in runs[1]] != [o.seed for o in runs[2]]
    assert runs[0][0].token_ids == runs[1][0].token_ids


def test_stop_tokens_eos_max_tokens_and_max_model_len(model, prompts, monkeypatch, capsys) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=5)
    llm = LLM(model, num_blocks=32, block_size=4)
    [full] = llm.generate(prompts[:1], greedy, use_tqdm=True)
    assert "rollout: 1/1 samples" in capsys.readouterr().err
    assert full.finish_reason == "length" and len(full.token_ids) == 5
    assert llm.stats["prefill_tokens"] == 7 and llm.stats["decode_tokens"] == 4
    assert llm.stats["generated_tokens"] == 5 and llm.stats["decode_seconds"] > 0
    cut = full.token_ids.index(full.token_ids[2])  # the first occurrence of the third token
    [stopped] = llm.generate(prompts[:1], dataclasses.replace(greedy, stop_token_ids=[full.token_ids[2]]))
    assert stopped.finish_reason == "stop" and stopped.token_ids == full.token_ids[:cut + 1]
    assert_same_bits(full.logprobs[:cut + 1], stopped.logprobs, "stopped early")
    # max_model_len caps prompt + completion
    [short] = LLM(model, num_blocks=32, block_size=4, max_model_len=9).generate(prompts[:1], greedy)
    assert short.token_ids == full.token_ids[:2] and short.finish_reason == "length"
    # the model's eos (config.json's eos_token_id, an int or a list) stops unless ignore_eos
    config = dataclasses.replace(model.config, extra={**model.config.extra, "eos_token_id": [255, full.token_ids[1]]})
    monkeypatch.setattr(model, "config", config)
    llm = LLM(model, num_blocks=32, block_size=4)
    [eos] = llm.generate(prompts[:1], greedy)
    assert eos.finish_reason == "stop" and eos.token_ids == full.token_ids[:full.token_ids.index(full.token_ids[1]) + 1]
    [ignored] = llm.generate(prompts[:1], dataclasses.replace(greedy, ignore_eos=True))
    assert ignored.token_ids == full.token_ids and ignored.finish_reason == "length"


@pytest.mark.parametrize("call, message", [
    (lambda llm, p: llm.generate([[]], SamplingParams()), "prompt 0 is empty"),
    (lambda llm, p: llm.generate([p[0], [1, 256]], SamplingParams(max_tokens=4)),
     r"prompt 1 holds token id 256; expected ids in \[0, 256\)"),
    (lambda llm, p: llm.generate([[-1]], SamplingParams()), "prompt 0 holds token id -1"),
    (lambda llm, p: llm.generate([p[0]], SamplingParams(stop_token_ids=[300])), r"stop_token_ids holds 300"),
    (lambda llm, p: llm.generate([[1] * 40], SamplingParams()),
     "prompt 0 has 40 tokens; with one completion token that exceeds max_model_len = 40"),
    (lambda llm, p: llm.generate([[1] * 30], SamplingParams(max_tokens=8)),
     r"may need 10 KV blocks of 4 tokens but the cache has 8; pass a larger num_blocks"),
    (lambda llm, p: llm.generate(p, [SamplingParams()]), "1 sampling_params for 3 prompts"),
    (lambda llm, p: llm.generate(["hello"], SamplingParams()), "expected a list of int token ids"),
], ids=["empty", "id-too-large", "id-negative", "stop-id", "too-long", "cache-too-small", "params-count", "text"])
def test_generate_errors(model, prompts, call, message) -> None:
    llm = LLM(model, num_blocks=8, block_size=4, max_model_len=40)
    with pytest.raises((ValueError, TypeError), match=message):
        call(llm, prompts)
    assert llm.stats["steps"] == 0  # checked before any work


@pytest.mark.parametrize("kwargs, message", [
    ({"n": 0}, r"n = 0; expected an int >= 1"), ({"max_tokens": 0}, r"max_tokens = 0; expected an int >= 1"),
    ({"temperature": -0.5}, r"temperature = -0.5; expected a finite float >= 0"),
    ({"temperature": float("nan")}, "temperature = nan"),
    ({"top_p": 1.5}, r"top_p = 1.5; expected a float in \[0, 1\]"),
    ({"top_k": -1}, r"top_k = -1; expected an int >= 0"), ({"seed": 1.5}, "seed = 1.5"),
    ({"stop_token_ids": "ab"}, "stop_token_ids = 'ab'"),
])
def test_sampling_params_errors(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"max_model_len": 1000}, "max_model_len = 1000 exceeds the model's max_position_embeddings = 512"),
    ({"kv_cache_memory": 100}, r"kv_cache_memory = 100 bytes is below one KV block \(1024 bytes"),
    ({"num_blocks": 0}, r"num_blocks = 0; expected an int >= 1"),
    ({"max_num_seqs": 0}, r"max_num_seqs = 0"),
])
def test_engine_errors(model, kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        LLM(model, block_size=4, **kwargs)


def test_cache_size_from_memory(model) -> None:
    per_block = model.kv_cache_bytes_per_block(4)
    assert LLM(model, block_size=4, kv_cache_memory=10 * per_block + 7).num_blocks == 10
    assert LLM(model, block_size=4, max_num_seqs=2, max_model_len=40).num_blocks == 20  # CPU: what 2 x 40 tokens need


def test_padded_decode_buffers_keep_the_bits(model, prompts, baseline) -> None:
    """The CUDA-graph decode path without the graphs: static buffers, batches padded to the captured
    sizes (1, 2, 4, 7) with rows writing to the padding blocks, run eagerly on the CPU and
    validated on the host every step; the same tokens and log-prob bits."""
    from rlkernel.rollout.cuda_graph import DecodeGraphs, graph_batch_sizes

    assert graph_batch_sizes(5) == [1, 2, 4, 5] and graph_batch_sizes(40) == [1, 2, 4, 8, 16, 32, 40]
    llm = LLM(model, num_blocks=40, block_size=4, max_num_seqs=7)
    runner = llm.model_runner
    pad = DecodeGraphs.padding_blocks(7, 4)
    runner.kv_cache = model.allocate_kv_cache(40 + pad, 4)
    runner.graphs = DecodeGraphs(model, runner.kv_cache, 7, llm.max_model_len, first_pad_block=40, capture=False)
    runner.graphs.check = True
    outs = llm.generate(prompts, PARAMS)
    assert_same_outputs(baseline, outs, "padded static decode buffers")
    assert runner.graphs.steps > runner.graphs.padded_steps > 0
    assert runner.graphs.exponents is not None and runner.graphs.exponents.refreshes == 2  # built, generate


def test_decode_graph_weight_digits_follow_weight_changes(tmp_path, prompts) -> None:
    """With ``weight_digits`` the decode buffers also hold every weight's digit planes, refreshed with
    the exponents (by ``generate`` after a ``.data`` write), and the outputs are those of an engine
    without them; engines off sm_90 do not hold them unless asked."""
    from rlkernel.ops import linear_weight_digits
    from rlkernel.rollout.cuda_graph import DecodeGraphs
    from rlkernel.rollout.weight_exponents import digits_bytes, reads_digits

    config = tiny_config()
    model = load_checkpoint(write_checkpoint(tmp_path, config, random_weights(config, seed=1)))
    assert not reads_digits(torch.device("cpu"))
    assert LLM(model, num_blocks=8, block_size=4, max_num_seqs=2).weight_digits is False  # eager on the CPU
    llm = LLM(model, num_blocks=40, block_size=4, max_num_seqs=7)
    runner = llm.model_runner
    runner.kv_cache = model.allocate_kv_cache(40 + DecodeGraphs.padding_blocks(7, 4), 4)
    runner.graphs = graphs = DecodeGraphs(model, runner.kv_cache, 7, llm.max_model_len, first_pad_block=40,
                                          capture=False, weight_digits=True)
    exps = graphs.exponents
    assert exps is not None and exps.digits is not None
    assert sum(d.numel() for d in exps.digits) == digits_bytes(model)
    baseline = LLM(model, num_blocks=64, block_size=4, max_num_seqs=16).generate(prompts, PARAMS)
    assert_same_outputs(baseline, llm.generate(prompts, PARAMS), "decode with the weights' digit planes")
    down = model.model.layers[1].mlp.down_proj
    down.weight.data[:3].mul_(-0.5)  # .data: the next generate refreshes the planes
    outs = llm.generate(prompts, PARAMS)
    i = exps.layers.index(down)
    assert torch.equal(exps.digits[i], linear_weight_digits(down.weight)[1])
    fresh = LLM(model, num_blocks=64, block_size=4, max_num_seqs=16).generate(prompts, PARAMS)
    assert_same_outputs(fresh, outs, "digit planes after a .data weight change")
    with exps.active():
        assert down.weight_digits is exps.digits[i] and down.weight_exponents is exps.buffers[i]
    assert down.weight_digits is None and down.weight_exponents is None


def test_decode_graph_weight_exponents_follow_weight_changes(tmp_path, prompts) -> None:
    """The decode path holds the linear weights' exponents in buffers: refreshed by every
    ``generate`` (a ``.data`` write between calls), by a decode step after an in-place update that
    moves a version counter, and an eager forward on stale buffers raises instead of computing on
    the wrong grid."""
    from rlkernel.rollout.cuda_graph import DecodeGraphs

    config = tiny_config()
    model = load_checkpoint(write_checkpoint(tmp_path, config, random_weights(config, seed=0)))
    llm = LLM(model, num_blocks=40, block_size=4, max_num_seqs=7)
    runner = llm.model_runner
    runner.kv_cache = model.allocate_kv_cache(40 + DecodeGraphs.padding_blocks(7, 4), 4)
    runner.graphs = graphs = DecodeGraphs(model, runner.kv_cache, 7, llm.max_model_len, first_pad_block=40,
                                          capture=False)
    exps = graphs.exponents
    assert exps is not None and len(exps.layers) == 4 * model.config.num_hidden_layers and exps.refreshes == 1
    llm.generate(prompts, PARAMS)
    assert exps.refreshes == 2  # generate's own
    qkv = model.model.layers[0].self_attn.qkv_proj
    before = exps.buffers[exps.layers.index(qkv)].clone()
    qkv.weight.data[:5].mul_(4.0)  # exponents + 2 on five rows; .data leaves the version counter alone
    with pytest.raises(ValueError, match="the weight changed after they were made"):
        graphs.run([1, 2], [3, 4], [[0], [1]])
    outs = llm.generate(prompts, PARAMS)
    assert torch.equal(exps.buffers[exps.layers.index(qkv)], before + torch.tensor([2] * 5 + [0] * (len(before) - 5)))
    fresh = LLM(model, num_blocks=64, block_size=4, max_num_seqs=16).generate(prompts, PARAMS)
    assert_same_outputs(fresh, outs, "decode buffers after a .data weight change")
    refreshes = exps.refreshes
    with torch.no_grad():
        qkv.weight[:5].div_(4.0)  # moves the version counter: the next decode step refreshes by itself
    graphs.run([1, 2], [3, 4], [[0], [1]])
    assert exps.refreshes == refreshes + 1 and torch.equal(exps.buffers[exps.layers.index(qkv)], before)
    graphs.run([1, 2], [3, 4], [[0], [1]])
    assert exps.refreshes == refreshes + 1


def test_an_interrupted_generate_frees_every_block(model, prompts, baseline, monkeypatch) -> None:
    llm = LLM(model, num_blocks=40, block_size=4)
    run = llm.model_runner.run
    calls = []

    def failing(batch):
        calls.append(len(batch))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return run(batch)

    monkeypatch.setattr(llm.model_runner, "run", failing)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(prompts, PARAMS)
    assert llm.block_manager.num_free_blocks == 40 and llm.scheduler.is_finished()
    monkeypatch.setattr(llm.model_runner, "run", run)
    outs = llm.generate(prompts[1:2], dataclasses.replace(PARAMS[1], n=2))
    for o in outs:
        o.prompt_index = 1
    assert_same_outputs(baseline[4:6], outs, "after an interrupted call")
