"""A sweep's cells packed into one archive that can be taken to another machine, and unpacked there so that
the same sweep resumes where it stopped.

A machine lent for minutes runs a sweep under a time limit (:mod:`kmipgt.sweep.time_limit`); what the next
machine needs from it must come back in a few files. The archive is a gzip-compressed tar of, for each cell
of the sweep that has started, the files directly in its folder (``cells/<cell>/``):

- a finished cell (complete ``metrics.json``): all but its checkpoints (``*.pt``). The summary reads its
  metrics; its weights (about three times a model's size with the optimiser's state) would make up most of
  the archive and are not needed to finish the sweep;
- any other cell: everything, ``last.pt`` and ``best.pt`` included, which is what ``--resume`` reads.

Folders inside a cell's folder (TensorBoard's events) stay behind. An archive larger than
:data:`PART_BYTES` is written as numbered parts ``NAME.000``, ``NAME.001``, ... so that each part stays
below a per-file limit of a transfer; :func:`unpack` reads either form.

Unpacking writes a cell only where this machine has not started it (neither finished nor with a
``last.pt``): a started cell here is as far as the archive's or further, since the archive was packed from
such a folder. An archive is checked whole before anything is written: every member must be a file
``cells/<cell>/<file>`` of a cell of this sweep; checkpoints from it are later read weights-only, as every
checkpoint is.
"""

from __future__ import annotations

import gzip
import io
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path

from kmipgt.atomic import atomic_write
from kmipgt.sweep.run import cell_state
from kmipgt.sweep.spec import Sweep, cell_dir, expand

__all__ = ["PART_BYTES", "archive_parts", "pack", "unpack"]

# 15 MiB: below the 16 MiB per file that a transfer may allow, with room for its own framing.
PART_BYTES = 15 * 2**20
# Weights compress little (fp32 noise); gzip's default level 9 spends several times longer for ~1% less.
COMPRESS_LEVEL = 6


def archive_parts(path: Path) -> list[Path]:
    """The files of the archive ``path``: itself where it is one file, else its parts ``path.000``, ...
    in order (none where neither exists)."""
    if path.is_file():
        return [path]
    parts = []
    while (part := path.with_name(f"{path.name}.{len(parts):03d}")).is_file():
        parts.append(part)
    return parts


def _packed_files(sweep: Sweep) -> Iterator[tuple[str, Path]]:
    """``(name in the archive, file)`` of every cell that has started, in grid order."""
    for cell in expand(sweep):
        directory = cell_dir(sweep, cell)
        if not directory.is_dir():
            continue
        finished = cell_state(sweep, cell) == "done"
        for path in sorted(directory.iterdir()):
            if path.is_file() and not path.is_symlink() and not (finished and path.suffix == ".pt"):
                yield f"cells/{cell.name}/{path.name}", path


def pack(sweep: Sweep, path: Path) -> list[Path]:
    """Write the archive of ``sweep``'s cells (module docstring) to ``path``, or to its parts where it is
    larger than :data:`PART_BYTES`; an earlier archive there (one file or parts) is replaced. Returns the
    files written."""
    buffer = io.BytesIO()
    with (gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=COMPRESS_LEVEL, mtime=0) as compressed,
          tarfile.TarFile(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as archive):
        for name, file in _packed_files(sweep):
            archive.add(file, arcname=name, recursive=False)
    content = buffer.getvalue()
    for stale in archive_parts(path):
        stale.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    if len(content) <= PART_BYTES:
        atomic_write(path, lambda f: f.write(content))
        return [path]
    parts = []
    for index, start in enumerate(range(0, len(content), PART_BYTES)):
        part = path.with_name(f"{path.name}.{index:03d}")
        atomic_write(part, lambda f, start=start: f.write(content[start:start + PART_BYTES]))
        parts.append(part)
    return parts


def _checked_members(archive: tarfile.TarFile, cells: set[str], where: Path) -> list[tarfile.TarInfo]:
    """Every member of ``archive``, each a regular file ``cells/<cell>/<file>`` of one of ``cells``; a
    ValueError naming the first that is not."""
    members = archive.getmembers()
    for member in members:
        parts = member.name.split("/")
        cell_file = len(parts) == 3 and parts[0] == "cells" and parts[1] in cells
        if not (member.isfile() and cell_file and parts[2] not in ("", ".", "..")):
            raise ValueError(f"{where}: {member.name!r} is not a file of a cell of this sweep "
                             "(cells/<cell>/<file>); nothing was unpacked")
    return members


def unpack(sweep: Sweep, path: Path) -> list[str]:
    """Unpack the archive ``path`` (one file or its parts, :func:`archive_parts`) into ``sweep``'s folder:
    the cells this machine has not started (module docstring). Returns the names of the cells written;
    FileNotFoundError where there is no archive."""
    parts = archive_parts(path)
    if not parts:
        raise FileNotFoundError(f"no archive at {path} (nor its parts {path.name}.000, ...)")
    content = io.BytesIO(b"".join(part.read_bytes() for part in parts))
    cells = {cell.name: cell for cell in expand(sweep)}
    written = []
    try:
        with tarfile.open(fileobj=content, mode="r:gz") as archive:
            members = _checked_members(archive, set(cells), path)
            started = {name for name, cell in cells.items() if cell_state(sweep, cell) != "new"}
            for member in members:
                _, name, file = member.name.split("/")
                if name in started:
                    continue
                target = cell_dir(sweep, cells[name]) / file
                target.parent.mkdir(parents=True, exist_ok=True)
                source = archive.extractfile(member)
                atomic_write(target, lambda f, source=source: shutil.copyfileobj(source, f))
                if name not in written:
                    written.append(name)
    except (tarfile.TarError, EOFError, gzip.BadGzipFile) as error:
        raise ValueError(f"{path} is not a whole sweep archive ({error}); a part may be missing") from None
    return written
