"""Ids: keyed hashes to dense ids in first-seen order, and the persisted id map of nightly runs."""
