"""An external SDK worker pool for kvtrace's portable runs (`--environment_type EXTERNAL
--environment_config HOST:PORT`), listening on one address only.

Beam's own pool (worker_pool_main) listens on every interface, and in its process mode starts
whatever `python` comes first on PATH: with the wrong one a job waits minutes for workers that
never come. This pool binds the address it is given (loopback by default) and runs each worker
as a thread of its own interpreter, the one kvtrace is installed in.

    python -m kvtrace.pipelines.worker_pool [--address 127.0.0.1:50000]
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor

import grpc
from apache_beam.portability.api import beam_fn_api_pb2_grpc
from apache_beam.runners.worker.worker_pool_main import BeamFnExternalWorkerPoolServicer

DEFAULT_ADDRESS = "127.0.0.1:50000"
# Each job's workers hold a thread for their lifetime; a laptop or CI machine runs a few at once.
MAX_WORKER_THREADS = 32


def serve(address: str = DEFAULT_ADDRESS) -> tuple[str, grpc.Server]:
    """Start the pool on address (port 0: any free port); returns (HOST:PORT bound, server)."""
    host, _, port = address.rpartition(":")
    server = grpc.server(ThreadPoolExecutor(max_workers=MAX_WORKER_THREADS))
    bound = server.add_insecure_port(f"{host}:{port}")
    if not bound:
        raise OSError(f"cannot listen on {address}")
    beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(
        BeamFnExternalWorkerPoolServicer(), server
    )
    server.start()
    return f"{host}:{bound}", server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="python -m kvtrace.pipelines.worker_pool",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "--address",
        default=DEFAULT_ADDRESS,
        help="HOST:PORT to listen on (default %(default)s; port 0: any free one)",
    )
    args = parser.parse_args(argv)
    try:
        address, server = serve(args.address)
    except (OSError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"worker pool listening on {address}", flush=True)
    server.wait_for_termination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
