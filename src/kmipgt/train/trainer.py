"""The training loop: full batch for one large graph, mini-batches for many graphs, exact resume."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import math
import random
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader
from torch_geometric.utils import negative_sampling
from tqdm import tqdm

from kmipgt.nn import GraphTransformer
from kmipgt.nn.baselines import BASELINE_KINDS, KIND_ARGUMENTS, BaselineModel
from kmipgt.train.atomic import atomic_write, atomic_write_text
from kmipgt.train.branches import BranchMonitor, plot_branches
from kmipgt.train.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from kmipgt.train.config import Config, ModelConfig, config_differences, config_to_dict, load_config
from kmipgt.train.datasets import SPLITS, PreparedData, label_columns, node_coords, prepare_data
from kmipgt.train.metrics import compute_metric, higher_is_better
from kmipgt.train.report import plot_curves, write_csv, write_json

LOSSES = ("cross_entropy", "bce", "l1")
PRECISIONS = ("fp32", "bf16")
logger = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch so that a run is reproducible."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU; anything else is passed to ``torch.device``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


# Model keys every kind reads, and those only GPS reads (both named as the model classes' arguments); a
# baseline's own keys come from KIND_ARGUMENTS.
_SHARED_MODEL_KEYS = (
    "kind", "channels", "num_layers", "dropout", "pooling", "head_layers", "coord_columns", "num_frequencies"
)
_GPS_MODEL_KEYS = (
    "local", "attention", "heads", "head_dim", "attn_dropout", "norm", "activation",
    "attention_qk", "attention_gate", "attention_layers", "branch_residual", "ffn", "checkpoint",
)
# GPS keys that reach the model as the attention core's attn_kwargs (ModelConfig.attn_kwargs).
_GPS_ATTENTION_KEYS = ("k", "attention_options")
_CONFIG_KEY = {"options": "baseline_options"}  # BaselineModel argument -> ModelConfig key, where they differ


def _shared_arguments(config: Config, data: PreparedData) -> dict[str, Any]:
    """The model arguments every kind takes: sizes and task from the data, the shared model keys, PEs."""
    return {
        "in_channels": data.in_channels,
        "out_channels": data.out_channels,
        "task": data.level,
        "lappe_dim": config.data.lappe_dim,
        "rwse_dim": config.data.rwse_dim,
        **{key: getattr(config.model, key) for key in _SHARED_MODEL_KEYS if key != "kind"},
    }


def _build_gps(config: Config, data: PreparedData) -> GraphTransformer:
    own = {key: getattr(config.model, key) for key in _GPS_MODEL_KEYS}
    return GraphTransformer(
        **_shared_arguments(config, data),
        edge_channels=data.edge_channels,
        attn_kwargs=config.model.attn_kwargs(),
        **own,
    )


def _build_baseline(config: Config, data: PreparedData) -> BaselineModel:
    m = config.model
    own = {name: getattr(m, _CONFIG_KEY.get(name, name)) for name in KIND_ARGUMENTS[m.kind]}
    return BaselineModel(m.kind, **_shared_arguments(config, data), **own)


# config ``model.kind`` -> builder of the model sized for the data
MODEL_BUILDERS = {"gps": _build_gps, **dict.fromkeys(BASELINE_KINDS, _build_baseline)}


def _log_ignored_model_keys(model: ModelConfig) -> None:
    """One warning naming the model keys set away from their defaults that ``model.kind`` does not read."""
    if model.kind == "gps":
        own = (*_GPS_MODEL_KEYS, *_GPS_ATTENTION_KEYS)
    else:
        own = tuple(_CONFIG_KEY.get(name, name) for name in KIND_ARGUMENTS[model.kind])
    used, defaults = {*_SHARED_MODEL_KEYS, *own}, ModelConfig()
    ignored = [
        f.name
        for f in dataclasses.fields(model)
        if f.name not in used and getattr(model, f.name) != getattr(defaults, f.name)
    ]
    if ignored:
        logger.warning("model.kind=%s ignores these model keys: %s", model.kind, ", ".join(ignored))


def build_model(config: Config, data: PreparedData) -> torch.nn.Module:
    """The model of ``config.model.kind`` (:data:`MODEL_BUILDERS`) sized for ``data``."""
    kind = config.model.kind
    if kind not in MODEL_BUILDERS:
        raise ValueError(f"model.kind must be one of {tuple(MODEL_BUILDERS)}, got {kind!r}")
    _log_ignored_model_keys(config.model)
    return MODEL_BUILDERS[kind](config, data)


def compute_loss(name: str, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Training loss ``name`` (one of :data:`LOSSES`)."""
    if name == "cross_entropy":
        return F.cross_entropy(output, target.long())
    if name == "bce":
        return F.binary_cross_entropy_with_logits(output, target.float().view_as(output))
    if name == "l1":
        return F.l1_loss(output, target.float().view_as(output))
    raise ValueError(f"task.loss must be one of {LOSSES}, got {name!r}")


