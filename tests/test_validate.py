"""``rlkernel validate``: record/replay, the layer-by-layer check, the transformers baseline and the CLI.

Every check here can fail: a flipped log-prob bit must be counted, a flipped activation bit
must be named at its layer and op, a record of other weights must be refused.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from qwen3_tiny import forward_only_one_thread
from safetensors import safe_open
from safetensors.torch import save_file

from rlkernel.cli import main
from rlkernel.rollout import SamplingParams
from rlkernel.validate import (
    HashMismatch,
    compare_layers,
    config_sha256,
    load_record,
    model_sha256,
    random_model,
    replay,
    save_record,
)
from rlkernel.validate.generate import make_prompts, record_rollout
from rlkernel.validate.record import Record

ENGINE_BATCHES = (1, 3, 8)
MICRO_BATCHES = (1, 3, 8)


@pytest.fixture(autouse=True)
def _forward_only():
    with forward_only_one_thread():
        yield


@pytest.fixture(scope="module")
def model():
    return random_model("tiny", seed=0)


@pytest.fixture(scope="module")
def records(model) -> dict[int, Record]:
    """One rollout per engine batch size: 4 prompts of mixed lengths x 2 samples, a stop token, 6 tokens."""
    prompts = make_prompts(4, 3, 20, model.config.vocab_size, seed=1)
    params = [SamplingParams(temperature=0.9, top_k=40 if i % 2 else 0, max_tokens=6, n=2, seed=100 + i,
                             stop_token_ids=(7,)) for i in range(len(prompts))]
    hashes = {"model_sha256": model_sha256(model), "config_sha256": config_sha256(model.config)}
    with forward_only_one_thread():
        return {eb: record_rollout(model, prompts, params, engine_batch=eb, max_model_len=32, **hashes)
                for eb in ENGINE_BATCHES}


def test_replay_has_zero_mismatches_in_every_batching(model, records) -> None:
    first = records[ENGINE_BATCHES[0]]
    assert len(first.samples) == 8 and first.num_tokens > 8
    for eb, rec in records.items():  # the engine batch changes no token and no bit
        assert (rec.tokens_sha256(), rec.logprobs_sha256()) == (first.tokens_sha256(), first.logprobs_sha256()), eb
        for k, mb in enumerate(MICRO_BATCHES):
            res = replay(model, rec, mb, order_seed=k)
            assert res.tokens == rec.num_tokens and res.sequences == 8
            assert res.mismatches == 0, [m.describe() for m in res.first_mismatches]
            assert res.ratio == {"max": 0.0, "p50": 0.0, "p99": 0.0, "mean": 0.0}


def test_replay_counts_a_flipped_logprob_bit(model, records) -> None:
    rec = copy.deepcopy(records[3])
    rec.samples[5].logprobs[1:2].view(torch.int32).bitwise_xor_(1)  # one ulp on one token
    res = replay(model, rec, 3)
    assert res.mismatches == 1
    assert (res.first_mismatches[0].sample, res.first_mismatches[0].position) == (5, 1)
    assert 0 < res.ratio["max"] < 1e-6


def test_record_round_trip_and_hash_check(tmp_path, model, records) -> None:
    rec = records[8]
    path = save_record(rec, tmp_path / "rollout.safetensors")
    back = load_record(path)
    assert back.prompts == rec.prompts and back.sampling_params == rec.sampling_params
    assert (back.model_sha256, back.config_sha256, back.dtype) == (rec.model_sha256, rec.config_sha256, "bfloat16")
    for a, b in zip(rec.samples, back.samples):
        assert (a.prompt_index, a.sample_index, a.token_ids, a.finish_reason, a.seed) == \
            (b.prompt_index, b.sample_index, b.token_ids, b.finish_reason, b.seed)
        assert torch.equal(a.logprobs.view(torch.int32), b.logprobs.view(torch.int32))
    assert back.meta["engine"]["max_num_seqs"] == 8
    ours = (model_sha256(model), config_sha256(model.config))
    assert replay(model, back, 2, check_hashes=ours).mismatches == 0

    other = random_model("tiny", seed=1)  # same config, other weights
    with pytest.raises(HashMismatch, match="model_sha256"):
        replay(other, back, check_hashes=(model_sha256(other), config_sha256(other.config)))
    with pytest.raises(HashMismatch, match="config_sha256"):
        back.check_model(ours[0], "0" * 64)

    with safe_open(str(path), framework="pt") as f:  # one log-prob bit changed under the recorded hash
        tensors, metadata = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    tensors["logprobs"][3:4].view(torch.int32).bitwise_xor_(1)
    save_file(tensors, str(tmp_path / "damaged.safetensors"), metadata=metadata)
    with pytest.raises(ValueError, match="damaged"):
        load_record(tmp_path / "damaged.safetensors")
    save_file({"x": torch.zeros(1)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(ValueError, match="rlkernel.validate"):
        load_record(tmp_path / "plain.safetensors")


def _sequences(rec: Record, k: int) -> tuple[list[list[int]], list[int]]:
    samples = rec.samples[:k]
    return ([rec.prompts[s.prompt_index] + s.token_ids for s in samples],
            [len(rec.prompts[s.prompt_index]) for s in samples])


@pytest.mark.parametrize("chunk", [None, 5], ids=["prefill", "chunked"])
def test_layers_agree(model, records, chunk) -> None:
    seqs, plens = _sequences(records[1], 4)
    report = compare_layers(model, seqs, plens, prefill_chunk=chunk, temperature=0.9)
    assert report.ok, report.first_difference
    assert len(report.ops) == 3 + 14 * model.config.num_hidden_layers
    assert all(op.tokens > 0 and op.elements >= op.tokens for op in report.ops)


def _flip_one_bit(module: torch.nn.Module) -> None:
    forward = module.forward

    def flipped(*args):
        out = forward(*args).clone()
        bits = out.view(-1).view({2: torch.int16, 4: torch.int32}[out.element_size()])
        bits[bits.numel() // 2] ^= 1
        return out

    module.forward = flipped


@pytest.mark.parametrize(("side", "path", "layer", "op"), [
    ("trainer", "mlp.act_fn", 1, "act"),
    ("trainer", "self_attn.k_norm", 0, "k_norm"),
    ("rollout", "self_attn.o_proj", 1, "o_proj"),
])
def test_layers_name_the_perturbed_op(model, records, side, path, layer, op) -> None:
    seqs, plens = _sequences(records[1], 3)
    perturbed = copy.deepcopy(model)
    _flip_one_bit(perturbed.model.layers[layer].get_submodule(path))
    if side == "trainer":
        report = compare_layers(model, seqs, plens, trainer_model=perturbed)
    else:
        report = compare_layers(perturbed, seqs, plens, trainer_model=model)
    assert not report.ok
    first = report.first_difference
    assert (first.layer, first.op) == (layer, op), first
    assert first.differing_elements >= 1 and first.first_token is not None
    before = report.ops[:report.ops.index(first)]
    assert before and all(o.differing_elements == 0 for o in before)


def test_baseline_transformers_reports_its_numbers(model) -> None:
    pytest.importorskip("transformers")
    from rlkernel.validate.baseline import run_baseline

    prompts = make_prompts(3, 3, 12, model.config.vocab_size, seed=2)
    params = [{"temperature": 1.0, "top_k": 0, "top_p": 1.0, "max_tokens": 5, "stop_token_ids": [],
               "n": 2, "seed": i, "ignore_eos": False} for i in range(3)]
    res = run_baseline(model, prompts, params, dtype=torch.float32, engine_batch=4, micro_batch_sizes=[1, 4])
    assert (res.sequences, res.tokens, res.dtype) == (6, 30, "float32")
    assert res.rollout_seconds > 0 and res.tokens_per_s > 0
    assert [r["micro_batch_size"] for r in res.replays] == [1, 4]
    for r in res.replays:
        assert 0 <= r["mismatches"] <= r["tokens"] == 30 and r["seconds"] > 0
        assert set(r["ratio"]) == {"max", "p50", "p99", "mean"}
        assert 0 <= r["ratio"]["p50"] <= r["ratio"]["p99"] <= r["ratio"]["max"] < 0.5  # same weights: close


def test_baseline_without_transformers_says_how_to_install(monkeypatch, model) -> None:
    from rlkernel.validate.baseline import hf_model

    monkeypatch.setitem(__import__("sys").modules, "transformers", None)
    with pytest.raises(ImportError, match=r"rlkernel\[test\]"):
        hf_model(model, torch.float32)


def test_cli_end_to_end(tmp_path, capsys) -> None:
    pytest.importorskip("transformers")
    rec, out = tmp_path / "rollout.safetensors", tmp_path / "report"
    common = ["--num-prompts", "3", "--group-size", "2", "--prompt-len", "3:10", "--max-tokens", "4"]
    status = main(["validate", *common, "--engine-batch", "1,4", "--train-micro-batch", "1",
                   "--train-micro-batch", "5", "--layers", "--layers-sequences", "2", "--baseline", "transformers",
                   "--baseline-dtype", "float32", "--record", str(rec), "--out", str(out)])
    printed = capsys.readouterr().out
    assert status == 0, printed
    doc = json.loads((out / "report.json").read_text())
    assert doc["ok"] and doc["summary"]["mismatches"] == 0 and doc["summary"]["tokens_compared"] == 4 * 24
    assert doc["engine_invariance"]["ok"] and doc["layers"]["ok"]
    assert doc["hashes"]["sequences"] == 6 and doc["hashes"]["tokens"] == 24
    assert doc["command"][:2] == ["rlkernel", "validate"] and doc["environment"]["torch"] == torch.__version__
    assert [r["micro_batch_size"] for r in doc["baseline"]["replays"]] == [1, 5]
    assert {t["micro_batch_size"] for t in doc["timing"]["trainer"]} == {1, 5}
    md = (out / "report.md").read_text()
    assert "rlkernel validate: OK" in md and doc["hashes"]["logprobs_sha256"] in md and "transformers" in md
    assert f"logprobs sha256 {doc['hashes']['logprobs_sha256']}" in printed

    # replay of the record: the same log-probs, no rollout
    assert main(["validate", "--replay", str(rec), "--baseline", "none", "--train-micro-batch", "2"]) == 0
    assert doc["hashes"]["logprobs_sha256"] in capsys.readouterr().out
    # a record of other weights is refused with a usage error
    assert main(["validate", "--replay", str(rec), "--seed", "1", "--baseline", "none"]) == 2
    assert "model_sha256" in capsys.readouterr().err
    # a record whose log-probs do not match the model fails the run
    bad = load_record(rec)
    assert bad.meta["command"][:2] == ["rlkernel", "validate"] and bad.meta["model_source"] == "random tiny (seed 0)"
    bad.samples[0].logprobs[0:1].view(torch.int32).bitwise_xor_(1)
    save_record(bad, tmp_path / "bad.safetensors")
    assert main(["validate", "--replay", str(tmp_path / "bad.safetensors"), "--baseline", "none"]) == 1
    assert "FAILED: 3 mismatches" in capsys.readouterr().out  # one token, three micro-batch sizes
