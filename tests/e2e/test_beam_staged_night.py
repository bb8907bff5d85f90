"""A Beam night's launcher publishes only the staging folder its manifest describes, derived
from the folder itself (anonymize_night.staged_manifest, check_staged): the promise
tests/e2e/test_redteam_remote_round24.py holds on a Flink cluster, here on the embedded runner,
whose staged path is the same. Faults are injected by a prelude in the CLI's process (the
launcher is forked from it), wrapping one of kvtrace's own functions: nothing depends on
timing."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import SALT, chat, kvtrace_child, staged_record_prelude, write_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.beam]

# What the launcher may meet in the staging folder the job left, or in the record it staged.
_FAULTS = {
    # The record's manifest short of one staged trace file (its files and sha256 entries).
    "a_file_left_out_of_the_records_manifest": staged_record_prelude(
        """
        name = next(f for f in record["manifest"]["files"] if f.startswith("trace-"))
        record["manifest"]["files"].remove(name)
        del record["manifest"]["sha256"][name]
        """,
        "manifest",
    ),
    # A file in the staging folder no manifest lists (a retried task's attempt's leftover).
    "a_staged_file_no_manifest_lists": """
import os
import kvtrace.pipelines.anonymize_night as night
_stage = night._stage_record
def _leftover(config, record):
    with open(os.path.join(config.staging, "trace-00001-of-00002.jsonl"), "wb") as handle:
        handle.write(b'{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [0]}\\n')
    return _stage(config, record)
night._stage_record = _leftover
""",
    # A staged trace file written again once the launcher staged the manifest (after any
    # check before the commit): a retried task's attempt still writing.
    "a_staged_file_written_after_its_digest": """
import os
import kvtrace.pipelines.anonymize_night as night
_stage_manifest = night.stage_manifest
def _late_write(config, manifest):
    with open(os.path.join(config.staging, "trace-00000-of-00001.jsonl"), "ab") as handle:
        handle.write(b'{"prompt": "a late attempt\\'s line"}\\n')
    return _stage_manifest(config, manifest)
night.stage_manifest = _late_write
""",
}


def _night(folder: Path, tokenizer: str) -> list[str]:
    """A night of a few chats on the embedded Beam runner, its salt in a file."""
    (folder / "salt").write_text(SALT)
    source = write_jsonl(
        folder / "in.jsonl", [chat(i, 1_000 * i, session=f"s{i % 3}") for i in range(8)]
    )
    return ["anonymize", "--engine", "beam", "--input", str(source), "--block-size", "4"] + [
        "--salt-file",
        str(folder / "salt"),
        "--tokenizer",
        tokenizer,
        "--quiet",
    ]


@pytest.mark.parametrize("fault", sorted(_FAULTS))
def test_a_staged_folder_that_is_not_its_manifests_publishes_nothing(
    tiny_tokenizer, tmp_path, fault
):
    """Promise (docs/NIGHTLY.md; brief: a night publishes whole or not at all, bad input is a
    one-line error): the launcher derives the manifest's files and digests from the staging
    folder (nothing more, nothing less) and the record's manifest must be that derivation; the
    folder is checked against its manifest once more from the bytes about to be published.
    Either refusal is one line, nothing published."""
    out = tmp_path / "out"
    said = kvtrace_child(
        *_night(tmp_path, tiny_tokenizer), "--output", str(out), prelude=_FAULTS[fault], timeout=300
    )
    errors = [line for line in said.stderr.splitlines() if line.startswith("error:")]
    assert said.returncode != 0 and len(errors) == 1, said.stderr[-2000:]
    assert "nothing was published" in errors[0]
    assert "Traceback" not in said.stderr
    assert not out.exists()


def test_an_untouched_beam_night_publishes_what_its_manifest_lists(tiny_tokenizer, tmp_path):
    """The checks refuse no night kvtrace staged itself: the same night, no fault, publishes."""
    out = tmp_path / "out"
    said = kvtrace_child(*_night(tmp_path, tiny_tokenizer), "--output", str(out), timeout=300)
    assert said.returncode == 0, said.stderr[-2000:]
    assert (out / "manifest.json").is_file()
