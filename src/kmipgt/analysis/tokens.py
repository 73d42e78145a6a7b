"""The query, key and value tokens every k-MIP layer of a trained model sees, captured by hooks.

A forward pre-hook on each :class:`~kmipgt.nn.KMIPAttention` hands the module's own input to its
:meth:`~kmipgt.nn.KMIPAttention.query_key_value`, so the tokens are exactly those the forward attends
with (no copy of the model's forward that could drift from it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from torch_geometric.data import Data

from kmipgt.analysis.explain import run_forward
from kmipgt.atomic import save_tensors
from kmipgt.nn import GraphTransformer, KMIPAttention
from kmipgt.safe_load import torch_load_safely

__all__ = ["LayerTokens", "collect_tokens", "kmip_layers", "load_tokens", "save_tokens"]


@dataclass
class LayerTokens:
    """One k-MIP layer's tokens on one graph: ``query``/``key`` ``[N, H, d]``, ``value`` ``[N, H, d_v]``.

    ``k`` and ``backend`` are the layer's own (what its forward searched with).
    """

    layer: int
    query: Tensor
    key: Tensor
    value: Tensor
    k: int
    backend: str


def kmip_layers(model: torch.nn.Module) -> dict[int, KMIPAttention]:
    """``{layer index: k-MIP attention module}``; ValueError when the model has no k-MIP layer."""
    layers = getattr(model, "layers", [])
    found = {
        number: layer.attention
        for number, layer in enumerate(layers)
        if isinstance(getattr(layer, "attention", None), KMIPAttention)
    }
    if not found:
        kinds = sorted({str(getattr(layer, "attention_kind", "none")) for layer in layers})
        raise ValueError(
            f"the model has no k-MIP attention layer (attention kinds: {', '.join(kinds) or 'none'})"
        )
    return found


@torch.no_grad()
def collect_tokens(model: GraphTransformer, graph: Data) -> list[LayerTokens]:
    """The tokens of every k-MIP layer in one eval-mode forward of ``model`` over ``graph`` (on the CPU)."""
    modules = kmip_layers(model)
    captured: list[LayerTokens] = []
    handles = []
    for number, module in modules.items():

        def capture(module, args, kwargs, number=number):
            tokens = module.query_key_value(args[0], kwargs.get("qk_x"))
            query, key, value = (t.detach().cpu() for t in tokens)
            captured.append(LayerTokens(number, query, key, value, module.k, module.backend))

        handles.append(module.register_forward_pre_hook(capture, with_kwargs=True))
    try:
        run_forward(model, graph)
    finally:
        for handle in handles:
            handle.remove()
    return captured


def save_tokens(path: str | Path, tokens: list[LayerTokens], **meta) -> None:
    """``torch.save`` of ``{"layers": [{"layer", "query", "key", "value", "k", "backend"}, ...], **meta}``."""
    layers = [vars(entry) for entry in tokens]
    save_tensors({**meta, "layers": layers}, path)


def load_tokens(path: str | Path) -> list[LayerTokens]:
    """The tokens :func:`save_tokens` wrote (tensors only: no pickled code is loaded)."""
    content = torch_load_safely(path, path)
    return [LayerTokens(**entry) for entry in content["layers"]]
