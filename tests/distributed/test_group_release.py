"""``destroy_process_group`` frees the default group after kmipgt's distributed ops ran on it."""

import sys

import pytest

from group_release_cases import group_freed_at_destroy
from spawn_ranks import spawn_ranks

pytestmark = pytest.mark.distributed


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names are read from /proc")
def test_destroy_process_group_stops_the_gloo_threads(tmp_path):
    """Else those threads outlive the script, and one that releases a finished collective's tensors while
    the interpreter shuts down aborts the process ("terminate called without an active exception")."""
    spawn_ranks(group_freed_at_destroy, 2, str(tmp_path))
