"""How many CPUs this process may use, and thread or worker counts capped at it.

A config from elsewhere can ask for any count (``threads: 300``, ``num_workers: 150``), and more threads or
processes than CPUs only contend for them; so counts are capped at the CPUs this process may run on (its
affinity, which a container or ``taskset`` narrows), with a one-line note.
"""

from __future__ import annotations

import logging
import os

__all__ = ["available_cpus", "capped_at_cpus"]

_log = logging.getLogger(__name__)


def available_cpus() -> int:
    """The CPUs this process may run on (``os.sched_getaffinity``; ``os.cpu_count`` where there is none)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def capped_at_cpus(count: int | None, name: str) -> int:
    """``count`` (None: one per available CPU) at most :func:`available_cpus`; a capped count is noted in one
    line naming ``name`` (the config key)."""
    cpus = available_cpus()
    if count is not None and count > cpus:
        _log.warning("%s: %d is more than the %d CPUs this process may use; using %d", name, count, cpus,
                     cpus)
    return cpus if count is None else min(count, cpus)