def warmup_cosine(warmup_steps: int, total_steps: int):
    """LR factor per optimiser step: linear warm-up to 1, then cosine decay to 0 at ``total_steps``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


@contextlib.contextmanager
def out_of_memory_hint(config: Config):
    """Turn out-of-memory failures into an error that says what to shrink; nothing is skipped."""
    try:
        yield
    except (torch.OutOfMemoryError, MemoryError) as error:
        raise MemoryError(_oom_message(config)) from error
    except RuntimeError as error:
        text = str(error)
        if "out of memory" in text or "can't allocate memory" in text or "not enough memory" in text:
            raise MemoryError(_oom_message(config)) from error
        raise


def _oom_message(config: Config) -> str:
    m = config.model
    what = f"{m.attention!r} attention" if m.kind == "gps" else f"the {m.kind!r} baseline"
    return (
        f"out of memory training {what} (k={m.k}, heads={m.heads}, channels={m.channels}, "
        f"batch_size={config.data.batch_size}). Try a smaller model.k, fewer model.heads or model.channels, "
        "a smaller data.batch_size, or an approximate search backend via model.attention_options.backend."
    )


def _forward(model: torch.nn.Module, batch) -> torch.Tensor:
    return model(
        batch.x,
        batch.edge_index,
        batch=getattr(batch, "batch", None),
        edge_attr=batch.edge_attr,
        lappe=getattr(batch, "lappe", None),
        rwse=getattr(batch, "rwse", None),
        edge_label_index=getattr(batch, "edge_label_index", None),
    )


def _target(batch, level: str) -> torch.Tensor:
    return batch.edge_label if level == "edge" else batch.y


def with_fresh_negatives(graph):
    """A shallow copy of a link-prediction graph scoring its positive pairs against newly sampled non-edges.

    One negative per positive, drawn with PyG's ``negative_sampling`` (Python's RNG, saved in checkpoints)
    among pairs that are not message-passing edges.
    """
    positives = graph.edge_label_index[:, graph.edge_label == 1]
    negatives = negative_sampling(graph.edge_index, graph.num_nodes, num_neg_samples=positives.size(1))
    out = copy.copy(graph)  # new label tensors only; features and encodings stay shared
    out.edge_label_index = torch.cat([positives, negatives], dim=1)
    labels = [positives.new_ones(positives.size(1)), negatives.new_zeros(negatives.size(1))]
    out.edge_label = torch.cat(labels)
    return out


# What resume reads from last.pt (written by Trainer._checkpoint_content).
_RESUME_KEYS = ("config", "model", "optimizer", "scheduler", "state", "rng")


@dataclass
class _State:
    """Everything that changes while training and is saved in checkpoints."""

    epoch: int = 0
    best_value: float | None = None
    best_epoch: int | None = None
    history: list[dict[str, Any]] = field(default_factory=list)


class Trainer:
    """Trains ``config``'s model on its dataset, writing checkpoints and logs to ``config.out_dir``.

    Run directory: ``config.yaml``, ``last.pt`` (every epoch, for ``resume``), ``best.pt`` (best
    validation metric), ``log.csv``, ``curves.png``, ``metrics.json`` and, on request, ``tokens.pt`` and
    ``branches.png``.
    """

    def __init__(self, config: Config, data: PreparedData | None = None):
        self.config = config
        self.run_dir = Path(config.out_dir)
        self.device = resolve_device(config.device)
        if config.threads is not None:
            if config.threads <= 0:
                raise ValueError(f"threads must be a positive int or null, got {config.threads}")
            torch.set_num_threads(config.threads)
        seed_everything(config.seed)
        self.data = data if data is not None else prepare_data(config)
        seed_everything(config.seed)
        self.model = build_model(config, self.data).to(self.device)
        self.loader_generator = torch.Generator().manual_seed(config.seed)
        self.steps_per_epoch = self._steps_per_epoch()
        opt = config.optim
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=opt.lr, weight_decay=opt.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            warmup_cosine(opt.warmup_epochs * self.steps_per_epoch, opt.epochs * self.steps_per_epoch),
        )
        self.branches = BranchMonitor(self.model) if config.log_branches else None
        self.state = _State()
        self.higher_is_better = higher_is_better(config.task.metric)

    def _steps_per_epoch(self) -> int:
        if self.data.level in ("node", "edge"):
            return 1
        return math.ceil(len(self.data.splits["train"]) / self.config.data.batch_size)

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        return DataLoader(
            self.data.splits[split],
            batch_size=self.config.data.batch_size,
            shuffle=shuffle,
            generator=self.loader_generator if shuffle else None,
        )

    def _hide_labels(self, graph):
        """``task.label_inputs``: a copy of ``graph`` showing the labels of a random share of the training
        nodes, and the mask of the other training nodes (those the loss is computed on)."""
        train = graph.train_mask.nonzero().view(-1).cpu()
        order = train[torch.randperm(train.numel(), generator=self.loader_generator)]
        shown = torch.zeros_like(graph.train_mask)
        shown[order[: int(self.config.task.label_inputs * train.numel())].to(shown.device)] = True
        num_classes = self.data.out_channels
        step = graph.clone()
        step.x = torch.cat([graph.x[:, : -(num_classes + 1)], label_columns(graph.y, shown, num_classes)], 1)
        return step, graph.train_mask & ~shown

    def _predict(self, batch) -> torch.Tensor:
        """The model's output in fp32; with ``optim.precision: bf16`` the forward runs under bf16 autocast
        (weights, optimiser state and the loss stay fp32)."""
        bf16 = self.config.optim.precision == "bf16"
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16):
            return _forward(self.model, batch).float()

    def _redraw_random_features(self) -> None:
        for module in self.model.modules():
            if hasattr(module, "redraw_projection"):
                module.redraw_projection()

    def _train_epoch(self) -> float:
        self.model.train()
        self._redraw_random_features()
        loss_name, clip = self.config.task.loss, self.config.optim.grad_clip
        level = self.data.level
        if level == "node":
            graph = self.data.graph.to(self.device)
            hide = self.config.task.label_inputs > 0
            batches = [self._hide_labels(graph) if hide else (graph, graph.train_mask)]
        elif level == "edge":
            batches = [(with_fresh_negatives(self.data.splits["train"][0]).to(self.device), None)]
        else:
            batches = ((b.to(self.device), None) for b in self._loader("train", shuffle=True))
        total, count = 0.0, 0
        for batch, mask in batches:
            output = self._predict(batch)
            target = _target(batch, level)
            if mask is not None:
                output, target = output[mask], target[mask]
            loss = compute_loss(loss_name, output, target)
            self.optimizer.zero_grad()
            loss.backward()
            if self.branches is not None:
                self.branches.record_gradients()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
            self.optimizer.step()
            self.scheduler.step()
            total += loss.item() * target.size(0)
            count += target.size(0)
        return total / count

    @torch.no_grad()
    def evaluate(self, splits: tuple[str, ...] = ("train", "val", "test")) -> dict[str, float]:
        """Metric ``config.task.metric`` on each split, in eval mode, over every node, graph or edge pair."""
        self.model.eval()
        level = self.data.level
        if level == "node":
            graph = self.data.graph.to(self.device)
            output, target = self._predict(graph), graph.y
            return {s: self._score(output[graph[f"{s}_mask"]], target[graph[f"{s}_mask"]]) for s in splits}
        results = {}
        for split in splits:
            outputs, targets = [], []
            batches = self.data.splits[split] if level == "edge" else self._loader(split, shuffle=False)
            for batch in batches:
                batch = batch.to(self.device)
                outputs.append(self._predict(batch))
                targets.append(_target(batch, level))
            results[split] = self._score(torch.cat(outputs), torch.cat(targets))
        return results

    def _score(self, output: torch.Tensor, target: torch.Tensor) -> float:
        if self.config.task.loss != "cross_entropy":
            target = target.float().view_as(output)
        return compute_metric(self.config.task.metric, output, target)

    def _is_better(self, value: float) -> bool:
        best = self.state.best_value
        if best is None:
            return True
        return value > best if self.higher_is_better else value < best

    def _checkpoint_content(self) -> dict[str, Any]:
        return {
            "config": config_to_dict(self.config),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "state": self.state.__dict__,
            "rng": rng_state(self.loader_generator),
        }

    def resume(self) -> None:
        """Continue from ``last.pt`` in the run directory, restoring weights, optimiser, history and RNG."""
        checkpoint = load_checkpoint(self.run_dir / "last.pt", keys=_RESUME_KEYS)
        changed = config_differences(checkpoint["config"], config_to_dict(self.config))
        if changed:
            raise ValueError(
                f"the config differs from the one saved in {self.run_dir / 'last.pt'} in "
                f"{', '.join(changed)}; resume with the same config (or start a new out_dir)"
            )
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.scheduler.load_state_dict(checkpoint["scheduler"])
        self.state = _State(**checkpoint["state"])
        set_rng_state(checkpoint["rng"], self.loader_generator)

    def fit(self, stop_after: int | None = None, progress: bool = True) -> dict[str, Any]:
        """Train up to ``optim.epochs`` (or stop after epoch ``stop_after``, resumable later).

        Returns the final metrics (best checkpoint on validation, every split) once training is complete,
        else the metrics of the last evaluation.
        """
        opt = self.config.optim
        self.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(
            self.run_dir / "config.yaml", yaml.safe_dump(config_to_dict(self.config), sort_keys=False)
        )
        last_epoch = opt.epochs if stop_after is None else min(opt.epochs, stop_after)
        bar = tqdm(
            range(self.state.epoch, last_epoch),
            desc=f"train {self.data.name}",
            disable=not progress,
            file=sys.stderr,
            initial=self.state.epoch,
            total=opt.epochs,
        )
        for epoch in bar:
            start = time.perf_counter()
            with out_of_memory_hint(self.config):
                loss = self._train_epoch()
            row: dict[str, Any] = {
                "epoch": epoch + 1,
                "lr": self.optimizer.param_groups[0]["lr"],
                "train_loss": loss,
                "val": None,
                "test": None,
            }
            if self.branches is not None:
                row.update(self.branches.epoch_row())
            if (epoch + 1) % opt.eval_every == 0 or epoch + 1 == opt.epochs:
                with out_of_memory_hint(self.config):
                    scores = self.evaluate(("val", "test"))
                row.update(scores)
                if self._is_better(scores["val"]):
                    self.state.best_value, self.state.best_epoch = scores["val"], epoch + 1
                    save_checkpoint(self.run_dir / "best.pt", model=self.model.state_dict(), epoch=epoch + 1)
                bar.set_postfix(loss=f"{loss:.3f}", val=f"{scores['val']:.3f}", test=f"{scores['test']:.3f}")
            row["seconds"] = time.perf_counter() - start
            self.state.history.append(row)
            self.state.epoch = epoch + 1
            save_checkpoint(self.run_dir / "last.pt", **self._checkpoint_content())
            write_csv(self.run_dir / "log.csv", self.state.history)
        bar.close()
        plot_curves(self.run_dir / "curves.png", self.state.history, self.config.task.metric)
        if self.branches is not None:
            plot_branches(self.run_dir / "branches.png", self.state.history)
        if self.state.epoch < opt.epochs:
            return {"epochs_done": self.state.epoch, "complete": False}
        return self.finish()

    def finish(self) -> dict[str, Any]:
        """Evaluate the best checkpoint on every split and write ``metrics.json``."""
        best = load_checkpoint(self.run_dir / "best.pt")
        self.model.load_state_dict(best["model"])
        with out_of_memory_hint(self.config):
            scores = self.evaluate()
        seconds = [row["seconds"] for row in self.state.history]
        metrics = {
            "dataset": self.data.name,
            "metric": self.config.task.metric,
            **scores,
            "best_epoch": best["epoch"],
            "epochs": self.state.epoch,
            "seconds_per_epoch": float(np.mean(seconds)),
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "peak_memory_mb": peak_memory_mb(self.device),
            "complete": True,
        }
        write_json(self.run_dir / "metrics.json", metrics)
        return metrics

    @torch.no_grad()
    def save_tokens(self) -> Path:
        """Dump the first attention layer's query/key tokens on the full graph (eval mode) to ``tokens.pt``.

        Format: ``{"query": [N, H, d], "key": [N, H, d], "dataset": name, "layer": 0}`` — the input of
        ``kmipgt bench search``. For graph-level data the graph is the first test graph, for edge-level data
        the test split's message-passing graph.
        """
        if not isinstance(self.model, GraphTransformer) or not self.model.layers:
            raise ValueError("save_tokens needs a GPS model (model.kind=gps) with at least one layer")
        if self.model.layers[0].attention is None:
            raise ValueError("save_tokens needs a model whose first layer has global attention")
        attention = self.model.layers[0].attention
        if not hasattr(attention, "query_key_value"):
            raise ValueError(f"{type(attention).__name__} does not expose query/key tokens")
        graph = self.data.graph if self.data.level == "node" else self.data.splits["test"][0]
        captured = {}

        def capture(module, args, kwargs):
            # Position-keyed attention projects its queries and keys from qk_x, not from the layer input.
            query, key, _ = module.query_key_value(args[0], kwargs.get("qk_x"))
            captured["query"], captured["key"] = query, key

        self.model.eval()
        handle = attention.register_forward_pre_hook(capture, with_kwargs=True)
        try:
            _forward(self.model, graph.to(self.device))
        finally:
            handle.remove()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / "tokens.pt"
        tokens = {
            "query": captured["query"].cpu(),
            "key": captured["key"].cpu(),
            "dataset": self.data.name,
            "layer": 0,
        }
        atomic_write(path, lambda f: torch.save(tokens, f))
        return path


def peak_memory_mb(device: torch.device) -> float:
    """Peak CUDA memory allocated by torch on ``device``, or the process's peak resident set on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def train(
    config: Config,
    resume: bool = False,
    stop_after: int | None = None,
    save_tokens: bool = False,
    progress: bool = True,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Train ``config`` (optionally resuming ``out_dir/last.pt``) and return the final metrics.

    The whole config and the run directory are checked first (:func:`kmipgt.train.rundir.prepare_run`):
    a directory holding another run is refused unless ``resume`` or ``overwrite``.
    """
    from kmipgt.train.rundir import prepare_run  # it imports this module

    config = prepare_run(config, resume=resume, overwrite=overwrite)
    trainer = Trainer(config)
    if resume:
        trainer.resume()
    metrics = trainer.fit(stop_after=stop_after, progress=progress)
    if save_tokens and metrics.get("complete"):
        metrics["tokens"] = str(trainer.save_tokens())
    return metrics


def load_run(
    run_dir: str | Path, checkpoint: str = "best", overrides: list[str] | tuple[str, ...] = ()
) -> Trainer:
    """A run's :class:`Trainer` as ``kmipgt train`` built it, with the weights of ``best.pt`` or ``last.pt``.

    The saved ``config.yaml`` (with ``overrides`` applied) gives the dataset, model and device; both files
    are checked before the dataset is loaded, so a wrong directory fails fast (FileNotFoundError).
    """
    if checkpoint not in ("best", "last"):
        raise ValueError(f"checkpoint must be 'best' or 'last', got {checkpoint!r}")
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise FileNotFoundError(f"no config.yaml in {run_dir} (not a run directory written by kmipgt train)")
    path = run_dir / f"{checkpoint}.pt"
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    trainer = Trainer(load_config(run_dir / "config.yaml", overrides))
    trainer.model.load_state_dict(load_checkpoint(path)["model"])
    return trainer


def evaluate_run(
    run_dir: str | Path,
    checkpoint: str = "best",
    overrides: list[str] | tuple[str, ...] = (),
    save_tokens: bool = False,
) -> dict[str, Any]:
    """Re-evaluate a finished run's ``best.pt`` or ``last.pt`` on every split with its saved config.

    ``overrides`` (``key.sub=value``) change the saved config first, e.g. to apply a model trained on a
    10k-node synthetic city to a 262k-node one (``data.options.num_nodes=262144``) and, with
    ``save_tokens``, dump that graph's query/key tokens to ``out_dir/tokens.pt`` (set ``out_dir`` to keep
    the run directory untouched).
    """
    trainer = load_run(run_dir, checkpoint, overrides)
    with out_of_memory_hint(trainer.config):
        metrics: dict[str, Any] = trainer.evaluate()
        if save_tokens:
            metrics["tokens"] = str(trainer.save_tokens())
    return metrics


@dataclass
class SplitGraph:
    """One graph of a run's data and a split's nodes on it, as attention analyses take them.

    ``nodes``: ``[S]`` the split's nodes (node level: its mask; graph and edge level: every node of the
    split's graph ``index``). ``labels``: ``[N]`` classes on node-level classification, else None.
    ``train_mask``: ``[N]`` training-labelled nodes on node-level tasks, else None. ``coords``: ``[N, 2]``
    node coordinates for pictures: the dataset's ``pos``, else the first two ``model.coord_columns`` of x
    (z-scored), else None.
    """

    graph: Data
    nodes: torch.Tensor
    labels: torch.Tensor | None
    train_mask: torch.Tensor | None
    coords: torch.Tensor | None


def split_graph(trainer: Trainer, split: str, index: int = 0) -> SplitGraph:
    """The graph that ``split`` lives on (graph ``index`` of the split on graph/edge level) and its nodes."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    data = trainer.data
    if data.level == "node":
        graph = data.graph
        nodes, train_mask = graph[f"{split}_mask"].nonzero().flatten(), graph.train_mask
        classes = trainer.config.task.loss == "cross_entropy" and graph.y.dim() == 1
        labels = graph.y if classes else None
    else:
        graphs = data.splits[split]
        if not 0 <= index < len(graphs):
            raise ValueError(f"graph {index} does not exist: split {split!r} has {len(graphs)} graphs")
        graph = graphs[index]
        nodes, labels, train_mask = torch.arange(graph.num_nodes), None, None
    coords = node_coords(graph, trainer.config.model.coord_columns)
    return SplitGraph(graph, nodes, labels, train_mask, coords)
