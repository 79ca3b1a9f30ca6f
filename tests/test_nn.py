"""rlkernel.nn on one process: each module gives the bits of the op it wraps, the TP classes without a
group (or with a one-rank view) give the bits of the plain ones, weight loaders place Hugging Face
tensors, and the batch description checks what the engine hands it. Multi-rank TP: test_model_tp.py."""

from __future__ import annotations

import math

import pytest
import torch
from qwen3_tiny import assert_same_bits, forward_only_one_thread

from rlkernel import ops
from rlkernel.nn import (
    Attention,
    AttentionMetadata,
    ColumnParallelLinear,
    KVCache,
    Linear,
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RMSNorm,
    RotaryEmbedding,
    RowParallelLinear,
    SiluAndMul,
    VocabParallelEmbedding,
)
from rlkernel.nn.parallel import divide, from_order_key, order_key

BF16 = torch.bfloat16


def _randn(seed: int, *shape: int, std: float = 1.0, dtype: torch.dtype = BF16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (std * torch.randn(shape, generator=g)).to(dtype)


@pytest.fixture(autouse=True)
def _forward_only():
    with forward_only_one_thread():
        yield


def test_linear_classes_without_group_give_the_bits_of_ops_linear() -> None:
    x, w, b = _randn(0, 5, 32), _randn(1, 24, 32, std=0.1), _randn(2, 24)
    expected = ops.linear(x, w, b)
    for cls in (Linear, ColumnParallelLinear, RowParallelLinear):
        layer = cls(32, 24, bias=True)
        layer.weight.weight_loader(layer.weight, w)
        layer.bias.weight_loader(layer.bias, b)
        assert not layer.weight.requires_grad
        assert_same_bits(expected, layer(x), cls.__name__)


def test_qkv_and_merged_loaders_place_each_checkpoint_tensor() -> None:
    hidden, d, hq, hkv = 32, 8, 4, 2
    q, k, v = _randn(3, hq * d, hidden), _randn(4, hkv * d, hidden), _randn(5, hkv * d, hidden)
    qkv = QKVParallelLinear(hidden, d, hq, hkv)
    for shard, t in (("v", v), ("q", q), ("k", k)):  # any order
        qkv.weight.weight_loader(qkv.weight, t, shard)
    x = _randn(6, 3, hidden)
    assert_same_bits(ops.linear(x, torch.cat([q, k, v])), qkv(x), "qkv")
    assert (qkv.q_size, qkv.kv_size) == (hq * d, hkv * d)
    gathered = qkv.weight.weight_gatherer(qkv.weight)
    for shard, t in (("q", q), ("k", k), ("v", v)):
        assert_same_bits(t, gathered[shard], f"gathered {shard}")

    gate, up = _randn(7, 40, hidden), _randn(8, 40, hidden)
    mlp = MergedColumnParallelLinear(hidden, [40, 40])
    mlp.weight.weight_loader(mlp.weight, up, 1)
    mlp.weight.weight_loader(mlp.weight, gate, 0)
    assert_same_bits(ops.silu_mul(ops.linear(x, gate), ops.linear(x, up)), SiluAndMul()(mlp(x)), "gate/up")


def test_loaders_refuse_wrong_shapes_and_shard_ids() -> None:
    qkv = QKVParallelLinear(32, 8, 4, 2)
    with pytest.raises(ValueError, match=r"k_proj: the checkpoint tensor has shape \(32, 32\); expected \[16, 32\]"):
        qkv.weight.weight_loader(qkv.weight, torch.zeros(32, 32, dtype=BF16), "k")
    with pytest.raises(ValueError, match="expected 'q', 'k' or 'v'"):
        qkv.weight.weight_loader(qkv.weight, torch.zeros(32, 32, dtype=BF16), "o")
    merged = MergedColumnParallelLinear(32, [16, 16])
    with pytest.raises(ValueError, match=r"part index in \[0, 2\)"):
        merged.weight.weight_loader(merged.weight, torch.zeros(16, 32, dtype=BF16), 2)
    with pytest.raises(TypeError, match="bfloat16 or torch.float16"):
        Linear(4, 4, dtype=torch.float32)


def test_tp_degree_must_divide_head_counts_and_vocab() -> None:
    with pytest.raises(ValueError, match="num_key_value_heads = 2 is not divisible by the TP degree 4"):
        divide(2, 4, "num_key_value_heads")
    assert divide(8, 4, "num_attention_heads") == 2


def test_embedding_norm_rope_silu_give_their_ops_bits() -> None:
    table = _randn(9, 50, 16)
    emb = VocabParallelEmbedding(50, 16)
    emb.weight.weight_loader(emb.weight, table)
    ids = torch.tensor([3, 49, 0, 3])
    assert_same_bits(ops.embedding(ids, table), emb(ids), "embedding")

    x = _randn(10, 6, 2, 16)
    norm = RMSNorm(16, eps=1e-5)
    gain = _randn(11, 16)
    norm.weight.weight_loader(norm.weight, gain)
    assert_same_bits(ops.rms_norm(x, gain, 1e-5), norm(x), "rms_norm")

    pos = torch.tensor([0, 5, 1, 7, 2, 300])
    q, k = RotaryEmbedding(16, 1e6, 512)(pos, x, x[:, :1])
    assert_same_bits(ops.rope(x, pos, 1e6), q, "rope q")
    assert_same_bits(ops.rope(x[:, :1], pos, 1e6), k, "rope k")

    with pytest.raises(ValueError, match="even last axis"):
        SiluAndMul()(x[..., :3])


def test_lm_head_logprobs_and_logits_are_the_ops() -> None:
    w, hidden = _randn(12, 40, 16, std=0.5), _randn(13, 5, 16)
    targets = torch.tensor([0, 39, 7, 7, 21])
    head = ParallelLMHead(40, 16)
    head.weight.weight_loader(head.weight, w)
    assert_same_bits(ops.token_logprobs(hidden, w, targets, 0.7), head(hidden, targets, 0.7), "logprobs")
    assert_same_bits(ops.linear(hidden, w, out_dtype=torch.float32), head.logits(hidden), "logits")


def test_order_key_orders_like_r5_max() -> None:
    values = [float("-inf"), -3.0, -1e-45, -0.0, 0.0, 1e-45, 2.5, float("inf"), float("nan")]
    x = torch.tensor(values, dtype=torch.float32)
    keys = order_key(x)
    assert keys.tolist() == sorted(keys.tolist())
    assert int(keys[3]) == int(keys[4]) == 0  # -0 and +0 compare equal
    back = from_order_key(keys)
    for i, value in enumerate(values):
        if math.isnan(value):
            assert int(back[i:i + 1].view(torch.int32)) == 0x7FC00000
        elif value == 0:
            assert int(back[i:i + 1].view(torch.int32)) == 0  # the max of zeros is +0
        else:
            assert_same_bits(x[i:i + 1], back[i:i + 1], f"round trip of {value}")


# ---------------------------------------------------------------------------- batch description
def test_metadata_positions_and_slots() -> None:
    packed = AttentionMetadata.packed([3, 0, 2])
    assert packed.cu_seqlens_q.tolist() == [0, 3, 3, 5]
    assert packed.positions().tolist() == [0, 1, 2, 0, 1]
    assert not packed.reads_cache

    table = torch.tensor([[5, 2, -1], [0, 7, 3]], dtype=torch.int32)
    paged = AttentionMetadata.paged([2, 1], [5, 9], table, block_size=4)
    assert paged.positions().tolist() == [3, 4, 8]
    # position 3 -> block 5 slot 3; position 4 -> block 2 slot 0; position 8 -> block 3 slot 0
    assert paged.slot_mapping.tolist() == [5 * 4 + 3, 2 * 4 + 0, 3 * 4 + 0]
    cache = KVCache.allocate(1, 8, 4, 1, 2)
    paged.validate(3, cache)

    decode = AttentionMetadata.decode([3, 9], table, block_size=4)
    assert decode.positions().tolist() == [2, 8] and decode.slot_mapping.tolist() == [5 * 4 + 2, 3 * 4 + 0]

    prefill = AttentionMetadata.prefill([2, 3], table, block_size=2)
    assert prefill.slot_mapping.tolist() == [10, 11, 0, 1, 14]
    assert prefill.positions().tolist() == [0, 1, 0, 1, 2]


def test_metadata_refuses_inconsistent_batches() -> None:
    table = torch.tensor([[1, 2]], dtype=torch.int32)
    cache = KVCache.allocate(1, 4, 2, 1, 2)
    meta = AttentionMetadata.paged([1], [3], table, block_size=2)
    with pytest.raises(ValueError, match="T = 2"):
        meta.validate(2, cache)
    with pytest.raises(ValueError, match="needs the KV cache"):
        meta.validate(1, None)
    with pytest.raises(ValueError, match="never written"):
        AttentionMetadata(meta.cu_seqlens_q, meta.context_lens, meta.block_tables,
                          torch.tensor([0])).validate(1, cache)
    with pytest.raises(ValueError, match="repeats a slot"):
        AttentionMetadata(torch.tensor([0, 2]), slot_mapping=torch.tensor([3, 3])).validate(2, cache)
    with pytest.raises(ValueError, match=r"expected slots in \[0, 8\)"):
        AttentionMetadata(torch.tensor([0, 1]), slot_mapping=torch.tensor([8])).validate(1, cache)
    with pytest.raises(ValueError, match="widen block_tables"):
        AttentionMetadata.paged([1], [5], table, block_size=2)
    with pytest.raises(ValueError, match="must be >= the query length"):
        AttentionMetadata.paged([4], [3], table, block_size=2)


def test_attention_module_packed_prefill_then_paged_decode() -> None:
    """A sequence's last query gives the same bits in the packed forward and as a decode step over
    the cache its prefill wrote (shuffled blocks, block size 3)."""
    hq, hkv, d, n = 4, 2, 16, 7
    q, k, v = _randn(20, n, hq, d), _randn(21, n, hkv, d), _randn(22, n, hkv, d)
    attn = Attention(hq, hkv, d)
    whole = attn(q, k, v, AttentionMetadata.packed([n]))
    cache = KVCache.allocate(1, 6, 3, hkv, d)
    table = torch.tensor([[4, 0, 2]], dtype=torch.int32)
    attn(q[:-1], k[:-1], v[:-1], AttentionMetadata.prefill([n - 1], table, 3), cache.layer(0))
    step = attn(q[-1:], k[-1:], v[-1:], AttentionMetadata.paged([1], [n], table, 3), cache.layer(0))
    assert_same_bits(whole[-1:], step, "decode step vs packed")
    assert_same_bits(k[4:6], cache.k[0, 0, 1:3], "keys of positions 4, 5: logical block 1 = block 0, slots 1, 2")
    assert_same_bits(k[6], cache.k[0, 2, 0], "key of position 6: logical block 2 = block 2, slot 0")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_residual_add_is_the_fp32_add_rounded_once(dtype: torch.dtype) -> None:
    """``residual_add`` (torch's one-kernel half-precision add on CPU and CUDA) has the bits of the
    spelled-out ``RN(fp32(a) + fp32(b))`` for random bit patterns (NaN, inf, subnormals included),
    near-cancelling pairs and exact ties."""
    from rlkernel.model.qwen3 import residual_add

    g = torch.Generator().manual_seed(11)
    a = torch.randint(-(1 << 15), 1 << 15, (1 << 20,), dtype=torch.int16, generator=g).view(dtype)
    near = (a.view(torch.int16) + torch.randint(-300, 300, a.shape, dtype=torch.int16, generator=g)).view(dtype)
    b = torch.randint(-(1 << 15), 1 << 15, a.shape, dtype=torch.int16, generator=g).view(dtype)
    one = torch.ones_like(a)
    for other in (b, near, -near, a, one):
        want = (a.float() + other.float()).to(dtype)
        got = residual_add(a, other)
        assert got.dtype == dtype
        assert torch.equal(want.view(torch.int16), got.view(torch.int16)), f"{dtype}: bits differ"
