"""Garbage-collector policy for long-running workers.

A worker holds large, long-lived projections (hundreds of thousands of small objects). CPython's
cyclic collector would rescan them on every full collection, so per-event cost would grow with the
projection. Freezing the survivors after each batch moves them out of the collector's view; they
are still freed by reference counting (projections hold no reference cycles).
"""

from __future__ import annotations

import gc

SETTLE_EVERY = 1000  # events between settles: cheap (a young collection and a freeze)


def settle() -> None:
    gc.collect(1)
    gc.freeze()
