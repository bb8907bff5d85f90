"""`kvtrace anonymize` for launchers that run `python FILE --option=value ...` and cannot put a
subcommand first: the Dataflow Flex Template launcher and Airflow's Beam operator."""

from __future__ import annotations

import sys

from kvtrace.cli import main

if __name__ == "__main__":
    sys.exit(main(["anonymize", *sys.argv[1:]]))
