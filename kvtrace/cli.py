"""The `kvtrace` command: registers each command group (kvtrace/commands/) and runs the one asked.

Flags kvtrace does not know are Beam pipeline options (--runner, --direct_num_workers, --project,
...) and pass through to Beam unchanged; a flag neither knows is an error. Every error is one
line on stderr: exit 2 for a run refused before it started, 1 for a job that stopped (a full
or failing disk mid-run included, on either engine), 128 plus the signal's number (130 for
Ctrl-C, 143 for SIGTERM, 129 for a hang-up) for a run stopped from outside, whatever the state
of stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import NoReturn

from kvtrace import __version__
from kvtrace.commands import analyze, anonymize, cache, check, convert, id_map, replay, synthesize
from kvtrace.commands.common import BeamFlags, Parser
from kvtrace.options import refuse_stray_words
from kvtrace.pipelines.processes import STOP_SIGNALS, end_descendants, quiet_thread
from kvtrace.transforms import storage
from kvtrace.transforms.encode.salt import SaltError
from kvtrace.transforms.errors import ConfigError, IdMapError, JobStopped
from kvtrace.transforms.write import interrupts

_LOG = logging.getLogger("kvtrace")
COMMANDS: dict[str, Callable[[argparse.Namespace, BeamFlags], int]] = {
    "anonymize": anonymize.run,
    "analyze": analyze.run,
    "reuse": cache.reuse,
    "simulate": cache.simulate,
    "report": cache.report,
    "calibrate": cache.calibrate,
    "synthesize": synthesize.run,
    "validate": check.validate,
    "audit": check.audit,
    "convert": convert.run,
    "render": replay.run,
    "export": replay.export,
    "id-map": id_map.run,
}
# A value such as -3M given to an option (argparse would take it for an option of its own).
NEGATIVE_NUMBER = re.compile(r"-\.?\d")
# Storage running out: only a write meets it, and every check is made before the work writes,
# so it is a job that stopped (1, as the Beam engine's wrapped error is), never a refusal (2);
# so is any error of the system once the run holds its output's lock (_began_writing).
STORAGE_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
STOPPED = "stopped: nothing published"  # by this process, nor (args.stop_leaves) its workers
# A stopped run unwinds (staging folders removed, pools end their workers, a cluster's job
# cancelled) for at most this long; then the process ends whatever it waits on (a tokenizer
# call, a thread join, a worker that will not go), its child processes with it.
STOP_DEADLINE_S = 1.5
ABANDON_WAIT_S = 0.2  # a publication under way at the deadline: renames, done in that
HALF_DONE = "; a publication was under way at the deadline and may be half done"


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="kvtrace", description="Turn LLM request logs into anonymized Mooncake-format traces."
    )
    parser.add_argument("--version", action="version", version=f"kvtrace {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    anonymize.add_parser(commands)
    analyze.add_parser(commands)
    cache.add_parsers(commands)
    synthesize.add_parser(commands)
    check.add_parsers(commands)
    check.add_audit_parser(commands)
    convert.add_parser(commands)
    replay.add_parser(commands)
    replay.add_export_parser(commands)
    id_map.add_parsers(commands)
    return parser


def _configure_logging(verbose: bool) -> None:
    """kvtrace's own progress at INFO; Beam (which logs every bundle, and a worker's failure with
    its traceback) and transformers only on --verbose: a failure is the one line main prints.
    Runs before Beam is imported, which logs warnings at import time."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger().setLevel(logging.INFO if verbose else logging.CRITICAL)
    _LOG.setLevel(logging.INFO)
    threading.excepthook = _log_thread_failure
    if not verbose:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # inherited by worker processes


def _log_thread_failure(args: threading.ExceptHookArgs) -> None:
    """A library thread's failure (Beam's watch on a worker a stop ended, say) logged as the
    library's messages are, on --verbose: the run's outcome is the one line main prints."""
    if args.exc_type is not SystemExit:
        logging.getLogger("threads").error(
            "thread %s failed",
            getattr(args.thread, "name", "?"),
            exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
        )


