"""Trace statistics: read any Mooncake trace and compute compatible and cache-sizing metrics."""
