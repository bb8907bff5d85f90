"""Read and parse: files (JSONL, compressed, Parquet) into records, records into Requests."""
