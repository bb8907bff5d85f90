"""Beam's SDK worker process (--direct_running_mode multi_processing), as the Beam engine starts
it (runner.sdk_worker_command: its starter's pid, then the module to run, Beam's
sdk_worker_main): it ends with its starter however that ends (processes.end_with; a SIGKILL
included, which no stop handler sees), then runs the module as `python -m` would. One whose
starter died before it could ask ends at once."""

from __future__ import annotations

import runpy
import sys

from kvtrace.pipelines.processes import end_with


def main(argv: list[str]) -> int:
    starter, module = int(argv[1]), argv[2]
    if not end_with(starter):
        return 1  # its starter is gone: no one reads its work
    sys.argv = argv[:1]  # Beam's worker reads its settings from the environment, not argv
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
