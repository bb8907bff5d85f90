"""What a user compares before and after synthesizing (from two analyze reports): load, lengths,
reuse, validity."""

from __future__ import annotations


def summary_from(stats: dict) -> dict:
    """What a user compares before and after (from an analyze report): load, lengths, reuse,
    validity."""
    rates = stats["hit_rates"]
    return {
        "requests": stats["total_requests"],
        "requests_per_minute": stats["request_rate"]["mean_per_minute"],
        "isl_mean": stats["isl_stats"]["mean"],
        "isl_median": stats["isl_stats"]["median"],
        "osl_mean": stats["osl_stats"]["mean"],
        "osl_median": stats["osl_stats"]["median"],
        "hit_rate_token_weighted": rates["token_weighted"],
        "hit_rate_after_warmup": rates["token_weighted_after_warmup"],
        "cache_hit_rate_aiperf": stats["cache_hit_rate"],
        "unique_blocks": rates["working_set"]["unique_blocks"],
        "problems": {name: found["count"] for name, found in stats["problems"].items()},
    }


def before_and_after(before: dict, after: dict) -> dict:
    malformed = before["problems"]["malformed_lines"]
    return {
        "before": summary_from(before),
        "after": summary_from(after),
        "malformed_lines": {"count": malformed["count"], "examples": malformed["examples"][:5]},
    }
