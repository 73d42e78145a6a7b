"""``kmipgt sweep --jobs auto``: as many cells at once as one device holds.

On a GPU every cell is a process of its own with a CUDA context, PyTorch's cached blocks and its batches'
activations; small-graph models (LRGB's, batches of 200 molecules) take well under
:data:`CELL_GPU_GIB` each, so a GPU holds its memory divided by that many cells. Each cell also drives its
GPU work from a CPU core, so at most one cell per core. On the CPU the cells would share the same cores,
each with one thread per core: one cell at a time.
"""

from __future__ import annotations

from kmipgt.cpus import available_cpus

__all__ = ["CELL_GPU_GIB", "auto_jobs"]

# GPU memory counted per cell: a CUDA context (~0.5 GiB) and a small-graph model's training with room to
# spare; a cell's own peak is in its metrics (peak_memory_mb).
CELL_GPU_GIB = 4.0


def auto_jobs(cells: int, device: str) -> int:
    """The cells to run at once for ``cells`` cells whose config asks for ``device`` (``auto``, ``cuda``,
    ``cuda:1``, ``cpu``): on CUDA the GPU's memory over :data:`CELL_GPU_GIB`, at most one per CPU this process
    may use and one per cell; on the CPU 1."""
    import torch

    if device == "cpu" or not torch.cuda.is_available():
        return 1
    index = torch.device(device).index if device.startswith("cuda") else None
    memory = torch.cuda.get_device_properties(0 if index is None else index).total_memory
    return max(1, min(cells, available_cpus(), int(memory // (CELL_GPU_GIB * 2**30))))
