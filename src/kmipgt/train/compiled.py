"""``optim.compile``: the model through ``torch.compile`` once per run, every batch shape on its graphs."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx.experimental._config as fx_config
from torch._dynamo.utils import counters

from kmipgt.nn.attention import ProjectedAttention

__all__ = ["CompiledModel"]


def _traceable(model: torch.nn.Module) -> bool:
    """Whether every attention kind of ``model`` compiles whole (``AttentionKind.compiles``)."""
    return all(m.kind.compiles for m in model.modules() if isinstance(m, ProjectedAttention))


class CompiledModel(torch.nn.Module):
    """``model`` compiled with dynamic shapes and no graph break (``fullgraph=True``): the numbers of nodes,
    edges and graphs of a batch are symbolic, so a run's batches of every shape reuse one graph per mode
    (training, evaluation). The model's own parameters are trained and saved; this module only calls it.
    A kind that does not compile (GRF: ``AttentionKind.compiles``) runs eagerly between compiled graphs.

    Sizes that happen to be equal in the first batch (the graph count plus one and a feature width, say)
    would be traced as one symbol and compiled again once they differ: TorchDynamo's duck shaping is off
    while the model is called.

    Args:
        model: a kmipgt model (its forward takes ``ptr``, as every kmipgt model's does).
        backend: the ``torch.compile`` backend (default: inductor).
    """

    def __init__(self, model: torch.nn.Module, backend: str = "inductor"):
        super().__init__()
        self.compiled = torch.compile(model, dynamic=True, fullgraph=_traceable(model), backend=backend)
        self._graphs_before = counters["stats"]["unique_graphs"]

    @property
    def graphs(self) -> int:
        """The graphs TorchDynamo has compiled since this module was built (those of this model, in a run)."""
        return counters["stats"]["unique_graphs"] - self._graphs_before

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with fx_config.patch(use_duck_shape=False):
            return self.compiled(*args, **kwargs)
