"""An id map's version record (versions/NNNNNN.json) as bytes: written keyed, read strictly.

The record lists the map's segment files with their sha256, next_id, the timestamp origin,
the identity of the runs that built it and the night that made each version (its start and
identity: id_map.Night). Anyone can recompute a sha256, so since format 4 a
record carries a MAC instead: HMAC-SHA256 over its canonical bytes under a key derived from the
run's salt, distinct from the block hashes' chain seed (map_key). A record altered on purpose
(segments swapped between shards with their checksums recomputed, next_id edited) is then
refused as surely as a damaged one.

Reading accepts only what kvtrace writes: the MAC is checked on the bytes as stored before
anything parses them (what an unkeyed writer puts there costs its bytes, never their parse),
then the bytes must be the ones kvtrace would write for that content (one canonical form), no
key may repeat, be missing or be unknown, and every field must have its type (an int is not a bool, a
float or a string) and lie within its range. Format 3 records (a sha256 of their own, no MAC,
so anyone can rewrite one) are refused wherever they appear: a keyed map's record downgraded to
format 3 is an edit. A map written before keying is keyed once, on purpose (read_keyless_record
and id_map.key_format_3_map), by whoever holds its salt.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvtrace.transforms.encode.blocks import salt_fingerprint
from kvtrace.transforms.errors import IdMapError
from kvtrace.transforms.ids.dense_ids import MAX_HASH_SHARDS
from kvtrace.transforms.ids.segments import index_path
from kvtrace.transforms.read.json_tree import containers_over
from kvtrace.transforms.read.timestamps import (
    DAY_MS,
    EPOCH,
    EPOCH_CEILING_MS,
    RELATIVE,
    timestamp_kind,
)
from kvtrace.transforms.trace_format import CAPTURE_FORMATS

MAP_FORMAT = "kvtrace-id-map"
# 2: segments sorted by hash with an index (segments.py), the shard count recorded.
# 3: every file's checksum and the version's own recorded and verified.
# 4: the version keyed by a MAC instead of its own sha256.
# 5: the kind of time the map's origin is (relative or epoch) recorded beside it.
# 6: each version's history entry names the night that made it: its start and identity; the
#    record holds the map's id (given at its creation, anchor.py names its mark by it) and
#    the sha256 of the record before it (previous_sha256: the versions form a chain).
# 7: the time its nights published: requests per day (published_days, what a night's clock
#    resets are judged against) and the last published time (published_to_ms, where the next
#    night must begin). A map of engine captures names their format (engine_capture), which
#    a kvtrace from before such maps refuses as an unknown key: a text map's record is as it was.
FORMAT_VERSION = 7
# Nights recorded before their times: read as it is (its next night is judged alone, as
# then); the map's next commit writes format 7, counting from that night.
TIMELESS_FORMAT = 6
# Keyed and kinded before nights were recorded: read as it is (its entries name no night, so
# the gate cannot confirm those nights); the map's next commit writes format 6.
NIGHTLESS_FORMAT = 5
# Keyed before the kind was recorded: proved by its MAC as format 5 is, and its kind is its
# origin's (read/timestamps.timestamp_kind, the rule that named it), so it is read as it is and
# the map's next commit writes format 5.
UNKINDED_FORMAT = 4
KEYLESS_FORMAT = 3  # read only to key it (id_map.key_format_3_map)
KINDS = ("blocks", "sessions")
MAC_CONTEXT = b"kvtrace id-map mac v1"
# Ids per kind: 100x the largest map planned for (1e10 ids), far inside int64 and the integers
# JSON readers hold exactly; a next_id beyond it is an edit, not a map.
MAX_IDS = 1 << 40
MAX_VERSION = 999_999  # version files are named by six digits
# The record of the largest map (33 segments x 4096 shards per kind) is ~150 MB.
MAX_RECORD_BYTES = 256 << 20
# Objects and lists in the largest record: 3 per history entry (one a version) and one per
# checksum (a segment file and its index, 33 x 4096 per kind). What a format-3 record, parsed
# before its sha256 is checked (read_keyless_record), may parse to (json_tree.containers_over):
# ~64 bytes of Python each.
MAX_RECORD_CONTAINERS = 3 * MAX_VERSION + 4 * 33 * MAX_HASH_SHARDS + 64
# Commas in the largest record, strings' included: 5 per format-3 history entry and 3 per
# checksum (its two members, the next checksum, its name in files). With the containers, they
# bound every value a format-3 record parses to (each follows a comma, a colon or a bracket),
# ~60 bytes of Python each: a value's text may be 3 bytes.
MAX_RECORD_COMMAS = 5 * MAX_VERSION + 3 * 4 * 33 * MAX_HASH_SHARDS + 1024
MAX_BLOCK_SIZE = 1 << 20  # the CLI's bound
SEGMENT_NAME = re.compile(r"segments/(\d{6})-[0-9a-f]{12}/(blocks|sessions)-(\d{5})\.parquet")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX16 = re.compile(r"[0-9a-f]{16}")
_HEX32 = re.compile(r"[0-9a-f]{32}")
# The checksums as record_bytes writes them, one grammar for all (a record lists up to ~540k
# files, too many to check one by one in Python): sizes are plain decimal ints below 1e16.
_FILE = r'"segments/\d{6}-[0-9a-f]{12}/(?:blocks|sessions)-\d{5}'
_SUMS = r'"sha256":"[0-9a-f]{64}"\}'
_SIZE = r'\{"bytes":(?:0|[1-9]\d{0,15}),'
_CHECKSUM = (
    rf'{_FILE}\.(?:parquet":{_SIZE}"footer_sha256":"[0-9a-f]{{64}}",'
    rf'|index\.npz":{_SIZE}){_SUMS}'
)
CHECKSUMS = re.compile(rf"\{{(?:(?:{_CHECKSUM})(?:,(?:{_CHECKSUM}))*)?\}}")


@dataclass(frozen=True)
class MapKey:
    """What a run proves and checks a map's records with: the MAC key (secret, never logged or
    shipped in a pipeline graph: workers derive it from the salt source) and the salt's public
    fingerprint, to tell a wrong salt from an altered map."""

    mac: bytes = field(repr=False)
    salt_fingerprint: str


def map_key(salt: bytes) -> MapKey:
    """The map's key, a subkey of the salt of its own: a MAC leaks nothing of the chain seed."""
    return MapKey(hmac.new(salt, MAC_CONTEXT, hashlib.sha256).digest(), salt_fingerprint(salt))


