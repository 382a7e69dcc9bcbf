"""`kvchat bench --contention`: decode measured quiet and next to each competitor, which is gone after."""

import os

import pytest

from app.bench.contention import contention_rows


def children() -> set[int]:
    pid = os.getpid()
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.add(int(entry))
    return found


@pytest.mark.slow  # decode next to busy cores and a second kvchat
def test_each_competitor_is_measured_and_stopped(tiny_engine):
    before = children()
    rows = contention_rows(tiny_engine, steps=4, runs=1, threads=None)
    assert [row["competitor"] for row in rows] == ["none", "busy loop", "second kvchat", "none (after)"]
    assert all(row["tokens_per_s"] > 0 for row in rows)
    assert rows[0]["ratio"] == 1.0
    assert rows[1]["ratio"] == round(rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"], 2)
    assert all(row["threads"] in (None, *tiny_engine.runner.decode_threads.candidates) for row in rows)
    assert children() <= before  # the busy loop and the second engine were killed and reaped
