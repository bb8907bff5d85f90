"""A large trace from a small one: N copies, ids offset per copy so copies share nothing, and
timestamps shifted so the result stays sorted (issue 3's benchmark input).

    python benchmarks/make_replicated_trace.py ../shared/traces/synthetic_trace.jsonl 60 \\
        benchmarks/corpora/synthetic_x60.jsonl
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    source, copies, target = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rows = [json.loads(line) for line in open(source) if line.strip()]
    id_span = 1 + max(i for r in rows for i in r["hash_ids"])
    time_span = 1 + max(r["timestamp"] for r in rows)
    with open(target, "w") as out:
        for copy in range(copies):
            for row in rows:
                out.write(
                    json.dumps(
                        {
                            "timestamp": row["timestamp"] + copy * time_span,
                            "input_length": row["input_length"],
                            "output_length": row["output_length"],
                            "hash_ids": [i + copy * id_span for i in row["hash_ids"]],
                        }
                    )
                    + "\n"
                )


if __name__ == "__main__":
    main()
