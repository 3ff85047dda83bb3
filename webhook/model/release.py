"""Letting go of a replaced cache table without stalling the reviews.

Dropping the last reference to a table of 100,000 entries frees them all in one C call chain with
the GIL held: at the envelope the swap of a relist would stall every review for 30 to 340 ms
(bench/RESULTS.md, "Findings the code rests on"). Emptied one entry at a time from Python code, the same work is spread
over many bytecodes and the interpreter switches threads between them (every
sys.getswitchinterval() seconds). Pure; no I/O.
"""

from __future__ import annotations

from typing import Any


def release_gradually(*tables: Any) -> None:
    """Empty each of `tables` (dicts, sets or lists, e.g. a cache's old tables after a relist
    swapped fresh ones in) one entry at a time, so their entries are freed between thread switches
    instead of in one GIL-held deallocation. Call it without holding a lock that reviews take, on
    tables nobody will read again (a reader that still has one sees it shrink). Other values are
    ignored. Returns None."""
    for table in tables:
        if isinstance(table, dict):
            pop: Any = table.popitem
        elif isinstance(table, (set, list)):
            pop = table.pop
        else:
            continue
        while table:
            pop()
