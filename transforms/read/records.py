"""Parse one log record (a JSON object) into a Request, or reject it with a reason.

Shapes, detected per record unless forced: chat (OpenAI `messages`, the Responses API's `input`
and `instructions`, Anthropic Messages told by its own fields: chat.is_anthropic), prompt
(`prompt`, already formatted), tokens (`input_ids`); any of them may sit inside a log envelope
{"request": {...}, "response": {...}}, the response possibly a list of streamed chunks, or in
the envelopes providers keep: LiteLLM's logging payload and spend logs, OpenAI Batch lines.
Every field is held to its declared shape (read/shapes.py: the types the serving engine would
accept), then checked for range; every string for valid Unicode.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kvtrace.transforms.dead_letters import DeadLetter
from kvtrace.transforms.errors import UNANTICIPATED, Rejected
from kvtrace.transforms.read import chat, streamed
from kvtrace.transforms.read.captures import (
    Capture,
    capture_fields,
    holds_engine_hashes,
    is_capture,
)
from kvtrace.transforms.read.json_tree import (
    ContainerBudget,
    check_tree,
    containers_over,
    loads_checked,
    orjson_reading,
)
from kvtrace.transforms.read.links import continued, names
from kvtrace.transforms.read.response_end import response_ms
from kvtrace.transforms.read.shapes import (
    FREE_FORM_FIELDS,
    check_record,
    declared_fields,
    type_name,
)
from kvtrace.transforms.read.timestamps import timestamp_ms
from kvtrace.transforms.trace_format import MAX_OUTPUT_LENGTH

INPUT_FORMATS = ("auto", "chat", "prompt", "tokens")
# The request's arrival: a log's own `timestamp`, else LiteLLM's `startTime` (its standard
# logging payload's epoch seconds, its spend logs' ISO date), read alike.
TIMESTAMP_FIELDS = ("timestamp", "startTime")
# Where a log keeps the request when not at its top level: an envelope's `request`, LiteLLM
# spend logs' `proxy_server_request` (an empty object when the proxy stores no prompts).
REQUEST_FIELDS = ("request", "proxy_server_request")
# The OpenAI Batch API's generation endpoints, and the kind of request each takes; a line's
# `url`'s path is the longest of them it ends in, after an optional prefix (BATCH_URL_PREFIX,
# matched whole) and before an optional query.
BATCH_ENDPOINTS = {"/chat/completions": "chat", "/responses": "chat", "/completions": "prompt"}
# OpenAI's `/v1`; Azure OpenAI's `/openai/deployments/NAME` or `/openai/v1`, or none at all (its
# documentation writes `/chat/completions`), its `?api-version=...` query after the path.
BATCH_URL_PREFIX = re.compile(r"(?:/openai(?:/deployments/[^/]+)?)?(?:/v1)?")
# LiteLLM's standard logging payload (its body the record itself) keeps its own rebuilding of
# the call in `messages`: the request the engine was sent only for these call types, each the
# kind of request it names. A text completion's messages wrap its prompt as one user message;
# any other call type's (anthropic_messages and responses drop the system prompt or
# instructions) is not what the engine saw. A payload without `call_type` reads as its fields say.
LITELLM_CALL_TYPE = "call_type"
LITELLM_CALL_TYPES = {
    "completion": "chat",
    "acompletion": "chat",
    "text_completion": "prompt",
    "atext_completion": "prompt",
}
# A record's `status` that says the call failed (LiteLLM's "failure"; a Responses API response's
# "failed"): the engine generated nothing to trace.
FAILED_STATUSES = frozenset({"failure", "failed", "error"})
# A response's `object` that no generation endpoint returns (an embeddings call's list of
# embeddings, a model list): its request was no generation, whatever its fields look like.
NOT_GENERATION_OBJECTS = frozenset({"list", "embedding", "model", "moderation", "file"})
# A Responses API object's `status` once its generation is over (`incomplete`: cut at a limit,
# its output what was generated); any other but a failed one (queued, in_progress, cancelled)
# says its output is not the generation's whole, which the log does not hold.
RESPONSES_OBJECT = "response"
FINISHED_STATUSES = frozenset({"completed", "incomplete"})
# Markers a log's writer leaves where it altered a request's text, so the engine's text is not
# in the log: its name, a pattern a string holding the marker matches, and what it means.
# LiteLLM's spend logs cut each long string to its two ends around a count of what they left
# out; its payloads (turn_off_message_logging, a callback that opts out) replace every message
# by a placeholder. An alteration with no marker here cannot be told from text (docs/BOUNDS.md).
ALTERATION_MARKERS = (
    (
        "litellm_truncated",
        re.compile(r"\.\.\. \(litellm_truncated skipped \d+ chars\) \.\.\."),
        "LiteLLM's spend log cut a string of it",
    ),
    (
        "redacted-by-litellm",
        re.compile(r"\A\s*redacted-by-litellm\s*\Z"),
        "LiteLLM logged a placeholder for its text",
    ),
)
ONE_OBJECT_PER_LINE = (
    "kvtrace reads one JSON object per line (JSONL), not pretty-printed JSON or a JSON array: "
    "jq -c . (objects) or jq -c '.[]' (an array) writes it so"
)
# What a Batch line read alone says (a stream's message, a Parquet row: batch_join.py joins
# the JSONL lines of a run without --streaming).
BATCH_JOIN = (
    "give the input file and the output file to one run (not --streaming), which joins their "
    "lines by custom_id (docs/ANONYMIZE.md)"
)
MAX_COUNT = MAX_OUTPUT_LENGTH  # also bounds the other counts a record gives
# Token ids are stored as uint32 (encode/blocks.TOKEN_DTYPE): larger ones are no tokenizer's.
MAX_TOKEN_ID = 2**32 - 1
# A record is rendered and tokenized whole: one 15 MB chat record peaked at 1.9 GB (DeepSeek-R1,
# ~125x the record; docs/BOUNDS.md). 16 MiB holds a million-token conversation with its JSON and
# keeps one record near 2 GB of a worker; larger ones are too_large dead letters unless raised.
DEFAULT_MAX_RECORD_BYTES = 16 << 20
# A JSON object or list parsed is a Python dict or list (~64 bytes with its slot) for its 2-3
# bytes of text (`[],`): a record's containers, counted before it is parsed
# (json_tree.containers_over), may cost at most this many times --max-record-bytes parsed.
PARSED_CONTAINER_BYTES = 64
CONTAINERS_BOUND_MULTIPLE = 2


@dataclass(frozen=True)
class ParseOptions:
    input_format: str = "auto"
    timestamp_unit: str = "auto"  # of numeric `timestamp` fields; `created` is always seconds
    drop_non_text_parts: bool = False
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    capture: str | None = None  # the engine capture format the input is (read/captures.py)
    # Read the links between requests (read/links.py; anonymize --emit-parents): off, a
    # streamed response's chunks are not walked for them.
    links: bool = False

    @property
    def withholds_letters(self) -> bool:
        """Whether every letter of the run withholds its line (DeadLetter.withhold): a capture
        run's records hold engine hashes however they are spelt, broken or cut."""
        return self.capture is not None

    def withholds(self, line: bytes, value: Any) -> bool:
        """Whether the letter of a record (line, its decoded value; None when it did not
        decode) withholds its line: in a capture run always, in a text run when the decoded
        record may hold engine hashes (captures.holds_engine_hashes)."""
        return self.withholds_letters or (value is not None and holds_engine_hashes(line, value))


