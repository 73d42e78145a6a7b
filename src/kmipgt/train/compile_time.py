"""``kmipgt bench compile``: a compiled training step against the eager one, interleaved in one process.

Two trainers of one config (the same initial weights, the same stand-in batches in the same order), one
with ``optim.compile``: the compiled one's first steps compile (timed apart), then the two take their
steps in turns (which goes first alternates), so a busy machine slows both alike and the ratio of their
medians holds.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from kmipgt.atomic import atomic_write_json, atomic_write_text, save_figure
from kmipgt.machine import machine_info
from kmipgt.train.config import Config
from kmipgt.train.datasets import prepare_data
from kmipgt.train.loop import Trainer
from kmipgt.train.stand_in import stand_in_data
from kmipgt.train.step_time import STAND_IN_BATCHES, endless_steps

__all__ = ["compiled_step_benchmark", "markdown_table", "plot_steps", "write_outputs"]


def _trainer(config: Config, compiled: bool) -> Trainer:
    cuda_graphs = compiled and config.optim.cuda_graphs
    variant = replace(config, optim=replace(config.optim, compile=compiled, cuda_graphs=cuda_graphs))
    raw = stand_in_data(variant, STAND_IN_BATCHES * variant.data.batch_size)
    trainer = Trainer(variant, data=prepare_data(variant, raw=raw))
    trainer.model.train()
    return trainer


def _timed_step(trainer: Trainer, steps) -> float:
    step = next(steps)
    if trainer.device.type == "cuda":
        torch.cuda.synchronize(trainer.device)
    start = time.perf_counter()
    trainer.train_step(step)
    if trainer.device.type == "cuda":
        torch.cuda.synchronize(trainer.device)
    return 1000 * (time.perf_counter() - start)


def compiled_step_benchmark(config: Config, steps: int = 10, warmup: int = 2) -> dict[str, Any]:
    """Median training step of ``config`` eager and compiled, on stand-in batches of varying shapes.

    ``warmup`` steps of each first (the compiled model's are its compilation, reported as
    ``compile_ms``), then ``steps`` rounds of one step each. Returns both medians, their ratio
    (compiled / eager: below 1 the compiled step is faster), every timed step and the graphs compiled.
    """
    eager, compiled = _trainer(config, False), _trainer(config, True)
    batches = {"eager": endless_steps(eager.task, eager.device),
               "compiled": endless_steps(compiled.task, compiled.device)}
    trainers = {"eager": eager, "compiled": compiled}
    warm = {name: [_timed_step(trainers[name], batches[name]) for _ in range(warmup)] for name in trainers}
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for number in range(steps):
        order = ("eager", "compiled") if number % 2 == 0 else ("compiled", "eager")
        for name in order:
            times[name].append(_timed_step(trainers[name], batches[name]))
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {
        "eager_ms": medians["eager"],
        "compiled_ms": medians["compiled"],
        "ratio": medians["compiled"] / medians["eager"],
        "compile_ms": sum(warm["compiled"]),
        "compiled_graphs": compiled.compiled.graphs,
        "steps": times,
        "warmup": warmup,
        "parameters": sum(p.numel() for p in eager.model.parameters()),
        "device": str(eager.device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": machine_info(str(eager.device)),
    }


def markdown_table(result: dict[str, Any]) -> str:
    """The medians, their ratio and the compilation of :func:`compiled_step_benchmark`."""
    return "\n".join([
        "| step | median ms |", "|---|---|",
        f"| eager | {result['eager_ms']:.1f} |",
        f"| compiled | {result['compiled_ms']:.1f} |",
        f"| **compiled / eager** | **{result['ratio']:.2f}** |",
        f"\ncompilation: {result['compile_ms'] / 1000:.0f} s over the first {result['warmup']} steps, "
        f"{result['compiled_graphs']} graph(s)",
    ])


def plot_steps(result: dict[str, Any], path: Path) -> None:
    """Every timed step of both, in the order taken."""
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for name, values in result["steps"].items():
        axis.plot(range(1, len(values) + 1), values, marker="o", label=name)
    axis.set(xlabel="round", ylabel="training step (ms)", ylim=(0, None),
             title=f"compiled / eager = {result['ratio']:.2f}")
    axis.legend()
    figure.tight_layout()
    save_figure(figure, path)
    plt.close(figure)


def write_outputs(result: dict[str, Any], out: Path) -> None:
    """``compile.json``, ``compile.md`` and ``compile.png`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "compile.json", result)
    atomic_write_text(out / "compile.md", markdown_table(result) + "\n")
    plot_steps(result, out / "compile.png")
