"""Failed requests grouped by kind: per-request details do not explode the table."""

from harness.metrics import failures


def test_per_request_details_are_one_kind():
    messages = [f"request 7f3a9c{i:04d}e1 failed after 1234{i} bytes" for i in range(500)]
    assert failures.tally(messages) == {"request # failed after # bytes": 500}


def test_short_numbers_keep_kinds_apart():
    counts = {"HTTP 429: rate limited": 3, "HTTP 500: boom": 2, "timeout after 0.5 s": 1}
    assert failures.tally(counts) == counts


def test_rare_kinds_are_folded_but_still_counted():
    messages = [f"failure in call {i}" for i in range(30)] + ["common"] * 5
    out = failures.tally(messages, limit=3)
    assert next(iter(out)) == "common"
    assert len(out) == 4
    assert out["(other: 28 more kinds of error)"] == 28
    assert sum(out.values()) == 35


def test_uuids_and_addresses_vanish():
    msg = "object at 0x7f00deadbeef id 123e4567-e89b-12d3-a456-426614174000 gone"
    assert failures.kind(msg) == "object at # id # gone"
