"""One module per command group of `kvtrace`: each adds its parsers and runs its commands."""
