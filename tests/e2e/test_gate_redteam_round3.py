"""Red team round 3 against the publication gate (`kvtrace audit`): holes in the mechanisms
added since round 2 (the id map start, stream windows, content times, tokenizer digests). Each
test builds a folder carrying something kvtrace would not write, recomputing every digest,
statistic and time with kvtrace's own functions, and asserts the gate refuses it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_gate_redteam import SECRET, _columns, _manifest, _night, _republish, _with

from helpers import ROOT, anonymize, write_jsonl
from kvtrace.transforms.stats import audit as gate

pytestmark = pytest.mark.slow
ROUND3 = "red team round 3"
SALT = b"s" * 32


@pytest.fixture(scope="module")
def made(tiny_tokenizer, tmp_path_factory) -> dict:
    """Publishable outputs: a night of its own, and two nights extending an id map (the second
    adds ids), with the map's numbering as `audit --id-map` reads it."""
    tmp = tmp_path_factory.mktemp("redgate3")
    night = write_jsonl(tmp / "night.jsonl", _night(12))
    later = write_jsonl(
        tmp / "later.jsonl",
        [
            {
                **row,
                "timestamp": row["timestamp"] + 86_400_000,
                "messages": row["messages"][:1]
                + [{"role": "user", "content": "again " * (1 + i % 4)}],
            }
            for i, row in enumerate(_night(6))
        ],
    )
    (tmp / "salt").write_bytes(SALT)
    mapped = ("--id-map", str(tmp / "map"), "--salt-file", str(tmp / "salt"))
    assert anonymize(tiny_tokenizer, [night], tmp / "plain", "--block-size", "4") == 0
    assert (
        anonymize(
            tiny_tokenizer,
            [night],
            tmp / "hourly",
            "--block-size",
            "512",
            "--timestamp-granularity-ms",
            "3600000",
        )
        == 0
    )
    texts = write_jsonl(tmp / "texts.jsonl", _night(12, with_output_text=True))
    assert (
        anonymize(
            tiny_tokenizer, [texts], tmp / "outputs", "--block-size", "4", "--emit-output-hashes"
        )
        == 0
    )
    assert anonymize(tiny_tokenizer, [night], tmp / "night1", "--block-size", "4", *mapped) == 0
    assert anonymize(tiny_tokenizer, [later], tmp / "night2", "--block-size", "4", *mapped) == 0
    numbering = gate.map_numbering(str(tmp / "map"), SALT)
    made = {"tokenizer": tiny_tokenizer, "numbering": numbering, "tmp": tmp}
    for name in ("plain", "hourly", "outputs", "night1", "night2"):
        made[name] = tmp / name
        report = gate.audit(
            str(tmp / name),
            tiny_tokenizer,
            numbering=numbering if name.startswith("night") else None,
        )
        assert report["publishable"], report["flags"]
    return made


def _copy(folder: Path, target: Path) -> Path:
    shutil.copytree(folder, target)
    return target


def _refused(made: dict, folder: Path, numbering=None) -> list[str]:
    report = gate.audit(str(folder), made["tokenizer"], numbering=numbering)
    assert not report["publishable"], "the gate accepted it: " + json.dumps(report["flags"])
    return report["flags"]


WORD = int.from_bytes(SECRET, "big")  # "alice": 5 bytes, under 2^40


def test_a_folder_named_like_a_stream_window_skips_the_id_map_check(made, tmp_path):
    """Round 2's fix: a manifest whose id_map says where numbering began (which alone licenses
    a first row past time 0) is refused unless `audit --id-map` confirms it. But a folder named
    window-* is taken for a stream's window (_stream_window_start): with no sibling window
    before it, (0, 0) is expected and time_from_ms is never compared with anything. So any
    night of its own, its folder named window-000000 (its name is the publisher's to choose),
    republished with id_map {0, 0, T} and every timestamp + T passes with no --id-map: T is 40
    free bits (here "alice"; or the log's absolute epoch ms, the round-1 hole)."""
    folder = _copy(made["plain"], tmp_path / "window-000000")
    columns = _columns(folder)
    _republish(
        folder,
        _with(columns, timestamp=columns.timestamp + WORD),
        id_map={"block_ids_from": 0, "sessions_from": 0, "time_from_ms": WORD},
    )
    _refused(made, folder)