class Weighed:
    """A value carrying the input bytes as stored it stands for (`stored`), which every letter
    made of it weighs; kept through Beam's pickling. Mixed into the value's own type (_PLAIN)."""

    _PLAIN: type
    stored: int

    @classmethod
    def weighing(cls, value: Any, stored: int) -> Any:
        weighed = cls(value)  # type: ignore[call-arg]
        weighed.stored = stored
        return weighed

    def __reduce__(self) -> tuple[Any, ...]:  # Beam pickles it between steps
        return type(self).weighing, (self._PLAIN(self), self.stored)


class StoredLine(Weighed, bytes):
    """A record's bytes with what they weigh (line_weight): a compressed file's line its
    decoded bytes at its file's whole share (sources.read_range), a joined Batch pair both its
    lines' (batch_join.py)."""

    _PLAIN = bytes


class SizedLine(StoredLine):
    """A Parquet row's rendering, `stored` its row's bytes as JSON as they were sized before
    decoding (sources.StoredRow, a RowSize): its letter weighs them at its file's share, known
    once the file is read (dead_letters.Tally)."""


class RowSize(int):
    """A Parquet row's bytes as JSON as sized before decoding, and `columns` their part in each
    top-level column of its file, which places the row in each column's stored bytes."""

    columns: tuple[int, ...]

    @classmethod
    def of(cls, columns: tuple[int, ...]) -> RowSize:
        size = cls(sum(columns))
        size.columns = columns
        return size

    def __reduce__(self) -> tuple[Any, ...]:  # Beam pickles it with its row
        return RowSize.of, (self.columns,)


def row_weight(size: RowSize) -> dict[str, Any]:
    """A Parquet row letter's weight fields (dead_letters.DeadLetter.row_bytes, row_columns)."""
    return {"row_bytes": int(size), "row_columns": size.columns}


def line_weight(line: bytes) -> int:
    """The input bytes a record's line stands for: what its letter weighs in
    --max-rejected-fraction whatever it decodes to and whatever its reason (a line may wrap any
    number of records); a plain file's line its own bytes."""
    return line.stored if isinstance(line, StoredLine) else len(line)


def letter_weight(line: bytes) -> dict[str, Any]:
    """A letter's weight fields for a record's line (line_weight): a Parquet row's as
    `row_bytes`, weighed at its file's share once the file is read; any other's as
    `lost_bytes`, bytes as stored."""
    if isinstance(line, SizedLine):
        return row_weight(line.stored)  # type: ignore[arg-type]
    return {"lost_bytes": line_weight(line)}


@dataclass(frozen=True)
class Request:
    """One parsed request, still holding its text: it never leaves the tokenize step."""

    source: str
    line: bytes  # the original record, for a dead letter if rendering fails later
    timestamp_ms: int
    kind: str  # "chat" | "prompt" | "tokens" | "capture"
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    prompt: str | None = None
    input_ids: list[int] | None = None
    output_text: str | None = None
    output_length: int | None = None
    session: str | None = None
    response_ms: int | None = None  # arrival to the response's end, when the log says
    # Prompt tokens the serving engine reported cached: private, never a trace column.
    cached_tokens: int | None = None
    defaulted: tuple[str, ...] = ()  # fields the record lacked and got a default for
    capture: Capture | None = None  # an engine's block hashes (kind "capture", read/captures.py)
    # read/links.py: the links naming this request, and the one it continues (never published)
    links: tuple[str, ...] = ()
    continues: str | None = None
    # Template variables the request sets for itself (its API's settings), over the run's
    template_kwargs: dict[str, Any] | None = None
    # The prompt's tokens the engine kept (truncate_prompt_tokens), from truncation_side's end
    # ("left": its last); None: all of them. add_special_tokens as the engine applied it.
    truncate_tokens: int | None = None
    truncation_side: str = "left"
    add_special_tokens: bool = False
    # The engine's cache salt (private: it seeds the request's chain, encode/blocks.py)
    cache_salt: str | None = None
    # Where output_text is a response's generation (no usage): the assistant message it holds
    # (chat.generated_turn; chat requests), counted as the template renders it
    # (encode/output_turn.py), and whether it ended at a stop the engine generated
    # (chat.ended_at_stop; None: not said).
    output_turn: dict[str, Any] | None = None
    output_stopped: bool | None = None

    def letter(self, reason: str, message: str) -> DeadLetter:
        """The dead letter of this request, refused after it parsed, withheld as its parse would
        have withheld it (ParseOptions.withholds): a capture is a capture run's; a text record
        is decided on its line decoded again here, as letters are few and no record should
        pay, as it parses, for what only a letter needs."""
        return DeadLetter(
            self.source,
            self.line,
            reason,
            message,
            withhold=self._withheld(),
            **letter_weight(self.line),
        )

    def _withheld(self) -> bool:
        if self.capture is not None:  # parsed in a capture run only: every letter withheld
            return True
        try:
            value, _ = load_json_line(self.line)
        except (Rejected, *UNANTICIPATED):  # it decoded once: if not again, the safe side
            return True
        return ParseOptions().withholds(self.line, value)


def parse_record(line: bytes, source: str, options: ParseOptions = ParseOptions()) -> Request:
    """The Request in one JSONL line; raises Rejected with a reason when there is none."""
    record, check_strings = decode_record(line, options)
    return request_from_object(record, line, source, options, check_strings=check_strings)


def decode_record(line: bytes, options: ParseOptions) -> tuple[dict[str, Any], bool]:
    """The JSON object of a line, bounded before it is decoded, and whether its strings may hold
    lone surrogates (load_json_line); raises Rejected when it is none."""
    value, check_strings = decode_value(line, options)
    return object_of(value), check_strings


def object_of(value: Any) -> dict[str, Any]:
    """A decoded line's value as the object a record is; raises Rejected when it is none."""
    if isinstance(value, list):
        raise Rejected("not_an_object", f"a JSON array, not an object: {ONE_OBJECT_PER_LINE}")
    if not isinstance(value, dict):
        raise Rejected("not_an_object", f"a JSON {type(value).__name__}, not an object")
    return value


