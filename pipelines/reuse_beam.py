"""`kvtrace reuse --engine beam`: the driver of transforms/cache/steps.ReuseTrace, the reuse-interval
CCDF and reuse times of traces beyond one machine. Exact LRU stack distances are not computed
here: they need every use in one order (the local engine)."""

from __future__ import annotations

from collections.abc import Callable

import apache_beam as beam
import numpy as np

from kvtrace.pipelines.reuse_local import ReuseConfig, check_plot, write_plot
from kvtrace.transforms.cache import plots
from kvtrace.transforms.cache.steps import ReuseTrace
from kvtrace.transforms.storage import is_url
from kvtrace.transforms.write.publish import StagedFile


def build(pipeline: beam.Pipeline, config: ReuseConfig) -> beam.PCollection:
    """The pipeline; its output is the report dict (one element)."""
    return pipeline | "Reuse" >> ReuseTrace(
        config.inputs, config.block_size, config.gpu_kv_cache_size
    )


def run_reuse_beam(
    config: ReuseConfig,
    beam_flags: list[str],
    report_file: StagedFile | None = None,
    accept: Callable[[dict], None] = lambda report: None,
) -> dict:
    """Run on the embedded runner unless --runner says otherwise; the plot and report are
    written by the launcher from the one report element (remote runners need config.plot and
    the report on a filesystem the launcher reads: a local temporary folder is used locally)."""
    from kvtrace.pipelines.runner import run_for_report

    check_plot(config)
    remote_folder = config.plot.rsplit("/", 1)[0] if is_url(config.plot or "") else None
    result = run_for_report(
        lambda p: build(p, config),
        beam_flags,
        remote_folder,
        "reuse.json",
        "--output on a filesystem its workers can write (gs://, s3://)",
    )
    accept(result)  # as run_reuse: the plot only for an accepted report
    if config.plot:
        png = plots.reuse_figure(
            np.array(result["ccdf"]["interval_tokens"]),
            np.array(result["ccdf"]["share_above"]),
            config.gpu_kv_cache_size,
            result.get("ccdf_at_gpu_kv_cache_size"),
            None,
            None,
            None,
            result["reuse_time"],
            config.kv_bytes_per_token,
        )
        write_plot(config.plot, png, report_file)
    return result
