"""The query and key tokens of a trained model's first attention layer, saved for ``kmipgt bench search``."""

from __future__ import annotations

from pathlib import Path

import torch

from kmipgt.atomic import save_tensors
from kmipgt.nn import GraphTransformer
from kmipgt.train.batches import forward
from kmipgt.train.loop import Trainer

__all__ = ["save_first_layer_tokens"]


@torch.no_grad()
def save_first_layer_tokens(trainer: Trainer, path: str | Path | None = None) -> Path:
    """Dump the first attention layer's query/key tokens on the full graph (eval mode) to ``path`` (default:
    ``tokens.pt`` in the trainer's run directory); its folder must exist.

    Format: ``{"query": [N, H, d], "key": [N, H, d], "dataset": name, "layer": 0}`` — the input of
    ``kmipgt bench search``. For graph-level data the graph is the first test graph, for edge-level data
    the test split's message-passing graph.
    """
    if not isinstance(trainer.model, GraphTransformer) or not trainer.model.layers:
        raise ValueError("save_tokens needs a GPS model (model.kind=gps) with at least one layer")
    if trainer.model.layers[0].attention is None:
        raise ValueError("save_tokens needs a model whose first layer has global attention")
    attention = trainer.model.layers[0].attention
    if not hasattr(attention, "query_key_value"):
        raise ValueError(f"{type(attention).__name__} does not expose query/key tokens")
    graph = trainer.task.token_graph()
    captured = {}

    def capture(module, args, kwargs):
        # Position-keyed attention projects its queries and keys from qk_x, not from the layer input.
        query, key, _ = module.query_key_value(args[0], kwargs.get("qk_x"))
        captured["query"], captured["key"] = query, key

    trainer.model.eval()
    handle = attention.register_forward_pre_hook(capture, with_kwargs=True)
    try:
        forward(trainer.model, graph.to(trainer.device))
    finally:
        handle.remove()
    path = Path(path) if path is not None else trainer.run_dir / "tokens.pt"
    tokens = {
        "query": captured["query"].cpu(),
        "key": captured["key"].cpu(),
        "dataset": trainer.data.name,
        "layer": 0,
    }
    save_tensors(tokens, path)
    return path
