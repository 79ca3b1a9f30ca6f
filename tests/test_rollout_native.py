"""The rollout engine's native baseline, ``LLM(model, ops="native")``: torch's own ops, NOT bitwise.

Nothing here compares bytes: the native ops are a performance baseline. The tests check that the
mode runs the engine's paths (batched and chunked prefill, decode through the padded graph
buffers), draws the requested tokens, that its greedy tokens are transformers' argmaxes up to
near ties (an accuracy check against an fp32 reference, with a stated margin), and that it is
refused wherever it could be mistaken for the product.
"""

from __future__ import annotations

import pytest
import torch
from qwen3_tiny import forward_only_one_thread, random_weights, tiny_config, write_checkpoint

from rlkernel.model import Qwen3ForCausalLM, load_checkpoint
from rlkernel.nn.opset import EXACT
from rlkernel.rollout import LLM, SamplingParams
from rlkernel.rollout import native_ops as native
from rlkernel.rollout.native_ops import NATIVE

PROMPT_LENS = [7, 2, 12, 5]
PARAMS = [
    SamplingParams(temperature=1.0, max_tokens=4, n=3, seed=11),
    SamplingParams(temperature=0.7, top_k=20, max_tokens=3, n=2, seed=12),
    SamplingParams(temperature=0.7, top_p=0.9, top_k=50, max_tokens=5, n=2, seed=13),
    SamplingParams(temperature=0.0, max_tokens=4),
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=6)
#: How far below the reference's best logit a greedy token may be: bf16 weights and activations
#: move the tiny model's logits by ~1e-2, and its vocabulary of 256 has close runners-up.
TIE_MARGIN = 0.1


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


def test_native_mode_generates_the_requested_tokens(model, prompts) -> None:
    llm = LLM(model, num_blocks=64, block_size=4, max_num_seqs=16, ops="native")
    assert llm.ops == "native" and llm.bitwise is False and llm.model.ops is NATIVE
    assert model.ops is EXACT  # the caller's model is untouched
    outs = llm.generate(prompts, PARAMS)
    assert [(o.prompt_index, o.sample_index) for o in outs] == [(i, j) for i, p in enumerate(PARAMS)
                                                                 for j in range(p.n)]
    for o in outs:
        p = PARAMS[o.prompt_index]
        assert len(o.token_ids) == p.max_tokens and o.finish_reason == "length"
        assert all(0 <= t < 256 for t in o.token_ids)
        assert o.logprobs.dtype == torch.float32 and o.logprobs.shape == (p.max_tokens,)
        assert bool(torch.isfinite(o.logprobs).all()) and bool((o.logprobs <= 0).all())
    assert llm.block_manager.num_free_blocks == 64


def test_native_model_shares_the_weights(model) -> None:
    twin = model.with_ops(NATIVE)
    ours = dict(model.named_parameters())
    for name, p in twin.named_parameters():
        assert p.data_ptr() == ours[name].data_ptr() and p.dtype == ours[name].dtype, name
    assert all(m.ops is NATIVE for m in twin.modules() if hasattr(m, "ops"))


