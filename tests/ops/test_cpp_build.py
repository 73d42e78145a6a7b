"""Compiled kernels are loaded only from folders no one else can write: a library planted in a shared cache
under a kernel's name never runs."""

import logging
import os
import stat
import subprocess

import pytest

from kmipgt.ops.cpp_build import compiled_library, find_compiler, library_name

pytestmark = pytest.mark.skipif(find_compiler() is None, reason="needs a C++ compiler")

FLAGS = ("-shared", "-fPIC")
SOURCE = 'extern "C" int answer() { return 42; }\n'
# What someone who can write to the cache could put there: its constructor runs when it is loaded.
PLANTED = """#include <cstdio>
__attribute__((constructor)) static void planted() {
    std::FILE *f = std::fopen("{marker}", "w");
    if (f) std::fclose(f);
}
extern "C" int answer() { return 7; }
"""


def _kernel(tmp_path):
    source = tmp_path / "kernel.cpp"
    source.write_text(SOURCE)
    return source, library_name(source, find_compiler(), FLAGS)


def _plant(path, marker):
    source = path.parent / "planted.cpp"
    source.write_text(PLANTED.replace("{marker}", str(marker)))
    subprocess.run([find_compiler(), *FLAGS, str(source), "-o", str(path)], check=True)
    source.unlink()


def _load(source, directory):
    return compiled_library(source, compiler=find_compiler(), flags=FLAGS, directory=directory,
                            purpose="a test kernel", fallback="no fallback")


def _listing(folder):
    return {path.name: (path.stat().st_mtime_ns, path.stat().st_mode) for path in folder.iterdir()}


@pytest.mark.parametrize("shared", ["folder", "file"])
def test_a_library_planted_where_others_can_write_is_never_loaded(tmp_path, caplog, shared):
    source, name = _kernel(tmp_path)
    cache, marker = tmp_path / "cache", tmp_path / "marker"
    cache.mkdir(mode=0o700)
    _plant(cache / name, marker)
    # A cache folder others may write (a shared KMIPGT_CACHE), or a library file others may write.
    os.chmod(cache if shared == "folder" else cache / name, 0o777)
    before = _listing(cache)
    with caplog.at_level(logging.WARNING, logger="kmipgt"):
        library = _load(source, cache)
    assert library.answer() == 42  # built anew elsewhere
    assert not marker.exists()
    assert _listing(cache) == before  # nothing written into the shared folder
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 1 and len(lines[0].splitlines()) == 1
    assert lines[0].startswith(str(cache)) and "others may write" in lines[0]


def test_a_library_in_a_private_folder_is_loaded(tmp_path):
    # The same planted file, in a folder and file of the user's own: loaded, so the test above can fail.
    source, name = _kernel(tmp_path)
    cache, marker = tmp_path / "cache", tmp_path / "marker"
    cache.mkdir(mode=0o700)
    _plant(cache / name, marker)
    os.chmod(cache / name, 0o700)
    assert _load(source, cache).answer() == 7
    assert marker.exists()


def test_a_fresh_build_creates_a_private_folder_and_file(tmp_path):
    source, name = _kernel(tmp_path)
    cache = tmp_path / "new" / "cache"
    assert _load(source, cache).answer() == 42
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert os.listdir(cache) == [name]  # no temporary file left
    assert (cache / name).stat().st_mode & 0o077 == 0
