"""kvtrace: anonymized Mooncake-format prefix-caching traces from LLM request logs."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kvtrace")
except PackageNotFoundError:  # running from a checkout that is not installed
    __version__ = "0.0.0+unknown"
