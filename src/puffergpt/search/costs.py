"""What a request would cost on turbopuffer, at its published rates.

The rates live here and nowhere else. They are turbopuffer's list prices as this
project recorded them on 2026-12-02: writes $2/GB, with a minimum of 10 KB a write
request; queries $1/PB of data queried, with a minimum of 1.28 GB a query; data
returned $0.05/GB; storage $0.33/GB-month. A text's key write (one layer, ~3 KB for
one token of GPT-2 small) is billed as 10 KB.
"""

from __future__ import annotations

RATES_DATE = "2026-12-02"
WRITE_PER_GB = 2.0
WRITE_MIN_BYTES = 10_000  # billed for each write request, however small
QUERY_PER_PB = 1.0
QUERY_MIN_BYTES = 1.28e9
RETURNED_PER_GB = 0.05
STORAGE_PER_GB_MONTH = 0.33
HIT_BYTES = 12  # a returned hit: its distance and one small attribute


def request_cost(op: str, nbytes: int, returned: int, queries: int = 1, requests: int = 1) -> float:
    """Dollars for one logged request: op is write, search or fetch. ``requests``: the
    write requests it took (each is billed at least WRITE_MIN_BYTES)."""
    if op == "write":
        return max(nbytes, WRITE_MIN_BYTES * max(requests, 1)) / 1e9 * WRITE_PER_GB
    returned_bytes = nbytes if op == "fetch" else returned * HIT_BYTES
    queried = max(nbytes, QUERY_MIN_BYTES * max(queries, 1))  # each query is billed at least the minimum
    return queried / 1e15 * QUERY_PER_PB + returned_bytes / 1e9 * RETURNED_PER_GB


def storage_cost_per_month(nbytes: int) -> float:
    return nbytes / 1e9 * STORAGE_PER_GB_MONTH


def rates() -> dict:
    return {
        "date": RATES_DATE,
        "write_per_gb": WRITE_PER_GB,
        "write_min_kb": WRITE_MIN_BYTES / 1e3,
        "query_per_pb": QUERY_PER_PB,
        "query_min_gb": QUERY_MIN_BYTES / 1e9,
        "returned_per_gb": RETURNED_PER_GB,
        "storage_per_gb_month": STORAGE_PER_GB_MONTH,
    }
