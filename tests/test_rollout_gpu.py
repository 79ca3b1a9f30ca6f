"""The rollout engine on a CUDA GPU: decode steps replayed from CUDA graphs have eager's bits,
and both equal the trainer's ``packed_logprobs`` and the CPU engine's bits.

Marked ``gpu``; skipped where torch sees no CUDA device (run on the H200 with
``pytest -m gpu tests/test_rollout_gpu.py -q``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from qwen3_tiny import assert_same_bits, random_weights, tiny_config, write_checkpoint
from test_rollout import assert_same_outputs, assert_trainer_bits

from rlkernel.model import load_checkpoint
from rlkernel.rollout import LLM, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or getattr(torch.version, "hip", None) is not None,
                       reason="needs an NVIDIA CUDA device"),
]

CONFIG = tiny_config(num_attention_heads=8, num_key_value_heads=4, head_dim=32)
PROMPT_LENS = [5, 1, 17, 3, 9, 33, 2, 12, 7, 4, 21, 6]
PARAMS = [SamplingParams(temperature=0.8, top_k=40, top_p=0.95, max_tokens=12, n=2, seed=100 + i)
          if i % 3 else SamplingParams(temperature=0.0, max_tokens=9, n=2)
          for i in range(len(PROMPT_LENS))]
#: PARAMS with a seed on every request: an engine draws the seeds of unseeded requests from its own
#: generator in the order they come, so engines that have served different requests compare only on these
SEEDED = [replace(sp, seed=200 + i) if sp.seed is None else sp for i, sp in enumerate(PARAMS)]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("qwen3"), CONFIG, random_weights(CONFIG, seed=4))


@pytest.fixture(scope="module")
def model(path):
    return load_checkpoint(path, device="cuda")


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(9)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in PROMPT_LENS]


@pytest.fixture(scope="module")
def eager(model, prompts):
    with torch.no_grad():
        return LLM(model, num_blocks=128, block_size=16, max_num_seqs=24, enforce_eager=True).generate(prompts, PARAMS)


def test_decode_graphs_replay_eager_bits(model, prompts, eager) -> None:
    """24 sequences at most: graphs of 1, 2, 4, 8, 16, 24 rows; as samples finish the batch shrinks and
    runs padded in the next captured size."""
    llm = LLM(model, num_blocks=128, block_size=16, max_num_seqs=24)
    graphs = llm.model_runner.graphs
    assert graphs is not None and sorted(graphs.graphs) == [1, 2, 4, 8, 16, 24]
    outs = llm.generate(prompts, PARAMS)
    assert graphs.replays > 0
    assert_same_outputs(eager, outs, "CUDA graphs vs eager")


def test_gpu_rollout_equals_trainer_bits(model, eager) -> None:
    assert_trainer_bits(model, eager, PARAMS)


def test_preemption_with_graphs_keeps_the_bits(model, prompts, eager) -> None:
    llm = LLM(model, num_blocks=12, block_size=4, max_num_seqs=16, max_num_batched_tokens=16)
    outs = llm.generate(prompts, PARAMS)
    assert llm.stats["preemptions"] > 0
    assert_same_outputs(eager, outs, "tiny cache with CUDA graphs vs eager")


def test_gpu_equals_cpu_bits(path, prompts, eager) -> None:
    """The same engine on the CPU backend draws the same tokens with the same log-probs (the first
    four prompts)."""
    cpu = load_checkpoint(path)
    with torch.no_grad():
        outs = LLM(cpu, num_blocks=64, block_size=16, max_num_seqs=8).generate(prompts[:4], PARAMS[:4])
    assert_same_outputs(eager[:8], outs, "CPU vs CUDA")
    assert_same_bits(eager[0].logprobs, outs[0].logprobs, "first sample")


def test_native_baseline_runs_with_cuda_graphs(model, prompts) -> None:
    """``ops="native"`` (torch's own ops, NOT bitwise): decode steps captured and replayed, the requested
    tokens drawn. Greedy samples draw their first token from the same eager prefill as the eager
    engine, so those agree; later tokens may part at near ties (cuBLAS picks kernels by batch size)."""
    llm = LLM(model, num_blocks=128, block_size=16, max_num_seqs=24, ops="native")
    graphs = llm.model_runner.graphs
    assert graphs is not None and sorted(graphs.graphs) == [1, 2, 4, 8, 16, 24]
    outs = llm.generate(prompts, PARAMS)
    assert graphs.replays > 0 and not llm.bitwise
    assert [len(o.token_ids) for o in outs] == [p.max_tokens for p in PARAMS for _ in range(p.n)]
    eager = LLM(model, num_blocks=128, block_size=16, max_num_seqs=24, ops="native", enforce_eager=True)
    outs_eager = eager.generate(prompts, PARAMS)
    for a, b in zip(outs, outs_eager):
        if PARAMS[a.prompt_index].greedy:
            assert a.token_ids[0] == b.token_ids[0], f"prompt {a.prompt_index}: {a.token_ids} vs {b.token_ids}"


def test_graph_weight_exponents_follow_weight_updates(path, prompts) -> None:
    """The captured decode steps read the linear weights' exponents from buffers: after the weights
    change in place (``.data``, as a weight sync writes them, then an optimizer-style in-place
    update), the next ``generate`` replays with the new weights' bits, equal to an eager engine's."""
    model = load_checkpoint(path, device="cuda")
    llm = LLM(model, num_blocks=128, block_size=16, max_num_seqs=24)
    graphs = llm.model_runner.graphs
    assert graphs is not None and graphs.exponents is not None
    # the digit planes too where linear's wgmma kernel reads them (sm_90)
    assert (graphs.exponents.digits is not None) == (torch.cuda.get_device_capability() == (9, 0)) == llm.weight_digits
    llm.generate(prompts, SEEDED)
    g = torch.Generator(device="cuda").manual_seed(5)
    for layer in model.model.layers:  # rows scaled by 2**-3 .. 2**3: every row's exponent moves
        for lin in (layer.self_attn.qkv_proj, layer.mlp.down_proj):
            scale = 2.0 ** torch.randint(-3, 4, (lin.weight.shape[0], 1), generator=g, device="cuda")
            lin.weight.data.mul_(scale.to(lin.weight.dtype))
    outs = llm.generate(prompts, SEEDED)
    assert graphs.replays > 0
    with torch.no_grad():
        eager = LLM(model, num_blocks=128, block_size=16, max_num_seqs=24, enforce_eager=True).generate(prompts, SEEDED)
    assert_same_outputs(eager, outs, "graphs after a .data weight update vs eager")
    with torch.no_grad():
        model.model.layers[1].mlp.gate_up_proj.weight.mul_(0.25)  # moves the version counter
    refreshes = graphs.exponents.refreshes
    outs = llm.generate(prompts, SEEDED)
    assert graphs.exponents.refreshes > refreshes
    with torch.no_grad():
        eager = LLM(model, num_blocks=128, block_size=16, max_num_seqs=24, enforce_eager=True).generate(prompts, SEEDED)
    assert_same_outputs(eager, outs, "graphs after an in-place update vs eager")


def test_weight_digits_at_qwen3_widths_replay_eager_bits(tmp_path) -> None:
    """One layer at Qwen3-0.6B's widths (qkv 4096 and gate_up 6144 output columns), 80 sequences: the
    decode graphs of 65-96 rows run linear's wgmma kernel on the held digit planes (sm_90) and give
    the eager engine's bits; an engine told not to hold them gives the same."""
    config = tiny_config(hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8,
                         head_dim=128, num_hidden_layers=1)
    model = load_checkpoint(write_checkpoint(tmp_path, config, random_weights(config, seed=6)), device="cuda")
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (int(n),), generator=g).tolist() for n in torch.randint(1, 12, (80,), generator=g)]
    params = SamplingParams(temperature=0.9, max_tokens=6, seed=21)
    with torch.no_grad():
        eager = LLM(model, num_blocks=256, block_size=16, max_num_seqs=96, enforce_eager=True).generate(prompts, params)
    llm = LLM(model, num_blocks=256, block_size=16, max_num_seqs=96)
    assert llm.weight_digits == (torch.cuda.get_device_capability() == (9, 0))
    assert_same_outputs(eager, llm.generate(prompts, params), "graphs with digit planes vs eager")
    plain = LLM(model, num_blocks=256, block_size=16, max_num_seqs=96, weight_digits=False)
    assert not plain.weight_digits
    assert_same_outputs(eager, plain.generate(prompts, params), "graphs without digit planes vs eager")
