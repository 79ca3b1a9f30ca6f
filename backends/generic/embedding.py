"""Device-generic ``embedding`` (contract ``embedding`` v1): a row gather, NaNs canonicalised."""

from __future__ import annotations

import torch

from rlkernel.backends.generic._exact.fp32 import canonical_nan


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Kernel ``embedding``: ids int64/int32 [L] in [0, V) (checked by the caller), weight [V, H] -> [L, H]."""
    return canonical_nan(torch.index_select(weight, 0, ids))
