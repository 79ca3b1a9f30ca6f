"""Hugging Face checkpoint directories: config.json parsing, loading (one file or shards with an index,
lazily, tied or untied, fp32 or bf16 on disk) and saving in the same format; checkpoints are written
with safetensors directly (qwen3_tiny.write_checkpoint), and what rlkernel saves is read back with
safetensors directly."""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest
import torch
from qwen3_tiny import (
    assert_same_bits,
    forward_only_one_thread,
    hf_shapes,
    random_weights,
    tiny_config,
    write_checkpoint,
)
from safetensors import safe_open

import rlkernel.model.loader as loader_module
from rlkernel.model import (
    AttentionMetadata,
    Qwen3Config,
    Qwen3ForCausalLM,
    load_checkpoint,
    save_checkpoint,
    state_dict_hf,
)


@pytest.fixture(autouse=True)
def _forward_only():
    with forward_only_one_thread():
        yield


def _assert_weights(expected: dict[str, torch.Tensor], model: Qwen3ForCausalLM) -> None:
    got = dict(state_dict_hf(model))
    assert set(got) == set(expected), f"names differ: {sorted(set(got) ^ set(expected))}"
    for name, t in expected.items():
        assert_same_bits(t, got[name], name)


def _read_dir(path) -> dict[str, torch.Tensor]:
    """Every tensor of a saved directory, read with safetensors directly (following the index if any)."""
    index = path / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() \
        else ["model.safetensors"]
    out = {}
    for file in files:
        with safe_open(str(path / file), framework="pt") as f:
            assert f.metadata() == {"format": "pt"}
            out.update({name: f.get_tensor(name) for name in f.keys()})
    return out


def test_single_file_and_sharded_checkpoints_load_the_same_weights(tmp_path) -> None:
    config = tiny_config()
    tensors = random_weights(config, seed=2)
    one = load_checkpoint(write_checkpoint(tmp_path / "one", config, tensors))
    three = Qwen3ForCausalLM.from_pretrained(write_checkpoint(tmp_path / "three", config, tensors, files=3))
    _assert_weights(tensors, one)
    _assert_weights(tensors, three)
    assert one.config == three.config == Qwen3Config.from_dict(config)


def test_loading_opens_one_shard_file_at_a_time(tmp_path, monkeypatch) -> None:
    config = tiny_config()
    path = write_checkpoint(tmp_path, config, random_weights(config, seed=3), files=4)
    open_now, most, opened = [0], [0], []
    real = loader_module.safe_open

    @contextmanager
    def counting(file, **kwargs):
        open_now[0] += 1
        most[0] = max(most[0], open_now[0])
        opened.append(file)
        try:
            with real(file, **kwargs) as f:
                yield f
        finally:
            open_now[0] -= 1

    monkeypatch.setattr(loader_module, "safe_open", counting)
    load_checkpoint(path)
    assert most[0] == 1 and len(opened) == 4


def test_fp32_checkpoint_is_rounded_to_bf16_once(tmp_path) -> None:
    config = tiny_config(torch_dtype="float32")
    tensors = random_weights(config, seed=4, dtype=torch.float32)
    model = load_checkpoint(write_checkpoint(tmp_path, config, tensors))
    _assert_weights({n: t.to(torch.bfloat16) for n, t in tensors.items()}, model)


def test_tied_checkpoints_share_the_embedding(tmp_path) -> None:
    config = tiny_config(tie_word_embeddings=True)
    tensors = random_weights(config, seed=5)
    assert "lm_head.weight" not in tensors
    model = load_checkpoint(write_checkpoint(tmp_path / "a", config, tensors))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    _assert_weights(tensors, model)
    # a tied checkpoint that also stores lm_head.weight (some do): ignored, as transformers does
    extra = {**tensors, "lm_head.weight": torch.zeros_like(tensors["model.embed_tokens.weight"])}
    _assert_weights(tensors, load_checkpoint(write_checkpoint(tmp_path / "b", config, extra)))


def test_save_writes_the_hugging_face_layout(tmp_path) -> None:
    config = tiny_config(attention_bias=True)
    tensors = random_weights(config, seed=6)
    model = load_checkpoint(write_checkpoint(tmp_path / "src", config, tensors))
    written = save_checkpoint(model, tmp_path / "one")
    assert sorted(p.name for p in written) == ["config.json", "model.safetensors"]
    for name, t in _read_dir(tmp_path / "one").items():
        assert_same_bits(tensors[name], t, f"saved {name}")
    assert set(_read_dir(tmp_path / "one")) == set(tensors)

    biggest = max(t.numel() * t.element_size() for t in tensors.values())
    written = save_checkpoint(model, tmp_path / "sharded", max_shard_size=biggest)
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    assert set(index["weight_map"]) == set(tensors)
    saved = _read_dir(tmp_path / "sharded")
    for name, t in tensors.items():
        assert_same_bits(t, saved[name], f"sharded {name}")
    config_back = json.loads((tmp_path / "sharded" / "config.json").read_text())
    assert config_back["torch_dtype"] == "bfloat16" and config_back["architectures"] == ["Qwen3ForCausalLM"]
    reloaded = load_checkpoint(tmp_path / "sharded")
    assert reloaded.config == model.config
    _assert_weights(tensors, reloaded)


