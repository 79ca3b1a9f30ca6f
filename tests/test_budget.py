"""The generic kernels' temporaries budgets per device (``backends/generic/_exact/budget.py``)."""

from __future__ import annotations

import pytest
import torch

from rlkernel.backends.generic._exact import budget


def test_cpu_keeps_the_module_budgets() -> None:
    assert budget.budget_scale(torch.device("cpu")) == 1


def test_device_without_memory_query_keeps_the_module_budgets() -> None:
    assert budget.budget_scale(torch.device("meta")) == 1


@pytest.mark.parametrize(("memory", "factor"), [(141 * 10**9, 16), (80 * 2**30, 10), (24 * 2**30, 3),
                                                (4 * 2**30, 1), (None, 1)])
def test_accelerator_factor_is_memory_over_the_unit_clamped(monkeypatch: pytest.MonkeyPatch, memory: int | None,
                                                            factor: int) -> None:
    monkeypatch.setattr(budget, "_device_memory", lambda device_type, index: memory)
    assert budget.budget_scale(torch.device("cuda", 0)) == factor
