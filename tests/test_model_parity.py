"""Architecture parity with transformers' ``Qwen3ForCausalLM`` (a labelled tolerance test).

transformers is not bitwise reproducible, so this is the one place the model is compared with a
tolerance: it shows the model *is* Qwen3 (same weights layout, norms, RoPE, GQA, SwiGLU, head),
not merely self-consistent. Setup: transformers builds a tiny Qwen3 with random weights (norm
gains perturbed so that a misplaced gain shows), every weight rounded to the low-precision dtype
under test, saved with ``save_pretrained``; rlkernel loads that directory and computes token
log-probs in that dtype. The truth is transformers' forward of the same weights in float64.

Tolerances (max |log-prob difference| over all scored tokens, in nats), one dtype per case:

* bfloat16: 0.15. Every op's output is rounded to bf16 (8 significand bits, unit roundoff
  2**-9), as in any bf16 inference engine; over 2 layers with logits up to ~10 that moves
  log-probs by up to 0.05-0.08 (measured here: 0.051-0.075). transformers' own bf16 forward of
  the same weights is as far from the float64 truth (measured: 0.048-0.067). 0.15 is twice the
  largest measured value.
* float16: 0.02 (11 significand bits, 8x finer; measured 0.006-0.010, transformers fp16
  0.006-0.010).

Negative controls prove the tolerance has teeth: the same model with its q/k norm gains
swapped, or RoPE at the wrong theta, is 10x or more beyond it.
"""

from __future__ import annotations

import pytest
import torch
from qwen3_tiny import assert_same_bits, forward_only_one_thread, tiny_config
from transformers import Qwen3Config as HFQwen3Config
from transformers import Qwen3ForCausalLM as HFQwen3ForCausalLM

from rlkernel.model import Qwen3ForCausalLM, load_checkpoint, save_checkpoint, state_dict_hf
from rlkernel.rl import packed_logprobs

TOLERANCE = {torch.bfloat16: 0.15, torch.float16: 0.02}
LENGTHS = [7, 12, 3, 20]


@pytest.fixture(autouse=True)
def _forward_only():
    with forward_only_one_thread():
        yield


def _hf_model(tied: bool, dtype: torch.dtype, seed: int) -> HFQwen3ForCausalLM:
    c = tiny_config(tie_word_embeddings=tied)
    config = HFQwen3Config(
        vocab_size=c["vocab_size"], hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"],
        num_hidden_layers=c["num_hidden_layers"], num_attention_heads=c["num_attention_heads"],
        num_key_value_heads=c["num_key_value_heads"], head_dim=c["head_dim"], rms_norm_eps=c["rms_norm_eps"],
        rope_theta=c["rope_theta"], max_position_embeddings=c["max_position_embeddings"], tie_word_embeddings=tied,
        initializer_range=0.2, attn_implementation="eager")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = HFQwen3ForCausalLM(config).float().eval()
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
        p.copy_(p.to(dtype).float())  # both models hold exactly the same (low-precision) values
    return model


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)
    return torch.randint(0, 256, (sum(LENGTHS),), generator=g), cu


def _truth(hf: HFQwen3ForCausalLM, ids: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """float64 log-prob of every token but each sequence's first, one sequence at a time."""
    hf = hf.double()
    out = []
    for b in range(len(LENGTHS)):
        x = ids[int(cu[b]):int(cu[b + 1])]
        logp = torch.log_softmax(hf(input_ids=x[None]).logits[0], dim=-1)
        out.append(logp[:-1].gather(1, x[1:, None])[:, 0])
    hf.float()
    return torch.cat(out)


def _ours(model: Qwen3ForCausalLM, ids: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    logp = packed_logprobs(model, ids, cu, micro_batch_size=2)
    scored = torch.ones(ids.shape[0], dtype=torch.bool)
    scored[cu[:-1].long()] = False
    return logp[scored].double()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_parity_with_transformers_qwen3_tolerance(tmp_path, dtype, tied) -> None:
    hf = _hf_model(tied, dtype, seed=0)
    hf.save_pretrained(tmp_path)
    assert ((tmp_path / "model.safetensors").exists())
    ours = load_checkpoint(tmp_path, dtype=dtype)
    assert ours.config.tie_word_embeddings is tied
    ids, cu = _batch(seed=1)
    truth = _truth(hf, ids, cu)
    diff = (_ours(ours, ids, cu) - truth).abs().max().item()
    assert diff <= TOLERANCE[dtype], f"max |log-prob - transformers float64| = {diff:.4g} > {TOLERANCE[dtype]}"


def test_parity_tolerance_rejects_a_wrong_architecture(tmp_path) -> None:
    """Negative controls at fp16: two plausible implementation mistakes exceed the tolerance by far."""
    dtype = torch.float16
    hf = _hf_model(False, dtype, seed=0)
    hf.save_pretrained(tmp_path)
    ids, cu = _batch(seed=1)
    truth = _truth(hf, ids, cu)

    swapped = load_checkpoint(tmp_path, dtype=dtype)
    for layer in swapped.model.layers:
        q, k = layer.self_attn.q_norm.weight, layer.self_attn.k_norm.weight
        q.data, k.data = k.data.clone(), q.data.clone()
    wrong_theta = load_checkpoint(tmp_path, dtype=dtype)
    for layer in wrong_theta.model.layers:
        layer.self_attn.rotary_emb.theta = 1e4
    for name, model in (("q/k norms swapped", swapped), ("rope_theta 1e4", wrong_theta)):
        diff = (_ours(model, ids, cu) - truth).abs().max().item()
        assert diff > 10 * TOLERANCE[dtype], f"{name}: {diff:.4g} is within 10x the tolerance"


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_transformers_reads_what_rlkernel_saves(tmp_path, tied) -> None:
    hf = _hf_model(tied, torch.bfloat16, seed=2).to(torch.bfloat16)
    hf.save_pretrained(tmp_path / "hf")
    ours = load_checkpoint(tmp_path / "hf")
    save_checkpoint(ours, tmp_path / "ours", max_shard_size=64 * 1024)  # several shards + index
    assert (tmp_path / "ours" / "model.safetensors.index.json").exists()
    back = HFQwen3ForCausalLM.from_pretrained(tmp_path / "ours", local_files_only=True).to(torch.bfloat16)
    assert back.config.tie_word_embeddings is tied
    theirs = back.state_dict()
    for name, t in state_dict_hf(ours):
        assert_same_bits(t, theirs[name], name)
    assert_same_bits(back.lm_head.weight.data, hf.lm_head.weight.data, "lm_head")
