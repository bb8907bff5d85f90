"""Beam options and the runner a job runs on.

Beam's DirectRunner first tries to download the Prism runner binary and silently falls back when
offline, so the same command could run on different engines on different machines. Locally we
therefore pin the embedded FnApiRunner (what DirectRunner uses for batch jobs); any other
--runner (DataflowRunner, FlinkRunner, PortableRunner, ...) is used as given.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

_LOG = logging.getLogger("kvtrace")
LOCAL_RUNNERS = (None, "DirectRunner", "direct", "FnApiRunner")


def pipeline_options(flags: Sequence[str]) -> PipelineOptions:
    return PipelineOptions(list(flags))


def runner_for(options: PipelineOptions) -> Any:
    """The FnApiRunner for local runs; None lets Beam build the runner named in the options."""
    if options.view_as(StandardOptions).runner in LOCAL_RUNNERS:
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        return FnApiRunner()
    return None


def run(build: Callable[[beam.Pipeline], Any], options: PipelineOptions) -> Any:
    """Build the pipeline with build(pipeline), run it to completion, return build's outputs."""
    pipeline = beam.Pipeline(runner=runner_for(options), options=options)
    outputs = build(pipeline)
    result = pipeline.run()
    result.wait_until_finish()
    _log_map_reads(result)
    return outputs


def _log_map_reads(result: Any) -> None:
    """What the night read of its id map (LookUpShard's counters), as the local engine says it."""
    from apache_beam.metrics.metric import MetricsFilter

    try:
        counters = result.metrics().query(MetricsFilter().with_namespace("kvtrace"))["counters"]
    except NotImplementedError:  # runners without metrics
        return
    totals: dict[str, int] = {}
    for counter in counters:
        totals[counter.key.metric.name] = totals.get(counter.key.metric.name, 0) + counter.committed
    if "map_bytes_read" in totals:
        _LOG.info("id map: read %.1f MiB, %d of %d row groups", totals["map_bytes_read"] / 2**20,
                  totals.get("map_row_groups_read", 0), totals.get("map_row_groups", 0))
