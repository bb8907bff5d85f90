"""The fields of a published trace row beyond Mooncake's four (timestamp, input_length,
output_length, hash_ids): what kvtrace writes, and its readers and replay forms read."""

from __future__ import annotations

# Each row holds its request's whole prompt, so a row is one self-contained request, also within
# a conversation. The pseudonymous conversation number is therefore published as `session`, not
# `session_id`: aiperf groups rows by `session_id` and replays a group as a multi-turn chat that
# prepends earlier turns and live responses to each request, which would double the context
# (aiperf#1393). Under `session` every consumer replays each row as it is.
SESSION_FIELD = "session"
# With --emit-output-hashes: the ids of the full blocks the engine holds after decoding, past
# the prompt's full blocks (kvtrace simulate --decode-cache replays them).
OUTPUT_IDS_FIELD = "output_hash_ids"
# When the log said when the response ended: ms from the request's arrival to that end. With the
# next turn's timestamp it gives the user's think or tool time (`kvtrace export` writes it as the
# `delay` session-aware replayers wait after the previous response).
RESPONSE_FIELD = "response_ms"
NO_RESPONSE_MS = -1  # in columns: the log did not say when the response ended
