import mmap

import numpy as np
import torch

from kmipgt.bench.isolation import time_calls

CPU = torch.device("cpu")


def _touch_fresh_mapping(num_bytes: int) -> None:
    # A private anonymous mapping bypasses malloc, so every call faults each of its pages whatever the
    # process's allocator settings; no huge pages, or one fault would map 512 of them.
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    with mmap.mmap(-1, num_bytes, flags=flags) as mapping:
        mapping.madvise(mmap.MADV_NOHUGEPAGE)
        pages = np.frombuffer(mapping, dtype=np.uint8)
        pages[:: mmap.PAGESIZE] = 1
        del pages


def test_page_faults_per_call_count_the_pages_a_call_touches_fresh():
    num_bytes = 32 * 2**20
    pages = num_bytes // mmap.PAGESIZE
    timing = time_calls(lambda: _touch_fresh_mapping(num_bytes), repeats=3, warmup=1, device=CPU)
    assert pages <= timing["page_faults_per_call"] < 1.2 * pages
    assert len(timing["times"]) == 3 and timing["time_min"] <= timing["time_median"] <= timing["time_max"]


def test_a_call_that_allocates_nothing_faults_no_pages():
    timing = time_calls(lambda: None, repeats=5, warmup=1, device=CPU)
    assert timing["page_faults_per_call"] < 10
