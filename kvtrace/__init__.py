"""kvtrace: anonymized Mooncake-format prefix-caching traces from LLM request logs."""

from transforms.write.manifest import KVTRACE_VERSION as __version__  # noqa: F401
