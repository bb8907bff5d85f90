"""Red team (t33-rt-map): the id map and determinism. Each test asserts a promise once broken."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers import WORDS, anonymize_night, chat, trace_bytes, write_jsonl
from kvtrace.transforms.ids import id_map, map_record
from kvtrace.transforms.ids.map_record import keyless_checksum, record_bytes
from kvtrace.transforms.ids.segments import index_path, read_segment, write_segment

pytestmark = pytest.mark.slow  # several nights each; .ci/run runs them

SALT = b"keyed-map-test-salt-of-32-bytes!"
DAY_MS = 86_400_000


def _night(folder: Path, day: int) -> Path:
    """30 chat requests; each night's user turns are words in orders of its own (new blocks)."""
    records = []
    for i in range(30):
        record = chat(i, day * DAY_MS + 1_000 + 611 * i, f"user-{day}-{i % 5}")
        words = random.Random(1000 * day + i).sample(WORDS, len(WORDS))
        record["messages"][1]["content"] = " ".join(words * 2)
        records.append(record)
    return write_jsonl(folder / f"night{day}.jsonl", records)


def _build(tokenizer: str, folder: Path) -> tuple[Path, list[str]]:
    """Two keyed (format-4) nights over 3 hash shards; the third night run on a pristine copy."""
    (folder / "salt").write_bytes(SALT)
    nights = [_night(folder, day) for day in range(3)]
    common = ["--salt-file", str(folder / "salt"), "--hash-shards", "3"]
    for day in range(2):
        assert (
            anonymize_night(
                tokenizer,
                [nights[day]],
                folder / f"out{day}",
                "--id-map",
                str(folder / "map"),
                *common,
            )
            == 0
        )
    shutil.copytree(folder / "map", folder / "reference-map")
    assert (
        anonymize_night(
            tokenizer,
            [nights[2]],
            folder / "expected",
            "--id-map",
            str(folder / "reference-map"),
            *common,
        )
        == 0
    )
    return nights[2], common


def _latest(map_dir: Path) -> Path:
    return map_dir / "versions" / f"{id_map.current_version_number(str(map_dir)):06d}.json"


def _permute_ids(map_dir: Path, record: dict) -> dict:
    """Without the salt: the ids of one segment's rows rotated among themselves (keys stay in
    their shard, ids stay below next_id), the file's checksums recomputed."""
    version = id_map.MapVersion.from_record(record)
    checksums = dict(record["checksums"])
    for segment in version.segment_files(str(map_dir), "blocks"):
        rows = np.concatenate([t for _, t in read_segment(segment, version.hash_shards)])
        if len(rows) < 2:
            continue
        rows["id"] = np.roll(rows["id"], 1)
        name = id_map.relative(str(map_dir), segment.path)
        written = write_segment(segment.path, [rows])
        checksums[name], checksums[index_path(name)] = written.data, written.index
        return record | {"checksums": checksums}
    raise AssertionError("no segment with two rows")


def test_a_keyed_map_refuses_its_newest_record_downgraded_to_format_3(tiny_tokenizer, tmp_path):
    """Promise: a keyed map's records are proved by the MAC; an edit without the salt is refused
    (docs/ID_MAP.md: only 'until a map's first keyed commit' is an edit undetectable). Version 1
    stays format 4, yet the newest record rewritten as format 3 (its own sha256 recomputed, no
    salt needed) with one segment's ids rotated is read, and the night publishes ids that differ
    from those earlier nights published for the same prefixes."""
    night, common = _build(tiny_tokenizer, tmp_path)
    map_dir = tmp_path / "map"
    path = _latest(map_dir)
    record = json.loads(path.read_bytes())
    assert record["format_version"] == map_record.FORMAT_VERSION
    content = _permute_ids(map_dir, {k: v for k, v in record.items() if k != "mac"})
    content["format_version"] = map_record.KEYLESS_FORMAT
    del content["timestamp_kind"]  # format 3 came before it
    path.write_bytes(record_bytes(content | {"sha256": keyless_checksum(content)}))
    code = anonymize_night(
        tiny_tokenizer, [night], tmp_path / "out", "--id-map", str(map_dir), *common
    )
    published = (tmp_path / "out" / "manifest.json").exists()
    assert code != 0 and not published, (
        "a format-3 record on top of a keyed map was trusted; the trace "
        + (
            "differs from"
            if trace_bytes(tmp_path / "out") != trace_bytes(tmp_path / "expected")
            else "equals"
        )
        + " the untampered night's"
    )


