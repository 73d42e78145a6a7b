"""Run configuration: nested dataclasses read from YAML, with ``key.sub=value`` overrides."""

from __future__ import annotations

import copy
import dataclasses
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kmipgt.configs import config_path
from kmipgt.train.config_reading import build_section, parse_override, read_yaml
from kmipgt.train.config_upgrade import log_moved_keys, moved_key, upgrade_tree


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
    ``split_index``: which split a graph holding several uses (its masks ``[N, S]``, one column a split, as
    PyG's WebKB, WikipediaNetwork and Actor ship them): column ``split_index``. ``split_ratios``: the
    train/val/test shares of a seeded split (seed ``split_seed``, else 0) drawn for data that has none: over
    the labelled nodes of one graph without masks, or over a list of graphs.
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
    split_index: int = 0
    split_ratios: list[float] = field(default_factory=lambda: [0.8, 0.1, 0.1])
    on_device: bool | None = None
    pad_to: dict[str, Any] | str = field(default_factory=dict)


@dataclass
class TaskConfig:
    """What is predicted and how it is scored; ``level``, ``loss`` and ``metric`` left out (``null``) are
    read from the data (:mod:`kmipgt.train.task_inference`), and the run logs what it chose.

    ``level``: ``node`` (one graph with train/val/test masks, full batch; or, on a dataset of graph lists
    per split with a label per node, mini-batches of those graphs: inductive segmentation), ``graph``
    (many graphs, mini-batches) or ``edge`` (link prediction on one graph: held-out edges against sampled
    non-edges, full batch, fresh negatives every epoch; use ``loss: bce``).
    ``loss``: ``cross_entropy``, ``bce`` (binary or multi-label) or ``l1``. ``metric``:
    ``accuracy``, ``macro_f1``, ``miou`` (mean IoU over classes), ``ap``, ``roc_auc`` (of a cross-entropy
    model: its positive class's probability for two classes, each class against the rest for more),
    ``mae``, or on a set
    of shapes with categories ``instance_miou`` / ``class_miou`` (ShapeNet-Part's per-shape IoU over the
    shape's category's parts, averaged over shapes / over categories); the best
    checkpoint is chosen on it. ``report``: further metrics of the same names that ``metrics.json`` gives
    for the best checkpoint on every split (e.g. ``[accuracy, miou]`` beside a ``macro_f1`` run).
    ``label_inputs`` (node-level classification): the training labels become inputs, one-hot columns
    plus a "label shown" column appended to the node features. Each training step shows the labels of
    this share of the training nodes, drawn afresh, and computes the loss on the others, so no node
    predicts a label it is shown; evaluation shows every training label. 0 (default): off.
    """

    level: str | None = None
    loss: str | None = None
    metric: str | None = None
    report: list[str] = field(default_factory=list)
    label_inputs: float = 0.0


@dataclass
class EncoderConfig:
    """The node encoder's options (:class:`kmipgt.nn.NodeEncoder`), for every model kind.

    ``coord_columns`` and ``num_frequencies``: Fourier features of those columns of x (coordinates).
    ``pe_channels``: channels of the positional encodings, concatenated after the features' (0: summed).
    ``rwse_norm``: batch-normalise the raw RWSE before its projection. ``attention_qk`` (GPS):
    what the attention's queries and keys come from, ``hidden`` (the layer input), ``encoding`` (the
    positional encodings) or ``position`` (the coordinates' Fourier features). The encodings' sizes are
    data keys (``data.lappe_dim``, ``data.rwse_dim``); which features are category ids is the dataset's word.
    Baselines read ``coord_columns`` and ``num_frequencies``.
    """

    coord_columns: list[int] = field(default_factory=list)
    num_frequencies: int = 0
    pe_channels: int = 0
    rwse_norm: bool = False
    attention_qk: str = "hidden"


@dataclass
class AttentionConfig:
    """The global attention of GPS layers (:class:`kmipgt.nn.AttentionOptions`); ``model.attention: KIND``
    is short for ``model.attention.kind: KIND``.

    ``kind``: ``kmip``, ``full``, ``performer``, ``grf`` or ``none`` (the MPNN-only ablation). ``k``: keys per
    query of k-MIP (read by the kinds whose core takes a ``k``). ``heads``, ``head_dim`` (default
    ``channels // heads``), ``dropout`` (on the attention weights). ``gate``: the branch enters through a
    zero-initialised per-channel gate. ``drop_path``: stochastic depth of the branch, per node. ``order``:
    ``parallel`` (GraphGPS) or ``series`` (the attention, then the MPNN on its output). ``layers``: the
    indices of the layers that have attention (``null``: all; negative from the last). ``options``: more
    options of the kind's core (k-MIP's ``backend``, ``key_dropout``, ``qk_dim``; GRF's ``num_walks``, ...).
    """

    kind: str = "kmip"
    k: int = 16
    heads: int = 4
    head_dim: int | None = None
    dropout: float = 0.0
    gate: bool = False
    drop_path: float = 0.0
    order: str = "parallel"
    layers: list[int] | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def core_options(self) -> dict[str, Any]:
        """The options of the attention kind's core: ``options``, plus ``k`` where the core takes one
        (``kmip``), so that ``k`` can be a key of its own without reaching kinds that take none."""
        # Imported here: reading and checking a config imports no torch, so key errors come at once.
        from kmipgt.nn.attention_kinds import ATTENTION_KINDS, NO_ATTENTION

        core = None if self.kind == NO_ATTENTION else ATTENTION_KINDS.lookup(self.kind).core_class
        if core is not None and "k" in inspect.signature(core).parameters:
            return {"k": self.k, **self.options}
        return dict(self.options)

    def attn_kwargs(self) -> dict[str, Any]:
        """The model's ``attn_kwargs``: the branch's options, ``layers``, and the core's options."""
        branch = {key: getattr(self, key) for key in _BRANCH_KEYS}
        return {**branch, "layers": self.layers, **self.core_options()}


# The keys of AttentionConfig that are AttentionOptions' fields of the same name.
_BRANCH_KEYS = ("heads", "head_dim", "dropout", "gate", "drop_path", "order")


@dataclass
class ModelConfig:
    """Which model and its arguments (sizes inferred from the data are left out), in the sections of its
    parts: ``encoder`` (:class:`EncoderConfig`) and ``attention`` (:class:`AttentionConfig`, GPS only).

    ``kind``: ``gps`` (:class:`kmipgt.nn.GraphTransformer`) or a PyG baseline of
    :class:`kmipgt.nn.BaselineModel` (``mlp``, ``gcn``, ``sage``, ``gat``, ``sgformer``, ``polynormer``).
    Each key is named as the model argument it sets: ``channels``, ``num_layers``, ``dropout``, ``norm``,
    ``activation``, ``pooling`` and ``head_layers`` mean the same for every kind; ``local``,
    ``norm_position``, ``branch_residual``, ``local_residual``, ``ffn`` and ``checkpoint`` are the GPS
    layers' (:class:`~kmipgt.nn.GPSLayer`); ``residual`` and ``baseline_options`` (keyword arguments of the
    PyG model) are for baselines.
    """

    kind: str = "gps"
    channels: int = 64
    num_layers: int = 4
    local: str = "gatedgcn"
    dropout: float = 0.0
    norm: str = "layer"
    activation: str = "gelu"
    pooling: str = "mean"
    head_layers: int = 2
    norm_position: str = "post"
    branch_residual: bool = True
    local_residual: bool = True
    ffn: bool = True
    checkpoint: bool = False
    residual: bool = False
    baseline_options: dict[str, Any] = field(default_factory=dict)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)


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
    the dataset's ``pos`` or ``model.encoder.coord_columns``), ``contiguous`` (the stored order) or ``auto``
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


