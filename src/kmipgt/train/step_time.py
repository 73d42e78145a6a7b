"""Where a training step's time goes: data, global attention, local message passing and the rest.

``kmipgt bench step`` runs optimiser steps of a config's own model, loss and optimiser (the trainer's
step, :meth:`~kmipgt.train.loop.Trainer.train_step`) on data shaped like the config's
(:mod:`kmipgt.train.stand_in`) and splits each step's wall time into parts that add up to it:

- ``data``: the task handing over the step's batch (collate and host-to-device copy, or the cut from the
  split kept on the device with ``data.on_device``);
- ``attention``: forward and backward of the GPS layers' global attention modules (projections included);
- ``mpnn``: forward and backward of their local message-passing modules (a baseline's PyG convolutions);
- ``rest``: everything else (encoders, FFN, norms, head, loss, clipping, optimiser and scheduler steps).

A module's forward runs between its forward pre-hook and hook; its backward between the full backward
pre-hook (the gradients of all its outputs are ready) and the full backward hook (those of its inputs are).
The time between two consecutive events goes to the part open then, so nothing counts twice. The
autograd engine runs the ready node created last first, so a module's backward runs as one block. On CUDA
the events are CUDA events on the current stream, read after one synchronisation at the end of each step:
nothing synchronises inside the step, so the library's own host syncs stall the step as in training.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import torch
from torch_geometric.nn import MessagePassing

from kmipgt.machine import machine_info
from kmipgt.nn.gps_layer import GPSLayer
from kmipgt.train.config import Config
from kmipgt.train.datasets import prepare_data
from kmipgt.train.loop import Trainer
from kmipgt.train.stand_in import stand_in_data
from kmipgt.train.tasks.base import Step, Task
from kmipgt.train.validation import validate_config

__all__ = ["PARTS", "STAND_IN_BATCHES", "endless_steps", "markdown_table", "step_breakdown", "timed_modules"]

PARTS = ("data", "attention", "mpnn", "rest")
# Mini-batches in the stand-in training split of a graph-level config (its epochs repeat).
STAND_IN_BATCHES = 2


class _Timeline:
    """Time stamps of one step, each naming the part that runs until the next (a stack of open parts)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.open: list[str] = []
        self.stamps: list[tuple[str, Any]] = []

    def _now(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def mark(self) -> None:
        self.stamps.append((self.open[-1] if self.open else "rest", self._now()))

    def enter(self, part: str) -> None:
        self.open.append(part)
        self.mark()

    def leave(self) -> None:
        self.open.pop()
        self.mark()

    def parts_ms(self) -> dict[str, float]:
        """Milliseconds per part between the first and the last stamp (on CUDA, after a synchronisation)."""
        parts = dict.fromkeys(PARTS, 0.0)
        for (part, start), (_, end) in pairwise(self.stamps):
            parts[part] += start.elapsed_time(end) if self.cuda else 1e3 * (end - start)
        return parts

    def clear(self) -> None:
        self.open.clear()
        self.stamps.clear()


def timed_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """``(part, module)`` for every module the breakdown times: each GPS layer's global attention
    (``"attention"``) and local MPNN (``"mpnn"``); in a model without GPS layers, its outermost PyG
    message-passing modules (``"mpnn"``)."""
    layers = [module for module in model.modules() if isinstance(module, GPSLayer)]
    if layers:
        return [(part, module) for layer in layers
                for part, module in (("attention", layer.attention), ("mpnn", layer.local))
                if module is not None]

    def outermost(module: torch.nn.Module) -> Iterator[torch.nn.Module]:
        if isinstance(module, MessagePassing):
            yield module
            return
        for child in module.children():
            yield from outermost(child)

    return [("mpnn", module) for module in outermost(model)]


def _hook(timeline: _Timeline, modules: list[tuple[str, torch.nn.Module]]) -> list[Any]:
    handles = []
    for part, module in modules:
        handles += [
            module.register_forward_pre_hook(lambda *_, part=part: timeline.enter(part)),
            module.register_forward_hook(lambda *_: timeline.leave()),
            module.register_full_backward_pre_hook(lambda *_, part=part: timeline.enter(part)),
            module.register_full_backward_hook(lambda *_: timeline.leave()),
        ]
    return handles


def endless_steps(task: Task, device: torch.device) -> Iterator[Step]:
    """``task``'s training steps, epoch after epoch, without end."""
    # Each epoch's steps are made inside next(), so a node-level graph's copy counts as data too.
    while True:
        yield from task.train_steps(device)


def _batch_shape(batch: Any) -> dict[str, int]:
    return {"graphs": int(getattr(batch, "num_graphs", 1)), "nodes": int(batch.num_nodes),
            "edges": int(batch.edge_index.size(1))}


def step_breakdown(config: Config, steps: int = 5, warmup: int = 1) -> dict[str, Any]:
    """Time ``warmup`` then ``steps`` training steps of ``config`` on stand-in data; the breakdown.

    Returns ``parts_ms`` (the median over the timed steps of each of :data:`PARTS`, in ms), ``total_ms``
    (their sum), ``step_ms`` (the median step, data included), ``per_step`` (every timed step's parts),
    ``modules_timed`` (False with ``optim.compile``: the compiled model is timed whole, as ``rest``),
    the first timed batch's ``batch`` shape (graphs, nodes, edges), ``parameters``, ``device``, ``torch``,
    ``threads`` and ``machine``.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    validate_config(config)
    if config.distributed.strategy != "none":
        raise ValueError(f"bench step times one process (distributed.strategy none), got "
                         f"{config.distributed.strategy!r}")
    raw = stand_in_data(config, STAND_IN_BATCHES * config.data.batch_size)
    trainer = Trainer(config, data=prepare_data(config, raw=raw))
    trainer.model.train()
    timeline = _Timeline(trainer.device)
    # Hooks inside a compiled model would split its graph where they fire: time it whole instead.
    modules_timed = not config.optim.compile
    handles = _hook(timeline, timed_modules(trainer.model)) if modules_timed else []
    batches = endless_steps(trainer.task, trainer.device)
    per_step, batch = [], None
    try:
        for number in range(warmup + steps):
            timeline.clear()
            timeline.enter("data")
            step = next(batches)
            timeline.leave()
            trainer.train_step(step)
            timeline.mark()
            if timeline.cuda:
                torch.cuda.synchronize(trainer.device)
            if number >= warmup:
                batch = batch or _batch_shape(step.batch)
                parts = timeline.parts_ms()
                per_step.append({**parts, "total": sum(parts.values())})
    finally:
        for handle in handles:
            handle.remove()
    parts_ms = {part: statistics.median(step[part] for step in per_step) for part in PARTS}
    return {
        "parts_ms": parts_ms,
        "total_ms": sum(parts_ms.values()),
        "step_ms": statistics.median(step["total"] for step in per_step),
        "per_step": per_step,
        "modules_timed": modules_timed,
        "steps": steps,
        "warmup": warmup,
        "batch": batch,
        "parameters": sum(p.numel() for p in trainer.model.parameters()),
        "device": str(trainer.device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": machine_info(str(trainer.device)),
    }


def markdown_table(result: dict[str, Any]) -> str:
    """The breakdown of :func:`step_breakdown` as a markdown table: median ms and share per part."""
    total = result["total_ms"]
    rows = [f"| {part} | {ms:.1f} | {100 * ms / total if total else 0.0:.0f}% |"
            for part, ms in result["parts_ms"].items()]
    lines = [
        "| part | median ms | share |", "|---|---|---|", *rows,
        f"| **total** (sum of medians) | **{total:.1f}** | 100% |",
        f"| median step | {result['step_ms']:.1f} | |",
    ]
    if not result["modules_timed"]:
        lines.append("\n(compiled model: attention and MPNN are timed within rest)")
    return "\n".join(lines)
