"""Encode: render chat templates, tokenize, cut blocks and chain-hash them (the only stage that sees text)."""