def test_an_id_map_nights_start_time_is_checked_against_nothing(made, tmp_path):
    """`audit --id-map` now checks id_map.block_ids_from and sessions_from against the map's
    versions, but id_map.time_from_ms (and with it every row's time) against nothing: the map
    keeps its origin and no night's times, and the gate only asks that the first row be at
    time_from_ms. A night extending the map, every timestamp moved by 40 free bits (or to the
    wall clock: the night's epoch ms minus nothing), passes the check made for it. Closed:
    each version records its night's start, all three figures, and identity (id_map.Night),
    and the gate accepts only a night a version recorded."""
    folder = _copy(made["night2"], tmp_path / "out")
    start = dict(_manifest(folder)["id_map"])
    columns = _columns(folder)
    shift = WORD - start["time_from_ms"]
    _republish(
        folder,
        _with(columns, timestamp=columns.timestamp + shift),
        id_map={**start, "time_from_ms": WORD},
    )
    flags = _refused(made, folder, made["numbering"])
    assert any("not a night a version of the id map recorded" in flag for flag in flags), flags


def test_the_tokenizer_name_is_free_text_when_audit_is_given_the_tokenizer(made, tmp_path):
    """tokenizer.name is checked only by loading it when `audit` has no --tokenizer
    (_check_tokenizer: `tokenizer or published["name"]`). Given --tokenizer (as the operator is
    told to), the manifest's name is never compared with it: any hub-shaped string of up to 128
    characters passes beside the right digests (the run named a local folder: its manifest
    says null). 128 bytes of the publisher's text in the manifest."""
    folder = _copy(made["plain"], tmp_path / "out")
    tokenizer = _manifest(folder)["tokenizer"]
    assert tokenizer["name"] is None
    _republish(
        folder, tokenizer={**tokenizer, "name": "patient-jane-doe.dob-1980-01-01/ssn-078-05-1120"}
    )
    _refused(made, folder)


def test_chat_template_kwargs_digests_carry_free_bytes(made, tmp_path):
    """Round 2 closed the free 32 bytes of tokenizer.sha256 digests by checking them against
    the tokenizer. chat_template_kwargs' digests ("hmac-sha256:" + 64 hex, keyed by the run's
    salt) are checked for shape only and against nothing (the gate has neither the run's kwargs
    nor its salt): 64 names and values, each 32 free bytes, nested arrays and objects of 64
    items more: here 4 KB of text in a night that used no kwargs at all."""
    folder = _copy(made["plain"], tmp_path / "out")
    assert _manifest(folder)["chat_template_kwargs"] == {}
    text = b"patient jane doe, dob 1980-01-01"  # 32 bytes: one digest's worth
    digest = "hmac-sha256:" + text.hex()
    kwargs = {
        f"hmac-sha256:{(text[:-2] + i.to_bytes(2, 'big')).hex()}": [digest] * 63 for i in range(2)
    }
    kwargs["enable_thinking"] = digest
    _republish(folder, chat_template_kwargs=kwargs)
    _refused(made, folder)


def test_output_ids_are_never_checked_as_chained_hashes(made, tmp_path):
    """A prompt id stands for its whole prefix: the gate refuses one behind two parents
    (_Rows._merge_ids). output_hash_ids are chained the same way (the blocks of prompt + output
    past the prompt's full blocks) yet never enter that check: only the output-only ids' first-
    seen order is. An output-only id swapped for any prompt id (the rest shifted down to stay
    dense and first-seen) passes, though that prompt id (here 0, a first block: no parent at
    all) cannot follow the row's last prompt block: log2(prompt ids) free bits per output id."""
    folder = _copy(made["outputs"], tmp_path / "out")
    columns = _columns(folder)
    prompt = set(columns.ids.tolist())
    only = [v for v in columns.output_ids.tolist() if v not in prompt]
    victim = next(v for v in only if only.count(v) == 1)
    output_ids = columns.output_ids.copy()
    output_ids[output_ids == victim] = 0
    output_ids[output_ids > victim] -= 1
    _republish(folder, _with(columns, output_ids=output_ids))
    _refused(made, folder)