def record_bytes(record: dict[str, Any]) -> bytes:
    """The one form kvtrace writes a record in (and MACs): canonical JSON, compact, which the
    standard library writes in C (with an indent it writes in Python, ~10x slower)."""
    return (canonical(record) + "\n").encode()


def canonical(value: Any) -> str:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


def keyed(record: dict[str, Any], key: MapKey) -> bytes:
    """A format-4 record's bytes, its MAC added."""
    return record_bytes(record | {"mac": _mac(record, key)})


def _mac(record: dict[str, Any], key: MapKey) -> str:
    return hmac.new(key.mac, record_bytes(record), hashlib.sha256).hexdigest()


def keyless_checksum(record: dict[str, Any]) -> str:
    """A format-3 record's own sha256 (over its content without it)."""
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def read_record(
    raw: bytes, where: str, key: MapKey, below_is_keyed: Callable[[], bool] = lambda: False
) -> dict[str, Any]:
    """A version record's fields, verified by its MAC and checked field by field; any doubt
    (a format-3 record included) is a one-line IdMapError naming the file. The MAC is checked on
    the bytes as stored before anything parses them (_signed_by): what an unkeyed writer puts
    in a version's place costs its bytes to read, never their parse. below_is_keyed tells
    whether the version below this one is keyed: a format-3 record above a keyed one is no map
    as written (keying keys a format-3 map whole, newest first), so it is an edit, never one
    to key."""
    if len(raw) > MAX_RECORD_BYTES:
        raise _altered(where, f"over {MAX_RECORD_BYTES} bytes")
    mac = _signed_by(raw, key)
    if mac is None:
        raise _unverified(raw, where, key, below_is_keyed)
    data = _checked_format(_loaded(raw, where), where)
    if data.get("mac") != mac:
        raise _altered(where, "its MAC is not the record's own")
    if raw != record_bytes(data):
        raise _altered(where, "its bytes are not the form kvtrace writes")
    _check_fields(data, where)
    return data


