"""Red team round 22, the gate's publishing side: reproducers of what anonymize publishes and
`kvtrace audit` refuses, and of a figure the published times give back that the run's options
rounded. Each asserts the promised behaviour, so each fails until it is fixed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import DEFAULT_ACL, anonymize, chat, write_jsonl
from kvtrace.cli import main

pytestmark = pytest.mark.slow


def _audited(folder: Path, tokenizer: str, capsys, *options: str) -> tuple[int, list[str]]:
    """audit's exit code and flags on folder, given the run's own options."""
    report = folder.parent / f"{folder.name}.audit.json"
    code = main(["audit", str(folder), "--tokenizer", tokenizer, "--json", str(report), *options])
    capsys.readouterr()
    return code, json.loads(report.read_text())["flags"]


def _shared_folder(parent: Path, how: str) -> None:
    """parent made as a team's shared folder is: setgid to a group of the team (new entries
    take its group), or with a default ACL (new entries take an access ACL from it)."""
    if how == "setgid":
        others = [g for g in os.getgroups() if g != os.getegid()]
        group = others[0] if others else (1 if os.geteuid() == 0 else None)
        if group is None:
            pytest.skip("no second group to make a shared folder's")
        os.chown(parent, -1, group)
        os.chmod(parent, 0o2775)
    else:
        try:
            os.setxattr(parent, "system.posix_acl_default", DEFAULT_ACL)
        except OSError:
            pytest.skip("no POSIX ACLs on this file system")


@pytest.mark.parametrize("how", ["setgid", "default-acl"])
def test_a_night_written_into_a_teams_shared_folder_is_publishable(
    tiny_tokenizer, tmp_path, capsys, how
):
    """What anonymize publishes, the audit passes (AUDIT.md: "passes only what kvtrace itself
    writes"; the brief: a false refusal of kvtrace's own output). A team's shared folder is
    setgid (chmod g+s: every new entry takes the folder's group) or carries a default ACL
    (setfacl -d): both are made to be inherited, and kvtrace's writer inherits them. Under a
    setgid parent the night's folder is the team's group (publish's chmod 0755 clears the setgid
    bit, so its files are then the user's group); under a default ACL every entry carries a
    system.posix_acl_access attribute. anonymize exits 0, and the audit, given the run's own
    options, refuses every such night ("owners kvtrace does not set", "extended attributes
    kvtrace does not set"): a nightly that gates on the audit never publishes. (An inheritable
    inode flag, chattr +d or +A on the parent, is the same cause.) Promised: anonymize refuses
    such an output before the work, in one line, or writes entries the audit passes."""
    parent = tmp_path / "shared"
    parent.mkdir()
    _shared_folder(parent, how)
    src = write_jsonl(tmp_path / "in.jsonl", [chat(i, 1000 * i) for i in range(6)])
    out = parent / "out"
    code = anonymize(tiny_tokenizer, [src], out, "--block-size", "4", "--quiet")
    capsys.readouterr()
    if code != 0:
        assert not out.exists()
        return
    assert _audited(out, tiny_tokenizer, capsys, "--block-size", "4") == (0, [])


def test_length_granularity_is_undone_by_the_next_turns_arrival(tiny_tokenizer, tmp_path):
    """--length-granularity N publishes a reply's length only to within N (PRIVACY.md, "Publishing
    less"), and since round 6 no response_ms beside it: "a response time is TTFT + tokens x
    TPOT ... so to the millisecond it gives each rounded length back to the token, and no
    rounding of it is safe without the engine's decode speed". The same figure is published
    anyway as the gap to the session's next request, whose timestamp is kept to the millisecond
    (--timestamp-granularity-ms 1, the default): an agent sends its next request as the reply
    ends (a tool of a few ms), so next arrival = arrival + TTFT + tokens x TPOT + tool time.
    Here two nights differ only in the first reply's length, 3 or 4 tokens (200 ms TTFT, 30 ms
    a token, a 5 ms tool): both publish output length 16, and the second row at 295 or 325 ms,
    the length to the token; the gate passes both. Promised: two replies within one granule
    publish the same bytes (times coarsened with the lengths, or the option refused without a
    timestamp granularity that hides a token's decode time)."""
    published = []
    for tokens in (3, 4):
        first = {**chat(2, 0, session="agent"), "output_length": tokens}
        follow = {**chat(5, 200 + 30 * tokens + 5, session="agent"), "output_length": 9}
        log = write_jsonl(tmp_path / f"{tokens}.jsonl", [first, follow])
        out = tmp_path / f"out{tokens}"
        options = ("--block-size", "16", "--length-granularity", "16", "--quiet")
        if anonymize(tiny_tokenizer, [log], out, *options) != 0:
            assert not out.exists()
            return  # refused: nothing published
        published.append((out / "trace-00000-of-00001.jsonl").read_bytes())
    assert published[0] == published[1], published