def test_load_errors_name_the_tensor_and_the_fix(tmp_path) -> None:
    config = tiny_config()
    tensors = random_weights(config, seed=7)
    missing = {n: t for n, t in tensors.items() if n != "model.layers.1.self_attn.k_proj.weight"}
    with pytest.raises(ValueError, match=r"no tensor for \['model.layers.1.self_attn.k_proj.weight'\]"):
        load_checkpoint(write_checkpoint(tmp_path / "missing", config, missing))
    extra = {**tensors, "model.layers.0.mlp.experts.0.weight": torch.zeros(2, 2, dtype=torch.bfloat16)}
    with pytest.raises(ValueError, match="tensors this Qwen3 model does not: .'model.layers.0.mlp.experts"):
        load_checkpoint(write_checkpoint(tmp_path / "extra", config, extra))
    wrong = {**tensors, "model.layers.0.mlp.down_proj.weight": torch.zeros(64, 64, dtype=torch.bfloat16)}
    shape = r"model.layers.0.mlp.down_proj.weight: .*shape \(64, 64\); expected \[64, 96\]"
    with pytest.raises(ValueError, match=shape):
        load_checkpoint(write_checkpoint(tmp_path / "wrong", config, wrong))
    untied_without_head = {n: t for n, t in tensors.items() if n != "lm_head.weight"}
    with pytest.raises(ValueError, match="lm_head.weight.*tie_word_embeddings"):
        load_checkpoint(write_checkpoint(tmp_path / "nohead", config, untied_without_head))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text(json.dumps(config))
    with pytest.raises(FileNotFoundError, match="no model.safetensors.index.json and no model.safetensors"):
        load_checkpoint(tmp_path / "empty")


def test_config_reads_both_transformers_spellings_and_refuses_what_it_cannot_run() -> None:
    v4 = Qwen3Config.from_dict(tiny_config(rope_theta=5e5))
    v5 = Qwen3Config.from_dict({k: v for k, v in tiny_config().items() if k != "rope_theta"}
                               | {"rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}})
    assert v4 == v5 and v4.rope_theta == 5e5
    no_head_dim = Qwen3Config.from_dict({k: v for k, v in tiny_config().items() if k != "head_dim"})
    assert no_head_dim.head_dim == 64 // 4
    assert Qwen3Config.from_dict(tiny_config(bos_token_id=3)).to_dict()["bos_token_id"] == 3
    with pytest.raises(ValueError, match="rope type 'yarn'"):
        Qwen3Config.from_dict(tiny_config(rope_scaling={"rope_type": "yarn", "factor": 4.0}))
    with pytest.raises(ValueError, match="sliding-window"):
        Qwen3Config.from_dict(tiny_config(use_sliding_window=True))
    with pytest.raises(ValueError, match="model_type = 'qwen3_moe'"):
        Qwen3Config.from_dict(tiny_config(model_type="qwen3_moe"))
    with pytest.raises(ValueError, match="not a multiple of num_key_value_heads = 3"):
        Qwen3Config.from_dict(tiny_config(num_key_value_heads=3))


def test_model_refuses_bad_inputs(tmp_path) -> None:
    config = tiny_config(max_position_embeddings=16)
    model = load_checkpoint(write_checkpoint(tmp_path, config, random_weights(config, seed=8)))
    meta = AttentionMetadata.packed([3])
    with pytest.raises(ValueError, match="input_ids is torch.int32"):
        model(torch.zeros(3, dtype=torch.int32), meta.positions(), meta)
    with pytest.raises(ValueError, match="below max_position_embeddings = 16"):
        model(torch.zeros(3, dtype=torch.int64), meta.positions() + 14, meta)
    with pytest.raises(ValueError, match="T = 4"):
        model(torch.zeros(4, dtype=torch.int64), torch.arange(4), meta)
    other = Qwen3ForCausalLM(Qwen3Config.from_dict(tiny_config(num_hidden_layers=1)))
    table = torch.tensor([[0]], dtype=torch.int32)
    paged = AttentionMetadata.paged([1], [1], table, 4)
    with pytest.raises(ValueError, match="kv_cache has .* expected"):
        model(torch.zeros(1, dtype=torch.int64), paged.positions(), paged, other.allocate_kv_cache(2, 4))
    assert set(hf_shapes(config)) == {n for n, _ in state_dict_hf(model)}
