"""Retaining freed memory: checked against the kernel's own resident-set count, in fresh processes."""

import subprocess
import sys

import pytest

from kmipgt.malloc import OPT_OUT_VARIABLE

# Resident pages before and after freeing a 256 MiB tensor whose pages were all touched.
_PROBE = """
import os, sys, torch
from kmipgt.malloc import retain_freed_memory
accepted = retain_freed_memory()
def resident_mib():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
buffer = torch.ones(64 * 2**20)
held = resident_mib()
del buffer
print(accepted, held - resident_mib())
"""


def _probe(env_extra: dict) -> tuple[bool, float]:
    import os

    env = {k: v for k, v in os.environ.items() if k != OPT_OUT_VARIABLE} | env_extra
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, check=True)
    accepted, released = out.stdout.split()
    return accepted == "True", float(released)


@pytest.mark.skipif(sys.platform != "linux", reason="glibc mallopt")
def test_freed_buffers_stay_resident_unless_opted_out():
    accepted, released = _probe({})
    if not accepted:
        pytest.skip("this C library does not accept mallopt thresholds")
    assert released < 16  # the 256 MiB stay in the heap for the next allocation
    accepted, released = _probe({OPT_OUT_VARIABLE: "1"})
    assert not accepted and released > 200  # glibc's default: the mapping is returned at once