def _block_ids(out: Path) -> set[int]:
    return {h for line in trace_bytes(out).splitlines() for h in json.loads(line)["hash_ids"]}


def test_a_map_rolled_back_a_version_does_not_reissue_published_ids(tiny_tokenizer, tmp_path):
    """Promise: a night never gives ids that published traces already use to other blocks
    (id_map.py: 'numbering again from an older version would give new keys ids that published
    traces already use' is why a map missing versions is refused). Deleting the newest version
    with its segment folder and pointing CURRENT back (no salt needed; also what restoring the
    backup the error messages ask for does) is not noticed: the next night numbers from the
    older next_id again, and its trace reuses ids night 2 published for other blocks."""
    night, common = _build(tiny_tokenizer, tmp_path)
    map_dir = tmp_path / "map"
    (map_dir / "versions" / "000002.json").unlink()
    for folder in (map_dir / "segments").glob("000002-*"):
        shutil.rmtree(folder)
    (map_dir / "CURRENT").write_text('{"version": 1}\n')
    code = anonymize_night(
        tiny_tokenizer, [night], tmp_path / "out", "--id-map", str(map_dir), *common
    )
    if code == 0:  # published: its new ids must not be ones night 2 published for others
        mixed = (_block_ids(tmp_path / "out") & _block_ids(tmp_path / "out1")) - _block_ids(
            tmp_path / "out0"
        )
        clash = _block_ids(tmp_path / "out") != _block_ids(tmp_path / "expected")
        assert not (mixed and clash), (
            f"rollback unnoticed: ids {sorted(mixed)[:5]} published by night 2 reissued"
        )


def _same_footer_with_ids_swapped(path: Path, rows: np.ndarray, used: set[int]) -> bytes | None:
    """The segment rewritten as kvtrace writes it, two rows' ids exchanged, when that gives a
    file of the same size and the same Parquet footer (only a page's bytes and CRC differ)."""
    import io

    import pyarrow.parquet as pq

    from kvtrace.transforms.ids.segments import (
        ROW_GROUP_ROWS,
        ROWS_SHA256,
        _arrow,
        _footer,
        _writer,
    )

    original = path.read_bytes()
    # The forger keeps the footer's rows digest verbatim: recomputing it would change the footer.
    kept = pq.read_metadata(io.BytesIO(original)).metadata[ROWS_SHA256.encode()].decode()
    wanted = [i for i in range(len(rows)) if int(rows["id"][i]) in used]
    for i in wanted:
        for j in range(len(rows)):
            if j == i:
                continue
            swapped = rows.copy()
            swapped["id"][[i, j]] = swapped["id"][[j, i]]
            sink = io.BytesIO()
            with _writer(sink) as writer:
                writer.write_table(_arrow(swapped), row_group_size=ROW_GROUP_ROWS)
                writer.add_key_value_metadata({ROWS_SHA256: kept})
            data = sink.getvalue()
            if len(data) == len(original) and _footer(data) == _footer(original):
                return data
    return None


def test_ids_swapped_in_a_segment_page_with_its_crc_recomputed_are_refused(
    tiny_tokenizer, tmp_path
):
    """Promise: a keyed map cannot be altered without the salt (docs/ID_MAP.md: 'the checksums
    prove a file is the one the record lists'). A night reads segments in part and checks such a
    read only by the file's size, its footer's sha256 and the pages' CRC32s, none of them keyed
    or covering the page bytes: two rows' ids exchanged in a data page, the file rewritten to the
    same size and footer (the CRC recomputed, as any Parquet writer does), the format-4 record
    and its MAC untouched, and the night publishes the two blocks under each other's ids."""
    night, common = _build(tiny_tokenizer, tmp_path)
    map_dir = tmp_path / "map"
    record = json.loads(_latest(map_dir).read_bytes())
    version = id_map.MapVersion.from_record(record)
    for segment in version.segment_files(str(map_dir), "blocks"):  # version 1's first: shared
        rows = np.concatenate([t for _, t in read_segment(segment, version.hash_shards)])
        used = _block_ids(tmp_path / "expected")  # ids the untampered night 3 gives
        forged = _same_footer_with_ids_swapped(Path(segment.path), rows, used)
        if forged is not None:
            Path(segment.path).write_bytes(forged)
            break
    else:
        raise AssertionError("no swap kept the file's size and footer")
    code = anonymize_night(
        tiny_tokenizer, [night], tmp_path / "out", "--id-map", str(map_dir), *common
    )
    assert code != 0 or trace_bytes(tmp_path / "out") == trace_bytes(tmp_path / "expected"), (
        "a segment altered without the salt was read; the night published other ids"
    )
