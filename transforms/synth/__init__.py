"""Synthesis: reshape a trace and draw new requests from it."""
