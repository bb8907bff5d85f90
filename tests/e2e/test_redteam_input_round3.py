"""Red-team round 3: hostile input to `kvtrace anonymize` and the reading commands, past the
round-1 and round-2 fixes (test_redteam_input.py, test_redteam_input_round2.py). Each test
asserts a promise the tool makes and fails today (2026-11-26)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from helpers import ROOT, anonymize, chat, peak_rss_mb, write_jsonl

pytestmark = [pytest.mark.slow]
ROUND3 = "red team round 3"


def _template_folder(tiny_tokenizer, tmp_path, template: str):
    folder = tmp_path / "tok"
    shutil.copytree(tiny_tokenizer, folder)
    (folder / "chat_template.jinja").write_text(template + "{{ messages[0].content }}")
    return folder


def _run_for(folder, tmp_path, seconds: float, records=None):
    """anonymize on records (two chat records by default) in a child of its own session;
    (ended within seconds, its stderr)."""
    src = write_jsonl(tmp_path / "in.jsonl", records or [chat(0, 0), chat(1, 10)])
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvtrace.cli",
            "anonymize",
            "--input",
            str(src),
            "--output",
            str(tmp_path / "out"),
            "--tokenizer",
            str(folder),
            "--block-size",
            "4",
            "--processes",
            "1",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    try:
        _, err = proc.communicate(timeout=seconds)
        return True, err.decode(errors="replace")
    except subprocess.TimeoutExpired:
        return False, ""
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# ---- integer arithmetic is not sized: one C call that runs for hours --------------------------


def test_integer_division_of_squared_powers_cannot_hang_the_run(tiny_tokenizer, tmp_path):
    """bounded_sandbox.py sizes `**` (64 Ki bits) but not `*` between integers, nor `//` or `%`
    with an integer on the left (intercepted_binops is *, **, %; _check_binop's `*` sizes only
    sequences, its `%` only str formats). 2 ** 32768 squared 8 times (a namespace attribute, so
    no call sees the integer) is a 16 M-bit integer in 0.06 s, each step cheap; then one `//`
    by a 8 M-bit divisor is CPython 3.11's schoolbook long division, ~10^11 digit steps in one C
    call holding the GIL: the 5 s render watchdog cannot stop it (measured: one render still
    running 300 s in, killed). CPython's division checks for signals, so SIGTERM still ends the
    run (see the next test for what it then prints)."""
    folder = _template_folder(
        tiny_tokenizer,
        tmp_path,
        "{% set ns = namespace(x=0) %}{% set ns.x = 2 ** 32768 %}"
        "{% for i in range(8) %}{% set ns.x = ns.x * ns.x %}{% endfor %}"
        "{% set d = ns.x * 3 + 1 %}{% set q = (ns.x * ns.x + 7) // d %}",
    )
    ended, _ = _run_for(folder, tmp_path, 90)
    assert ended, "still running 90 s in on a 2-record input (render budget: 5 s a record)"


# ---- a stop during an overrunning render: the watchdog's exception escapes the run -----------


def test_sigterm_during_a_render_over_its_budget_is_not_a_traceback(tiny_tokenizer, tmp_path):
    """render_budget.Watchdog promises a RenderOverrun "never lands in code after the render":
    run()'s finally loops over _leave until it unregisters. But the stop handler (cli.py) raises
    KeyboardInterrupt inside that loop, which escapes it with the render still registered and
    marked overran; the watchdog keeps raising RenderOverrun into the thread each tick, and one
    lands in cli's stop.end() (pipelines/processes.descendants): two chained tracebacks ending
    in `transforms.encode.render_budget.RenderOverrun`, where a stopped run says one line.
    The render here is over its budget in one long C call (an integer division, see above)
    that checks for signals, so SIGTERM arrives while the overrun is pending."""
    folder = _template_folder(
        tiny_tokenizer,
        tmp_path,
        "{% set ns = namespace(x=0) %}{% set ns.x = 2 ** 32768 %}"
        "{% for i in range(8) %}{% set ns.x = ns.x * ns.x %}{% endfor %}"
        "{% set d = ns.x * 3 + 1 %}{% set q = (ns.x * ns.x + 7) // d %}",
    )
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0), chat(1, 10)])
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvtrace.cli",
            "anonymize",
            "--input",
            str(src),
            "--output",
            str(tmp_path / "out"),
            "--tokenizer",
            str(folder),
            "--block-size",
            "4",
            "--processes",
            "1",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    try:
        time.sleep(20)  # start-up, then well past the 5 s budget, inside the division
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    said = err.decode(errors="replace")
    assert "Traceback" not in said and "RenderOverrun" not in said, said[-2000:]


# ---- items are not bytes: a list of 100 M distinct objects from one |list --------------------


def test_a_template_cannot_spend_gigabytes_in_one_list_call(tiny_tokenizer, tmp_path):
    """bounded_sandbox.py bounds a value by its count of items (MAX_VALUE_LENGTH, 256 Mi), as
    if an item cost a byte or a pointer. `|list` of a string makes one str object per
    character; CPython caches only Latin-1 ones, so each 'ア' is a new 76-byte object plus its
    8-byte slot: 'ア' * 100 M (200 MB, within every bound) becomes ~8.4 GB in one C call (jinja's
    do_list), measured only after it returns (_checked) and beyond the watchdog's reach (its
    1 GiB memory budget is looked at between steps). `.split()` of 'ab ' * 80 M does the same
    (~5 GB). Capped here at 3.2 GB of address space (~2 GB resident) so the machine survives: the peak is the
    cap's, where the render should have been refused from its operands."""

    folder = _template_folder(tiny_tokenizer, tmp_path, "{{ ('\u30a2' * 100000000)|list|length }}")
    src = write_jsonl(tmp_path / "in.jsonl", [chat(0, 0), chat(1, 10)])
    code, peak, said = peak_rss_mb(
        [
            "prlimit",
            "--as=3200000000",
            sys.executable,
            "-m",
            "kvtrace.cli",
            "anonymize",
            "--input",
            str(src),
            "--output",
            str(tmp_path / "out"),
            "--tokenizer",
            str(folder),
            "--block-size",
            "4",
            "--processes",
            "1",
        ],
        ROOT,
    )
    # 1 GiB render budget above a ~200 MB process
    assert peak < 1400, f"{peak} MB peak rendering a 2-record input"