# A record's MAC as record_bytes writes it: a member of the top-level object, never its first
# (checksums sorts before it in every keyed format).
_MAC_MEMBER = re.compile(rb',"mac":"([0-9a-f]{64})"')
# What is left of JSON text once every escape is gone and all but quotes and brackets deleted:
# strings (now holding brackets only) to remove before the brackets are counted.
_NOT_STRUCTURE = bytes(byte for byte in range(256) if byte not in b'"[]{}')
_BRACKETS_IN_STRING = re.compile(rb'"[^"]*"')


def _signed_by(raw: bytes, key: MapKey) -> str | None:
    """The record's MAC when it verifies over the bytes it covers: the record as stored with
    its top-level mac member cut out (keyed wrote the MAC over exactly those bytes); else None.
    Only the first member named mac at depth 1 is tried (chat_template_kwargs, before it, may
    hold one too): one HMAC, linear time, no parse. A cut of bytes kvtrace did not write fails
    the MAC; one it did write is the record's own, which read_record confirms parsed."""
    for member in _at_depth_1(raw, _MAC_MEMBER.finditer(raw)):
        view = memoryview(raw)
        signed = hmac.new(key.mac, view[: member.start()], hashlib.sha256)
        signed.update(view[member.end() :])
        mac = member[1].decode()
        return mac if hmac.compare_digest(signed.hexdigest(), mac) else None
    return None


def _at_depth_1(raw: bytes, matches: Iterable[re.Match[bytes]]) -> Iterator[re.Match[bytes]]:
    """The matches (in order, of text holding no brackets) that lie in the top-level object of
    JSON text: the one scan that reads a record's members without parsing it, linear time at
    C speed, and no further than the last match it is asked for."""
    view = memoryview(raw)
    depth, start = 0, 0
    for match in matches:
        depth += _depth_change(view[start : match.start()])
        start = match.end()
        if depth == 1:
            yield match


# The bytes _depth_change works on at once: the scan of a record of any size holds at most a
# few copies of this many (a junk record's bytes, never copied whole).
_DEPTH_CHUNK = 1 << 20


def _depth_change(text: memoryview) -> int:
    """How much deeper JSON text ends than it starts, brackets in strings not counted: at C
    speed (a record is ~150 MB at most), chunk by chunk, whether the chunk starts in a string
    or just after an escaping backslash carried from the one before."""
    change, in_string, escaped = 0, False, False
    for at in range(0, len(text), _DEPTH_CHUNK):
        chunk = bytes(text[at + escaped : at + _DEPTH_CHUNK])
        trailing = len(chunk) - len(chunk.rstrip(b"\\"))
        escaped = trailing % 2 == 1  # the chunk's last backslash escapes the next one's first
        in_string, counted = _chunk_depth(chunk[: len(chunk) - escaped], in_string)
        change += counted
    return change


def _chunk_depth(chunk: bytes, in_string: bool) -> tuple[bool, int]:
    """The depth change of a chunk whose escapes are whole (every backslash pairs within it),
    and whether it ends in a string. Its escapes are removed first, so every quote left opens
    or closes a string."""
    chunk = chunk.replace(b"\\\\", b"").replace(b'\\"', b"")
    chunk = chunk.translate(None, _NOT_STRUCTURE)
    if in_string:  # up to the quote that closes the string, all is in it
        closing = chunk.find(b'"')
        if closing < 0:
            return True, 0
        chunk = chunk[closing + 1 :]
    in_string = chunk.count(b'"') % 2 == 1
    if in_string:  # a string the next chunk closes: its brackets are in it
        chunk = chunk[: chunk.rfind(b'"')]
    chunk = _BRACKETS_IN_STRING.sub(b"", chunk.replace(b'""', b""))
    counted = chunk.count(b"[") + chunk.count(b"{") - chunk.count(b"]") - chunk.count(b"}")
    return in_string, counted