def _override(tree: dict, text: str, moved: list[str]) -> None:
    """Apply ``"model.attention.k=32"`` to a config tree (an old key at its new place, :func:`moved_key`)."""
    key, value = parse_override(text)
    *sections, leaf = moved_key(key, value, moved).split(".")
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
        moved: list[str] = []
        tree = upgrade_tree(tree, moved)
        log_moved_keys(moved, str(file))
    moved = []
    for text in overrides:
        _override(tree, text, moved)
    log_moved_keys(moved, "--set")
    return build_section(Config, tree)


def config_to_dict(config: Config) -> dict:
    """Plain nested dict, suitable for ``yaml.safe_dump``."""
    return dataclasses.asdict(config)


# Keys that do not change what a run computes (config_differences).
_NOT_COMPARED = frozenset({"allocator", "data.on_device"})
# Keys a config may leave to the data: a run saves what was read, which the same config reads again.
_READ_FROM_DATA = frozenset({"task.level", "task.loss", "task.metric"})


def _dotted(tree: dict) -> dict[str, Any]:
    """Every key of a :func:`config_to_dict` tree, defaults filled in, by dotted name (``model.attention.k``).

    Option mappings (``data.options``, ``model.attention.options``, ``model.baseline_options``) stay whole
    values: they are a loader's or a model's keyword arguments, not config keys. A tree written before the
    model's sections is read as its sections (:func:`upgrade_tree`).
    """
    flat = _flat(build_section(Config, upgrade_tree(copy.deepcopy(tree))))
    flat["out_dir"] = Path(flat["out_dir"]).resolve()  # runs/x and ./runs/x/ are the same run
    return flat


def _flat(section: Any, prefix: str = "") -> dict[str, Any]:
    """The values of ``section`` and of its sections by dotted name."""
    flat = {}
    for key, value in vars(section).items():
        if dataclasses.is_dataclass(value):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def config_differences(saved: dict, current: dict) -> list[str]:
    """Dotted keys whose values differ between two :func:`config_to_dict` trees.

    ``out_dir`` is compared as a resolved path: ``runs/x`` and ``./runs/x/`` are the same run. Keys that
    ``saved`` lacks (it was written before they existed) count as their defaults, which reproduce what
    the run did then. ``allocator`` and ``data.on_device`` are not compared: they change memory and speed,
    not results, so a run may be resumed under another one (a run saved before ``allocator`` existed counts
    as ``retain``). A task key ``current`` leaves to the data (``null``) matches what ``saved`` read.
    """
    saved, current = _dotted(saved), _dotted(current)
    return sorted(
        key for key in saved
        if key not in _NOT_COMPARED and saved[key] != current[key]
        and not (key in _READ_FROM_DATA and current[key] is None)
    )
