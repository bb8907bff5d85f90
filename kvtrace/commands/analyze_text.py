"""The printed form of `kvtrace analyze`: Dynamo's `datagen analyze` table, then our sections.

Values are rounded for display only, hit rates and shares in percent as every command and the
report print them (capacity.percent); the JSON keeps full precision, rates as fractions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from kvtrace.transforms.cache.capacity import percent
from kvtrace.transforms.dead_letters import shown_name

TABLE_ROWS = (
    ("Input Length", "isl_stats"),
    ("Context Length", "context_length_stats"),
    ("Unique Prompt Length", "unique_prompt_length_stats"),
    ("Output Length", "osl_stats"),
)
HIT_RATE_ROW = ("Theoretical Hit Rates", "hit_rate_stats")  # fractions, printed as percent
TABLE_COLUMNS = ("", "Mean", "Std Dev", "Min", "P25", "Median", "P75", "Max")
STAT_KEYS = ("mean", "std_dev", "min", "p25", "median", "p75", "max")


def _center(text: str, width: int) -> str:
    """Centred as in Dynamo's table (PrettyTable): odd slack goes to the right."""
    left = (width - len(text)) // 2
    return " " * left + text + " " * (width - len(text) - left)


def ascii_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells: Sequence[str]) -> str:
        return "|" + "|".join(" " + _center(c, w) + " " for c, w in zip(cells, widths)) + "|"

    return "\n".join([rule, line(header), rule, *(line(r) for r in rows), rule])


def compatible_table(report: dict) -> str:
    """The `datagen analyze` table, its figures rounded for people (Dynamo prints every digit
    of a float: 2677.841851494696) and its hit rates in percent (Dynamo's are fractions); the
    JSON report keeps them whole."""
    rows = [[label, *(rounded(report[key][s]) for s in STAT_KEYS)] for label, key in TABLE_ROWS]
    label, key = HIT_RATE_ROW
    rows.append([label, *(percent(report[key][s]) for s in STAT_KEYS)])
    return ascii_table(TABLE_COLUMNS, rows)


SIGNIFICANT_DIGITS = 4


def rounded(value: float) -> str:
    """A figure for people: a whole number as it is, any other to SIGNIFICANT_DIGITS without
    trailing zeros (2,678, 44.67, 0.2287, 7.5), with thousands separated."""
    if float(value).is_integer():
        return f"{int(value):,}"
    magnitude = math.floor(math.log10(abs(value)))
    text = f"{value:,.{max(0, SIGNIFICANT_DIGITS - 1 - magnitude)}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def input_name(path: str) -> str:
    """An input as published text names it: its file name (as `report` does), never the
    operator's folders, shown as every name is (one printable text per name)."""
    return shown_name(path.rstrip("/").rsplit("/", 1)[-1])


def published_report(report: dict) -> dict:
    """The report as analyze --output publishes it: each example of a problem names its file by
    name only."""

    def named(example: Any) -> Any:
        return (
            {**example, "file": input_name(example["file"])}
            if isinstance(example, dict)
            else example
        )

    problems = {
        name: {**problem, "examples": [named(e) for e in problem["examples"]]}
        for name, problem in report["problems"].items()
    }
    return {**report, "problems": problems}


def render(report: dict, sources: Sequence[str]) -> str:
    hit = report["hit_rates"]
    rate = report["request_rate"]
    definitions = report["definitions"]
    lines = [
        f"Analyzing: {', '.join(input_name(source) for source in sources)}",
        f"Block size: {report['block_size']}",
        f"Rows: {report['total_requests']:,}; unique prefixes: {report['unique_prefixes']:,}; "
        f"prefix groups: {report['num_prefix_groups']:,}; prefix reuse ratio: "
        f"{percent(report['prefix_reuse_ratio'])}",
        "",
        "Compatible with Dynamo `datagen analyze` and aiperf analyze-trace:",
        compatible_table(report),
        f"cache_hit_rate {percent(report['cache_hit_rate'])}: {definitions['cache_hit_rate']}",
        f"context length: {definitions['context_length']}",
        "",
        "Cache sizing (infinite cache):",
        *(
            f"  {name:<28} {percent(hit[name])}  {definitions[name]}"
            for name in (
                "token_weighted",
                "block_weighted",
                "per_request_mean",
                "token_weighted_after_warmup",
            )
        ),
        f"after warmup: rows after the first {hit['warmup_fraction']:.0%} in (timestamp, file "
        "order)",
        f"working set: {hit['working_set']['unique_blocks']:,} unique blocks, "
        f"{hit['working_set']['unique_tokens']:,} unique tokens",
        f"request rate: {rate['mean_per_minute']:,.1f} per minute on average, peak "
        f"{rate['peak_per_minute']:,} (over {rate['minutes']:,} one-minute bins from the first "
        "request)",
    ]
    if "sessions" in report:
        s = report["sessions"]
        lines.append(
            f"sessions: {s['sessions']:,} ({s['requests_with_session']:,} requests, "
            f"{s['requests_per_session']['mean']:.1f} per session on average)"
        )
    problems = [(name, p) for name, p in report["problems"].items() if p["count"]]
    if problems:
        lines += ["", "Warnings:"]
        for name, problem in problems:
            lines.append(
                f"  {name.replace('_', ' ')}: {problem['count']:,}; e.g. "
                f"{_examples(problem['examples'])}"
            )
    return "\n".join(lines)


def _examples(examples: list) -> str:
    shown = []
    for example in examples[:5]:
        if isinstance(example, dict):
            where = f"{input_name(example['file'])}:{example['line']}"
            shown.append(f"{where} ({example['error']})" if "error" in example else where)
        else:
            shown.append(f"id {example}")
    return ", ".join(shown)