def _unverified(
    raw: bytes, where: str, key: MapKey, below_is_keyed: Callable[[], bool]
) -> IdMapError:
    """Why a record's MAC did not verify, told from a few of its top-level members read
    unparsed (unverified_members): a format-3 record, another salt's, or an altered one."""
    data = unverified_members(raw, ("format", "format_version", "salt_fingerprint"))
    if _checked_format(data, where)["format_version"] == KEYLESS_FORMAT:
        if below_is_keyed():
            return IdMapError(
                f"{where} is of id map format {KEYLESS_FORMAT} above a keyed version: kvtrace "
                f"never writes that, so the map was edited (keying it would publish the "
                f"edit). Restore the id map from a backup; nothing was read or written."
            )
        return IdMapError(
            f"{where} is of id map format {KEYLESS_FORMAT}: unkeyed, so anyone can rewrite it, "
            f"and a keyed map's record rewritten so is an edit. If this map was built before "
            f"keying, key it once with its salt (kvtrace id-map upgrade MAP --salt-file ...; "
            f"docs/ID_MAP.md, 'Format 3 maps'); otherwise "
            f"restore the id map from a backup. Nothing was read or written."
        )
    named = data.get("salt_fingerprint")
    why = (
        "it names this salt's fingerprint, so its bytes are not the form kvtrace writes: it "
        "was damaged or altered"
        if named == key.salt_fingerprint
        else f"either the salt is not the map's (it names "
        f"{'no salt fingerprint' if named is None else 'salt fingerprint ' + shown(named)}, "
        f"this run's salt has {key.salt_fingerprint}), or the map was damaged or altered"
    )
    return IdMapError(
        f"{where}: its MAC does not verify with this run's salt: {why}. Run with the salt the "
        f"map was built with, or restore the id map from a backup; nothing was read or written."
    )


# The most bytes of a member's value read unverified: the longest value read so is a sha256.
MAX_MEMBER_BYTES = 256
_SPACE = rb"[ \t\n\r]*"  # what JSON allows between tokens
# What a key's opening quote follows: `{`, `,` or a space, never the backslash every quote
# inside a string follows.
_BEFORE_KEY = b"{, \t\n\r"


def unverified_members(raw: bytes, names: tuple[str, ...]) -> dict[str, Any]:
    """The values of the named members of a record's top-level object, read without parsing
    the record (what its MAC does not vouch for costs its bytes, never their parse): the first
    at depth 1 of each name, as kvtrace or an older kvtrace writes it (spaces allowed), its
    value at most MAX_MEMBER_BYTES of JSON; a name not found so is absent. Nothing of it is
    trusted: it only says why a record is refused, or where a chain walk looks next."""
    if len(raw) > MAX_RECORD_BYTES:
        return {}
    # One literal pattern a name (found at C speed, where an alternation of names steps
    # through every quote), their matches merged in order for the one depth scan.
    matches = heapq.merge(
        *(
            _keys(raw, re.compile(rb'"%s"%s:%s' % (re.escape(name.encode()), _SPACE, _SPACE)))
            for name in names
        ),
        key=lambda match: match.start(),
    )
    decoder = json.JSONDecoder(
        object_pairs_hook=_no_repeated_keys, parse_constant=_no_constant, parse_float=_finite
    )
    found: dict[str, Any] = {}
    for member in _at_depth_1(raw, matches):
        name = member[0].split(b'"', 2)[1].decode()
        if name in found:
            continue
        text = raw[member.end() : member.end() + MAX_MEMBER_BYTES].decode("utf-8", "replace")
        try:
            found[name] = decoder.raw_decode(text)[0]
        except (ValueError, RecursionError):
            found[name] = None
        if len(found) == len(names):
            break
    return {name: value for name, value in found.items() if value is not None}