def _reference_logits(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """transformers' fp32 logits of the rows that predict each completion token: [len(completion), V]."""
    from rlkernel.validate.baseline import hf_model

    hf = hf_model(model, torch.float32)
    ids = torch.tensor([prompt + completion])
    logits = hf(ids).logits[0].float()
    return logits[len(prompt) - 1:len(prompt) - 1 + len(completion)]


@pytest.mark.parametrize("engine", [
    {"num_blocks": 64, "block_size": 4, "max_num_seqs": 16},
    {"num_blocks": 160, "block_size": 3, "max_num_seqs": 2, "max_num_batched_tokens": 5},
], ids=["batched-prefill", "chunked-prefill-one-by-one"])
def test_native_greedy_is_transformers_fp32_argmax_up_to_near_ties(model, prompts, engine) -> None:
    """Accuracy, not bits: every greedy token's fp32 reference logit is within TIE_MARGIN of the row's
    best, and the recorded log-probs are within 0.15 of the reference's (bf16 activations)."""
    pytest.importorskip("transformers")
    outs = LLM(model, ops="native", **engine).generate(prompts, GREEDY)
    exact = LLM(model, **engine).generate(prompts, GREEDY)
    for o, e in zip(outs, exact):
        for run, what in ((o, "native"), (e, "rlkernel")):
            ref = _reference_logits(model, run.prompt_token_ids, run.token_ids)
            chosen = ref.gather(1, torch.tensor(run.token_ids).unsqueeze(1)).squeeze(1)
            gap = ref.max(dim=1).values - chosen
            assert bool((gap <= TIE_MARGIN).all()), f"{what} prompt {run.prompt_index}: gaps {gap.tolist()}"
        ref = _reference_logits(model, o.prompt_token_ids, o.token_ids)
        ref_lp = torch.log_softmax(ref, -1).gather(1, torch.tensor(o.token_ids).unsqueeze(1)).squeeze(1)
        assert float((ref_lp - o.logprobs).abs().max()) < 0.15, (ref_lp, o.logprobs)
        # the two engines agree until the first near tie, where they may part
        same = next((i for i, (a, b) in enumerate(zip(o.token_ids, e.token_ids)) if a != b), None)
        if same is not None:
            ref = _reference_logits(model, o.prompt_token_ids, o.token_ids[:same + 1])[same]
            assert float(ref.max() - ref[e.token_ids[same]]) <= TIE_MARGIN


def test_native_decode_through_the_padded_graph_buffers(model, prompts) -> None:
    """The CUDA-graph decode path without the graphs (static buffers, padded batch sizes, padding
    rows writing to the padding blocks) on the CPU: the greedy tokens are the reference's argmaxes
    up to near ties."""
    pytest.importorskip("transformers")
    from rlkernel.rollout.cuda_graph import DecodeGraphs

    llm = LLM(model, num_blocks=40, block_size=4, max_num_seqs=7, ops="native")
    runner = llm.model_runner
    pad = DecodeGraphs.padding_blocks(7, 4)
    runner.kv_cache = llm.model.allocate_kv_cache(40 + pad, 4)
    runner.graphs = DecodeGraphs(llm.model, runner.kv_cache, 7, llm.max_model_len, first_pad_block=40,
                                 capture=False)
    outs = llm.generate(prompts[:3], GREEDY)  # 3 rows run in the captured size 4
    assert runner.graphs.steps > 0 and runner.graphs.padded_steps > 0
    for o in outs:
        ref = _reference_logits(model, o.prompt_token_ids, o.token_ids)
        gap = ref.max(dim=1).values - ref.gather(1, torch.tensor(o.token_ids).unsqueeze(1)).squeeze(1)
        assert bool((gap <= TIE_MARGIN).all()), f"prompt {o.prompt_index}: gaps {gap.tolist()}"


def _paged_case(query_lens: list[int], context_lens: list[int], block_size: int = 4):
    g = torch.Generator().manual_seed(5)
    hq, hkv, d = 4, 2, 16
    num_blocks = sum(-(-c // block_size) for c in context_lens) + 3
    k_cache = torch.randn(num_blocks, block_size, hkv, d, generator=g).to(torch.bfloat16)
    v_cache = torch.randn(num_blocks, block_size, hkv, d, generator=g).to(torch.bfloat16)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    width = max(-(-c // block_size) for c in context_lens) + 1
    table = torch.full((len(context_lens), width), -1, dtype=torch.int32)
    for b, c in enumerate(context_lens):
        n = -(-c // block_size)
        table[b, :n] = torch.tensor([perm.pop() for _ in range(n)])
    q = torch.randn(sum(query_lens), hq, d, generator=g).to(torch.bfloat16)
    cu = torch.tensor([0] + torch.tensor(query_lens).cumsum(0).tolist(), dtype=torch.int32)
    return q, k_cache, v_cache, table, torch.tensor(context_lens, dtype=torch.int32), cu


@pytest.mark.parametrize("query_lens, context_lens", [
    ([1, 1, 1], [5, 1, 9]),           # decode: the captured per-row gather
    ([3, 1, 4], [5, 1, 9]),           # chunks: per sequence, eager
    ([2, 0, 1], [6, 3, 2]),           # T == B with uneven rows: still the per-row gather
], ids=["decode", "chunks", "uneven-rows"])
def test_native_paged_attention_is_close_to_the_exact_op(query_lens, context_lens) -> None:
    """Accuracy, not bits: within bf16 rounding (0.02) of ``rlkernel.ops.attention_paged``."""
    import rlkernel.ops as ops

    args = _paged_case(query_lens, context_lens)
    got = native.attention_paged(*args)
    expected = ops.attention_paged(*args, causal=True)
    assert float((got.float() - expected.float()).abs().max()) < 0.02


def test_native_packed_attention_and_sampling() -> None:
    import rlkernel.ops as ops

    g = torch.Generator().manual_seed(1)
    q = torch.randn(21, 4, 16, generator=g).to(torch.bfloat16)
    k = torch.randn(21, 2, 16, generator=g).to(torch.bfloat16)
    v = torch.randn(21, 2, 16, generator=g).to(torch.bfloat16)
    cu = torch.tensor([0, 7, 9, 21], dtype=torch.int32)
    diff = native.attention(q, k, v, cu, cu).float() - ops.attention(q, k, v, cu, cu, causal=True).float()
    assert float(diff.abs().max()) < 0.02
    logits = torch.randn(4, 50, generator=g)
    t = torch.tensor([0.0, 1.0, 0.5, 1.0])
    tokens = native.sample(logits, t, torch.tensor([0, 1, 3, 0]), torch.tensor([1.0, 1.0, 1.0, 0.0]),
                           torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int64))
    best = logits.argmax(-1)
    assert tokens[0] == best[0] and tokens[1] == best[1] and tokens[3] == best[3]  # greedy, top-1, top-p 0
    assert int(tokens[2]) in logits[2].topk(3).indices.tolist()


def test_native_mode_is_refused_where_it_would_be_misused(model) -> None:
    with pytest.raises(ValueError, match="expected 'rlkernel' .* or 'native'"):
        LLM(model, ops="torch")  # type: ignore[arg-type]
    twin = model.with_ops(NATIVE)
    with pytest.raises(ValueError, match="LLM\\(model, ops='native'\\)"):
        LLM(twin)
    with pytest.raises(TypeError, match="expected an rlkernel.nn.opset.OpSet"):
        Qwen3ForCausalLM(model.config, ops="native")  # type: ignore[arg-type]
    from rlkernel.train import GRPOConfig, GRPOTrainer, ReverseDigits

    with pytest.raises(ValueError, match="not bitwise"):
        GRPOTrainer(twin, ReverseDigits(), GRPOConfig())
    with pytest.raises(ValueError, match="not bitwise"):
        GRPOTrainer(model, ReverseDigits(), GRPOConfig(), llm=LLM(model, num_blocks=8, ops="native"))
    assert not any(p.requires_grad for p in model.parameters())  # refused before touching the model
