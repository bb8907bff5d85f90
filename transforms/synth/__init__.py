"""Synthesis: reshape a trace (seed 002's knobs) and draw new requests from it."""
