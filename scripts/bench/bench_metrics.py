"""Reading the metrics files `orpheus train --metrics` writes, for the benchmark
scripts beside this one: one JSON object per clock, then a summary line."""

import json


def read_metrics(path):
    """Returns (per-clock records, summary record or None)."""
    clocks, summary = [], None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            record = json.loads(line)
            if record.get("summary"):
                summary = record
            elif "clock" in record and not record.get("decision") and not record.get("membership"):
                # --adapt's decisions and membership changes are lines of their own, not clocks.
                clocks.append(record)
    return clocks, summary