def _keys(raw: bytes, member: re.Pattern[bytes]) -> Iterator[re.Match[bytes]]:
    """A member's matches where a key begins: a key holding an escaped quote and a member's
    name is not that member, nor cuts the depth scan inside a string. Checked per match, so
    the search stays a literal one (a lookbehind in the pattern is ~15x slower)."""
    return (m for m in member.finditer(raw) if m.start() and raw[m.start() - 1] in _BEFORE_KEY)


def read_keyless_record(raw: bytes, where: str) -> dict[str, Any]:
    """A format-3 record's fields, verified by its own sha256 and checked field by field: what
    keying a map built before keying reads (id_map.key_format_3_map), and nothing else. The
    one whole parse of a record no MAC vouches for (whoever keys a map vouches for it), and it
    too is bounded: a record of another format is refused before it, and it parses only
    within what the largest record holds (MAX_RECORD_CONTAINERS, MAX_RECORD_COMMAS)."""
    form = format_of(raw, where)
    if form != KEYLESS_FORMAT:
        raise IdMapError(
            f"{where} is of id map format {form}, not {KEYLESS_FORMAT}: it is keyed already"
        )
    containers = containers_over(raw, MAX_RECORD_CONTAINERS)
    if containers is not None:
        raise _altered(
            where,
            f"{containers} objects and lists, over the {MAX_RECORD_CONTAINERS} a record holds",
        )
    if raw.count(b",") > MAX_RECORD_COMMAS:
        raise _altered(where, f"over the {MAX_RECORD_COMMAS} values a record holds")
    data = _checked_format(_loaded(raw, where), where)
    if data.get("sha256") != keyless_checksum({k: v for k, v in data.items() if k != "sha256"}):
        raise IdMapError(
            f"{where} is damaged: its content does not match its sha256. "
            f"Restore the id map from a backup."
        )
    _check_fields(data, where)
    return data


def format_of(raw: bytes, where: str) -> int:
    """A record's format version, 3 to 7 (anything else refused), read from its top-level
    member unparsed (unverified_members): nothing of it trusted yet."""
    members = unverified_members(raw, ("format", "format_version"))
    return _checked_format(members, where)["format_version"]


def _loaded(raw: bytes, where: str) -> Any:
    try:
        return json.loads(
            raw,
            object_pairs_hook=_no_repeated_keys,
            parse_constant=_no_constant,
            parse_float=_finite,
        )
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise _altered(where, f"not JSON kvtrace wrote: {str(err)[:80]}") from None


def _checked_format(data: Any, where: str) -> dict[str, Any]:
    """A record of a format this kvtrace reads (its other fields not yet checked)."""
    if not isinstance(data, dict) or data.get("format") != MAP_FORMAT:
        raise IdMapError(f"{where} is not a kvtrace id map version")
    form = data.get("format_version")
    if type(form) is not int or form not in (
        FORMAT_VERSION,
        TIMELESS_FORMAT,
        NIGHTLESS_FORMAT,
        UNKINDED_FORMAT,
        KEYLESS_FORMAT,
    ):
        raise IdMapError(
            f"{where} has id map format version {json.dumps(form)[:40]}; this kvtrace reads "
            f"versions {UNKINDED_FORMAT} to {FORMAT_VERSION}. Start a new map in another directory."
        )
    return data


def keyed_from_keyless(
    data: dict[str, Any], key: MapKey, map_id: str, previous: bytes | None
) -> bytes:
    """A verified format-3 record's content as a format-7 record keyed with key (records from
    before the probe tokenization was recorded hold none), its origin's kind recorded, in the
    map of id map_id, chained to the keyed record before it (previous; None for version 1)."""
    content = {k: v for k, v in data.items() if k != "sha256"}
    return keyed(
        {"tokenization": None, "published_days": {}, "published_to_ms": None}
        | content
        | {
            "format_version": FORMAT_VERSION,
            "timestamp_kind": origin_kind(content["timestamp_origin_ms"]),
            "map_id": map_id,
            "previous_sha256": None if previous is None else hashlib.sha256(previous).hexdigest(),
        },
        key,
    )


