"""The documentation against the code: every `kvtrace COMMAND ...` line of README.md and docs/
names a real command and only flags its parser knows (a Beam option by name, where the command
takes Beam options: kvtrace.options' own list), with a value its choices allow; every relative
link points to a file that exists, and an anchor to a heading there. The CLI's own parser is
asked in-process, one parse per command, no subprocess. The site build (mkdocs build --strict)
runs in .ci/run."""

from __future__ import annotations

import argparse
import functools
import re
import shlex
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import ROOT
from kvtrace import cli

# Flags are checked against Beam's options too (beam_option_names loads Beam): one group.
pytestmark = pytest.mark.beam
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
INLINE_COMMAND = re.compile(r"`(kvtrace [^`]+)`")
CODE_COMMAND = re.compile(r"(?:^|&&\s*|\$\s*)(kvtrace\s.*)")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FLAG = re.compile(r"--?[A-Za-z][\w-]*")
PLACEHOLDER = "COMMAND"  # `kvtrace COMMAND --help`: a flag every command must know


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    text: str


def _code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text) of each command in an indented code block, continuation lines
    (a trailing backslash, or a synopsis line going on with [--option]) joined to it."""
    commands: list[tuple[int, str]] = []
    joining = False
    for number, line in enumerate(text.splitlines(), 1):
        code = line.startswith("    ") and line.strip()
        if not code:
            joining = False
            continue
        stripped = line.strip()
        if joining and (commands[-1][1].endswith("\\") or stripped.startswith(("[", "--"))):
            commands[-1] = (commands[-1][0], commands[-1][1].rstrip("\\ ") + " " + stripped)
            continue
        match = CODE_COMMAND.search(stripped)
        joining = bool(match)
        if match:
            commands.append((number, match.group(1)))
    return commands


def commands_in(page: Path) -> list[Command]:
    """The page's commands: in code blocks, and in `code spans` of the prose (which may wrap)."""
    text = page.read_text()
    found = [Command(page.name, n, t) for n, t in _code_lines(text)]
    prose = "\n".join("" if line.startswith("    ") else line for line in text.splitlines())
    for match in INLINE_COMMAND.finditer(prose):
        number = prose.count("\n", 0, match.start()) + 1
        found.append(Command(page.name, number, " ".join(match.group(1).split())))
    return found


def _words(command: str) -> list[str]:
    """The command's words up to where another command or a comment begins; a synopsis' [ ] and
    | alternatives are read as the words they hold."""
    command = re.split(r"\s(?:&&|;|#)\s|\s\|\s*(?=[a-z])", command)[0]
    command = command.replace("[", " ").replace("]", " ")
    try:
        words = shlex.split(command)
    except ValueError:  # an apostrophe in a placeholder: read the words as written
        words = command.split()
    return [w for w in words if w not in ("|", "...", "\\")]


@functools.cache
def parser() -> argparse.ArgumentParser:
    return cli._parser()


