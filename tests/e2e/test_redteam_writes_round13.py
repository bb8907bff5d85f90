"""Red team round 13, writes, stops and crashes: reproducers of holes left after the twelfth
round's fixes. Each asserts the promised behaviour, so each fails until it is fixed.

A fault is injected as the system gives it: a prelude wraps one of kvtrace's own steps and
fails (or signals) right there, or a second run is started from inside the first at a named
step, so nothing depends on timing."""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import pytest

from helpers import kvtrace_child, night_args

pytestmark = pytest.mark.slow

USER = {"role": "user", "content": "the quick brown fox jumps over the lazy dog " * 4}
# A response that reports the engine's cached tokens: the run writes a measured file.
MEASURED = {"usage": {"prompt_tokens_details": {"cached_tokens": 8}}}


def _night(tmp_path: Path, tokenizer: str, out: Path, measured: int, *extra: str) -> list[str]:
    """An anonymize run's arguments on 8 chats, the first `measured` of whose responses carry
    the engine's cached tokens, and one dead letter."""
    records = [
        {
            "timestamp": 1_000 * i,
            "messages": [USER],
            "output_length": 3,
            **({"response": MEASURED} if i < measured else {}),
        }
        for i in range(8)
    ]
    return night_args(tmp_path, tokenizer, out, *extra, records=records)


def test_a_measured_aggregate_of_one_request_is_never_written_for_all_to_read(
    tiny_tokenizer, tmp_path
):
    """stats.json publishes the engine's measured aggregate only over at least
    MIN_MEASURED_REQUESTS (20) requests: "fewer would publish their private counts"
    (write/totals.with_measured). `analyze --measured FILE --json OUT` (and `report --measured`,
    `calibrate --json`) take the same aggregate from the private measured file and write it,
    over one request, into a world-readable file (0644): that request's cached tokens, its
    prompt length being public in the trace. The aggregate must be held to the same floor, or
    the file holding it be owner-only as the measured file is."""
    out = tmp_path / "out"
    night = kvtrace_child(*_night(tmp_path, tiny_tokenizer, out, measured=1), timeout=120)
    assert night.returncode == 0, night.stderr[-2000:]
    (measured_file,) = Path(f"{out}-rejected").glob("measured-*.jsonl")
    report = tmp_path / "analysis.json"
    ran = kvtrace_child(
        "analyze", str(out), "--measured", str(measured_file), "--json", str(report), timeout=120
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    numbers = json.loads(report.read_text()).get("measured") or {}
    aggregate = numbers.get("measured") or {}
    private = stat.S_IMODE(report.stat().st_mode) & 0o077 == 0
    assert private or not {"cached_tokens", "hit_rate"} & set(aggregate), (
        oct(report.stat().st_mode),
        aggregate,
    )


def test_a_run_refused_by_the_id_maps_anchor_makes_no_id_map_folder(tiny_tokenizer, tmp_path):
    """Every check is made before the work writes, the id map's settings included (round 8:
    a refused run makes no id map folder). A night given --id-map at a place the salt's marks
    bind to another map (the map there was deleted: a restored backup elsewhere, a typo'd
    mount) is refused in one line, "the map was not extended and no trace was published", yet
    it has made a new, empty id map folder there (MAP/segments/) first: the anchor is checked
    after the folder is made, not before."""
    first = _night(
        tmp_path, tiny_tokenizer, tmp_path / "night1", 8, "--id-map", str(tmp_path / "map")
    )
    ran = kvtrace_child(*first, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    shutil.rmtree(tmp_path / "map")
    second = _night(
        tmp_path, tiny_tokenizer, tmp_path / "night2", 8, "--id-map", str(tmp_path / "map")
    )
    refused = kvtrace_child(*second, timeout=120)
    assert refused.returncode != 0 and "is not the map last published there" in refused.stderr
    assert not (tmp_path / "night2").exists()
    assert not (tmp_path / "map").exists(), sorted(p.name for p in (tmp_path / "map").rglob("*"))


def test_a_run_that_lost_the_race_for_an_id_map_never_says_it_published_the_winners_version(
    tiny_tokenizer, tmp_path, monkeypatch, capsys
):
    """A failure inside the id map's commit says what stands: "published version N of the id
    map MAP before the failure" (docs/NIGHTLY.md: then "rerun that night before the next"),
    read from the map as any version past the night's base (anonymize_night._committed: "one
    writer: the map's"). Two runs on one map (a cron overlap) break that: the loser, refused
    with "it published nothing (its trace has no manifest)", is told in the same line that it
    published the winner's version. What stands must be this run's commit, not the map's
    newest version."""
    from kvtrace.cli import main
    from kvtrace.transforms.ids import id_map

    args = night_args(tmp_path, tiny_tokenizer, tmp_path / "oa", "--id-map", str(tmp_path / "map"))
    other = [a if a != str(tmp_path / "oa") else str(tmp_path / "ob") for a in args]
    real, raced = id_map.check_anchor, []

    def other_run_commits_first(*check_args, **kwargs):
        if not raced:  # the other night commits once this one has read the map's base
            raced.append(None)
            raced[0] = main(other)
        return real(*check_args, **kwargs)

    monkeypatch.setattr(id_map, "check_anchor", other_run_commits_first)
    capsys.readouterr()
    code = main(args)
    err = capsys.readouterr().err
    assert raced == [0] and code != 0, err
    assert not (tmp_path / "oa").exists()
    error = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "extended by another run" in error[0], err
    assert "published version" not in error[0], error[0]
