"""The heap policies: the thresholds each passes to mallopt, and retaining freed memory checked against the
kernel's own resident-set count, in fresh processes."""

import logging
import subprocess
import sys

import pytest

from kmipgt import malloc
from kmipgt.malloc import OPT_OUT_VARIABLE, retain_freed_memory, use_allocator

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


@pytest.fixture
def mallopt_calls(monkeypatch):
    """The (option, value) pairs passed to a stand-in for glibc's mallopt, which accepts them all."""
    calls = []
    monkeypatch.setattr(malloc, "_mallopt", lambda: lambda option, value: calls.append((option, value)) or 1)
    monkeypatch.delenv(OPT_OUT_VARIABLE, raising=False)
    return calls


@pytest.mark.parametrize(("policy", "expected"), [
    ("retain", [(malloc.M_MMAP_THRESHOLD, 2**31 - 1), (malloc.M_TRIM_THRESHOLD, 2**31 - 1)]),
    ("live", [(malloc.M_MMAP_THRESHOLD, 2**20), (malloc.M_TRIM_THRESHOLD, 128 * 2**10)]),
    ("trim", [(malloc.M_MMAP_THRESHOLD, 2**31 - 1), (malloc.M_TRIM_THRESHOLD, 2**31 - 1)]),
    ("system", []),
])
def test_each_allocator_sets_its_thresholds(mallopt_calls, policy, expected):
    assert use_allocator(policy) is bool(expected)
    assert mallopt_calls == expected


def test_retain_freed_memory_is_the_retain_policy(mallopt_calls):
    assert retain_freed_memory()
    assert mallopt_calls == [(malloc.M_MMAP_THRESHOLD, 2**31 - 1), (malloc.M_TRIM_THRESHOLD, 2**31 - 1)]


@pytest.mark.parametrize("policy", ["retain", "live"])
def test_the_environment_variable_wins_over_the_key(mallopt_calls, monkeypatch, policy):
    monkeypatch.setenv(OPT_OUT_VARIABLE, "1")
    assert not use_allocator(policy)
    assert mallopt_calls == []


def test_an_unknown_allocator_names_the_key(mallopt_calls):
    with pytest.raises(ValueError, match=r"config key 'allocator' must be one of .*'live'.*got 'jemalloc'"):
        use_allocator("jemalloc")
    assert mallopt_calls == []


def test_without_mallopt_it_is_a_no_op_said_once(monkeypatch, caplog):
    monkeypatch.setattr(malloc, "_mallopt", lambda: "platform darwin")
    monkeypatch.delenv(OPT_OUT_VARIABLE, raising=False)
    malloc._say_unavailable.cache_clear()
    with caplog.at_level(logging.INFO, logger="kmipgt"):
        assert not use_allocator("live") and not use_allocator("live")
    assert [record.getMessage() for record in caplog.records] == [
        "no glibc mallopt here (platform darwin): allocator 'live' changes nothing"
    ]


def test_no_mallopt_off_linux(monkeypatch):
    malloc._glibc.cache_clear()
    monkeypatch.setattr(sys, "platform", "darwin")
    try:
        assert malloc._mallopt() == "platform darwin"
        assert not malloc.release_free_memory()
    finally:
        malloc._glibc.cache_clear()


# Under retain, 32 freed 4 MiB holes between live buffers stay resident until release_free_memory.
_HOLES = """
import os, torch
from kmipgt.malloc import release_free_memory, use_allocator
accepted = use_allocator("trim")
def resident_mib():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
buffers = [torch.ones(2**20) for _ in range(64)]
del buffers[::2]
kept = resident_mib()
released = release_free_memory()
print(accepted, released, kept - resident_mib())
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc malloc_trim")
def test_release_returns_the_free_holes_of_the_heap():
    import os

    env = {k: v for k, v in os.environ.items() if k != OPT_OUT_VARIABLE}
    out = subprocess.run([sys.executable, "-c", _HOLES], capture_output=True, text=True, env=env, check=True)
    accepted, released, dropped = out.stdout.split()
    if accepted != "True":
        pytest.skip("this C library does not accept mallopt thresholds")
    assert released == "True" and float(dropped) > 100  # of the 128 MiB of holes
