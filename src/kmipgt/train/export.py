"""``kmipgt export``: a trained model as a ``torch.export`` program whose node, edge and graph counts are
dynamic, saved as a ``.pt2`` file that ``torch.export.load`` runs with kmipgt installed."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.fx.experimental._config as fx_config
from torch import Tensor
from torch.export import Dim, ExportedProgram

from kmipgt.atomic import atomic_write
from kmipgt.train.batches import batch_to_device, model_inputs
from kmipgt.train.run import load_run
from kmipgt.train.tasks.node import NodeTask

__all__ = ["dynamic_shapes", "export_model", "export_run"]

# The first dimension of each input that grows with the graph, by what it counts.
_NODE_ROWS = ("x", "batch", "lappe", "rwse")
_EDGE_ROWS = ("edge_attr",)


def dynamic_shapes(inputs: dict[str, Tensor]) -> dict[str, dict[int, Dim]]:
    """The dynamic dimensions of a model's keyword ``inputs``: nodes, edges, graphs (``ptr``) and scored
    pairs (``edge_label_index``) each of any size."""
    nodes, edges = Dim("nodes", min=1), Dim("edges", min=0)
    shapes = {name: {0: nodes} for name in _NODE_ROWS if name in inputs}
    shapes.update({name: {0: edges} for name in _EDGE_ROWS if name in inputs})
    if "edge_index" in inputs:
        shapes["edge_index"] = {1: edges}
    if "ptr" in inputs:
        shapes["ptr"] = {0: Dim("graphs_plus_one", min=2)}
    if "edge_label_index" in inputs:
        shapes["edge_label_index"] = {1: Dim("pairs", min=1)}
    return shapes


def export_model(model: torch.nn.Module, inputs: dict[str, Tensor]) -> ExportedProgram:
    """``model`` in evaluation mode exported on the keyword ``inputs`` of one graph or mini-batch (those
    :func:`~kmipgt.train.batches.model_inputs` gives; a mini-batch with its CPU ``ptr``), every count of
    nodes, edges, graphs and pairs dynamic.

    The k-MIP, full-attention and aggregation operators are ``torch.ops.kmipgt`` operators: loading the
    program needs kmipgt imported. Shapes are reasoned about size-obliviously: a traced size of 2 or more
    still admits 1 (one graph in a batch, one edge), which export would otherwise specialise away.
    """
    model.eval()
    with fx_config.patch(backed_size_oblivious=True):
        return torch.export.export(model, (), inputs, dynamic_shapes=dynamic_shapes(inputs))


def export_run(
    run_dir: str | Path, out: str | Path | None = None, checkpoint: str = "best",
    overrides: list[str] | tuple[str, ...] = (), trust_checkpoint: bool = False,
) -> Path:
    """Export the model of a run (its ``best.pt`` or ``last.pt``, loaded as :func:`~kmipgt.train.load_run`
    loads it) traced on its graph (node level) or the first batch of its validation split, and save it to
    ``out`` (default ``RUN_DIR/model.pt2``). Returns the path written."""
    trainer = load_run(run_dir, checkpoint, overrides, trust_checkpoint=trust_checkpoint)
    task = trainer.task
    example = task.token_graph() if isinstance(task, NodeTask) else next(iter(task.eval_batches("val")))
    inputs = model_inputs(batch_to_device(example, trainer.device))
    program = export_model(trainer.model, {name: t for name, t in inputs.items() if t is not None})
    path = Path(run_dir) / "model.pt2" if out is None else Path(out)
    atomic_write(path, lambda file: torch.export.save(program, file))
    return path