# ---- the 1 MiB rule: a small record still condemns the template, and the run -----------------


def test_three_small_records_first_in_a_log_do_not_condemn_a_real_template(
    qwen3_tokenizer, tmp_path
):
    """tokenize.render_chat blames the template (and stops the job after OVERRUNS_TO_STOP)
    when a record of at most CONDEMNING_RECORD_BYTES (1 MiB) goes over the 5 s render budget,
    assuming a record that small renders in milliseconds. It need not: a chat record whose
    `tools` are 340,000 empty objects is 1.02 MB written compactly (under 1 MiB), and Qwen3's
    own template prints each tool with `tojson` (sized first by the sandbox's walk), ~30 us a
    tool: ~10 s a render here. Three of them first in a log end the run with "the chat
    template went over the render budget ... on each of the first 3 requests of at most
    1048576 bytes: it does not render" (exit 1): the good requests after them are lost with
    the run, where round 1's fix promised 3 dead letters (a 1 MiB record is not small when
    the template's work is per item, not per byte)."""
    src = tmp_path / "in.jsonl"
    with open(src, "w") as handle:
        for i in range(3):
            line = json.dumps(
                {
                    "timestamp": i,
                    "messages": [{"role": "user", "content": "hi"}],
                    "tools": [{}] * 340_000,
                    "output_length": 1,
                },
                separators=(",", ":"),
            )
            assert len(line) < 1 << 20
            handle.write(line + "\n")
        for i in range(5):
            handle.write(json.dumps(chat(i, 10 + i)) + "\n")
    out = tmp_path / "out"
    # The 3 letters hold nearly all the input's bytes, which refuses the night by default
    # (every letter weighs its bytes): here the letters themselves are the subject.
    fraction = ("--max-rejected-fraction", "1")
    assert anonymize(qwen3_tokenizer, [src], out, "--processes", "1", *fraction) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["records"]["exported"] == 5  # the run's other counts are private: letters
    letters = [
        line
        for f in (tmp_path / "out-rejected").glob("rejected-*.jsonl")
        for line in f.read_text().splitlines()
    ]
    assert len(letters) == 3


# ---- dead letters: the same input, different bytes per engine --------------------------------


def test_dead_letters_are_the_same_bytes_whatever_the_engine(tiny_tokenizer, tmp_path):
    """docs/DEPLOY.md promises the engines' trace, stats, dead letters and map byte for byte (and
    kvtrace: same input and config, byte-identical output whatever the engine). The local
    engine wrote its dead letters in input order, Beam's sorted as text. Two bad lines whose
    text sorts against their order ("zz" first, then "aa") gave the same lines in a different
    order: now both engines write the one declared order (dead_letters.py)."""
    salt = tmp_path / "salt"
    salt.write_text("a-salt-for-tests-that-is-long-enough\n")
    salt.chmod(0o600)
    src = tmp_path / "in.jsonl"
    src.write_text(
        "zz not json\n"
        + json.dumps(chat(1, 1))
        + "\naa not json\n"
        + json.dumps(chat(2, 2))
        + "\n"
        + json.dumps(chat(3, 3))
        + "\n"
    )
    letters = {}
    for engine in ("local", "beam"):
        out = tmp_path / engine
        assert (
            anonymize(
                tiny_tokenizer,
                [src],
                out,
                "--block-size",
                "4",
                "--engine",
                engine,
                "--salt-file",
                str(salt),
                "--max-rejected-fraction",
                "0.9",
            )
            == 0
        )
        (letters[engine],) = (tmp_path / f"{engine}-rejected").iterdir()
    assert letters["local"].read_bytes() == letters["beam"].read_bytes()
