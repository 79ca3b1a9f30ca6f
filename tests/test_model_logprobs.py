"""The promise of issue 10 on a tiny Qwen3: a token's log-prob has the same bits in the trainer's
packed forward and in the rollout's prefill + decode over the paged KV cache, whatever the batch
composition, packing, micro-batch size, chunking, block size and block placement on either side.

All comparisons are on bytes. The rollout side is played by ``qwen3_tiny.rollout`` (continuous
batching with requests joining as others leave); the trainer side is ``rlkernel.rl.packed_logprobs``.
"""

from __future__ import annotations

import random

import pytest
import torch
from qwen3_tiny import (
    assert_same_bits,
    forward_only_one_thread,
    random_weights,
    rollout,
    tiny_config,
    write_checkpoint,
)

from rlkernel.model import load_checkpoint
from rlkernel.rl import micro_batches, packed_logprobs

PROMPT_LENS = [5, 1, 7, 3, 4, 2, 6, 3]
TOTAL_LENS = [9, 4, 11, 6, 12, 5, 8, 10]


@pytest.fixture(autouse=True)
def _forward_only():
    with forward_only_one_thread():
        yield


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    config = tiny_config()
    path = write_checkpoint(tmp_path_factory.mktemp("qwen3"), config, random_weights(config, seed=0))
    return load_checkpoint(path)


@pytest.fixture(scope="module")
def sequences() -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in TOTAL_LENS]


def _pack(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    cu = [0]
    for s in seqs:
        cu.append(cu[-1] + len(s))
    return torch.tensor(sum(seqs, []), dtype=torch.int64), torch.tensor(cu, dtype=torch.int32)


def _per_sequence(logprobs: torch.Tensor, cu: torch.Tensor) -> list[torch.Tensor]:
    """Tokens 1 .. n-1 of each sequence (the first has no prediction)."""
    return [logprobs[int(cu[b]) + 1:int(cu[b + 1])] for b in range(len(cu) - 1)]


@pytest.fixture(scope="module")
def reference(model, sequences) -> list[torch.Tensor]:
    """The trainer's log-probs of all 8 sequences in one packed forward."""
    with torch.no_grad():
        ids, cu = _pack(sequences)
        return _per_sequence(packed_logprobs(model, ids, cu), cu)


def test_micro_batches_split_in_order() -> None:
    assert micro_batches([3, 4, 5, 1], micro_batch_size=3) == [[0, 1, 2], [3]]
    assert micro_batches([3, 4, 5, 1], max_tokens=7) == [[0, 1], [2, 3]]
    assert micro_batches([9, 1], max_tokens=4) == [[0], [1]]
    with pytest.raises(ValueError, match="micro_batch_size = 0"):
        micro_batches([1], micro_batch_size=0)


@pytest.mark.parametrize("micro_batch_size, max_tokens, head_chunk_size, permute", [
    (1, None, None, False), (3, None, 4, False), (None, 25, None, True), (8, None, 1, True)],
    ids=["mbs1", "mbs3-head4", "max25tokens-permuted", "mbs8-head1-permuted"])
def test_trainer_bits_do_not_depend_on_micro_batching(model, sequences, reference, micro_batch_size, max_tokens,
                                                      head_chunk_size, permute) -> None:
    order = list(range(len(sequences)))
    if permute:
        random.Random(3).shuffle(order)
    ids, cu = _pack([sequences[b] for b in order])
    got = _per_sequence(packed_logprobs(model, ids, cu, micro_batch_size=micro_batch_size, max_tokens=max_tokens,
                                        head_chunk_size=head_chunk_size), cu)
    for k, b in enumerate(order):
        assert_same_bits(reference[b], got[k], f"sequence {b} packed at {k}")


@pytest.mark.parametrize("max_batch, chunk, block_size, packed_prefill, shuffled", [
    (8, None, 4, True, False),
    (3, 2, 3, True, True),
    (1, 3, 2, True, False),
    (8, 1, 5, False, True),
], ids=["batch8-prefill-decode", "batch3-chunked2-block3", "batch1-chunked3-block2", "batch8-token-by-token-block5"])
def test_rollout_logprobs_equal_trainer_bits(model, sequences, reference, max_batch, chunk, block_size,
                                             packed_prefill, shuffled) -> None:
    order = list(range(len(sequences)))
    if shuffled:
        random.Random(max_batch).shuffle(order)
    got, tokens = rollout(model, sequences, PROMPT_LENS, TOTAL_LENS, max_batch=max_batch, chunk=chunk,
                          block_size=block_size, num_blocks=64, seed=block_size, order=order,
                          packed_prefill=packed_prefill)
    assert tokens == sequences  # teacher-forced: nothing was sampled
    for b in range(len(sequences)):
        assert_same_bits(reference[b], got[b], f"sequence {b} (prompt {PROMPT_LENS[b]}, length {TOTAL_LENS[b]})")


def test_generation_is_batch_invariant_and_the_trainer_replays_it(tmp_path) -> None:
    """Sampled rollouts (tied head, temperature 0.8): the same tokens and log-probs with 8 or 3
    sequences in flight, and the trainer's log-probs of the generated sequences equal them."""
    config = tiny_config(tie_word_embeddings=True)
    tied = load_checkpoint(write_checkpoint(tmp_path, config, random_weights(config, seed=1)))
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in PROMPT_LENS]
    runs = [rollout(tied, prompts, PROMPT_LENS, TOTAL_LENS, max_batch=m, chunk=c, block_size=4, num_blocks=48,
                    seed=m, temperature=0.8) for m, c in ((8, None), (3, 2))]
    first_lp, first_tokens = runs[0]
    assert [len(t) for t in first_tokens] == TOTAL_LENS
    for k, (lp, tokens) in enumerate(runs[1:], 1):
        assert tokens == first_tokens, f"run {k} sampled different tokens"
        for b in range(len(prompts)):
            assert_same_bits(first_lp[b], lp[b], f"run {k} sequence {b}")
    ids, cu = _pack(first_tokens)
    trainer = _per_sequence(packed_logprobs(tied, ids, cu, temperature=0.8, micro_batch_size=3), cu)
    for b in range(len(prompts)):
        assert_same_bits(trainer[b], first_lp[b], f"trainer vs rollout, sequence {b}")
