"""The reuse plot says capacities as the report and the CLI do: GiB where the model is known
(capacity_text), tokens otherwise; hit rates in percent."""

from __future__ import annotations

import numpy as np
import pytest

from kvtrace.transforms.cache import plots
from kvtrace.transforms.cache.capacity import GIB

PER_TOKEN = 131_072  # Llama-3.1-8B's KV bytes per token: 8,192 tokens are 1 GiB
GPU_TOKENS = 8_192


@pytest.fixture
def axes():
    figure, (ccdf, stack) = plots._pyplot().subplots(1, 2)
    yield ccdf, stack
    plots._pyplot().close(figure)


def draw(axes, kv_bytes_per_token):
    ccdf, stack = axes
    x, y = np.array([100.0, 10_000.0]), np.array([0.5, 0.25])
    plots.draw_ccdf(ccdf, x, y, GPU_TOKENS, 0.25, kv_bytes_per_token)
    capacities = np.array([1_024, 8_192, 65_536])
    plots.draw_lru_stack(
        stack,
        capacities,
        np.array([0.1, 0.2, 0.3]),
        np.array([0.1, 0.25, 0.3]),
        GPU_TOKENS,
        kv_bytes_per_token,
    )
    return [t.get_text() for t in ccdf.get_legend().get_texts()], stack


def test_with_the_model_known_the_gpu_line_and_capacities_are_in_gib(axes):
    legend, stack = draw(axes, PER_TOKEN)
    assert legend[0] == "GPU KV cache: 1.0 GiB (8,192 tokens)"
    assert legend[1] == "25.0% reusable beyond it (offload bound)"
    assert stack.get_xlabel().startswith("LRU cache capacity (GiB")
    gpu_line = stack.get_lines()[-1]
    assert gpu_line.get_xdata()[0] == pytest.approx(GPU_TOKENS * PER_TOKEN / GIB)
    assert stack.get_lines()[0].get_xdata()[-1] == pytest.approx(65_536 * PER_TOKEN / GIB)
    assert list(stack.get_lines()[0].get_ydata()) == pytest.approx([10.0, 20.0, 30.0])  # percent


def test_without_a_model_they_are_in_tokens(axes):
    legend, stack = draw(axes, None)
    assert legend[0] == "GPU KV cache: 8,192 tokens"
    assert stack.get_xlabel().startswith("LRU cache capacity (tokens")
    assert stack.get_lines()[-1].get_xdata()[0] == GPU_TOKENS