@pytest.mark.parametrize("channel", ["atime", "mode", "owner"])
def test_file_metadata_beside_the_content_times_carries_free_data(made, tmp_path, channel):
    """Round 2's fix derives each file's and the folder's mtime from content and checks it
    (_check_times), but the copies it names keep more than the mtime: `cp -p` keeps the access
    time, permission bits and (as root) owners, `rsync -tU`/`-p`/`-o` and tar (mode, numeric
    uid and gid) too. An access time of 2100 whose nanoseconds are text (reads under relatime
    never move a future atime), permission bits of the publisher's choice (12 bits per entry:
    0o7777), or a uid and gid of text (64 bits per entry) pass unread."""
    folder = _copy(made["plain"], tmp_path / "out")
    _republish(folder)
    for i, path in enumerate(sorted(folder.iterdir())):
        stat = path.stat()
        if channel == "atime":
            atime = 4_102_444_800 * 10**9 + int.from_bytes(SECRET[:3], "big")  # 2100 + text
            os.utime(path, ns=(atime, stat.st_mtime_ns))
        elif channel == "mode":
            os.chmod(path, 0o6000 | 0o644 | (SECRET[i] & 0o7) << 3)  # setuid/setgid + text
        else:  # tar keeps numeric owners (and cp -p, rsync -o as root): 64 bits a file
            try:
                os.chown(path, int.from_bytes(SECRET[:3], "big"), int.from_bytes(SECRET[3:], "big"))
            except PermissionError:
                pytest.skip("only root gives a file another owner")
    _refused(made, folder)


@pytest.mark.parametrize("setting", ["granularity", "block_size"])
def test_run_settings_the_rows_only_bound_carry_free_numbers(made, tmp_path, setting):
    """The manifest's granularity and block_size are checked only as far as the rows bound
    them (_Rows._check: every value a multiple of the granularity, ceil(input_length /
    block_size) ids per row). Where the rows do not bound them they are free: a night whose
    times all round to 0 (an hour's --timestamp-granularity-ms over a short log; likewise
    output lengths all 0 for granularity.output_length) passes with timestamp_ms = 40 bits of
    text, and one whose prompts all fit one block (block size 512, short chats) with any
    block_size from the longest prompt to 2^20 (~20 bits), its replay commands rewritten."""
    from kvtrace.transforms.write.replayers import replay_commands

    folder = _copy(made["hourly"], tmp_path / "out")
    manifest = _manifest(folder)
    columns = _columns(folder)
    if setting == "granularity":
        assert not columns.timestamp.any() and manifest["granularity"]["timestamp_ms"] == 3600000
        _republish(folder, granularity={**manifest["granularity"], "timestamp_ms": WORD})
    else:
        assert (columns.num_ids == 1).all() and manifest["block_size"] == 512
        size = (1 << 20) - int.from_bytes(SECRET[:2], "big")  # 16 bits of text
        _republish(
            folder,
            block_size=size,
            replay=replay_commands(size, manifest["records"]["exported"], manifest["files"]),
        )
    _refused(made, folder)


def test_a_stream_windows_start_is_checked_against_an_unaudited_sibling(made, tmp_path):
    """A window-* folder's id_map is checked against the sibling folder that sorts before it
    (_stream_window_start), read without any check: only its manifest's id_map and the Parquet
    files its `files` names. The publisher of window-000001 makes that sibling too (it need not
    be published, nor pass an audit): a window-000000 holding just {"id_map": {W, W}, "files":
    []} makes any start W expected, so ids and sessions numbered from 40 free bits pass with no
    --id-map, where a night of its own must number from 0."""
    parent = tmp_path / "stream"
    parent.mkdir()
    (parent / "window-000000").mkdir()
    (parent / "window-000000" / "manifest.json").write_text(
        json.dumps({"id_map": {"block_ids_from": WORD, "sessions_from": WORD}, "files": []})
    )
    folder = _copy(made["plain"], parent / "window-000001")
    columns = _columns(folder)
    session = np.where(columns.session >= 0, columns.session + WORD, columns.session)
    _republish(
        folder,
        _with(columns, ids=columns.ids + WORD, session=session),
        id_map={"block_ids_from": WORD, "sessions_from": WORD, "time_from_ms": 0},
    )
    _refused(made, folder)


