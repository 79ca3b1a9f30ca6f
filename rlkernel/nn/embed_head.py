"""Vocabulary-parallel token embedding and LM head (log-probabilities and entropy without full logits)."""

from __future__ import annotations

import torch
from torch import nn

from rlkernel import grads
from rlkernel.distributed import all_reduce_exact
from rlkernel.nn.linear import ShardId, frozen
from rlkernel.nn.opset import OpsUser
from rlkernel.nn.parallel import combine_owned, divide, gather_cat, max_fp32, tp_rank_size
from rlkernel.ops import (
    embedding,
    token_entropy,
    token_logprobs_backward_finish,
    token_logprobs_backward_partial,
    token_logprobs_finish,
    token_logprobs_partial,
)

__all__ = ["ParallelLMHead", "VocabParallelEmbedding"]


class VocabParallelEmbedding(OpsUser, nn.Module):
    """Token embedding with the vocabulary sharded over the tensor-parallel ranks.

    Parameters
    ----------
    num_embeddings : int
        V, the whole vocabulary; must divide by the TP degree.
    embedding_dim : int
        H.
    group : ProcessGroup, optional
        Tensor-parallel group; None = no tensor parallelism.
    dtype : torch.dtype
        bfloat16 (default), float16 or float32.
    device : torch.device or str, optional

    Rank r holds rows ``[r V/tp, (r+1) V/tp)`` (``vocab_start`` .. ``vocab_end``).

    Forward: ids ``[*]`` int64/int32 in ``[0, V)`` -> ``[*, H]`` (dtype). Each rank gathers the
    rows it owns (``rlkernel.ops.embedding``) and puts +0 elsewhere; the ranks' bit patterns are
    summed as integers (:func:`~rlkernel.nn.parallel.combine_owned`), so every rank gets the
    embedding rows' exact bits, as with one rank.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, group: object = None,
                 dtype: torch.dtype = torch.bfloat16, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.group = group
        self.tp_rank, self.tp_size = tp_rank_size(group)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.shard_size = divide(num_embeddings, self.tp_size, "vocab_size")
        self.vocab_start = self.tp_rank * self.shard_size
        self.vocab_end = self.vocab_start + self.shard_size
        self.weight = frozen((self.shard_size, embedding_dim), dtype, device)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        self.weight.weight_gatherer = self.weight_gatherer  # type: ignore[attr-defined]
        self.weight.shard_ids = (None,)  # type: ignore[attr-defined]

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        """Copy rows ``vocab_start .. vocab_end`` of the whole ``[V, H]`` checkpoint tensor."""
        if tuple(loaded.shape) != (self.num_embeddings, self.embedding_dim):
            raise ValueError(f"{type(self).__name__}: the checkpoint tensor has shape {tuple(loaded.shape)}; "
                             f"expected [vocab_size, hidden_size] = [{self.num_embeddings}, {self.embedding_dim}] "
                             f"(check config.json's vocab_size and hidden_size)")
        param.data.copy_(loaded.narrow(0, self.vocab_start, self.shard_size))

    def weight_gatherer(self, param: nn.Parameter) -> dict[ShardId, torch.Tensor]:
        """The whole ``[V, H]`` table (gathered over the ranks)."""
        return {None: gather_cat(param.data, 0, self.group)}

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self.ops.embedding(ids, self.weight)
        if ids.numel():
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= self.num_embeddings:
                raise ValueError(f"{type(self).__name__}: ids span [{lo}, {hi}]; expected token ids in [0, "
                                 f"{self.num_embeddings}) (vocab_size)")
        local = ids - self.vocab_start
        mine = (local >= 0) & (local < self.shard_size)
        rows = embedding(torch.where(mine, local, torch.zeros_like(local)), self.weight)
        rows = torch.where(mine.unsqueeze(-1), rows, torch.zeros((), dtype=rows.dtype, device=rows.device))
        return combine_owned(rows, self.group)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, rows=[{self.vocab_start}, {self.vocab_end}), "
                f"tp={self.tp_rank}/{self.tp_size}")


class ParallelLMHead(VocabParallelEmbedding):
    """The LM head ``[V, H]`` (nn.Linear layout), vocabulary-sharded like the embedding.

    Tied embeddings share the :class:`VocabParallelEmbedding`'s parameter (same shards).

    Forward (= :meth:`logprobs`): ``(hidden [T, H], targets [T] int64, temperature=1.0)`` ->
    float32 ``[T]``, ``log softmax(hidden @ W.T / temperature)[targets]``, through
    ``rlkernel.ops.token_logprobs`` (one rank) or its vocabulary-sharded sub-ops (TP): the
    ``[T, V]`` logits are never held whole, and every TP degree gives the one-rank bits.
    :meth:`logits` computes the whole fp32 logits of a few rows, for sampling.

    :meth:`entropy`: ``-sum_v p_v log p_v`` of each row's next-token distribution through
    ``rlkernel.ops.token_entropy`` (contract ``token_entropy`` v1: two exact sums over the
    vocabulary, differentiable in the hidden states and the head), on one rank only: no sharded
    entropy sub-ops exist yet, so TP > 1 raises.
    """

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor,  # type: ignore[override]
                temperature: float = 1.0) -> torch.Tensor:
        return self.logprobs(hidden, targets, temperature)

    def logprobs(self, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """Log-probability of each target token; see the class docstring.

        Parameters
        ----------
        hidden : Tensor, the head's dtype, [T, H]
            Final hidden states (after the model's last norm).
        targets : Tensor, int64, [T]
            Token ids in ``[0, V)``.
        temperature : float
            Logits are divided by ``fp32(temperature)`` (> 0), as in sampling.

        Returns
        -------
        Tensor, float32, [T]

        Bitwise semantics
        -----------------
        Contract ``token_logprobs`` v1. Under TP: phase 1 row max per shard -> exact fp32 MAX over
        the ranks (:func:`~rlkernel.nn.parallel.max_fp32`) -> phase 2 integer sum of
        probabilities and the target's ``z - m`` -> int64 SUM (the target's bit pattern is owned
        by one rank) -> ``token_logprobs_finish``: the bits of ``token_logprobs`` on the whole
        vocabulary.
        """
        if self.tp_size == 1:
            return self.ops.token_logprobs(hidden, self.weight, targets, temperature)
        if torch.is_grad_enabled() and (hidden.requires_grad or self.weight.requires_grad):
            out: torch.Tensor = _ShardedLogprobs.apply(hidden, self.weight, targets, temperature, self.vocab_start,
                                                       self.group)
            return out
        return _sharded_logprobs(hidden, self.weight, targets, temperature, self.vocab_start, self.group)[0]

    def entropy(self, hidden: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """Entropy of each row's next-token distribution ``softmax(hidden @ W.T / temperature)``.

        Parameters
        ----------
        hidden : Tensor, the head's dtype, [T, H]
            Final hidden states (after the model's last norm).
        temperature : float
            Logits are divided by ``fp32(temperature)`` (> 0), as in sampling.

        Returns
        -------
        Tensor, float32, [T]

        Raises
        ------
        NotImplementedError
            Under tensor parallelism (``tp_size > 1``): the vocabulary-sharded entropy (exact
            partial sums merged over the ranks) is not defined yet.

        Bitwise semantics
        -----------------
        Contract ``token_entropy`` v1 (``rlkernel.ops.token_entropy``): ``H = log_c(L) + U / L``
        with ``L`` token_logprobs' exact normaliser and ``U`` the exact grid sum of ``p (m - z)``;
        a row's result depends only on that row. Differentiable (``token_entropy_backward``).
        """
        if self.tp_size != 1:
            raise NotImplementedError(
                f"ParallelLMHead.entropy: tensor parallelism (tp_size = {self.tp_size}) is not supported: the "
                f"vocabulary-sharded entropy (token_entropy partial/finish ops) is not defined yet; compute "
                f"entropy with tp_size = 1, or gather the head's weight and call rlkernel.ops.token_entropy")
        return token_entropy(hidden, self.weight, temperature)

    def logprobs_of_logits(self, logits: torch.Tensor, targets: torch.Tensor,
                           temperature: float = 1.0) -> torch.Tensor:
        """:meth:`logprobs` of rows whose whole logits :meth:`logits` already made (the sampled tokens').

        Parameters
        ----------
        logits : Tensor, float32, [B, V]
            :meth:`logits` of the rows (identical on every rank).
        targets : Tensor, int64, [B]
            Token ids in ``[0, V)``.
        temperature : float
            As in :meth:`logprobs` (> 0).

        Returns
        -------
        Tensor, float32, [B]: the bits :meth:`logprobs` gives for the hidden rows of ``logits``.

        Raises
        ------
        TypeError
            logits not float32 [B, V].
        ValueError
            targets not int64 [B] or an id outside [0, V); temperature not a finite value > 0.

        Bitwise semantics
        -----------------
        Contract ``token_logprobs`` v1 from its step 2 on: ``z = logits / fp32(temperature)`` (one
        IEEE fp32 division per element, by a device tensor; none for temperature 1, where it is
        the identity), then ``log_softmax(z)[targets]`` (contract ``log_softmax`` v1: the same max,
        ``exp_c``, exact fixed-point sum on the 2**-40 grid and ``log_c`` as token_logprobs' steps
        3-6, and the same NaN rows). Step 1, the fp32 logits, is :meth:`logits`. The rollout uses
        this to score the tokens it sampled without a second LM-head GEMM;
        ``tests/test_rollout.py`` checks it against :meth:`logprobs` bit for bit.
        """
        if logits.dtype != torch.float32 or logits.dim() != 2:
            raise TypeError(f"logprobs_of_logits: logits {logits.dtype}{list(logits.shape)}; expected float32 [B, V] "
                            f"as ParallelLMHead.logits returns")
        if targets.shape != (logits.shape[0],) or targets.dtype != torch.int64:
            raise ValueError(f"logprobs_of_logits: targets {targets.dtype}{list(targets.shape)}; expected int64 "
                             f"[{logits.shape[0]}], one token id per logits row")
        if targets.numel():
            lo, hi = (int(v) for v in torch.stack(torch.aminmax(targets)).tolist())
            if lo < 0 or hi >= logits.shape[1]:
                raise ValueError(f"logprobs_of_logits: target ids span [{lo}, {hi}]; expected ids in "
                                 f"[0, {logits.shape[1]}) (the vocabulary of the logits)")
        z = logits
        tau = float(torch.tensor(temperature, dtype=torch.float32))
        if not tau > 0.0 or tau == float("inf"):
            raise ValueError(f"logprobs_of_logits: temperature {temperature!r}; expected a finite fp32 value > 0")
        if tau != 1.0:
            z = z / torch.full((z.shape[0], 1), tau, dtype=torch.float32, device=z.device)
        lp = self.ops.log_softmax(z, dim=-1)
        return lp.gather(-1, targets.reshape(-1, 1)).reshape(-1)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Whole-vocabulary fp32 logits ``hidden @ W.T`` of a few rows (the next-token rows, for sampling).

        Parameters
        ----------
        hidden : Tensor, the head's dtype, [B, H]

        Returns
        -------
        Tensor, float32, [B, V], identical on every rank

        Bitwise semantics
        -----------------
        ``rlkernel.ops.linear`` with fp32 output per vocabulary shard (the P5 logits that
        ``token_logprobs`` also uses), gathered over the ranks by copies.
        """
        return gather_cat(self.ops.linear(hidden, self.weight, out_dtype=torch.float32), -1, self.group)


def _sharded_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
                      vocab_start: int, group: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The vocabulary-parallel forward: log-probs and the global row max and probability sum."""
    row_max = token_logprobs_partial(hidden, weight, targets, vocab_start, temperature)
    row_max = max_fp32(row_max, group)  # type: ignore[arg-type]
    sum_int, target_d = token_logprobs_partial(hidden, weight, targets, vocab_start, temperature, row_max=row_max)
    t = sum_int.shape[0]
    both = torch.cat([sum_int, target_d.view(torch.int32).to(torch.int64)])
    both = all_reduce_exact(both, "sum", group)
    sums = both[:t].contiguous()
    return token_logprobs_finish(sums, both[t:].to(torch.int32).view(torch.float32)), row_max, sums


class _ShardedLogprobs(torch.autograd.Function):
    """Autograd of the vocabulary-parallel log-probs (contract ``token_logprobs_backward``, sharded form).

    ``d_hidden``: each rank's exact two-word part of the sum over its vocabulary rows on the global
    grids (exponents all-reduced with MAX, words with SUM), finished once: the one-rank bits.
    ``d_weight``: this rank's rows, one unit per sequence (:func:`rlkernel.grads.current_units`),
    summed exactly by :func:`rlkernel.grads.deposit`, as the one-rank head does.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, vocab_start, group):  # type: ignore[no-untyped-def,override]
        out, row_max, sums = _sharded_logprobs(hidden.detach(), weight.detach(), targets, temperature, vocab_start,
                                               group)
        ctx.save_for_backward(hidden, weight, targets, row_max, sums)
        ctx.temperature, ctx.vocab_start, ctx.group = temperature, vocab_start, group
        ctx.units = grads.current_units(hidden.shape[0])
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def,override]
        hidden, weight, targets, row_max, sums = ctx.saved_tensors
        g = grad.to(torch.float32).contiguous()
        tau, start, group = ctx.temperature, ctx.vocab_start, ctx.group
        need_w = bool(ctx.needs_input_grad[1])
        ec, ew = token_logprobs_backward_partial(g, hidden, weight, targets, start, row_max, sums, tau)[:2]
        assert ec is not None and ew is not None
        t = ec.shape[0]
        exps = all_reduce_exact(torch.cat([ec, ew]), "max", group)
        ec, ew = exps[:t].contiguous(), exps[t:].contiguous()
        spans = [(a, b) for a, b in zip(ctx.units, ctx.units[1:]) if b > a] if need_w else [(0, t)]
        his: list[torch.Tensor] = []
        los: list[torch.Tensor] = []
        units = grads.UnitStates(weight)
        for a, b in spans:
            hi, lo, dw = token_logprobs_backward_partial(g[a:b], hidden[a:b], weight, targets[a:b], start,
                                                         row_max[a:b], sums[a:b], tau, exponents=(ec[a:b], ew),
                                                         need_weight=need_w)
            assert hi is not None and lo is not None
            his.append(hi)
            los.append(lo)
            if dw is not None:
                units.add_terms(dw.unsqueeze(0))
        words = all_reduce_exact(torch.cat([torch.cat(his), torch.cat(los)]), "sum", group)
        dh = token_logprobs_backward_finish(words[:t], words[t:], ec, ew, hidden.dtype) if t else hidden.new_zeros(
            hidden.shape)
        gw = units.gradient() if need_w else None
        return (dh if ctx.needs_input_grad[0] else None), gw, None, None, None, None
