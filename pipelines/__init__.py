"""One module per job; each builds its pipeline from a typed config and returns its outputs."""
