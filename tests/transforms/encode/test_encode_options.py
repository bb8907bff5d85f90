"""The encoder's options come whole from a run's config: every one of them, none left at its
default."""

from __future__ import annotations

import dataclasses

from kvtrace.pipelines.anonymize_config import AnonymizeConfig
from kvtrace.transforms.encode.encode_requests import EncodeOptions
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.encode.schemes import HashScheme
from kvtrace.transforms.read.records import ParseOptions


def test_every_encode_option_is_the_configs_own():
    config = AnonymizeConfig(
        inputs=(),
        output="out",
        staging="staging",
        dead_letter="rejected",
        tokenizer="tok",
        salt=SaltSource("env", "KVTRACE_SALT"),
        block_size=16,
        chat_template_kwargs={"enable_thinking": False},
        hash_scheme=HashScheme("dynamo"),
        emit_output_hashes=True,
        segment_cache_bytes=1 << 20,
        tokenizer_backend="fastokens",
        tokenizer_sha256={"a": "b" * 64},
        parse=ParseOptions(max_record_bytes=1 << 20),
    )
    options = config.encode
    defaults = EncodeOptions("", SaltSource("random"))
    for option in dataclasses.fields(EncodeOptions):
        # the record bound is the reader's too: the config holds it once, in its parse options
        owner = config.parse if option.name == "max_record_bytes" else config
        given = getattr(owner, option.name)
        assert getattr(options, option.name) == given, option.name
        assert given != getattr(defaults, option.name), f"{option.name} is not tested"
