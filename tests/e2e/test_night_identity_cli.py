"""A night's identity is its rows on the map's clock: a night recorded from the map's origin,
rerun from its own (--time-origin night), is the same night: found in the map, no version
added, and confirmed by the gate."""

from __future__ import annotations

from helpers import anonymize_night, chat, write_jsonl
from kvtrace.cli import main

DAY_MS = 86_400_000


def test_a_recorded_night_rerun_on_its_own_clock_is_the_same_night(tiny_tokenizer, tmp_path):
    (tmp_path / "salt").write_text("nightly-salt-kept-in-a-secret-manager")
    salt = ["--salt-file", str(tmp_path / "salt")]
    mapped = ["--id-map", str(tmp_path / "map"), "--id-map-marks", str(tmp_path / "marks"), *salt]
    logs = [
        write_jsonl(
            tmp_path / f"night{n}.jsonl",
            [chat(i + n, (n - 1) * DAY_MS + 1_000 + 613 * i, f"u{i % 3}") for i in range(8)],
        )
        for n in (1, 2)
    ]
    for n, log in enumerate(logs, 1):
        assert anonymize_night(tiny_tokenizer, [log], tmp_path / f"n{n}", *mapped) == 0
    versions = sorted((tmp_path / "map" / "versions").iterdir())
    own = ["--time-origin", "night"]
    assert anonymize_night(tiny_tokenizer, [logs[1]], tmp_path / "again", *mapped, *own) == 0
    assert sorted((tmp_path / "map" / "versions").iterdir()) == versions  # nothing new
    audit = ["audit", str(tmp_path / "again"), "--tokenizer", tiny_tokenizer]
    assert main([*audit, "--id-map", str(tmp_path / "map"), *salt]) == 0
