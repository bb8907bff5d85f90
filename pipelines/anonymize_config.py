"""What an anonymize job is given (AnonymizeConfig, IdMapRun): shared by the Beam pipeline
(anonymize_beam.py), the local engine (anonymize_local.py), the stream (anonymize_streaming.py)
and the night's end they all run (anonymize_night.py). No Beam here."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from kvtrace.transforms.encode.encode_requests import EncodeOptions
from kvtrace.transforms.encode.fast_backend import DEFAULT_BACKEND
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.encode.schemes import HashScheme
from kvtrace.transforms.encode.segment_cache import DEFAULT_BUDGET_BYTES
from kvtrace.transforms.ids.dense_ids import DEFAULT_HASH_SHARDS, hash_shards_for
from kvtrace.transforms.ids.id_map import MapVersion, new_run_id
from kvtrace.transforms.read.records import ParseOptions
from kvtrace.transforms.trace_format import DEFAULT_BLOCK_SIZE
from kvtrace.transforms.write.coarsen import Coarsening

# The id steps move one element per batch and hash shard: ~200k blocks per batch keeps those
# elements a few thousand rows each (cheap to ship) and a batch's tables near 10 MB.
ID_BATCH_BLOCKS = 200_000


@dataclass(frozen=True)
class IdMapRun:
    """The id map a run extends: its directory, the version the run starts from (version 0
    for a new map), already checked against the run's settings (id_map.open_map), and the
    folder of marks that anchors its published version (anchor.py)."""

    directory: str
    base: MapVersion
    marks: str
    run_id: str = field(default_factory=new_run_id)  # names this run's segment files


def run_hash_shards(requested: int | None, base: MapVersion | None) -> int:
    """A run's hash shard count: as asked; else the id map's, so that a night finds a key's map
    rows in one file per segment; on a night that compacts anyway, one derived from the map's
    size, so shards keep growing with it (dense_ids.hash_shards_for)."""
    if requested:
        return requested
    if base is None or base.version == 0 or base.compaction_due():
        return hash_shards_for(base.next_id["blocks"] if base else 0)
    return base.hash_shards


@dataclass(frozen=True)
class AnonymizeConfig:
    inputs: tuple[tuple[str, int], ...]  # (file, size in bytes), expanded from the user's globs
    output: str
    staging: str  # where the output is written before it is published whole (publish.py)
    tokenizer: str
    salt: SaltSource
    dead_letter: str
    block_size: int = DEFAULT_BLOCK_SIZE
    parse: ParseOptions = field(default_factory=ParseOptions)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    max_rejected_fraction: float | None = None
    hash_shards: int = DEFAULT_HASH_SHARDS
    tokenizer_sha256: dict[str, str] = field(default_factory=dict)
    id_map: IdMapRun | None = None
    hash_scheme: HashScheme = field(default_factory=HashScheme)
    coarsening: Coarsening = field(default_factory=Coarsening)
    block_hashes: str | None = None  # where --emit-block-hashes writes (private), or None
    emit_output_hashes: bool = False  # also number the blocks the engine caches after decoding
    segment_cache_bytes: int = DEFAULT_BUDGET_BYTES  # per worker; 0 tokenizes every text whole
    tokenizer_backend: str = DEFAULT_BACKEND  # what encodes texts where verified (fast_backend.py)
    route_sessions: bool = False  # Beam: a session's requests encoded on one worker
    model_name: str | None = None  # published as the manifest's model_name (--model-name)
    # With an id map, where the rows' times count from: "map" (its origin: nights continue one
    # clock) or "night" (this night's first request; the manifest says where on the map's)
    time_origin: str = "map"

    def __post_init__(self) -> None:
        # The engine's raw hashes are the keys only where they are written out (HashScheme.raw):
        # rows read them back from the keys (schemes.engine_hashes), so one implies the other.
        if self.block_hashes and not self.hash_scheme.raw:
            object.__setattr__(self, "hash_scheme", replace(self.hash_scheme, raw=True))

    @property
    def input_bytes(self) -> int:
        return sum(size for _, size in self.inputs)

    @property
    def emit_parents(self) -> bool:
        """Whether rows publish their parent row (write/parents.py): the parse reads links."""
        return self.parse.links

    @property
    def compacts_map(self) -> bool:
        """Whether the run rewrites the id map whole: every MAX_SEGMENTS nights, and when its
        shard count differs from the map's (segments must all be split alike)."""
        base = self.id_map.base if self.id_map else None
        if base is None or base.version == 0:
            return False
        return base.compaction_due() or self.hash_shards != base.hash_shards

    @property
    def reshards_map(self) -> bool:
        """A folding night whose shard count differs from the map's: every map row is read
        and re-split by shard; other folding nights merge each shard's sorted files in place."""
        return self.compacts_map and self.hash_shards != self.id_map.base.hash_shards

    @property
    def encode(self) -> EncodeOptions:
        """The encoder's options, as `parse` holds the parser's."""
        return EncodeOptions(
            tokenizer=self.tokenizer,
            salt=self.salt,
            block_size=self.block_size,
            chat_template_kwargs=self.chat_template_kwargs,
            hash_scheme=self.hash_scheme,
            emit_output_hashes=self.emit_output_hashes,
            segment_cache_bytes=self.segment_cache_bytes,
            tokenizer_backend=self.tokenizer_backend,
            tokenizer_sha256=self.tokenizer_sha256,
            max_record_bytes=self.parse.max_record_bytes,
        )

    @property
    def timestamp_origin_ms(self) -> int | None:
        """Fixed by the id map once it has one, so nightly traces share one time axis."""
        return self.id_map.base.timestamp_origin_ms if self.id_map else None
