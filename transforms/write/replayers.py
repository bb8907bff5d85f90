"""The replayers a trace is for: the form each reads, and the command that replays a file in it
with the block size and time unit it needs (a replayer left at its own block size replays every
prompt at the wrong length, the most reported failure with these traces).

Each reader is described as its source says, at the version named (tests/e2e/test_consumers.py runs
the readers that install here on exported files).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

WHOLE, TURNS, DELTAS, RECUT = "whole rows", "turns", "deltas", "re-cut blocks"
# agent structure (transforms/replay/agentic.py): a dependency graph, conversation objects, and
# every block as a cache request
AGENTIC, CONVERSATIONS, BLOCK_REQUESTS = "agentic graph", "conversations", "block requests"
# SGLang's bench_serving spells each hash id as its digits and 128 words ("hi"), about 128-134
# tokens whatever the trace's block size: the ids are re-cut to that size.
SGLANG_TOKENS_PER_ID = 128
MODEL, URL = "MODEL", "http://localhost:8000"


@dataclass(frozen=True)
class Consumer:
    name: str
    reader: str  # what reads the file, at the version whose source was read
    form: str
    command: Callable[[str, int, int], str]  # (file, block size, rows) -> the command line
    note: str = ""
    # aiperf schedules a follow-up turn by its timestamp when it has one, by its delay only when
    # not (aiperf 0.13: timing/strategies/fixed_schedule.py): its follow-ups go without one
    follow_up_timestamps: bool = True
    suffix: str = ".jsonl"  # of the file kvtrace export writes for it


def _aiperf(path: str, block_size: int, rows: int) -> str:
    return (
        f"aiperf profile --model {MODEL} --url {URL} --endpoint-type completions "
        f"--input-file {path} --custom-dataset-type mooncake_trace --fixed-schedule "
        f"--isl-block-size {block_size}"
    )


def _guidellm(path: str, block_size: int, rows: int) -> str:
    return (
        f"guidellm run --backend kind=openai_http,target={URL} --profile kind=replay "
        f"--data kind=mooncake,source.kind=json_file,source.path={path},"
        f"hash_id_block_size={block_size},time_scale=0.001"
    )


def _vllm(path: str, block_size: int, rows: int) -> str:
    return (
        f"vllm bench serve --backend vllm --model {MODEL} --base-url {URL} "
        f"--dataset-name timed_trace --dataset-path {path} --num-prompts {rows} "
        f"--timed-trace-chunk-hash-size {block_size} --timed-trace-sec-multiplier 0.001"
    )


def _sglang(path: str, block_size: int, rows: int) -> str:
    return (
        f"python -m sglang.benchmark.serving --backend sglang --model {MODEL} "
        f"--base-url {URL} --dataset-name mooncake --dataset-path {path} --num-prompts {rows}"
    )


def _dynamo(trace_format: str, agentic: bool = False) -> Callable[[str, int, int], str]:
    """Dynamo 1.6.1 moved its replay command line into aisimulate (not installable here); its
    Python entry point is what runs here, and is tested. Its agentic formats replay for a
    named target model."""
    target = f", execution_model='{MODEL}'" if agentic else ""

    def command(path: str, block_size: int, rows: int) -> str:
        return (
            f'python -c "from dynamo.replay import run_trace_replay; print(run_trace_replay('
            f"'{path}', trace_format='{trace_format}', trace_block_size={block_size}{target})"
            '.summary)"'
        )

    return command


def _libcachesim(path: str, block_size: int, rows: int) -> str:
    """Every object is a block of block_size bytes: the cache size is in tokens."""
    return (
        'python -c "import libcachesim as lcs; print(lcs.LRU(cache_size=CACHE_TOKENS)'
        f".process_trace(lcs.TraceReader('{path}', lcs.TraceType.ORACLE_GENERAL_TRACE)))\""
    )


CONSUMERS = {
    c.name: c
    for c in (
        Consumer(
            "aiperf",
            "aiperf 0.13 mooncake_trace",
            WHOLE,
            _aiperf,
            "timestamps in ms; one self-contained request per row",
        ),
        Consumer(
            "aiperf-sessions",
            "aiperf 0.13 mooncake_trace (multi-turn)",
            DELTAS,
            _aiperf,
            "session_id groups turns; aiperf sends each follow-up `delay` ms after the previous "
            "response and adds its live answers to the history",
            follow_up_timestamps=False,
        ),
        Consumer(
            "guidellm",
            "guidellm 0.8.1 mooncake trace data",
            WHOLE,
            _guidellm,
            "time_scale 0.001: guidellm reads timestamps as seconds",
        ),
        Consumer(
            "vllm",
            "vLLM 0.33.0 bench serve, timed_trace dataset",
            WHOLE,
            _vllm,
            "its chunk size defaults to 16 and its timestamps to seconds; --num-prompts defaults "
            "to 1,000 rows; one file, read in order",
        ),
        Consumer(
            "sglang",
            "SGLang 0.5.23 bench_serving, mooncake dataset",
            RECUT,
            _sglang,
            f"hash ids re-cut to {SGLANG_TOKENS_PER_ID} tokens each: SGLang writes ~"
            f"{SGLANG_TOKENS_PER_ID} tokens per id and ignores input_length; timestamps in ms",
        ),
        Consumer(
            "dynamo",
            "Dynamo 1.6.1 replay, mooncake format",
            TURNS,
            _dynamo("mooncake"),
            "rows with session_id: each follow-up turn sent `delay` ms after the previous "
            "response ends",
        ),
        Consumer(
            "dynamo-delta",
            "Dynamo 1.6.1 replay, mooncake-delta format",
            DELTAS,
            _dynamo("mooncake-delta"),
            "follow-up turns hold only what they add; Dynamo rebuilds each prompt from the "
            "previous prompt, its generated answer and the delta",
        ),
        Consumer(
            "dynamo-agentic",
            "Dynamo 1.6.1 replay, agentic_mooncake format (v2)",
            AGENTIC,
            _dynamo("agentic_mooncake", agentic=True),
            "each follow-up turn depends on the previous one's completion, `delay_ms` after it "
            "and not before its logged arrival; hash ids shared across conversations",
        ),
        Consumer(
            "weka",
            "WEKA trace format: aiperf 0.13 weka_trace, Dynamo 1.6.1 weka",
            CONVERSATIONS,
            _dynamo("weka", agentic=True),
            "one conversation per line, t in seconds, api_time and think_time where the "
            "response end was logged; hash ids scoped per conversation (a block two share "
            "replays as two); aiperf reads a folder "
            "of one-conversation .json files (split -l 1 --additional-suffix=.json)",
        ),
        Consumer(
            "libcachesim",
            "libCacheSim oracleGeneral binary trace (libcachesim 0.3.5)",
            BLOCK_REQUESTS,
            _libcachesim,
            "24-byte records: second, block id, size (block_size), next use; a cache size "
            "in tokens; set CACHE_TOKENS",
            suffix=".oracleGeneral.bin",
        ),
    )
}


def replay_commands(
    block_size: int, rows: int, trace_files: list[str], folder: str = "."
) -> dict[str, str]:
    """The command per replayer for a kvtrace output folder (by default run inside it): straight
    on the trace file where a replayer reads it as published and there is one, else after
    `kvtrace export` has written the replayer's file beside the folder (never into it: the
    folder holds only what its manifest lists)."""
    jsonl = sorted(f for f in trace_files if f.endswith(".jsonl"))
    beside = "../kvtrace" if folder == "." else folder.rstrip("/")
    commands = {}
    for consumer in CONSUMERS.values():
        if consumer.form == WHOLE and len(jsonl) == 1:
            path = jsonl[0] if folder == "." else f"{folder.rstrip('/')}/{jsonl[0]}"
            commands[consumer.name] = consumer.command(path, block_size, rows)
        else:
            exported = f"{beside}.{consumer.name}{consumer.suffix}"
            commands[consumer.name] = (
                f"kvtrace export {folder} --to {consumer.name} -o "
                f"{exported} && " + consumer.command(exported, block_size, rows)
            )
    return commands
