"""Red team round 21, damaged id maps: reproducers of holes left after the twentieth round's
fixes. Each asserts the promised behaviour, so each fails until it is fixed."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import KVTRACE, anonymize_night, peak_rss_mb, write_jsonl

pytestmark = pytest.mark.slow

SALT = b"keyed-map-test-salt-of-32-bytes!"
ZERO = 1_700_000_000_000
PROMPTS = [
    "the quick brown fox jumps over the lazy dog",
    "What is the capital of France ? The capital of France is Paris .",
    "What is the capital of Finland ? The capital of Finland is Helsinki .",
]


def _night(folder: Path, day: int) -> Path:
    prompt = PROMPTS[day]
    return write_jsonl(
        folder / f"night{day}.jsonl",
        [
            {
                "timestamp": ZERO + day * 86_400_000,
                "output_length": 5,
                "messages": [{"role": "user", "content": f"{prompt} {prompt}"}],
            }
        ],
    )


def _map_of_nights(tokenizer: str, tmp_path: Path, nights: int) -> list[str]:
    """A map kvtrace wrote over `nights` nights; returns the flags that name it."""
    salt = tmp_path / "salt"
    salt.write_bytes(SALT)
    common = ["--id-map", str(tmp_path / "map"), "--id-map-marks", str(tmp_path / "marks")]
    common += ["--salt-file", str(salt)]
    for day in range(nights):
        out = tmp_path / f"out{day}"
        assert anonymize_night(tokenizer, [_night(tmp_path, day)], out, *common) == 0
    return common


@pytest.mark.xfail(strict=True, reason="red team round 21")
def test_a_record_of_empty_lists_in_a_versions_place_is_refused_in_bounded_memory(
    tiny_tokenizer, tmp_path
):
    """Promise (brief, docs/BOUNDS.md 'JSON line's containers'): bad input is refused in one
    line within bounded memory; a damaged map is refused before any work. docs/ID_MAP.md, 'What
    a read checks, in order': a record is parsed (1: at most 256 MiB) before its MAC is checked
    (3), and map_record._parsed gives json.loads the whole record with no count of its
    containers, the rule every other JSON reader bounds its parse by (json_tree.containers_over:
    a container parses to ~64 bytes of Python for its 2-3 bytes of text). Whoever can write the
    map's files (no salt needed: the MAC is checked after) puts 48 MiB of `[],` in the newest
    version's place: the night peaks at ~1.4 GB (a one-night baseline is ~150 MB) before it
    refuses the MAC; at the 256 MiB the read allows, ~7.5 GB; under a memory limit it ends 'the
    job failed: MemoryError' (exit 1), not the refusal. The same parse opens the map in `kvtrace
    audit --id-map`, `id-map rebind` and `id-map upgrade`."""
    common = _map_of_nights(tiny_tokenizer, tmp_path, 2)
    newest = tmp_path / "map" / "versions" / "000002.json"
    lists = (48 << 20) // 3
    newest.write_bytes(
        b'{"format":"kvtrace-id-map","format_version":7,"x":[' + b"[]," * lists + b"[]]}\n"
    )
    night = _night(tmp_path, 2)
    code, peak, stderr = peak_rss_mb(
        [*KVTRACE, "anonymize", "--input", str(night), "--tokenizer", tiny_tokenizer]
        + ["--block-size", "4", "--output", str(tmp_path / "out2"), "--quiet", *common]
    )
    assert code == 2, stderr
    assert "000002.json" in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert peak < 500, f"peak RSS {peak} MB for a 48 MiB record"
    assert not (tmp_path / "out2").exists()


@pytest.mark.xfail(strict=True, reason="red team round 21")
def test_a_dangling_link_in_the_next_versions_place_is_refused_as_the_map_opens(
    tiny_tokenizer, tmp_path
):
    """Promise (docs/ID_MAP.md, docs/BOUNDS.md 'id map file read'): a damaged map is refused in
    one line naming the file before any work; a link or folder in a map file's place is refused
    as such. But id_map._committed_versions lists versions/ through storage.files_in, which
    keeps regular files only: a dangling link (or a folder) named versions/000003.json, which
    kvtrace never writes, is invisible as the map opens. The night does all its work, then
    exclusive.create_exclusive's link(2) finds the name taken and the night is told 'the id map
    was extended by another run while this one ran ... Run the night again': every rerun does
    the work again and ends so, and nothing names the file to remove."""
    common = _map_of_nights(tiny_tokenizer, tmp_path, 2)
    (tmp_path / "map" / "versions" / "000003.json").symlink_to(tmp_path / "nowhere")
    night = _night(tmp_path, 2)
    code, _, stderr = peak_rss_mb(
        [*KVTRACE, "anonymize", "--input", str(night), "--tokenizer", tiny_tokenizer]
        + ["--block-size", "4", "--output", str(tmp_path / "out2"), "--quiet", *common]
    )
    assert code == 2, stderr  # refused as the map opens, as a link elsewhere in the map is
    assert "versions/000003.json" in stderr, stderr
    assert "extended by another run" not in stderr
    assert not (tmp_path / "out2").exists()