@pytest.mark.parametrize("name", ["pkg:this.x", "pkg:os.x"])
def test_the_published_tokenizer_name_makes_the_audit_import_a_module(made, tmp_path, name):
    """Without --tokenizer the gate resolves the manifest's tokenizer.name offline
    (_tokenizer_here -> tokenize.resolve_tokenizer -> importlib.util.find_spec), and find_spec
    of a dotted name imports its parent: the folder under audit chooses a module to run. "pkg:
    this.x" runs `this` (the Zen of Python printed by `kvtrace audit`; any installed module's
    import-time code likewise), and "pkg:os.x" stops the audit with "the job failed:
    ModuleNotFoundError" and no report, neither caught as a name that does not load (OSError,
    ValueError)."""
    import subprocess
    import sys

    folder = _copy(made["plain"], tmp_path / "out")
    tokenizer = _manifest(folder)["tokenizer"]
    _republish(folder, tokenizer={**tokenizer, "name": name})
    out = subprocess.run(
        [sys.executable, "-m", "kvtrace.cli", "audit", str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(ROOT),
    )
    assert out.returncode == 1, out.stderr[-300:]  # flagged: the name does not load
    assert "Zen of Python" not in out.stdout and "job failed" not in out.stderr


def test_a_map_nights_references_to_earlier_ids_may_be_permuted(made, tmp_path):
    """Round 1 closed the permutation channel of ids by first-seen order, but that order binds
    only a night's new ids (>= id_map.block_ids_from) and sessions. A night extending an id map
    (the nightly deployment) may relabel its references to the map's earlier ids and sessions
    by any one-to-one map into [0, block_ids_from): chains, token counts, stats and the first-
    seen order of new ids all hold, and `audit --id-map` passes it. Here the earlier ids the
    night uses are reversed among themselves; the capacity is log2 of the injections of k
    referenced ids into the map's N (every night, growing with the map). Closed with the map
    alone: its version records the night's identity, the digest of its files' digests, which
    binds every row (docs/ID_MAP.md, "What the gate confirms")."""
    folder = _copy(made["night2"], tmp_path / "out")
    start = _manifest(folder)["id_map"]
    columns = _columns(folder)
    old = sorted({v for v in columns.ids.tolist() if v < start["block_ids_from"]})
    assert len(old) > 2
    relabel = dict(zip(old, old[::-1]))
    ids = np.array([relabel.get(v, v) for v in columns.ids.tolist()], np.int64)
    _republish(folder, _with(columns, ids=ids))
    flags = _refused(made, folder, made["numbering"])
    assert any("not a night a version of the id map recorded" in flag for flag in flags), flags


def test_a_folder_audited_through_a_link_hides_its_own_attributes(made, tmp_path):
    """Round 2's fix reads the folder's own extended attributes with follow_symlinks=False
    (_check_attributes), while the folder is listed and timed through the link (os.scandir,
    os.stat follow it). Audited as `out-latest` -> out (or `out-latest/`: the trailing slash is
    stripped), the link's attributes are read, not the folder's: a user.* attribute on the real
    folder, which cp -a, rsync -X and tar --xattrs of it carry along, passes."""
    folder = _copy(made["plain"], tmp_path / "out")
    try:
        os.setxattr(folder, "user.note", b"patient jane doe, dob 1980-01-01")
    except (OSError, AttributeError):
        pytest.skip("no user extended attributes on this file system")
    _republish(folder)
    assert not gate.audit(str(folder), made["tokenizer"])["publishable"]
    link = tmp_path / "out-latest"
    link.symlink_to(folder)
    _refused(made, Path(f"{link}/"))


def test_the_window_before_is_read_as_often_as_its_manifest_names_a_file(
    made, tmp_path, monkeypatch
):
    """_stream_window_start reads every Parquet file the sibling window's manifest lists, with
    no check of the list: not its schema, not kvtrace's file names, not repeats. A 260 KB
    manifest naming one 12-row shard 20,000 times took 25 s here; 1 MiB names ~80,000, each up
    to 2 GiB and 16M items decoded (MAX_SHARD_BYTES, MAX_LONE_SHARD_ITEMS): hours of an audit
    of a 12-row folder, bounded by nothing BOUNDS.md states. The file is read once at most."""
    parent = tmp_path / "stream"
    (parent / "window-000000").mkdir(parents=True)
    shutil.copy(
        made["plain"] / "trace-00000-of-00001.parquet", parent / "window-000000" / "x.parquet"
    )
    (parent / "window-000000" / "manifest.json").write_text(
        json.dumps(
            {"id_map": {"block_ids_from": 0, "sessions_from": 0}, "files": ["x.parquet"] * 2000}
        )
    )
    folder = _copy(made["plain"], parent / "window-000001")
    _republish(folder, id_map={"block_ids_from": 23, "sessions_from": 3, "time_from_ms": 0})
    reads = []
    real = gate.columns_of_jsonl
    monkeypatch.setattr(
        gate, "columns_of_jsonl", lambda data, *a: reads.append(len(data)) or real(data, *a)
    )
    gate.audit(str(folder), made["tokenizer"])
    assert len(reads) <= 2, f"{len(reads)} trace files parsed for the window before"


def test_the_one_allowed_attribute_carries_any_value(made, tmp_path):
    """Round 2's fix refuses every extended attribute but security.selinux (_check_attributes:
    "the label a security module gives every file, not chosen by who copies the folder"), and
    never reads its value. Where no SELinux module claims the name (most Debian/Ubuntu hosts, and
    this one), root stores any bytes under it, and rsync -X / cp -a as root carry them: 32 bytes
    of text on each file pass as a "label"."""
    folder = _copy(made["plain"], tmp_path / "out")
    _republish(folder)
    try:
        for path in folder.iterdir():
            os.setxattr(path, "security.selinux", b"patient jane doe, dob 1980-01-01")
    except (OSError, AttributeError):
        pytest.skip("security.selinux takes no free value here (an SELinux host, or not root)")
    _refused(made, folder)


def test_input_lengths_kvtrace_never_writes_pass(made, tmp_path):
    """Round 2 bounded output_length and response_ms by what the reader accepts (2^31 - 1);
    input_length is still bounded only by 2^40 (check_values), though kvtrace writes none above
    records.MAX_COUNT (row_order.py says so, and saturates its tie key at 2^32 - 1 on that
    ground). A row of 5 bytes of text as its input_length ("alice" = 4.2e11 tokens) and the
    ~400,000 ids its block size of 2^20 needs passes (with the free block size above), and any
    such rows of one time and output length order freely under the saturated tie key."""
    from kvtrace.transforms.trace_format import TraceColumns
    from kvtrace.transforms.write.replayers import replay_commands

    folder = _copy(made["hourly"], tmp_path / "out")
    manifest = _manifest(folder)
    columns = _columns(folder)
    size = 1 << 20
    extra = -(-WORD // size)
    first = int(columns.ids.max()) + 1

    def add(values, value):
        return np.concatenate([values, np.array([value], np.int64)])

    grown = TraceColumns(
        add(columns.timestamp, 0),
        add(columns.input_length, WORD),
        add(columns.output_length, 0),
        add(columns.num_ids, extra),
        np.concatenate([columns.ids, np.arange(first, first + extra)]),
        add(columns.session, -1),
        add(columns.response_ms, -1),
    )
    _republish(folder, block_size=size)  # stats.json is then weighed at this block size
    _republish(
        folder,
        grown,
        records={"exported": len(grown)},
        replay=replay_commands(size, len(grown), manifest["files"]),
    )
    _refused(made, folder)