def _subparsers(parser_: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser_._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def _options(parser_: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {o: a for a in parser_._actions for o in a.option_strings}


@functools.cache
def beam_option_names() -> frozenset[str]:
    from kvtrace.options import beam_option_names as names  # imports Beam: only when asked

    return frozenset(names())


def problems(text: str) -> list[str]:
    """What is wrong with one documented `kvtrace ...` command: nothing, for a command that
    parses (its placeholders aside)."""
    words = _words(text)[1:]
    top = parser()
    if not words or words[0].startswith("-"):
        return [
            f"{w}: not a kvtrace option"
            for w in words
            if w.startswith("-") and w not in _options(top)
        ]
    name, words = words[0], words[1:]
    commands = _subparsers(top)
    if name == PLACEHOLDER:
        targets = list(commands.values())
    elif name in commands:
        targets = [commands[name]]
        nested = _subparsers(targets[0])  # id-map ACTION
        if nested and words and not words[0].startswith("-"):
            if words[0] not in nested and words[0] != words[0].upper():
                return [f"{name} {words[0]}: no such action (one of {', '.join(nested)})"]
            targets = [nested.get(words[0], targets[0])]
            words = words[1:]
    else:
        return [f"{name}: no such command (one of {', '.join(commands)})"]
    return [p for target in targets for p in _flag_problems(name, target, words)]


def _flag_problems(name: str, target: argparse.ArgumentParser, words: list[str]) -> list[str]:
    known = _options(target)
    takes_beam = "--engine" in known  # the commands with a Beam engine pass Beam options on
    found = []
    for index, word in enumerate(words):
        if not FLAG.fullmatch(word.split("=", 1)[0]):
            continue
        flag, _, value = word.partition("=")
        (respelled,) = cli._with_dashes([flag], parser())  # --id_map: a launcher's spelling
        action = known.get(respelled)
        if action is None:
            if takes_beam and flag in beam_option_names():
                continue
            found.append(f"{name} {flag}: not an option of kvtrace {name}")
            continue
        if not value and index + 1 < len(words) and not words[index + 1].startswith("-"):
            value = words[index + 1]
        found += _choice_problems(name, flag, action, value)
    return found


def _choice_problems(name: str, flag: str, action: argparse.Action, value: str) -> list[str]:
    """A literal value (not an UPPERCASE placeholder) given to an option with choices: each of
    its | alternatives must be one of them."""
    if not action.choices or action.nargs not in (None, "?") or value.upper() == value:
        return []
    return [
        f"{name} {flag} {choice}: not one of {', '.join(map(str, action.choices))}"
        for choice in value.split("|")
        if choice not in action.choices
    ]


ALL_COMMANDS = [command for page in PAGES for command in commands_in(page)]


def test_the_docs_hold_commands_to_check():
    """The extraction finds the README's set-up and first-run commands: a check that reads
    nothing would pass anything."""
    readme = [c.text for c in ALL_COMMANDS if c.page == "README.md"]
    assert any(
        c.startswith("kvtrace anonymize --input 'examples/requests/*.jsonl'") for c in readme
    )
    assert any(c.startswith("kvtrace audit night") for c in readme)
    assert len(ALL_COMMANDS) > 40


@pytest.mark.parametrize("command", ALL_COMMANDS, ids=[f"{c.page}:{c.line}" for c in ALL_COMMANDS])
def test_every_documented_command_parses(command: Command):
    assert problems(command.text) == [], f"{command.page}:{command.line}: {command.text}"


@pytest.mark.parametrize(
    "typo, says",
    [
        ("kvtrace anonymise --input x", "anonymise: no such command"),
        ("kvtrace anonymize --blocksize 16", "--blocksize: not an option"),
        ("kvtrace analyze TRACE --runer DirectRunner", "--runer: not an option"),
        ("kvtrace validate TRACE --runner DirectRunner", "--runner: not an option"),
        ("kvtrace anonymize --engine locale", "--engine locale: not one of"),
        ("kvtrace id-map upgade MAP", "upgade: no such action"),
        ("kvtrace id-map upgrade MAP --salt-fil F", "--salt-fil: not an option"),
        ("kvtrace COMMAND --json OUT", "--json: not an option of kvtrace COMMAND"),
        ("kvtrace --versoin", "--versoin: not a kvtrace option"),
    ],
)
def test_a_typo_in_a_command_is_caught(typo: str, says: str):
    """The check fails on what a typo makes: an unknown command or action, a flag the command
    does not know (a Beam option only where the command takes them), a value outside the
    choices."""
    assert any(says in p for p in problems(typo)), problems(typo)


def test_beam_options_pass_where_a_command_takes_them():
    line = "kvtrace anonymize --config c.yaml --runner DataflowRunner --enable_streaming_engine"
    assert problems(line) == []
    assert problems("kvtrace simulate TRACE --runner DirectRunner") != []


def github_slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def mkdocs_slug(heading: str) -> str:
    """Python-Markdown's toc anchor (MkDocs' default): ASCII, punctuation dropped, runs of spaces
    and hyphens one hyphen."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def anchors(page: Path) -> set[str]:
    """The anchors both GitHub and the site give the page's headings: a link works in both."""
    lines = page.read_text().splitlines()
    headings = [line.lstrip("#").strip() for line in lines if line.startswith("#")]
    return {github_slug(h) for h in headings} & {mkdocs_slug(h) for h in headings}


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto: (the site build checks none)
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
            broken.append(f"{target}: no heading #{anchor}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_resolves(page: Path):
    assert broken_links(page) == []


def test_a_broken_link_is_caught(tmp_path: Path):
    (tmp_path / "OTHER.md").write_text("# Nightly exports\n")
    page = tmp_path / "PAGE.md"
    page.write_text("[ok](OTHER.md#nightly-exports) [typo](OTHR.md) [anchor](OTHER.md#nightly)")
    assert broken_links(page) == ["OTHR.md: no such file", "OTHER.md#nightly: no heading #nightly"]


def test_the_readme_and_the_site_list_every_page():
    """A page is found from the README's index (a folder's pages from their section's page)
    and from the site's navigation."""
    docs = ROOT / "docs"
    pages = {p.relative_to(docs).as_posix() for p in docs.rglob("*.md")} - {"index.md"}
    readme = set(re.findall(r"\]\(docs/([^)#]+)", (ROOT / "README.md").read_text()))
    assert {page for page in pages if "/" not in page} - readme == set()
    nav = set(re.findall(r":\s*([A-Za-z_/]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M))
    assert pages - nav == set()