def keyed_map_id(first: dict[str, Any], key: MapKey) -> str:
    """The id keying gives a format-3 map: derived from its first record under the key, so a
    rerun of an interrupted keying gives the same id, and another map another one."""
    return hmac.new(key.mac, b"map id" + record_bytes(first), hashlib.sha256).hexdigest()[:32]


def origin_kind(origin_ms: int | None) -> str | None:
    """The kind of time a map's origin is, and so every night of it: None before it has one."""
    return None if origin_ms is None else timestamp_kind(origin_ms)


class AlteredRecord(IdMapError):
    """A record not as kvtrace writes it; why: where it departs (a commit refusing its own
    record tells that, not the reader's advice to restore the map)."""

    def __init__(self, where: str, why: str):
        super().__init__(
            f"{where} is not an id map version as kvtrace writes it ({why}). Restore "
            f"the id map from a backup; nothing was read or written."
        )
        self.why = why


def _altered(where: str, why: str) -> IdMapError:
    return AlteredRecord(where, why)


def refusal(raw: bytes, key: MapKey) -> str | None:
    """Why read_record would refuse a record's bytes, None if it reads them: run on what a
    commit is about to write, so no commit writes a record its own reader refuses."""
    try:
        read_record(raw, "the record", key)
    except AlteredRecord as err:
        return err.why
    except IdMapError as err:
        return str(err)
    return None


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data = dict(pairs)
    if len(data) != len(pairs):
        raise ValueError("a key repeats")
    return data


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: no record kvtrace writes holds it
        raise ValueError(f"{text[:20]} is out of range")
    return value


def is_int(value: Any, low: int, high: int) -> bool:
    """An int (not a bool, a float or a string) in [low, high]."""
    return type(value) is int and low <= value <= high


def _is_hex64(value: Any) -> bool:
    return type(value) is str and _HEX64.fullmatch(value) is not None


def _is_json_object(value: Any) -> bool:
    return type(value) is dict


# Every field a record may hold, and what it must be; fields of several values are checked below.
_FIELDS: dict[str, Callable[[Any], bool]] = {
    "format": lambda v: v == MAP_FORMAT,
    "format_version": lambda v: type(v) is int,
    "version": lambda v: is_int(v, 1, MAX_VERSION),
    "salt_fingerprint": lambda v: type(v) is str and _HEX16.fullmatch(v) is not None,
    "block_size": lambda v: is_int(v, 1, MAX_BLOCK_SIZE),
    "tokenizer_sha256": lambda v: _is_json_object(v) and all(map(_is_hex64, v.values())),
    "hash_scheme": lambda v: type(v) is str and v != "",
    "chat_template_kwargs": _is_json_object,
    "tokenization": lambda v: v is None or type(v) is str,
    "engine_capture": lambda v: v in CAPTURE_FORMATS,
    "timestamp_origin_ms": lambda v: v is None or is_int(v, 0, EPOCH_CEILING_MS),
    "timestamp_kind": lambda v: v is None or v in (RELATIVE, EPOCH),
    "next_id": lambda v: (
        _is_json_object(v)
        and v.keys() == set(KINDS)
        and all(is_int(n, 0, MAX_IDS) for n in v.values())
    ),
    "files": lambda v: (
        _is_json_object(v)
        and v.keys() == set(KINDS)
        and all(type(names) is list and all(type(n) is str for n in names) for names in v.values())
    ),
    "hash_shards": lambda v: is_int(v, 1, MAX_HASH_SHARDS),
    "history": lambda v: type(v) is list,
    "checksums": _is_json_object,
    "map_id": lambda v: type(v) is str and _HEX32.fullmatch(v) is not None,
    "previous_sha256": lambda v: v is None or _is_hex64(v),
    "published_days": lambda v: (
        _is_json_object(v)
        and len(v) <= MAX_DAYS
        and all(is_day(day) and is_int(n, 1, MAX_IDS) for day, n in v.items())
    ),
    "published_to_ms": lambda v: v is None or is_int(v, 0, EPOCH_CEILING_MS),
}
# Days a map's nights can publish on: those of 2000-2100 (timestamps.EPOCH_CEILING_MS).
MAX_DAYS = EPOCH_CEILING_MS // DAY_MS
_DAY = re.compile(r"0|[1-9]\d{0,5}")


