"""Training on data one holds in Python: a ``Data``, a list of them or a PyG ``Dataset``, with the starting
recipe of its task level or any config, written as a run folder that ``kmipgt predict``, ``eval``,
``export`` and ``analysis explain`` read like any other."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch_geometric.data import Dataset as PyGDataset

from kmipgt.atomic import save_tensors
from kmipgt.train.config import Config, load_config
from kmipgt.train.loop import Trainer
from kmipgt.train.recipes import starting_recipe
from kmipgt.train.rundir import prepare_run

__all__ = ["fit"]

# The data's copy in the run folder, which the run's config names (dataset ``file``).
DATA_FILE = "data.pt"


def _as_config(data: Any, config: Config | str | Path | None, overrides: Sequence[str]) -> Config:
    if isinstance(config, Config):
        if overrides:
            raise ValueError("overrides change a config read from a file or a shipped name; edit the Config "
                             "object instead")
        return config
    return load_config(config if config is not None else starting_recipe(data, overrides), overrides)


def fit(
    data: Any,
    config: Config | str | Path | None = None,
    overrides: Sequence[str] = (),
    out_dir: str | Path | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> Trainer:
    """Train a model on ``data`` and return its :class:`~kmipgt.train.loop.Trainer`: the best checkpoint's
    weights loaded, its scores on every split in ``trainer.metrics`` (as ``metrics.json``).

    Args:
        data: one graph (a PyG ``Data``: a node-level task, or ``task.level: edge``), a list of graphs (a
            graph-level task, or node level where every node has a label; split by ``data.split_ratios``),
            ``{"train": [...], "val": [...], "test": [...]}`` graph lists, or a PyG ``Dataset``.
        config: a :class:`~kmipgt.train.config.Config`, a config file or a shipped config's name; None: the
            starting recipe of the data's task level (``start_node``, ``start_graph``, ``start_edge``).
        overrides: ``key.sub=value`` changes to a config read from a file or name, e.g.
            ``["optim.epochs=50", "model.attention.k=8"]``.
        out_dir: the run folder (default: the config's ``out_dir``). It gets the run's files and the data
            (``data.pt``, which its ``config.yaml`` names), so that the run can be evaluated, predicted and
            exported later. A folder holding another run is refused unless ``overwrite``.
        progress: a progress bar on stderr.

    The task's level, loss and metric that the config leaves open are read from the data, as ``kmipgt train``
    reads them; the data are checked before anything is written.
    """
    config = _as_config(data, config, overrides)
    out = Path(out_dir if out_dir is not None else config.out_dir)
    saved = (out / DATA_FILE).resolve()
    source = dataclasses.replace(config.data, name="file", options={"path": str(saved)})
    config = dataclasses.replace(config, out_dir=str(out), data=source)
    config = prepare_run(config, overwrite=overwrite)
    trainer = Trainer(config, data)  # prepares and checks the data: an error leaves nothing written
    out.mkdir(parents=True, exist_ok=True)
    plain = [data[i] for i in range(len(data))] if isinstance(data, PyGDataset) else data
    save_tensors(plain, saved)
    trainer.fit(progress=progress)
    return trainer
