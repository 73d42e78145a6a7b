"""A trained run's predictions: its best (or last) model on its own data or on new data, one row per node,
graph or scored pair of its task, batch by batch as evaluation computes them (``kmipgt predict``).

The data:

- the run's dataset, as its saved config gives it with ``overrides`` applied: its own splits, or new data
  given the way a config gives it (``data.options.seed=1``, another ``data.name`` and ``data.options.root``);
- one graph (a PyG ``Data``, or a ``.pt`` file of one, read weights-only): on a run over one graph (node or
  link tasks on a road network) it stands in for that graph and is prepared alone, as the run's graph was;
  on a run over a set of graphs it is one more graph of the set, z-scored with the statistics of the set's
  training graphs (so those are read when ``data.normalize_features`` is on).

Before anything is predicted, new data are checked against the widths the weights were trained for
(:func:`~kmipgt.train.widths.trained_widths`): other feature widths are a one-line ValueError. The model has
as many outputs as training saw, whatever labels the new data carry (labels are never read).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader
from tqdm import tqdm

from kmipgt.cpus import capped_at_cpus
from kmipgt.data import get_dataset, load_graph
from kmipgt.data.registry import ONE_GRAPH
from kmipgt.logs import quiet
from kmipgt.train.batches import batch_to_device, forward
from kmipgt.train.categories import model_categories
from kmipgt.train.choices import PREDICTED_SPLITS
from kmipgt.train.config import Config, DistributedConfig
from kmipgt.train.datasets import SPLITS, PreparedData, load_raw, prepare_data, prepare_set_graph
from kmipgt.train.models import build_model
from kmipgt.train.prediction_files import check_output, collect, write_rows
from kmipgt.train.raw_forms import as_raw
from kmipgt.train.run import read_run
from kmipgt.train.runtime import compile_failure_hint, resolve_device, seed_everything
from kmipgt.train.validation import validate_config
from kmipgt.train.widths import trained_widths

__all__ = ["SPLIT_CHOICES", "Predictions", "predict", "write_predictions"]

SPLIT_CHOICES = PREDICTED_SPLITS
NO_SPLIT = ""  # the split of a node in no split mask, and of a graph given alone
MASKS = tuple(f"{split}_mask" for split in SPLITS)
CHECKED_WIDTHS = (("in_channels", "node features"), ("edge_channels", "edge features"))


def _outputs(output: torch.Tensor, loss: str, probabilities: bool) -> dict[str, torch.Tensor]:
    """``predicted`` (a class, 0/1 per binary target, or the value) and, on request, ``probabilities`` (the
    softmax over classes, or each binary target's sigmoid) from the model's ``[R, C]`` output."""
    if loss == "cross_entropy":
        columns = {"predicted": output.argmax(-1)}
        if probabilities:
            columns["probabilities"] = output.softmax(-1)
        return columns
    if loss != "bce":
        return {"predicted": output.squeeze(-1) if output.size(-1) == 1 else output}
    chance = torch.sigmoid(output)
    columns = {"predicted": (chance > 0.5).long(), **({"probabilities": chance} if probabilities else {})}
    return {key: value.squeeze(-1) if value.size(-1) == 1 else value for key, value in columns.items()}


def _stand_in(graph: Data, level: str) -> Data:
    """``graph`` as a one-graph dataset's loader returns it for training: at node level a graph without
    labels gets zeros and empty split masks, neither of which a prediction reads (a labelled one lacking
    masks gets them drawn as training drew them)."""
    graph = copy.copy(graph)
    if level == "node" and graph.get("y") is None:
        graph.y = torch.zeros(graph.num_nodes, dtype=torch.long)
        for mask in MASKS:
            if graph.get(mask) is None:
                graph[mask] = torch.zeros(graph.num_nodes, dtype=torch.bool)
    return graph


def _overrides(keys: Mapping[str, Any], prefix: str) -> list[str]:
    """``key.sub=value`` overrides setting each leaf of the nested ``keys`` under ``prefix`` (so that
    ``{"options": {"seed": 1}}`` changes the seed and keeps the other options)."""
    overrides = []
    for key, value in keys.items():
        if isinstance(value, Mapping) and value:
            overrides += _overrides(value, f"{prefix}.{key}")
        else:
            overrides.append(f"{prefix}.{key}={json.dumps(value)}")  # JSON is YAML, as overrides are read
    return overrides


def _prepared(config: Config, data: Data | str | Path | None) -> tuple[PreparedData, str]:
    """The data to predict on, prepared as training prepared the run's, and how messages name them."""
    level = config.task.level
    if data is None:
        raw = as_raw(load_raw(config), config)
        graph = _stand_in(raw, level) if isinstance(raw, Data) else raw
        return prepare_data(config, graph, training=False), f"dataset {config.data.name!r}"
    what = "the graph" if isinstance(data, Data) else str(data)
    graph = data if isinstance(data, Data) else load_graph(data)
    one_graph = level == "edge" or get_dataset(config.data.name).levels == ONE_GRAPH or (
        level == "node" and isinstance(as_raw(load_raw(config), config), Data))
    if one_graph:
        return prepare_data(config, _stand_in(graph, level), training=False), what
    training = load_raw(config)["train"] if config.data.normalize_features else None
    prepared = prepare_set_graph(graph, config, training)
    edges = prepared.get("edge_attr")
    categories = model_categories(config)
    return PreparedData(level, None, {NO_SPLIT: [prepared]}, prepared.x.size(-1),
                        0 if edges is None else edges.size(-1), 0, config.data.name,
                        categories.node, categories.edge), what


class Predictions:
    """A run's model, loaded and checked against the data it will predict on; :meth:`chunks` gives the rows.

    Args:
        run_dir: a folder written by ``kmipgt train``.
        data: None (the dataset of the run's config with ``overrides``), a ``Data`` or the path of a ``.pt``
            file holding one, or a mapping of ``data`` config keys applied as overrides, nested keys one by
            one (``{"options": {"seed": 1}}`` keeps the other options).
        split: ``train``, ``val``, ``test`` or ``all`` (every node, graph or pair; a graph given alone
            has no splits, so only ``all``).
        checkpoint: ``best`` or ``last``; ``trust_checkpoint`` as for :func:`~kmipgt.train.load_run`.
        overrides: ``key.sub=value`` changes to the run's saved config, e.g. ``data.options.seed=1``.
        probabilities: also the class probabilities (cross-entropy) or each target's sigmoid (bce).
        device: where the model runs (default: the config's ``device``).

    Everything that can be refused (a missing run, a bad split, data of other feature widths) is refused
    here, before a row is computed.
    """

    def __init__(
        self,
        run_dir: str | Path,
        data: Data | str | Path | Mapping[str, Any] | None = None,
        *,
        split: str = "all",
        checkpoint: str = "best",
        overrides: Sequence[str] = (),
        probabilities: bool = False,
        device: str | None = None,
        trust_checkpoint: bool = False,
    ):
        if split not in SPLIT_CHOICES:
            raise ValueError(f"split must be one of {SPLIT_CHOICES}, got {split!r}")
        overrides = [*overrides, *([f"device={device}"] if device is not None else [])]
        if isinstance(data, Mapping):
            overrides += _overrides(data, "data")
            data = None
        config, weights = read_run(run_dir, checkpoint, overrides, trust_checkpoint)
        validate_config(config)
        if probabilities and config.task.loss not in ("cross_entropy", "bce"):
            raise ValueError(f"probabilities need classes (task.loss cross_entropy or bce); this run's "
                             f"task.loss {config.task.loss!r} predicts values")
        # One process predicts, whatever spread the training: the weights are the same.
        self.config = config = dataclasses.replace(config, distributed=DistributedConfig())
        self.split, self.probabilities = split, probabilities
        widths = trained_widths(config, config.task.level, weights)
        if config.threads is not None:
            torch.set_num_threads(capped_at_cpus(config.threads, "threads"))
        seed_everything(config.seed)  # as the trainer seeds before it prepares the data (link splits)
        self.data, what = _prepared(config, data)
        self._check(widths, what, run_dir)
        self.device = resolve_device(config.device)
        sized = dataclasses.replace(self.data, out_channels=widths["out_channels"])
        self.model = build_model(config, sized).to(self.device)
        try:
            self.model.load_state_dict(weights)
        except RuntimeError as error:  # a model override (model.channels=...) builds another model
            raise ValueError(f"the weights of {run_dir} do not fit the model this config builds: "
                             f"{str(error).splitlines()[-1].strip()}") from None
        self.model.eval()
        if config.optim.compile:
            self.model.compile(dynamic=True)

    def _check(self, widths: dict[str, int | None], what: str, run_dir: str | Path) -> None:
        wrong = [f"it has {getattr(self.data, field)} {name}, the model reads {widths[field]}"
                 for field, name in CHECKED_WIDTHS
                 if widths[field] is not None and getattr(self.data, field) != widths[field]]
        if wrong:
            raise ValueError(f"{what} does not fit the model of {run_dir}: {'; '.join(wrong)}")
        if self.split == "all":
            return
        graph = self.data.graph
        if graph is not None and not bool(graph[f"{self.split}_mask"].any()):
            raise ValueError(f"{what} has no {self.split} nodes (its {self.split}_mask is empty or missing); "
                             "predict every node with split all")
        if graph is None and self.split not in self.data.splits:
            raise ValueError(f"{what} is one graph in no split: predict it with split all")

    @torch.no_grad()
    def _forward(self, batch: Data) -> torch.Tensor:
        """The model's fp32 output on ``batch`` (on the device), under bf16 autocast with
        ``optim.precision: bf16``, as evaluation runs it."""
        bf16 = self.config.optim.precision == "bf16"
        with compile_failure_hint(self.config.optim.compile), torch.autocast(
            self.device.type, dtype=torch.bfloat16, enabled=bf16
        ):
            return forward(self.model, batch).float()

    def _columns(self, output: torch.Tensor) -> dict[str, torch.Tensor]:
        return _outputs(output.cpu(), self.config.task.loss, self.probabilities)

    def chunks(self, progress: bool = False) -> Iterator[dict[str, Any]]:
        """The rows, a chunk per forward pass: ``split`` (a list of names, ``""`` for none), the ids
        (``graph`` and ``node`` on node level, ``graph`` on graph level, ``source`` and ``target`` on edge
        level: ``[R]`` int64), ``predicted`` (``[R]``, or ``[R, T]`` for several targets) and with
        ``probabilities`` ``probabilities`` (``[R, C]``, or ``[R]`` for one binary target).

        ``progress``: a bar over the batches on stderr (hidden when logging is quiet).
        """
        if self.data.graph is not None:
            yield self._graph_rows()
            return
        chosen = SPLITS if self.split == "all" else (self.split,)
        for split, graphs in self.data.splits.items():
            if split == NO_SPLIT or split in chosen:
                yield from self._set_rows(split, graphs, progress)

    def _graph_rows(self) -> dict[str, Any]:
        """Every chosen node of the one graph, from one forward pass over it."""
        graph = self.data.graph.to(self.device)
        output = self._forward(graph)
        names = np.full(graph.num_nodes, NO_SPLIT, dtype=object)
        for split in SPLITS:
            names[graph[f"{split}_mask"].cpu().numpy()] = split
        nodes = torch.arange(graph.num_nodes)
        if self.split != "all":
            nodes = graph[f"{self.split}_mask"].cpu().nonzero().view(-1)
        columns = self._columns(output[nodes.to(self.device)])
        # A source that names its nodes (the node table's ids) and its classes is answered in its names.
        ids = graph.get("node_ids")
        named = {"node": nodes if ids is None else [ids[i] for i in nodes.tolist()]}
        classes = graph.get("label_names")
        if classes is not None and self.config.task.loss == "cross_entropy":
            named["predicted_label"] = [classes[i] for i in columns["predicted"].tolist()]
        return {"split": names[nodes.numpy()].tolist(), "graph": torch.zeros_like(nodes), **named, **columns}

    def _set_rows(self, split: str, graphs: Sequence[Data], progress: bool) -> Iterator[dict[str, Any]]:
        """The rows of a split's graphs, a chunk per batch (mini-batches of ``data.batch_size`` graphs in
        their order, as evaluation takes them; a link task's one graph scores its pairs)."""
        level = self.config.task.level
        batches = graphs if level == "edge" else DataLoader(graphs, batch_size=self.config.data.batch_size)
        hidden = not progress or quiet()
        done = 0  # graphs of the split before this batch
        for batch in tqdm(batches, desc=f"predict {split or 'graph'}", disable=hidden, file=sys.stderr):
            output = self._columns(self._forward(batch_to_device(batch, self.device)))
            if level == "edge":
                ids = dict(zip(("source", "target"), batch.edge_label_index.cpu()))
            elif level == "graph":
                ids = {"graph": done + torch.arange(batch.num_graphs)}
            else:
                owner = batch.batch.cpu()
                ids = {"graph": done + owner, "node": torch.arange(batch.num_nodes) - batch.ptr.cpu()[owner]}
            done += getattr(batch, "num_graphs", 1)
            rows = len(next(iter(ids.values())))
            yield {"split": [split] * rows, **ids, **output}


def predict(
    run_dir: str | Path,
    data: Data | str | Path | Mapping[str, Any] | None = None,
    *,
    progress: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """A trained run's predictions on ``data`` as columns, every row in memory: ``split`` (a list of names)
    and ``[R]`` or ``[R, C]`` tensors (:meth:`Predictions.chunks`). ``options``: the keyword arguments of
    :class:`Predictions` (``split``, ``checkpoint``, ``overrides``, ``probabilities``, ``device``,
    ``trust_checkpoint``); ``progress`` shows a bar over the batches."""
    return collect(Predictions(run_dir, data, **options).chunks(progress))


def write_predictions(
    run_dir: str | Path,
    out: str | Path,
    data: Data | str | Path | Mapping[str, Any] | None = None,
    *,
    progress: bool = False,
    **options: Any,
) -> int:
    """Write a trained run's predictions on ``data`` to ``out``, CSV, Parquet or ``.pt`` by its extension,
    streamed batch by batch (:func:`~kmipgt.train.prediction_files.write_rows`); the number of rows.
    ``progress`` and ``options`` as for :func:`predict`. Nothing is written when the data are refused or a
    batch fails."""
    check_output(out)  # a wrong extension or folder is refused before the data are read
    return write_rows(out, Predictions(run_dir, data, **options).chunks(progress))