def _our_flags(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of every subcommand."""
    return {
        option
        for action in parser._subparsers._group_actions  # the subcommands
        for subparser in action.choices.values()
        for sub_action in subparser._actions
        for option in sub_action.option_strings
    }


def _with_dashes(argv: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """Launchers (Dataflow Flex Templates, Airflow's Beam operator) spell every option with
    underscores, as Beam does: --id_map=DIR. kvtrace's own flags take dashes, so respell those;
    Beam's options pass through as they are."""
    ours = _our_flags(parser)
    respelled: list[str] = []
    for arg in argv:
        name, sep, value = arg.partition("=")
        dashed = name.replace("_", "-")
        if respelled and respelled[-1] in ours and NEGATIVE_NUMBER.match(arg):
            respelled[-1] += f"={arg}"  # --capacity -3M: a value, for the option to judge
            continue
        respelled.append(dashed + sep + value if name.startswith("--") and dashed in ours else arg)
    return respelled


def _refuse_misspelled(command: str, leftovers: list[str], parser: argparse.ArgumentParser) -> None:
    """An option a command does not know but that is close to one it does is a typo: say so at
    once, whichever command (the rest are Beam options, or refused by commands without Beam)."""
    (subparsers,) = parser._subparsers._group_actions
    known = [o for a in subparsers.choices[command]._actions for o in a.option_strings]
    for arg in leftovers:
        name = arg.split("=", 1)[0]
        if name.startswith("-"):
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
            if close:
                raise ConfigError(
                    f"unknown option {name} (did you mean {close[0]}?); see "
                    f"kvtrace {command} --help"
                )


def _stray_words(leftovers: list[str]) -> list[str]:
    """Words argparse left that follow no flag, so cannot be a Beam option's value either (an
    unquoted glob expanded by the shell, given to an option that takes one value)."""
    return [
        word
        for before, word in zip([""] + leftovers, leftovers)
        if not word.startswith("-") and not (before.startswith("--") and "=" not in before)
    ]


class _Stop:
    """The first stop signal (SIGINT, SIGTERM, SIGHUP: STOP_SIGNALS) stops the run:
    KeyboardInterrupt in the main thread, so that the run unwinds through its finally blocks,
    and a deadline past which the process ends anyway. Python runs a handler only once the main thread is back in Python code, which a
    wait in a library may delay; the watcher learns of the signal at once, from the wakeup fd
    the interpreter writes to. Later signals are ignored: the stop is under way, and bounded.
    A publication defers the stop to its end (interrupts), so it is whole or rolled back; what
    the stop leaves is said from what this process published (publish.published_here)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self._args = args  # read when the stop is said: a command's word for its workers' part
        self.signum: int | None = None
        self._raised = False
        self._saying = threading.Lock()  # held from the line on: said once, by one thread

    def __call__(self, signum: int, frame: object) -> None:
        if self._raised:
            return
        self._raised = True
        self.signum = self.signum or signum
        interrupts.stop()  # raised now, or at the end of the publication under way

    def end(self) -> NoReturn:
        """End what this process started, say so once, and end this process: at once, as the
        interpreter's own exit would wait on threads and finalizers (gRPC's, for seconds).
        What the run made goes too (its staging, lock files: the run's one registry,
        storage.remove_on_exit): it may not have unwound (a wait in a library). The exit is
        in a finally and the line is said under OSError: a stderr that is gone (a closed
        pipe, a dropped terminal) neither keeps the process past its deadline nor changes
        its exit code."""
        try:
            end_descendants()
            publish = sys.modules.get("kvtrace.transforms.write.publish")  # else nothing staged
            whole = publish is None or publish.abandon_staged(ABANDON_WAIT_S)
            storage = sys.modules.get("kvtrace.transforms.storage")  # else nothing made
            if publish is None and storage is not None:  # no publication to wait for
                storage.remove_leftovers()
            # Bounded: the other thread may hold it (and the streams), stuck in a write to a
            # stalled terminal; then that thread says the line, or nobody does.
            if self._saying.acquire(timeout=ABANDON_WAIT_S):
                self._say(self._leaves(_published_here()) + ("" if whole else HALF_DONE))
        finally:
            os._exit(128 + (self.signum or signal.SIGINT))

    @staticmethod
    def _say(line: str) -> None:
        """The stop's line and both streams flushed: a stream that is gone (EPIPE, EIO) is
        passed over, as there is nobody left to tell."""
        with contextlib.suppress(OSError):
            print(line, file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError):
                stream.flush()

    def _leaves(self, published: str) -> str:
        """What the stop leaves: what this process published, else what the command says its
        workers (another process, a cluster) may have published, else nothing."""
        if published:
            return f"stopped: {_published_before(published, 'stop')}"
        leaves = getattr(self._args, "stop_leaves", None)
        return f"stopped: {leaves}" if leaves else STOPPED

    def watch(self, wakeup: socket.socket) -> None:
        """In a thread of its own: the first signal's number, then the deadline."""
        first = b"\0"
        while first[0] not in STOP_SIGNALS:  # a library's handler of another signal wakes it too
            try:
                first = wakeup.recv(1)
            except OSError:  # closed: the command ended
                return
            if not first:
                return
        self.signum = self.signum or first[0]
        if not self._raised:
            # Sent on to the main thread itself: the kernel may have given the signal to another
            # thread, leaving the main one in a lock's wait, which only a signal of its own ends.
            signal.pthread_kill(threading.main_thread().ident, self.signum)
        # A command may ask more (args.stop_grace_s: a cluster's job cancelled, waited for).
        time.sleep(STOP_DEADLINE_S + getattr(self._args, "stop_grace_s", 0.0))
        self.end()  # the run is still unwinding: a wait that does not end, say


def _published_here() -> str:
    """What this process published (publish.published_here: whichever process of the run made
    it); "" for nothing."""
    publish = sys.modules.get("kvtrace.transforms.write.publish")  # else nothing published
    return publish.published_here() if publish is not None else ""


def _began_writing() -> bool:
    """Whether the run got past its checks to its output (publish.began_writing)."""
    publish = sys.modules.get("kvtrace.transforms.write.publish")  # else nothing written
    return publish is not None and publish.began_writing()


def _published_before(published: str, end: str) -> str:
    """How a run's line says what it published before its end (a stop, a failure)."""
    return f"published {published} before the {end}"


def _failed(message: str) -> None:
    """A failure's one line, with what the run published before it (an id map's version
    committed before the output failed to publish): never read as a run that changed nothing."""
    published = _published_here()
    said = f"; {_published_before(published, 'failure')}" if published else ""
    print(f"error: {message}{said}", file=sys.stderr)


@contextlib.contextmanager
def _stopped_by_signals(args: argparse.Namespace) -> Iterator[_Stop]:
    """The stop signals handled by a _Stop while a command runs (in the main thread only:
    Python delivers signals there). Once stopped, the handlers stay: the process is ending."""
    stop = _Stop(args)
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    wakeup, written = socket.socketpair()
    written.setblocking(False)
    previous_fd = signal.set_wakeup_fd(written.fileno(), warn_on_full_buffer=False)
    watcher = threading.Thread(target=stop.watch, args=(wakeup,), name="stop-watcher", daemon=True)
    watcher.start()
    quiet_thread(watcher)  # it waits in recv: the local engine may still fork its workers
    previous = {signum: signal.signal(signum, stop) for signum in STOP_SIGNALS}
    try:
        yield stop
    finally:
        if stop.signum is None:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            signal.set_wakeup_fd(previous_fd)
            written.close()
            wakeup.shutdown(socket.SHUT_RDWR)  # the watcher's wait ends: it returns
            wakeup.close()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # the reader of stdout left (`| head`): it has what it wanted
        for stream in (sys.stdout, sys.stderr):  # or of stderr (`2>&1 | tee`), say, as it failed
            try:
                stream.flush()
            except OSError:  # gone: what it holds goes nowhere, so that exit's flush is quiet
                os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
        return 128 + signal.SIGPIPE


def _main(argv: Sequence[str] | None) -> int:
    _show_any_name()
    parser = _parser()
    args, leftovers = parser.parse_known_args(
        _with_dashes(sys.argv[1:] if argv is None else argv, parser)
    )
    _configure_logging(args.verbose)
    publish = sys.modules.get("kvtrace.transforms.write.publish")  # else nothing published yet
    if publish is not None:
        publish.forget_published()  # a run's line says what it published, not an earlier one's
    with _stopped_by_signals(args) as stop:
        try:
            return _run(COMMANDS[args.command], args, leftovers, parser, stop)
        except KeyboardInterrupt:
            stop.end()
        finally:
            if stop.signum is not None:  # however the run unwound (a failure's line unsaid)
                stop.end()


def _show_any_name() -> None:
    """Paths are bytes on Linux: a name that is not UTF-8 reaches Python as surrogates, which a
    strict stdout (PYTHONIOENCODING=utf-8, some locales) refuses to print, failing a run that
    has published. Shown escaped instead, whatever the terminal's encoding settings."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure") and stream.errors == "strict":
            stream.reconfigure(errors="backslashreplace")


def _run(
    run: Callable[[argparse.Namespace, BeamFlags], int],
    args: argparse.Namespace,
    leftovers: list[str],
    parser: argparse.ArgumentParser,
    stop: _Stop,
) -> int:
    try:
        _refuse_misspelled(args.command, leftovers, parser)
        refuse_stray_words(_stray_words(leftovers))
        # A command that publishes nothing (failed, refused, stopped) leaves no folder it made.
        with storage.run_folders():
            code = run(args, BeamFlags(leftovers, _our_flags(parser)))
    except BrokenPipeError:  # stdout's reader left: main ends quietly, as `| head` expects
        raise
    except OSError as err:
        code = 1 if err.errno in STORAGE_FULL or _began_writing() else 2
        if stop.signum is None:
            _failed(f"{'the job failed: ' if code == 1 else ''}{_one_line(err)}")
    except (ConfigError, SaltError, IdMapError, ValueError) as err:
        code = 2
        if stop.signum is None:
            _failed(_one_line(err))
    except Exception as err:  # never a traceback: say what failed, and how to see more
        code = 1
        stopped = JobStopped.message_in(err)
        if stop.signum is None and stopped is not None:
            _failed(stopped)
        elif stop.signum is None:  # a stop that a library wrapped is still a stop
            if args.verbose:
                raise
            _failed(
                f"the job failed: {type(err).__name__}: {_one_line(err)} "
                f"(run with --verbose for the traceback)"
            )
    return code


MAX_ERROR_CHARS = 500  # a long path twice in a message must not push the advice off screen
TRACEBACK = "Traceback (most recent call last):"


def _one_line(err: BaseException) -> str:
    """An error's first line, its middle cut if it is long: the advice comes last. An error
    whose text is a traceback (a worker's, as Beam passes it on) is said by its last line,
    where the traceback names what failed."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    line = (lines[-1] if lines[0] == TRACEBACK else lines[0]) if lines else type(err).__name__
    if len(line) <= MAX_ERROR_CHARS:
        return line
    half = MAX_ERROR_CHARS // 2
    return f"{line[: half - 3]}...{line[-half:]}"


if __name__ == "__main__":
    sys.exit(main())