def is_day(name: str) -> bool:
    """A day as published_days names it: its number since the epoch, in decimal."""
    return _DAY.fullmatch(name) is not None and int(name) <= MAX_DAYS


_OWN_CHECK = {
    FORMAT_VERSION: ("mac", lambda v: type(v) is str),
    TIMELESS_FORMAT: ("mac", lambda v: type(v) is str),
    NIGHTLESS_FORMAT: ("mac", lambda v: type(v) is str),
    UNKINDED_FORMAT: ("mac", lambda v: type(v) is str),
    KEYLESS_FORMAT: ("sha256", lambda v: type(v) is str),
}
# Format-3 maps made before the probe text's tokenization was recorded lack it.
_OPTIONAL = {
    KEYLESS_FORMAT: {"tokenization"},
    UNKINDED_FORMAT: set(),
    NIGHTLESS_FORMAT: set(),
    TIMELESS_FORMAT: set(),
    # A map of engine captures (id_map.MapIdentity.recorded): a text map's holds none.
    FORMAT_VERSION: {"engine_capture"},
}
# Fields a format came before.
TIMES = {"published_days", "published_to_ms"}
_CHAINED = {"map_id", "previous_sha256"} | TIMES
_CAPTURES = {"engine_capture"}
_LATER = {
    KEYLESS_FORMAT: {"timestamp_kind"} | _CHAINED | _CAPTURES,
    UNKINDED_FORMAT: {"timestamp_kind"} | _CHAINED | _CAPTURES,
    NIGHTLESS_FORMAT: _CHAINED | _CAPTURES,
    TIMELESS_FORMAT: TIMES | _CAPTURES,
    FORMAT_VERSION: set(),
}


def _check_fields(data: dict[str, Any], where: str) -> None:
    form = data["format_version"]
    own, own_check = _OWN_CHECK[form]
    fields = {name: check for name, check in _FIELDS.items() if name not in _LATER[form]} | {
        own: own_check
    }
    unknown, missing = data.keys() - fields, fields.keys() - data.keys() - _OPTIONAL[form]
    if unknown or missing:
        raise _altered(
            where,
            ", ".join(
                [f"unknown key {k!r}" for k in sorted(unknown)]
                + [f"no {k!r}" for k in sorted(missing)]
            ),
        )
    wrong = [name for name, check in fields.items() if name in data and not check(data[name])]
    if wrong:
        raise _altered(
            where, f"{wrong[0]} is {shown(data[wrong[0]])}, not a value kvtrace writes there"
        )
    problem = (
        _kind_problem(data)
        or _times_problem(data)
        or _chain_problem(data)
        or _history_problem(data)
        or _files_problem(data)
    )
    if problem:
        raise _altered(where, problem)


def shown(value: Any) -> str:
    """A value as a refusal shows it: JSON-escaped (one line), cut, and its type."""
    return f"{json.dumps(value)[:40]} ({type(value).__name__})"


def _kind_problem(data: dict[str, Any]) -> str | None:
    """The recorded kind of time must be the origin's: one fact, never two that disagree."""
    if "timestamp_kind" in data and data["timestamp_kind"] != origin_kind(
        data["timestamp_origin_ms"]
    ):
        return (
            f"timestamp_kind {data['timestamp_kind']} is not the kind of its origin "
            f"({data['timestamp_origin_ms']} ms)"
        )
    return None


def _times_problem(data: dict[str, Any]) -> str | None:
    """A map's nights published a last time once they published on a day, and not before."""
    if "published_days" in data and (data["published_to_ms"] is None) != (
        not data["published_days"]
    ):
        return (
            f"published_to_ms is {shown(data['published_to_ms'])} for "
            f"{len(data['published_days'])} days published"
        )
    return None


def _chain_problem(data: dict[str, Any]) -> str | None:
    """Only a map's first version has no record before it."""
    if "previous_sha256" in data and (data["previous_sha256"] is None) != (data["version"] == 1):
        return f"previous_sha256 is {shown(data['previous_sha256'])} for version {data['version']}"
    return None


