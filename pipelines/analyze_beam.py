"""`kvtrace analyze --engine beam`: the driver of transforms/stats/steps.AnalyzeTrace, for traces
spread over many files and machines. The numbers equal analyze_local's."""

from __future__ import annotations

import apache_beam as beam

from kvtrace.pipelines.analyze_local import AnalyzeConfig
from kvtrace.transforms.stats.steps import AnalyzeTrace


def build(pipeline: beam.Pipeline, config: AnalyzeConfig) -> beam.PCollection:
    """The pipeline; its output is the report dict (one element)."""
    return pipeline | "Analyze" >> AnalyzeTrace(
        config.inputs, config.block_size, config.warmup_fraction, config.shards
    )


def analyze_beam(config: AnalyzeConfig, beam_flags: list[str], output: str | None = None) -> dict:
    """Run the Beam engine (embedded runner unless --runner says otherwise) and return the
    report, which the pipeline writes to OUTPUT/analysis.json on any Beam filesystem; without
    an output folder, to a temporary local one (local runners only)."""
    from kvtrace.pipelines.runner import run_for_report

    return run_for_report(
        lambda p: build(p, config),
        beam_flags,
        output,
        "analysis.json",
        "--output DIR (a folder its workers can write: gs://, s3://) for the report",
    )