def decode_value(line: bytes, options: ParseOptions) -> tuple[Any, bool]:
    """The JSON value of a line, bounded before it is decoded, and whether its strings may hold
    lone surrogates (load_json_line); raises Rejected when it is none."""
    if len(line) > options.max_record_bytes:
        raise Rejected(
            "too_large",
            f"record of {len(line)} bytes > --max-record-bytes {options.max_record_bytes}",
        )
    containers = containers_over(line, record_containers(options.max_record_bytes))
    if containers is not None:
        raise Rejected(
            "too_large",
            f"record of {containers} JSON objects and lists, "
            f"over {CONTAINERS_BOUND_MULTIPLE} x --max-record-bytes "
            f"{options.max_record_bytes} once parsed at {PARSED_CONTAINER_BYTES} "
            f"bytes each",
        )
    return load_json_line(line)


def record_containers(max_record_bytes: int) -> int:
    """The most JSON objects and lists a record may parse into: its line's, and, apart, its
    JSON texts inside strings together (chat tool-call arguments)."""
    return CONTAINERS_BOUND_MULTIPLE * max_record_bytes // PARSED_CONTAINER_BYTES


def without_nulls(value: Any, free_form: frozenset[str] = frozenset()) -> Any:
    """A record with every null object field left out, the one rule for a null in every form,
    applied by each reader before a shape is checked: vLLM's request models read an Optional
    field sent as null as unset, and one the engine requires, null or absent, is a 400 alike
    (shapes.required); Parquet cannot tell an absent field from a null one (a struct column
    gives each row every field any row has). So the same records read alike as JSONL and as
    Parquet (docs/ANONYMIZE.md, Input). A null list element stays: it is a value, not a field.
    What an object field named in `free_form` holds stays as it is (a JSON text's reader passes
    shapes.FREE_FORM_FIELDS): no model reads it, and the template writes its nulls out; a
    Parquet row cannot tell them from absent ones, so its reader passes none (docs/BOUNDS.md).

    In place, on a tree its reader just built and owns (a decoded line, a converted row), a
    level at a time over containers only: a streamed response is ~10^5 scalars a record, and
    copying the tree with a call per value was 4x orjson's own parse of it (issue 36)."""
    level = [value] if isinstance(value, (dict, list)) else []
    while level:
        for node in level:
            if isinstance(node, dict) and None in node.values():
                for key in [key for key, item in node.items() if item is None]:
                    del node[key]
        level = [
            child
            for node in level
            for child in (_model_values(node, free_form) if isinstance(node, dict) else node)
            if isinstance(child, (dict, list))
        ]
    return value


def _model_values(node: dict[str, Any], free_form: frozenset[str]) -> Iterable[Any]:
    """An object's values but the objects its free_form fields hold (a free-form value is an
    object: a Responses API `input` list is a model's)."""
    if free_form.isdisjoint(node):
        return node.values()
    return [item for key, item in node.items() if key not in free_form or type(item) is not dict]


def load_json_line(line: bytes) -> tuple[Any, bool]:
    """The JSON value of a line, and whether its strings may hold lone surrogates (orjson's
    reading where it reads alike, else the standard parser's)."""
    read, value = orjson_reading(line)
    if read:
        return value, False
    # Only \u escapes can make a lone surrogate out of valid UTF-8.
    return _loads_lenient(line), b"\\u" in line


