"""Write: trace rows into sorted JSONL and Parquet shards, export totals, manifest, dead letters."""
