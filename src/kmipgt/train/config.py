"""Run configuration: nested dataclasses read from YAML, with ``key.sub=value`` overrides."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import reprlib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kmipgt.configs import config_path


@dataclass
class DataConfig:
    """Which dataset and how to prepare it.

    ``name`` picks a dataset registered in :mod:`kmipgt.data` (see :func:`kmipgt.data.list_datasets`);
    ``options`` are passed to it as keyword arguments (e.g. ``root``, ``num_nodes``, ``seed``).
    ``val_edges``/``test_edges``: shares of edges held out for edge-level (link) tasks.
    ``virtual_node`` (graph level): each graph gets one extra node joined to all of its nodes, with
    marker columns on its features and edges (:func:`kmipgt.data.add_virtual_node`), added after the
    encodings and the z-scoring, so the original nodes' inputs are unchanged.
    ``split_seed`` (node level): redraw the dataset's train/val/test split with this seed, keeping each
    part's size (:func:`kmipgt.data.redraw_split_masks`); ``None`` (default): the dataset's own split.
    ``on_device`` (graph level): collate each split once into one batch on the run's device and cut every
    mini-batch from it there (:class:`kmipgt.train.resident.ResidentGraphs`) instead of collating each on
    the host and copying it: the same batches in the same order, for the memory of the whole dataset on
    the device. ``None`` (default): on for a CUDA device whose free memory is at least four times the
    graphs' tensors (:func:`kmipgt.train.resident.resident_by_default`), off on the CPU.
    ``pad_to`` (graph level, GPS models): ``{nodes: N, edges: E, graphs: G}`` packs every mini-batch to
    exactly these sizes, with padding nodes in graphs of their own that change no loss, gradient, metric
    or norm statistic (:mod:`kmipgt.train.padding`), so that a compiled model sees one shape; every batch
    must leave room for one padding node and one padding graph (checked before training). ``auto``: two
    budgets sized from the data, each batch packed to the smaller that holds it: one for nearly every batch
    and one for every possible batch, with padding graphs no larger than the largest real graph
    (:func:`kmipgt.train.padding.fitted_budgets`; the run logs them). Empty (default): off.
    """

    name: str = "minnesota"
    options: dict[str, Any] = field(default_factory=dict)
    lappe_dim: int = 0
    rwse_dim: int = 0
    batch_size: int = 32
    normalize_features: bool = True
    val_edges: float = 0.1
    test_edges: float = 0.1
    virtual_node: bool = False
    split_seed: int | None = None
    on_device: bool | None = None
    pad_to: dict[str, Any] | str = field(default_factory=dict)


@dataclass
class TaskConfig:
    """What is predicted and how it is scored.

    ``level``: ``node`` (one graph with train/val/test masks, full batch; or, on a dataset of graph lists
    per split with a label per node, mini-batches of those graphs: inductive segmentation), ``graph``
    (many graphs, mini-batches) or ``edge`` (link prediction on one graph: held-out edges against sampled
    non-edges, full batch, fresh negatives every epoch; use ``loss: bce``).
    ``loss``: ``cross_entropy``, ``bce`` (multi-label) or ``l1``. ``metric``:
    ``accuracy``, ``macro_f1``, ``miou`` (mean IoU over classes), ``ap``, ``roc_auc``, ``mae``, or on a set
    of shapes with categories ``instance_miou`` / ``class_miou`` (ShapeNet-Part's per-shape IoU over the
    shape's category's parts, averaged over shapes / over categories); the best
    checkpoint is chosen on it. ``report``: further metrics of the same names that ``metrics.json`` gives
    for the best checkpoint on every split (e.g. ``[accuracy, miou]`` beside a ``macro_f1`` run).
    ``label_inputs`` (node-level classification): the training labels become inputs, one-hot columns
    plus a "label shown" column appended to the node features. Each training step shows the labels of
    this share of the training nodes, drawn afresh, and computes the loss on the others, so no node
    predicts a label it is shown; evaluation shows every training label. 0 (default): off.
    """

    level: str = "node"
    loss: str = "cross_entropy"
    metric: str = "accuracy"
    report: list[str] = field(default_factory=list)
    label_inputs: float = 0.0


@dataclass
class ModelConfig:
    """Which model and its arguments (sizes inferred from the data are left out).

    ``kind``: ``gps`` (:class:`kmipgt.nn.GraphTransformer`) or a PyG baseline of
    :class:`kmipgt.nn.BaselineModel` (``mlp``, ``gcn``, ``sage``, ``gat``, ``sgformer``, ``polynormer``).
    Each key is named as the model argument it sets: ``channels``, ``num_layers``, ``dropout``, encoder and
    head keys mean the same for every kind; the keys named as arguments of ``GraphTransformer`` or
    :class:`~kmipgt.nn.GPSLayer` only (``local``, ``attention``, ``heads``, ``head_dim``, ``attn_dropout``,
    ``attention_drop_path``, ``attention_order``, ``norm_position``, ``attention_qk``, ``attention_gate``,
    ``attention_layers``, ``branch_residual``, ``ffn``, ``checkpoint``, ...: see those classes) are
    GPS-only, as are ``k`` and ``attention_options`` (e.g. k-MIP's ``key_dropout``), the attention core's
    ``attn_kwargs`` (:meth:`attn_kwargs`); ``residual`` and ``baseline_options`` (keyword arguments of the
    PyG model) are for baselines.
    """

    kind: str = "gps"
    channels: int = 64
    num_layers: int = 4
    local: str = "gatedgcn"
    attention: str = "kmip"
    heads: int = 4
    k: int = 16
    head_dim: int | None = None
    dropout: float = 0.0
    attn_dropout: float = 0.0
    norm: str = "layer"
    activation: str = "gelu"
    pooling: str = "mean"
    head_layers: int = 2
    coord_columns: list[int] = field(default_factory=list)
    num_frequencies: int = 0
    pe_channels: int = 0
    rwse_norm: bool = False
    attention_options: dict[str, Any] = field(default_factory=dict)
    attention_qk: str = "hidden"
    attention_gate: bool = False
    attention_layers: list[int] | None = None
    attention_drop_path: float = 0.0
    attention_order: str = "parallel"
    norm_position: str = "post"
    branch_residual: bool = True
    local_residual: bool = True
    ffn: bool = True
    checkpoint: bool = False
    residual: bool = False
    baseline_options: dict[str, Any] = field(default_factory=dict)

    def attn_kwargs(self) -> dict[str, Any]:
        """The options of the attention kind's core: ``attention_options``, plus ``k`` where the core
        takes one (``kmip``).

        ``k`` stays a top-level key so that configs written before ``attention_options`` carried the
        kind-specific options read unchanged; kinds whose core takes no ``k`` do not get it.
        """
        # Imported here: reading and checking a config imports no torch, so key errors come at once.
        from kmipgt.nn.attention_kinds import ATTENTION_KINDS, NO_ATTENTION

        core = None if self.attention == NO_ATTENTION else ATTENTION_KINDS.lookup(self.attention).core_class
        if core is not None and "k" in inspect.signature(core).parameters:
            return {"k": self.k, **self.attention_options}
        return dict(self.attention_options)


@dataclass
class OptimConfig:
    """AdamW with linear warm-up then cosine decay to zero, and gradient-norm clipping.

    ``precision``: ``fp32``, or ``bf16`` (the forward pass under bfloat16 autocast on CPU or GPU, with fp32
    weights, optimiser state and loss: about half the activation memory).
    ``compile``: run the model through ``torch.compile`` (dynamic shapes, no graph break, one process only):
    one graph for training and one for evaluation whatever the batch shapes (docs/training.md, "Compile
    and export").
    ``cuda_graphs``: capture the compiled model in CUDA graphs (``torch.compile(mode="reduce-overhead")``), so
    that a step replays its kernels instead of launching them one by one; needs ``compile``, ``data.pad_to``
    (one batch shape) and a CUDA device. The attention operators run eagerly between the captured parts.
    """

    lr: float = 1e-3
    weight_decay: float = 0.0
    epochs: int = 100
    warmup_epochs: int = 5
    grad_clip: float = 1.0
    eval_every: int = 1
    precision: str = "fp32"
    compile: bool = False
    cuda_graphs: bool = False


@dataclass
class DistributedConfig:
    """How a run spreads over processes (``docs/distributed.md``).

    ``strategy``: ``none`` (one process), ``ddp`` (``task.level: graph``: DistributedDataParallel under
    torchrun; ``data.batch_size`` is the global batch, split evenly over the ranks; rank 0 writes the run)
    or ``graph`` (``task.level: node``: the graph's nodes split across the ranks under torchrun, each rank
    training on its nodes with a halo exchange per MPNN and sharded k-MIP attention; rank 0 writes the run).
    ``partition`` (``graph``): which nodes each rank owns, ``spatial`` (recursive coordinate bisection of
    the dataset's ``pos`` or ``model.coord_columns``), ``contiguous`` (the stored order) or ``auto``
    (spatial where the graph has coordinates).
    """

    strategy: str = "none"
    partition: str = "auto"


@dataclass
class Config:
    """A whole run: data, task, model, optimiser, processes, seed, device, CPU threads and output directory.

    ``threads`` sets torch's intra-op CPU threads (``None``: torch's default, one per core).
    ``log_branches``: log each GPS layer's branch output scale and gradient norm per epoch
    (:mod:`kmipgt.train.branches`).
    ``tensorboard``: also write each epoch's ``log.csv`` values as TensorBoard scalars to
    ``out_dir/tensorboard/`` (extra ``kmipgt[tensorboard]``; :mod:`kmipgt.train.tensorboard`).
    ``allocator``: glibc's heap policy for the process, applied by the ``kmipgt`` commands before the data
    and model are built (:mod:`kmipgt.malloc`): ``retain`` (freed buffers kept for reuse), ``system``
    (glibc's defaults), ``live`` (buffers above 1 MiB returned on free) or ``trim`` (``retain``, and free
    heap pages returned after each training step); the environment variable ``KMIPGT_SYSTEM_MALLOC`` wins
    over it.
    """

    data: DataConfig = field(default_factory=DataConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    seed: int = 0
    device: str = "auto"
    threads: int | None = None
    log_branches: bool = False
    tensorboard: bool = False
    allocator: str = "retain"
    out_dir: str = "runs/default"


def _checked(value: Any, annotation: Any, key: str) -> Any:
    """``value`` for config key ``key``: a section built from its mapping, or a value of the key's type."""
    if dataclasses.is_dataclass(annotation):
        return _build(annotation, value, key)
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    options = typing.get_args(annotation) if union else (annotation,)
    allowed = tuple(typing.get_origin(a) or a for a in options)  # list[int] | None -> (list, NoneType)
    if float in allowed and type(value) is int:  # YAML reads ``lr: 1`` as an int
        return float(value)
    # bool is a subclass of int, but ``k: true`` is a mistake rather than k = 1
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        raise TypeError(f"config key {key!r} expects {_type_name(annotation)}, got {reprlib.repr(value)}")
    return value


def _type_name(annotation: Any) -> str:
    """``int``, ``int | None``, ``list[int]``: the annotation as it is written, not ``<class 'int'>``."""
    return annotation.__name__ if isinstance(annotation, type) else str(annotation).replace("typing.", "")


def _unknown_key_message(unknown: list[str], known: list[str], where: str) -> str:
    """Name the unknown keys, each with the closest known key where one is close (a typo); the known keys
    are listed only where some unknown key has no close match."""
    close = {key: difflib.get_close_matches(key, known, n=1) for key in unknown}
    named = ", ".join(
        f"{reprlib.repr(key)} (did you mean {match[0]!r}?)" if match else reprlib.repr(key)
        for key, match in close.items()
    )
    listed = "" if all(close.values()) else f"; known: {', '.join(known)}"
    return f"unknown config keys in {where!r}: {named}{listed}"


def _build(cls: type, values: Any, section: str = "") -> Any:
    """An instance of the dataclass ``cls`` from a mapping that may leave keys out but adds none."""
    where = section or "<root>"
    if not isinstance(values, dict):
        raise TypeError(f"config section {where!r} must be a mapping, got {reprlib.repr(values)}")
    fields = typing.get_type_hints(cls)
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(_unknown_key_message(unknown, sorted(fields), where))
    prefix = f"{section}." if section else ""
    return cls(**{key: _checked(value, fields[key], prefix + key) for key, value in values.items()})


class _NoAliasLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses aliases (``*name``): a few hundred bytes of nested aliases expand to
    gigabytes, and no config needs them."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"found the alias *{event.anchor} (aliases are not read)", event.start_mark
            )
        return super().compose_node(parent, index)


def read_yaml(stream: Any, source: str) -> Any:
    """Parse YAML text or a file with the safe loader, aliases refused; a syntax error or an alias becomes a
    one-line ValueError naming ``source``."""
    try:
        return yaml.load(stream, Loader=_NoAliasLoader)
    except yaml.YAMLError as error:
        raise ValueError(f"{source} is not valid YAML: {' '.join(str(error).split())}") from error


def parse_override(text: str) -> tuple[str, Any]:
    """``"model.k=32"`` -> ``("model.k", 32)``: the value is read as YAML (numbers, lists, null, ...)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"override must look like key.sub=value, got {text!r}")
    return key.strip(), read_yaml(raw, f"override {text!r}")


def _override(tree: dict, text: str) -> None:
    """Apply ``"model.k=32"`` to a config tree."""
    key, value = parse_override(text)
    *sections, leaf = key.split(".")
    for part in sections:
        tree = tree.setdefault(part, {})
        if not isinstance(tree, dict):
            raise ValueError(f"override {text!r}: {part!r} is not a section")
    tree[leaf] = value


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML config (or start from defaults) and apply ``key.sub=value`` overrides.

    ``path``: a YAML file, or the name of a config shipped with kmipgt (``"minnesota"``; see
    :mod:`kmipgt.configs`). Unknown keys and values of the wrong type raise, so a typo never silently
    keeps a default; a sweep file (it has a ``base`` key) raises a ValueError naming ``kmipgt sweep``.
    """
    tree: dict = {}
    if path is not None:
        file = config_path(path)
        with open(file) as f:
            tree = read_yaml(f, str(file)) or {}
        # A sweep file names its base config; no run config has a `base` key.
        if isinstance(tree, dict) and "base" in tree:
            raise ValueError(f"{path} is a sweep, not a run config: run `kmipgt sweep {path}`")
    for text in overrides:
        _override(tree, text)
    return _build(Config, tree)


def config_to_dict(config: Config) -> dict:
    """Plain nested dict, suitable for ``yaml.safe_dump``."""
    return dataclasses.asdict(config)


# Keys that do not change what a run computes (config_differences).
_NOT_COMPARED = frozenset({"allocator", "data.on_device"})


def _dotted(tree: dict) -> dict[str, Any]:
    """Every key of a :func:`config_to_dict` tree, defaults filled in, by dotted name (``model.k``).

    Option mappings (``data.options``, ``model.*_options``) stay whole values: they are a loader's or a
    model's keyword arguments, not config keys.
    """
    flat = {}
    for key, value in vars(_build(Config, tree)).items():
        if dataclasses.is_dataclass(value):
            flat.update({f"{key}.{sub}": sub_value for sub, sub_value in vars(value).items()})
        else:
            flat[key] = value
    flat["out_dir"] = Path(flat["out_dir"]).resolve()  # runs/x and ./runs/x/ are the same run
    return flat


def config_differences(saved: dict, current: dict) -> list[str]:
    """Dotted keys whose values differ between two :func:`config_to_dict` trees.

    ``out_dir`` is compared as a resolved path: ``runs/x`` and ``./runs/x/`` are the same run. Keys that
    ``saved`` lacks (it was written before they existed) count as their defaults, which reproduce what
    the run did then. ``allocator`` and ``data.on_device`` are not compared: they change memory and speed,
    not results, so a run may be resumed under another one (a run saved before ``allocator`` existed counts
    as ``retain``).
    """
    saved, current = _dotted(saved), _dotted(current)
    return sorted(key for key in saved if key not in _NOT_COMPARED and saved[key] != current[key])
