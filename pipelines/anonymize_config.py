"""What an anonymize job is given (AnonymizeConfig) and what it writes last (stats, manifest):
shared by the Beam pipeline (anonymize_beam.py) and the local engine (anonymize_local.py), so both
describe their output in the same bytes. No Beam here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from transforms import storage
from transforms.encode.encode_requests import (  # noqa: F401 (the local engine's batches)
    TOKENIZE_BATCH_BYTES,
    TOKENIZE_BATCH_REQUESTS,
    EncodeOptions,
)
from transforms.encode.schemes import HashScheme
from transforms.encode.segment_cache import DEFAULT_BUDGET_BYTES
from transforms.encode.salt import SaltSource
from transforms.ids.dense_ids import DEFAULT_HASH_SHARDS, UniqueTotals, hash_shards_for
from transforms.ids.id_map import MapVersion, new_run_id
from transforms.read.records import ParseOptions
from transforms.write.replayers import replay_commands
from transforms.write.coarsen import Coarsening
from transforms.trace_format import DEFAULT_BLOCK_SIZE, FORMAT, STATS, canonical_json
from transforms.write.manifest import (
    KVTRACE_VERSION,
    RecordCounts,
    manifest_path,
    public_template_kwargs,
    public_tokenizer_name,
    public_tokenizer_sha256,
    run_counts,
    write_json,
    write_run_counts,
)
from transforms.write.publish import publish_folder, sha256_of
from transforms.write.totals import ExportTotals, export_stats

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
    route_sessions: bool = False  # Beam: a session's requests encoded on one worker

    @property
    def input_bytes(self) -> int:
        return sum(size for _, size in self.inputs)

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
            tokenizer=self.tokenizer, salt=self.salt, block_size=self.block_size,
            chat_template_kwargs=self.chat_template_kwargs, hash_scheme=self.hash_scheme,
            emit_output_hashes=self.emit_output_hashes,
            segment_cache_bytes=self.segment_cache_bytes, tokenizer_sha256=self.tokenizer_sha256)

    @property
    def timestamp_origin_ms(self) -> int | None:
        """Fixed by the id map once it has one, so nightly traces share one time axis."""
        return self.id_map.base.timestamp_origin_ms if self.id_map else None


def write_stats(config: AnonymizeConfig, files: list[tuple[str, str]], counts: RecordCounts,
                totals: ExportTotals, unique: UniqueTotals, damaged: int,
                id_map: dict[str, int] | None) -> dict:
    """Write stats.json into the staging folder (and the run's own counts beside its dead
    letters) and return the manifest, which lists every file of the output with its sha256 and
    is written last. id_map: where the night's numbering begins when it extends an id map or a
    stream (write/manifest.id_map_start), else None."""
    write_run_counts(config.dead_letter, run_counts(counts, totals, damaged))
    stats = canonical_json(export_stats(totals, unique.count, unique.weight))
    with storage.create(storage.join(config.staging, STATS)) as handle:
        handle.write(stats)
    sha256 = {path.rsplit("/", 1)[-1]: digest for path, digest in files}
    sha256[STATS] = sha256_of(stats)
    return {
        "kvtrace_version": KVTRACE_VERSION,
        "format": FORMAT,
        "tokenizer": {"name": public_tokenizer_name(config.tokenizer),
                      "sha256": public_tokenizer_sha256(config.tokenizer_sha256)},
        "block_size": config.block_size,
        "hash_scheme": config.hash_scheme.identity,
        "hash_scheme_keyed": config.hash_scheme.keyed,
        "granularity": {"timestamp_ms": config.coarsening.timestamp_ms,
                        "output_length": config.coarsening.output_length},
        # Whether engine hashes were written elsewhere; not where (a private location).
        "output_hash_ids": config.emit_output_hashes,
        "chat_template_kwargs": public_template_kwargs(config.chat_template_kwargs,
                                                       config.salt.load()),
        # Only what the rows prove: the other counts are the operator's (write_run_counts).
        "records": {"exported": totals.requests},
        # Where ids continue an id map's (a stream's) earlier nights; None: dense from 0.
        "id_map": id_map,
        "files": sorted(sha256),
        "sha256": sha256,
        # How each replayer reads this folder, with this block size and ms timestamps.
        "replay": replay_commands(config.block_size, totals.requests, list(sha256)),
    }


def publish_output(config: AnonymizeConfig, manifest: dict) -> dict:
    """The run's last step, once the id map (if any) has published: the manifest into the
    staging folder, then the folder in the output's place, whole."""
    write_json(manifest_path(config.staging), manifest)
    publish_folder(config.staging, config.output)
    return manifest