def _loads_lenient(line: bytes) -> Any:
    """The standard parser's reading of a line orjson refused: invalid UTF-8 and JSON are
    rejected with where; big integers, NaN and lone surrogates read (checked later)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        raise Rejected("invalid_utf8", f"not valid UTF-8 at byte {err.start}") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise Rejected("too_deep", "JSON nested too deep to parse") from None
    except ValueError as err:  # also integers of more than 4300 digits
        hint = f"; {ONE_OBJECT_PER_LINE}" if _piece_of_wider_json(text) else ""
        raise Rejected("invalid_json", f"not JSON: {str(err)[:200]}{hint}") from None


def _piece_of_wider_json(text: str) -> bool:
    """Whether a line that is not JSON reads as a line of JSON written over many lines (a
    pretty-printed object, an array of them): it opens or closes a bracket, opens with a key
    or indentation, or ends where a value goes on."""
    stripped = text.strip()
    return (
        stripped[:1] in ("[", "]", "{", "}", '"')
        or text[:1] in (" ", "\t")
        or stripped.endswith((",", "{", "[", ":"))
    )


def request_from_object(
    record: dict[str, Any],
    line: bytes,
    source: str,
    options: ParseOptions = ParseOptions(),
    check_strings: bool = True,
) -> Request:
    """The Request in an already-decoded record (JSONL line or Parquet row)."""
    budget = ContainerBudget(record_containers(options.max_record_bytes))
    check_strings = decoded_body(record, budget) or check_strings
    # Links are read from the response as logged, before any merging: a text chunk's id names
    # its request, and a merged chunk holds none, so every path reads the same links.
    links = names(_response(record, record.get("custom_id") is not None)) if options.links else ()
    chunks = _streamed_chunks(record, options, check_strings)
    shorter = streamed.condensed(chunks) if chunks is not None else None
    if shorter is not None:  # read with a stream's text chunks merged (read/streamed.py)
        record["response"] = shorter
        try:
            return _request(record, line, source, options, check_strings, links, budget.left)
        except (Rejected, *UNANTICIPATED):
            record["response"] = chunks  # refused: read whole, so its letter is the whole's
    return _request(record, line, source, options, check_strings, links, budget.left)


# A server-sent event stream's lines (docs/ANONYMIZE.md, Input): a chunk, an event's name, the
# blank line between events; the stream ends with a data line of DONE.
DATA_LINE, EVENT_LINE, DONE = "data:", "event:", "[DONE]"


def decoded_body(record: dict[str, Any], budget: ContainerBudget) -> bool:
    """Read, in place, the bodies a log keeps as their text (a spend-log row's JSON columns, a
    proxy's raw event stream) as the values their JSON twin holds, so both read alike: a request
    field holding one JSON object's text, a response holding one JSON object's or list's, or an
    event stream's (its list of chunks). Each text is parsed within what the record may still
    parse (json_tree.loads_checked), its containers taken from `budget`; any other string is
    left for the shape check to letter. Returns whether a decoded text may hold lone surrogates
    (its \\u escapes: only those make one), so the record's strings are checked."""
    batch = record.get("custom_id") is not None
    texts = [
        name for name in (("body",) if batch else REQUEST_FIELDS) if type(record.get(name)) is str
    ]
    surrogates = False
    for name in texts:
        value = _json_text(record[name], budget, (dict,))
        if value is not None:
            record[name], surrogates = value, surrogates or "\\u" in record[name]
    response = record.get("response")
    if not batch and type(response) is str:
        value = _json_text(response, budget, (dict, list))
        if value is None:
            value = _event_stream(response, budget)
        if value is not None:
            record["response"], surrogates = value, surrogates or "\\u" in response
    return surrogates


def _json_text(text: str, budget: ContainerBudget, types: tuple[type, ...]) -> Any:
    """The value of a JSON text of one of `types`, within the budget; None when it is not
    one (the string stays a string)."""
    if not text.lstrip().startswith(("{", "[")):
        return None
    try:
        value = loads_checked(text, budget)
    except ValueError:  # not JSON: a string after all
        return None
    return value if isinstance(value, types) else None


def _event_stream(text: str, budget: ContainerBudget) -> list[Any] | None:
    """An event stream's chunk objects, each within the budget; None when the text is not only
    data and event lines and blank separators ending in a data line of DONE."""
    lines = text.replace("\r\n", "\n").split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    if (
        not lines
        or not lines[-1].startswith(DATA_LINE)
        or lines[-1][len(DATA_LINE) :].strip() != DONE
    ):
        return None
    chunks = []
    for line in lines[:-1]:
        if not line.strip() or line.startswith(EVENT_LINE):
            continue
        if not line.startswith(DATA_LINE):
            return None
        chunk = _json_text(line[len(DATA_LINE) :], budget, (dict,))
        if chunk is None:
            return None
        chunks.append(chunk)
    return chunks


def _streamed_chunks(
    record: dict[str, Any], options: ParseOptions, check_strings: bool
) -> list[Any] | None:
    """The streamed chunks a record's reading may condense: a log's response list, in a record
    whose strings are valid Unicode (a merged chunk's checks would not name where one is not)
    and that is no capture."""
    chunks = record.get("response")
    if (
        type(chunks) is not list
        or check_strings
        or record.get("custom_id") is not None  # a Batch line's response is an object
        or options.capture is not None
        or is_capture(record)
    ):
        return None
    return chunks


def _request(
    record: dict[str, Any],
    line: bytes,
    source: str,
    options: ParseOptions,
    check_strings: bool,
    links: tuple[str, ...],
    containers: int,
) -> Request:
    check_tree(record, check_strings)  # first: without_nulls recurses, within this depth
    if options.capture is not None or is_capture(record):  # an engine's hashes, no text
        return Request(source=source, line=line, **capture_fields(record, options.capture))
    if b"null" in line:  # a record whose text lacks the word holds no null: nothing to drop
        record = without_nulls(record, FREE_FORM_FIELDS)
    batch = record.get("custom_id") is not None
    body_field, body = _request_body(record, batch)
    # A Responses API stream's events read as its final response (read/streamed.py).
    logged = _response(record, batch)
    response = streamed.final_response(logged)

    payload_kind = None if batch else _payload_kind(record, body)
    kind = options.input_format
    if kind == "auto":
        kind = _batch_kind(record) if batch and body is not record else _detect_kind(body)
        kind = payload_kind or kind
    envelope = "batch" if batch else "log"
    # A text completion's payload holds its prompt in messages: held to the chat's shape.
    check_record(record, body, "chat" if payload_kind else kind, envelope, body_field)
    if batch and body is record:
        raise Rejected("unjoined_batch", f"a Batch output line holds no request: {BATCH_JOIN}")
    _check_outcome(record, response)
    _check_finished(logged)
    _check_unaltered(body, line)
    sent = chat.request_fields(record, body)
    fields: dict[str, Any] = {"kind": kind}
    api = _request_api(kind, body, sent.get("tools"))
    _check_one_sequence(sent, API_FIELDS[api], response)
    budget = ContainerBudget(containers)  # what the decoded bodies left
    if kind == "chat":
        fields["messages"] = _chat(body, api, options.drop_non_text_parts, budget)
        settings = API_FIELDS[api].settings
        fields["template_kwargs"] = settings(sent) if settings is not None else None
    elif kind == "prompt" and payload_kind == "prompt":
        fields |= _prompt_fields(_payload_prompt(body.get("messages")))
    elif kind == "prompt":
        fields |= _prompt_fields(body.get("prompt"))
    elif kind == "tokens":
        fields["input_ids"] = _token_ids(body.get("input_ids"))
    else:
        raise Rejected("no_input", "no messages, input, prompt or input_ids")
    fields |= _api_fields(sent, kind, api, response)

    ts = _timestamp(record, body, response, options.timestamp_unit)
    if ts is None:
        # A default would become the export's origin and shift every other row: never guess.
        if batch:
            raise Rejected("unjoined_batch", f"a Batch input line has no time: {BATCH_JOIN}")
        raise Rejected("missing_timestamp", "no timestamp, startTime or created field")
    output_text, output_length, counted = _output(declared_fields(record, envelope), body, response)
    stopped = chat.ended_at_stop(response) if counted else None
    cap = _token_cap(sent, API_FIELDS[api]) if stopped is False else None
    if cap is not None:  # cut at its length: the cap is the count, whatever its text shows
        output_text, output_length, counted, stopped = None, cap, False, None
    return Request(
        source=source,
        line=line,
        timestamp_ms=ts,
        output_text=output_text,
        output_length=output_length,
        session=_session(record, body),
        response_ms=response_ms(record, body, response, ts, options.timestamp_unit),
        cached_tokens=_cached_tokens(declared_fields(record, envelope), response),
        defaulted=("output_length",) if output_text is None and output_length is None else (),
        output_turn=_output_turn(response, budget) if counted and kind == "chat" else None,
        output_stopped=stopped,
        links=links,
        continues=continued(fields.get("messages")) if options.links else None,
        **fields,
    )


def _token_cap(sent: dict[str, Any], api: ApiFields) -> int | None:
    """The request's cap on generated tokens (api.caps, first given), when it is a count;
    None otherwise (the count from the response stands)."""
    for name in api.caps:
        value = sent.get(name)
        if value is not None:
            usable = isinstance(value, int) and not isinstance(value, bool)
            return value if usable and 0 < value <= MAX_COUNT else None
    return None


def _output_turn(response: dict | list | None, budget: ContainerBudget) -> dict[str, Any] | None:
    """The response's generated turn (chat.generated_turn), built leniently: the engine served
    the request, so whatever the turn's build refuses (a tool call's arguments past the JSON
    bounds, a call of no function) means no turn, and the text's count stands."""
    try:
        return chat.generated_turn(response, budget)
    except Rejected:
        return None


def _request_body(record: dict[str, Any], batch: bool) -> tuple[str, dict[str, Any]]:
    """(the field holding the request, the request): a Batch line's `body`, else the first of
    REQUEST_FIELDS holding a non-empty object, else the record itself."""
    for name in ("body",) if batch else REQUEST_FIELDS:
        value = record.get(name)
        if isinstance(value, dict) and (value or batch):
            return name, value
    if record.get("proxy_server_request") == {} and not isinstance(record.get("messages"), list):
        raise Rejected(
            "no_input",
            "a LiteLLM spend log without its request (the proxy keeps it only with "
            "store_prompts_in_spend_logs)",
        )
    return "request", record


def _response(record: dict[str, Any], batch: bool) -> dict | list | None:
    """The response object (or streamed chunks): a Batch output line's `response.body`."""
    response = record.get("response")
    if batch:
        response = response.get("body") if isinstance(response, dict) else None
    return response if isinstance(response, (dict, list)) else None


def _payload_kind(record: dict[str, Any], body: dict[str, Any]) -> str | None:
    """The kind of request a LiteLLM payload's call type names (LITELLM_CALL_TYPES); None for
    a record that is no payload or a payload without one (or of a type its shape refuses
    next). Raises Rejected for a call type whose messages are not what the engine saw."""
    call_type = record.get(LITELLM_CALL_TYPE) if body is record else None
    if not isinstance(call_type, str):
        return None
    kind = LITELLM_CALL_TYPES.get(call_type)
    if kind is None:
        raise Rejected(
            "unsupported_request",
            f"a LiteLLM payload of call_type {call_type[:40]!r}: its messages are LiteLLM's "
            "rebuilding of the call, not the request the engine was sent",
        )
    return kind


def _payload_prompt(messages: list | None) -> str | None:
    """A LiteLLM text completion's prompt: the content of the one user message its payload
    wraps it in; raises Rejected for messages that are no such wrapping."""
    if messages is None:
        return None
    message = messages[0] if len(messages) == 1 else None
    if not (message and message.get("role") == "user" and isinstance(message.get("content"), str)):
        raise Rejected(
            "unsupported_request",
            "a LiteLLM text completion's messages are not one user message holding its prompt",
        )
    return message["content"]


def _batch_kind(record: dict[str, Any]) -> str:
    """The kind of request a Batch line's endpoint takes; other endpoints generate nothing."""
    url = record.get("url")
    if not isinstance(url, str):  # absent, or of a type its shape refuses next
        return _detect_kind(record["body"])
    path = url.partition("?")[0]
    # The longest endpoint first: `/openai/deployments/chat/completions` names no deployment
    # before its chat endpoint, and is not read as a deployment `chat`'s prompt (a guess).
    ends = [end for end in BATCH_ENDPOINTS if path.endswith(end)]
    end = max(ends, key=len, default=None)
    if end is None or not BATCH_URL_PREFIX.fullmatch(path[: -len(end)]):
        raise Rejected("unsupported_request", f"a Batch request to {url[:64]!r}: not a generation")
    return BATCH_ENDPOINTS[end]


def _check_outcome(record: dict[str, Any], response: dict | list | None) -> None:
    """Refuse a call that served no generation, on every envelope alike: a failed call (a
    status that says so, an error beside or in the response, an HTTP status outside 2xx) is a
    failed_request, a gateway's answer from its own cache a gateway_cache_hit, a response no
    generation endpoint returns an unsupported_request. Read
    from the declared fields (shapes.ENVELOPE, RESPONSE_OBJECT), so their types are checked."""
    wrapper = record.get("response")  # a Batch output line's {status_code, body}
    holders = [record, *(h for h in (wrapper, response) if isinstance(h, dict))]
    if isinstance(response, list):  # a stream that ended in an error chunk failed
        holders += [chunk for chunk in response if isinstance(chunk, dict)]
    for holder in holders:
        status = holder.get("status")
        if isinstance(status, str) and status.lower() in FAILED_STATUSES:
            raise Rejected("failed_request", f"the call's status is {status[:32]!r}: not served")
        for name in ("status_code", "status"):
            code = holder.get(name)
            if isinstance(code, int) and not 200 <= code < 300:
                # The server refused the request (context too long, invalid): nothing generated.
                raise Rejected("failed_request", f"the call's {name} is {code}: not served")
        for name in ("error", "error_str"):
            if holder.get(name) not in (None, ""):
                raise Rejected("failed_request", f"the call logged an {name}: not served")
        hit = holder.get("cache_hit")
        if hit is True or (isinstance(hit, str) and hit.lower() == "true"):
            raise Rejected(
                "gateway_cache_hit",
                "the gateway answered from its own response cache: the engine never saw it",
            )
    kind = response.get("object") if isinstance(response, dict) else None
    if kind in NOT_GENERATION_OBJECTS:
        raise Rejected(
            "unsupported_request", f"the response is a {kind!r} object: not a generation"
        )


def _check_finished(logged: dict | list | None) -> None:
    """Refuse a Responses API object logged whole (`object` "response", or an `output`, which
    only it has) whose `status` is not a finished one (FINISHED_STATUSES): a background
    request answered while queued, a response cancelled. A stream's events are not checked: a
    stream cut short is read by what it streamed (read/streamed.py)."""
    if not isinstance(logged, dict):
        return
    if logged.get("object") != RESPONSES_OBJECT and "output" not in logged:
        return
    status = logged.get("status")
    if isinstance(status, str) and status.lower() not in FINISHED_STATUSES:
        raise Rejected(
            "unfinished_response",
            f"the response's status is {status[:32]!r}: its generation is not in the log",
        )


def _check_unaltered(body: dict[str, Any], line: bytes) -> None:
    """Refuse a request whose log holds a writer's alteration marker (ALTERATION_MARKERS) in
    any string of it: the text the engine saw is not in the log, and its length would be made
    up. Each marker's name is in the text of a string holding it, so a line naming none is
    passed without a walk."""
    markers = [marker for marker in ALTERATION_MARKERS if marker[0].encode() in line]
    level: list[Any] = [body] if markers else []
    while level:
        strings = [node for node in level if type(node) is str]
        for name, pattern, meaning in markers:
            if any(pattern.search(text) for text in strings):
                raise Rejected(
                    "altered_text",
                    f"the request's text holds {name!r}: {meaning}, so its length is unknown",
                )
        level = [
            child
            for node in level
            if type(node) in (dict, list)
            for child in (node.values() if type(node) is dict else node)
        ]


# The APIs a request may come to the engine by: each declares its own request fields.
CHAT_COMPLETIONS, COMPLETIONS, RESPONSES, ANTHROPIC = (
    "chat completions",
    "completions",
    "responses",
    "anthropic messages",
)
# The engine's add_special_tokens where a request gives none: a chat's template writes its own
# special tokens; a completions prompt gets the tokenizer's. (Token ids get none: read below.)
SPECIAL_TOKENS_DEFAULT = {CHAT_COMPLETIONS: False, COMPLETIONS: True, RESPONSES: False}
TRUNCATION_SIDES = ("left", "right")
CACHE_SALT = "cache_salt"
# The strictest engine's cache salt: 1 to 128 characters, none a separator of its cache keys.
MAX_CACHE_SALT_CHARS = 128
CACHE_SALT_FORBIDDEN = frozenset("@/\\\x00")


# A request field's reader: its value and the logged response in, the Request fields it gives
# out (or Rejected).
FieldReader = Callable[[Any, "dict | list | None"], dict[str, Any]]


def _request_api(kind: str, body: dict[str, Any], tools: Any) -> str:
    """The API a request of this kind and body came by (its fields are that API's)."""
    if kind != "chat":
        return COMPLETIONS
    if body.get("messages") is None:
        return RESPONSES
    return ANTHROPIC if chat.is_anthropic(body, tools) else CHAT_COMPLETIONS


def _stored_context(name: str) -> FieldReader:
    """A field naming context the engine prepends to the request's own input, which the log does
    not hold (a stored response or conversation, or earlier turns the reader does not model)."""

    def read(value: Any, response: dict | list | None) -> dict[str, Any]:
        raise Rejected(
            "stored_context",
            f"{name}: the engine prepended earlier context the trace cannot rebuild",
        )

    return read


def _kept_tokens(value: Any, response: dict | list | None) -> dict[str, Any]:
    """truncate_prompt_tokens: N >= 1 keeps N of the prompt's tokens; -1 the model's length,
    which the engine's own prompt token count says (else a letter)."""
    if type(value) is not int:
        raise Rejected("wrong_type", f"truncate_prompt_tokens is {type_name(value)}")
    if value == -1:
        return _model_length("truncate_prompt_tokens -1", response)
    if value < 1:
        raise Rejected("invalid_request", f"truncate_prompt_tokens {str(value)[:32]} is below 1")
    return {"truncate_tokens": value}


def _model_length(what: str, response: dict | list | None) -> dict[str, Any]:
    """A prompt cut to the model's length: as long as the engine counted it, which the log says
    or the request is a letter."""
    prompt_tokens = _prompt_tokens(response)
    if prompt_tokens is None:
        raise Rejected(
            "unsupported_request",
            f"{what}: the prompt cut to the model's length, and the log holds no prompt token "
            "count that says it",
        )
    return {"truncate_tokens": prompt_tokens}


def _responses_truncation(value: Any, response: dict | list | None) -> dict[str, Any]:
    """The Responses API's truncation: "auto" cuts to the model's length, "disabled" nothing."""
    if type(value) is not str:
        raise Rejected("wrong_type", f"truncation is {type_name(value)}")
    if value == "auto":
        return _model_length('truncation "auto"', response)
    if value != "disabled":
        raise Rejected("invalid_request", f"truncation {value[:32]!r} is not auto or disabled")
    return {}


def _truncation_side(value: Any, response: dict | list | None) -> dict[str, Any]:
    if type(value) is not str:
        raise Rejected("wrong_type", f"truncation_side is {type_name(value)}")
    if value not in TRUNCATION_SIDES:
        raise Rejected("invalid_request", f"truncation_side {value[:32]!r} is not left or right")
    return {"truncation_side": value}


def _special_tokens(value: Any, response: dict | list | None) -> dict[str, Any]:
    if type(value) is not bool:
        raise Rejected("wrong_type", f"add_special_tokens is {type_name(value)}")
    return {"add_special_tokens": value}


def _cache_salt(value: Any, response: dict | list | None) -> dict[str, Any]:
    """The engine's cache salt, as the strictest engine takes it (else the request fails)."""
    if type(value) is not str:
        raise Rejected("wrong_type", f"{CACHE_SALT} is {type_name(value)}")
    if not 1 <= len(value) <= MAX_CACHE_SALT_CHARS:
        raise Rejected("invalid_request", f"{CACHE_SALT} of {len(value)} characters, not 1 to 128")
    if CACHE_SALT_FORBIDDEN.intersection(value):
        raise Rejected("invalid_request", f"{CACHE_SALT} holds @, /, \\ or NUL")
    return {"cache_salt": value}


def _unsupported(name: str, why: str) -> FieldReader:
    """A field the engine refuses, or renders with what the log does not hold: a letter."""

    def read(value: Any, response: dict | list | None) -> dict[str, Any]:
        raise Rejected("unsupported_request", f"{name}: {why}")

    return read


def _tools(served: Callable[[list[Any]], list[dict[str, Any]]]) -> FieldReader:
    """An API's tools, as its request model takes them and the engine hands them to the
    template (served: chat.*_tools); an empty list is none, as the template is given none."""

    def read(value: Any, response: dict | list | None) -> dict[str, Any]:
        return {"tools": served(value) or None}

    return read


def _read_apart(value: Any, response: dict | list | None) -> dict[str, Any]:
    """A field read where the prompt is built (_chat, the API's settings), or a sequence field
    _check_one_sequence reads: it gives no Request field of its own here."""
    return {}


# Sampling parameters by which the engine generates more than one sequence a request (their
# count a value over 1) or sends the prompt back with what it generated (true): a trace row holds
# one generated length, so no row could say what the engine did (docs/ANONYMIZE.md).
MANY_SEQUENCES = ("n", "best_of")
ECHO = "echo"


_TOKENIZING: dict[str, FieldReader] = {
    "truncate_prompt_tokens": _kept_tokens,
    "truncation_side": _truncation_side,
    "add_special_tokens": _special_tokens,
    CACHE_SALT: _cache_salt,
}
# Read by _check_one_sequence, where an API declares them: a trace row holds one sequence.
_SEQUENCES = frozenset((*MANY_SEQUENCES, ECHO))


@dataclass(frozen=True)
class ApiFields:
    """What kvtrace does with each request field one API declares in the engine: `reads`, read
    as the engine applies it (a Request field, the prompt it renders, or a letter when the log
    cannot say what it rendered); `leaves`, fields that change neither the prompt nor its
    cache; `settings`, the API's own template variables (chat.*_settings), which read the
    fields named `_read_apart` here. A field an API does not declare is ignored, as the engine
    ignores it; one it declares is in one of the two, so none slips through unread
    (tests/transforms/read/test_api_fields.py walks each API's declared fields)."""

    reads: dict[str, FieldReader]
    leaves: frozenset[str]
    settings: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # The request's cap on generated tokens, first given wins: a sequence that ended at its
    # length generated exactly that many (the engine refuses a cap past the context left).
    caps: tuple[str, ...] = ()


def _leaving(names: str) -> frozenset[str]:
    return frozenset(names.split())


# The sampling, output and serving fields every API's request declares that leave the prompt
# alone (multimodal kwargs too: a non-text part is a letter or dropped before they matter).
_SERVING = (
    "model stream temperature top_p top_k min_p seed stop logit_bias priority request_id "
    "session_id watermarking kv_transfer_params ec_transfer_params vllm_xargs mm_payload "
    "return_mm_kwargs mm_processor_kwargs media_io_kwargs structured_outputs "
    "repetition_penalty presence_penalty frequency_penalty stop_token_ids ignore_eos "
    "skip_special_tokens spaces_between_special_tokens include_stop_str_in_output "
    "thinking_token_budget"
)
_GENERATION = (
    "logprobs top_logprobs max_tokens stream_options response_format user use_beam_search "
    "length_penalty min_tokens prompt_logprobs logprob_token_ids allowed_token_ids bad_words "
    "return_tokens_as_token_ids return_token_ids return_weight_versions "
    "routed_experts_prompt_start return_token_offsets repetition_detection stream_interval"
)
_CHAT_RENDERED = (
    "messages chat_template chat_template_kwargs add_generation_prompt "
    "continue_final_message documents reasoning_effort"
)
# Each API's row (docs/ANONYMIZE.md, Request fields per API). tool_choice leaves the prompt
# alone: "none" drops the tools only under a server flag (--exclude-tools-when-tool-choice-none)
# on Chat Completions and Responses alike, which a log does not say; kvtrace renders them.
API_FIELDS: dict[str, ApiFields] = {
    CHAT_COMPLETIONS: ApiFields(
        reads={
            **_TOKENIZING,
            "tools": _tools(chat.chat_completions_tools),
            **dict.fromkeys(_CHAT_RENDERED.split(), _read_apart),
            **dict.fromkeys(_SEQUENCES - {"best_of"}, _read_apart),
        },
        leaves=_leaving(
            f"{_SERVING} {_GENERATION} max_completion_tokens tool_choice include_reasoning "
            "parallel_tool_calls return_prompt_text"
        ),
        settings=chat.chat_completions_settings,
        caps=("max_completion_tokens", "max_tokens"),
    ),
    COMPLETIONS: ApiFields(
        reads={
            **_TOKENIZING,
            "prompt": _read_apart,
            **dict.fromkeys(_SEQUENCES, _read_apart),
            "suffix": _unsupported(
                "suffix",
                "the engine refuses it, or a fill-in-the-middle server renders the suffix's "
                "tokens into the prompt, which kvtrace does not",
            ),
            "prompt_embeds": _unsupported(
                "prompt_embeds", "the prompt sent as embeddings, whose tokens no log holds"
            ),
        },
        leaves=_leaving(f"{_SERVING} {_GENERATION}"),
        caps=("max_tokens",),
    ),
    RESPONSES: ApiFields(
        reads={
            "truncation": _responses_truncation,
            CACHE_SALT: _cache_salt,
            "tools": _tools(chat.responses_tools),
            **dict.fromkeys(
                "input instructions reasoning chat_template_kwargs".split(), _read_apart
            ),
            **{
                name: _stored_context(name)
                for name in (
                    "previous_response_id",
                    "previous_response",
                    "previous_input_messages",
                    "conversation",
                    "prompt",  # a stored prompt template, prepended to the input
                )
            },
        },
        leaves=_leaving(
            f"{_SERVING} background include max_output_tokens max_tool_calls metadata "
            "parallel_tool_calls include_reasoning service_tier store text tool_choice "
            "top_logprobs user prompt_cache_key prompt_cache_options "
            "prompt_cache_retention safety_identifier enable_response_messages"
        ),
        settings=chat.responses_settings,
        caps=("max_output_tokens",),
    ),
    ANTHROPIC: ApiFields(
        reads={
            CACHE_SALT: _cache_salt,
            "tools": _tools(chat.anthropic_tools),
            **dict.fromkeys(
                "messages system output_config thinking chat_template_kwargs".split(), _read_apart
            ),
        },
        leaves=_leaving(f"{_SERVING} max_tokens metadata stop_sequences tool_choice"),
        settings=chat.anthropic_settings,
        caps=("max_tokens",),
    ),
}


def _api_fields(
    sent: dict[str, Any], kind: str, api: str, response: dict | list | None
) -> dict[str, Any]:
    """The Request fields the request's API's API_FIELDS give (null: not given), over that
    API's add_special_tokens default; token ids get no special tokens, whatever the field."""
    fields: dict[str, Any] = {"add_special_tokens": SPECIAL_TOKENS_DEFAULT.get(api, False)}
    for name, read in API_FIELDS[api].reads.items():
        if sent.get(name) is not None:
            fields |= read(sent[name], response)
    if kind == "tokens":
        fields["add_special_tokens"] = False
    return fields


def _check_one_sequence(sent: dict[str, Any], api: ApiFields, response: dict | list | None) -> None:
    """Refuse a request whose engine generates other than one sequence, the prompt not echoed:
    by the request's fields as the engine received them (chat.request_fields), those its API
    declares (an undeclared one the engine ignores), and by the response's own evidence, which
    holds however the request was logged."""
    for name in MANY_SEQUENCES:
        value = sent.get(name) if name in api.reads else None
        if _asked_number(value) > 1:
            raise Rejected(
                "unsupported_request",
                f"{name} {str(value)[:32]}: more than one sequence generated, and a trace row "
                "holds one",
            )
    if ECHO in api.reads and sent.get(ECHO) is True:
        raise Rejected(
            "unsupported_request",
            f"{ECHO} true: the prompt sent back with what was generated, which a trace row "
            "cannot tell apart",
        )
    indexes = _choice_indexes(response)
    if len(indexes) > 1:
        raise Rejected(
            "unsupported_request",
            f"the response holds {len(indexes)} sequences (choice indexes "
            f"{sorted(indexes)[:4]}), and a trace row holds one",
        )


def _asked_number(value: Any) -> float:
    """A sampling count: a number, or a string Python reads as a number (as pydantic's lax
    mode reads one, near enough: a count over 1 either way refuses the record); 0 for anything
    else, which asks no more sequences."""
    if type(value) in (int, float):
        return value
    if type(value) is str and len(value) <= 32:
        try:
            return float(value)
        except ValueError:
            return 0
    return 0


def _choice_indexes(response: dict | list | None) -> set[int]:
    """The distinct sequences a response's choices generated, across a stream's chunks: a
    choice's `index` (an integer, its shape says), else its place in its list."""
    chunks = response if isinstance(response, list) else [response]
    indexes: set[int] = set()
    for chunk in chunks:
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        for place, choice in enumerate(choices if isinstance(choices, list) else ()):
            index = choice.get("index") if isinstance(choice, dict) else None
            indexes.add(place if index is None else index)
    return indexes


def _detect_kind(body: dict[str, Any]) -> str:
    """The kind of request by the fields it gives; a null field is not given (vLLM's request
    models read null as unset, and a Parquet log cannot tell the two apart)."""
    if body.get("messages") is not None or not isinstance(
        body.get("input"), (int, float, type(None))
    ):
        return "chat"
    if body.get("prompt") is not None:
        return "prompt"
    if body.get("input_ids") is not None:
        return "tokens"
    return "none"


def _chat(
    body: dict[str, Any], api: str, drop_non_text: bool, budget: ContainerBudget
) -> list[dict]:
    """The messages of a chat request of its API (its tools: API_FIELDS' tools readers)."""
    if api == CHAT_COMPLETIONS:
        return chat.openai_messages(body["messages"], drop_non_text, budget)
    if api == ANTHROPIC:
        return chat.anthropic_messages(body, drop_non_text, budget)
    if body.get("input") is None:
        raise Rejected("no_input", "no messages or input")
    return chat.responses_messages(body, drop_non_text, budget)


def _prompt_fields(prompt: str | list | None) -> dict[str, Any]:
    """A Completions prompt as the engine takes it (its type checked: shapes.PROMPT_BODY): a
    string; a list of token ids, read as a token-ids record is; a list of one string or one
    token-id list, that prompt. A list of several is several requests in one, which a trace
    row cannot be (as n over 1); one mixing those kinds is the engine's 400."""
    if isinstance(prompt, list):
        kinds = {type(item) for item in prompt}
        if kinds == {int}:
            return {"kind": "tokens", "input_ids": _token_ids(prompt, "prompt")}
        if len(kinds) > 1:
            raise Rejected("invalid_request", "prompt mixes strings, token ids and token-id lists")
        if len(prompt) > 1:
            raise Rejected(
                "unsupported_request",
                f"a prompt of {len(prompt)} prompts: several requests in one, and a trace row "
                "holds one",
            )
        prompt = prompt[0] if prompt else ""
        if isinstance(prompt, list):
            return {"kind": "tokens", "input_ids": _token_ids(prompt, "prompt")}
    if prompt is None:
        raise Rejected("no_input", "no prompt")
    if not prompt:
        raise Rejected("no_input", "prompt is empty")
    return {"kind": "prompt", "prompt": prompt}


def _token_ids(ids: list[int] | None, name: str = "input_ids") -> list[int]:
    if ids is None:
        raise Rejected("no_input", f"no {name}")
    if not ids:
        raise Rejected("no_input", f"{name} is empty")
    for token in ids:
        if not 0 <= token <= MAX_TOKEN_ID:
            raise Rejected("wrong_type", f"{name} holds something other than token ids")
    return ids


def _timestamp(record: dict, body: dict, response: dict | list | None, unit: str) -> int | None:
    for name in TIMESTAMP_FIELDS:
        for holder in (record, body):
            if holder.get(name) is not None:
                return timestamp_ms(holder[name], unit)
    first_chunk = response
    if isinstance(response, list):  # a stream: dated by its completion's first chunk
        first_chunk = (
            response[at] if (at := streamed.dating_chunk(response)) < len(response) else None
        )
    for holder in (record, body, first_chunk if isinstance(first_chunk, dict) else {}):
        if holder.get("created") is not None:
            return timestamp_ms(holder["created"], "s")  # OpenAI's `created` is epoch seconds
    if isinstance(first_chunk, dict) and first_chunk.get("created_at") is not None:
        return timestamp_ms(first_chunk["created_at"], "s")  # a Responses API response's
    return None


def _output(
    record: dict, body: dict, response: dict | list | None
) -> tuple[str | None, int | None, bool]:
    """(text to tokenize, known length, whether the text is the response's generation): the
    first source present, in docs/ANONYMIZE.md's order. `record`: the record's declared fields
    (shapes.declared_fields), so every count read here has had its type checked."""
    for holder in (record, body):
        if "output" in holder:
            return holder["output"], None, False
    for holder in (record, body):
        if "output_length" in holder:
            return None, _count(holder["output_length"], "output_length"), False
    if "completion_tokens" in record:  # LiteLLM's logs
        return None, _count(record["completion_tokens"], "completion_tokens"), False
    if response is None:
        return None, None, False
    for chunk in reversed(response if isinstance(response, list) else [response]):
        usage = chunk.get("usage") if isinstance(chunk, dict) else None
        if isinstance(usage, dict):
            for name in ("completion_tokens", "output_tokens"):
                if usage.get(name) is not None:
                    return None, _count(usage[name], f"usage.{name}"), False
    text = chat.generated_text(response)
    if text is None and response and not chat.holds_generation(response):
        raise Rejected("unread_response", f"{_shape(response)}: no usage or generation read")
    return text, None, text is not None


def _shape(response: dict | list) -> str:
    """A logged response's shape in a few words, for a letter: its first object's type or
    fields (bounded)."""
    first = response[0] if isinstance(response, list) else response
    kind = first.get("type") if isinstance(first, dict) else None
    if isinstance(kind, str):
        what = f"type {kind[:40]!r}"
    elif isinstance(first, dict):
        what = f"fields {', '.join(sorted(str(name)[:24] for name in first)[:6])}"
    else:
        what = type(first).__name__
    if isinstance(response, list):
        return f"the logged response, a list of {len(response)} (the first of {what})"
    return f"the logged response, an object of {what}"


# Where a usage object keeps the engine's cached prompt tokens (shapes.USAGE), first found wins.
CACHED_TOKEN_FIELDS = (
    ("prompt_tokens_details", "cached_tokens"),
    ("input_tokens_details", "cached_tokens"),
    ("cache_read_input_tokens",),
)


def _cached_tokens(record: dict, response: dict | list | None) -> int | None:
    """The prompt tokens the engine reported cached: vLLM's `num_cached_tokens` beside the
    request or in the response, else the last usage that says (a stream's final chunk)."""
    chunks = response if isinstance(response, list) else [response]
    for holder in (record, *reversed(chunks)):
        if not isinstance(holder, dict):
            continue
        if "num_cached_tokens" in holder:
            return _count(holder["num_cached_tokens"], "num_cached_tokens")
        usage = holder.get("usage")
        for path in CACHED_TOKEN_FIELDS if isinstance(usage, dict) else ():
            value = usage.get(path[0])
            if len(path) == 2 and isinstance(value, dict):
                value = value.get(path[1])
            if value is not None:
                return _count(value, "usage." + ".".join(path))
    return None


# Where a usage object keeps the engine's prompt token count (shapes.USAGE), first found wins.
PROMPT_TOKEN_FIELDS = ("prompt_tokens", "input_tokens")


def _prompt_tokens(response: dict | list | None) -> int | None:
    """The prompt tokens the engine counted: the last usage that says (a stream's final chunk)."""
    chunks = response if isinstance(response, list) else [response]
    for holder in reversed(chunks):
        usage = holder.get("usage") if isinstance(holder, dict) else None
        for name in PROMPT_TOKEN_FIELDS if isinstance(usage, dict) else ():
            if usage.get(name) is not None:
                return _count(usage[name], "usage." + name)
    return None


def _count(value: int, name: str) -> int:
    if not 0 <= value <= MAX_COUNT:
        raise Rejected("out_of_range", f"{name} {str(value)[:32]} is outside [0, {MAX_COUNT}]")
    return value


# Where a record keeps its session id, first found wins; LiteLLM's standard logging payload
# (its body the record itself, its tools in `model_parameters`) keeps the client's
# litellm_session_id as its `trace_id`, which its spend-log twin writes as `session_id`.
SESSION_FIELDS = ("session_id", "conversation_id")
LITELLM_PAYLOAD_SESSION_FIELD = "trace_id"


def _session(record: dict, body: dict) -> str | None:
    payload = body is record and isinstance(record.get("model_parameters"), dict)
    names = (*SESSION_FIELDS, LITELLM_PAYLOAD_SESSION_FIELD) if payload else SESSION_FIELDS
    for holder in (record, body):
        for name in names:
            value = holder.get(name)
            if name == LITELLM_PAYLOAD_SESSION_FIELD and value is not None:
                if not isinstance(value, str):  # LiteLLM writes a string (a uuid)
                    raise Rejected("wrong_type", f"{name} is a {type(value).__name__}")
            if value is None or value == "":  # "" is no id: it would join unrelated requests
                continue
            if isinstance(value, int) and not -(2**63) <= value < 2**63:
                raise Rejected("out_of_range", f"{name} is an integer beyond int64")
            return str(value)
    return None
