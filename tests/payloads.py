"""Pickled objects that create a marker file when a full unpickler reads them (the ``__reduce__`` trick): what
a shared run directory or dataset copy could hold instead of tensors."""

import os
from pathlib import Path


class ShellPayload:
    """Runs ``touch MARKER`` through ``os.system`` (torch's weights-only unpickler blocks ``os`` by name)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


class TouchPayload:
    """Calls ``Path.touch(MARKER)``: no blocked module, the case where PyG's loader retries with the full
    unpickler."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (Path(self.marker),)


PAYLOADS = (ShellPayload, TouchPayload)