def _history_problem(data: dict[str, Any]) -> str | None:
    """Each version's entry, in order, and the ids they added summing to next_id. Since format 6
    an entry names its night (night_entry); entries from before it only come first."""
    history = data["history"]
    if len(history) != data["version"]:
        return f"its history has {len(history)} entries for version {data['version']}"
    added = dict.fromkeys(KINDS, 0)
    named = False
    for number, entry in enumerate(history, 1):
        shape = _is_json_object(entry) and entry.keys()
        named = named or (data["format_version"] >= TIMELESS_FORMAT and shape == NIGHT_ENTRY)
        if not (
            shape == (NIGHT_ENTRY if named else ENTRY)
            and type(entry["version"]) is int
            and entry["version"] == number
            and type(entry["compacted"]) is bool
            and _is_json_object(entry["added"])
            and entry["added"].keys() == set(KINDS)
            and all(is_int(n, 0, MAX_IDS) for n in entry["added"].values())
            and (not named or _is_night(entry, added))
        ):
            return f"history entry {number} is not one kvtrace writes"
        for kind in KINDS:
            added[kind] += entry["added"][kind]
    if added != data["next_id"]:
        return f"next_id {data['next_id']} is not the ids its history added ({added})"
    return None


def night_entry(
    number: int, added: dict[str, int], compacted: bool, start: dict[str, int], night: str
) -> dict[str, Any]:
    """A version's history entry: the ids it added, and the night that made it, by its start
    (the manifest's id_map, as published) and its identity (id_map.night_identity)."""
    return {
        "version": number,
        "added": added,
        "compacted": compacted,
        "start": start,
        "night": night,
    }


ENTRY = {"version", "added", "compacted"}  # before format 6: no night named
NIGHT_ENTRY = ENTRY | {"start", "night"}
NIGHT_START = ("block_ids_from", "sessions_from", "time_from_ms")


def _is_night(entry: dict[str, Any], before: dict[str, int]) -> bool:
    """A night's start as kvtrace records it: its first ids are where the versions before it
    ended (the record proves those figures twice), its time a time of the map's clock."""
    start = entry["start"]
    return (
        _is_json_object(start)
        and start.keys() == set(NIGHT_START)
        and all(is_int(start[name], 0, MAX_IDS) for name in NIGHT_START[:2])
        and is_int(start["time_from_ms"], 0, EPOCH_CEILING_MS)
        and (start["block_ids_from"], start["sessions_from"])
        == (before["blocks"], before["sessions"])
        and _is_hex64(entry["night"])
    )


def _files_problem(data: dict[str, Any]) -> str | None:
    """Segment names of this map's shape, each with its index, and exactly their checksums."""
    listed: list[str] = []
    for kind in KINDS:
        names = data["files"][kind]
        if names != sorted(set(names)):
            return f"its {kind} files are not sorted and distinct"
        parts = [SEGMENT_NAME.fullmatch(name) for name in names]
        wrong = [name for name, match in zip(names, parts) if not match or match[2] != kind]
        if wrong:
            return f"{wrong[0][:80]!r} is not the name of a {kind} segment"
        versions = np.array([int(match[1]) for match in parts], dtype=np.int64)
        shards = np.array([int(match[3]) for match in parts], dtype=np.int64)
        if len(names) and (
            versions.min() < 1
            or versions.max() > data["version"]
            or shards.max() >= data["hash_shards"]
        ):
            return f"its {kind} files name versions or shards this version does not have"
        listed += names + [index_path(name) for name in names]
    checksums = data["checksums"]
    if checksums.keys() != set(listed):
        extra = sorted(checksums.keys() - set(listed)) or sorted(set(listed) - checksums.keys())
        return f"its checksums and files differ (at {extra[0][:80]!r})"
    if not CHECKSUMS.fullmatch(canonical(checksums)):
        return "a file's checksum is not one kvtrace writes (sha256, size, Parquet footer)"
    return None
