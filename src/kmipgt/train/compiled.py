"""``optim.compile``: the model through ``torch.compile`` once per run, every batch shape on its graphs."""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.fx.experimental._config as fx_config
from torch._dynamo.utils import counters

from kmipgt.nn.attention import ProjectedAttention

_BATCH_NORM_OPS = ("_native_batch_norm_legit_functional", "native_batch_norm_backward",
                   "_native_batch_norm_legit", "_native_batch_norm_legit_no_training")


@functools.cache
def _aten_batch_norm() -> None:
    """Keep aten's BatchNorm kernels in inductor's graphs instead of its generated ones.

    On the CPU inductor computes a BatchNorm's batch statistics over ``[N, C]`` rows column block by column
    block: about 40 ms per call on a Peptides-func batch where aten's kernel takes 3, enough to make the
    compiled GatedGCN step slower than the eager one (docs/benchmarks.md, "Compiled training step"). With
    aten's kernels it is faster. Inductor's own tables are private: this is the one place that edits them.
    """
    from torch._inductor import decomposition, lowering

    for name in _BATCH_NORM_OPS:
        op = getattr(torch.ops.aten, name).default
        decomposition.decompositions.pop(op, None)
        lowering.make_fallback(op, override_decomp=True)

__all__ = ["CompiledModel"]


def _traceable(model: torch.nn.Module) -> bool:
    """Whether every attention kind of ``model`` compiles whole (``AttentionKind.compiles``)."""
    return all(m.kind.compiles for m in model.modules() if isinstance(m, ProjectedAttention))


def _check_cuda_graphs(model: torch.nn.Module, backend: str, dynamic: bool) -> None:
    """ValueError unless ``model`` can be captured in CUDA graphs as :class:`CompiledModel` does it."""
    devices = sorted({p.device.type for p in model.parameters()})
    if devices != ["cuda"]:
        raise ValueError(f"CUDA graphs (optim.cuda_graphs) need the model on a CUDA device, got {devices}")
    if backend != "inductor":
        raise ValueError(f"CUDA graphs (optim.cuda_graphs) are captured by inductor, got backend {backend!r}")
    if dynamic:
        raise ValueError("CUDA graphs (optim.cuda_graphs) need static shapes (data.pad_to): a graph is "
                         "captured for every batch shape")


class CompiledModel(torch.nn.Module):
    """``model`` compiled with dynamic shapes and no graph break (``fullgraph=True``): the numbers of nodes,
    edges and graphs of a batch are symbolic, so a run's batches of every shape reuse one graph per mode
    (training, evaluation). The model's own parameters are trained and saved; this module only calls it.
    A kind that does not compile (GRF: ``AttentionKind.compiles``) runs eagerly between compiled graphs.

    On the CPU the model's BatchNorms and dropout run aten's kernels inside the compiled graphs (inductor's
    are slower there). Sizes that happen to be equal in the first batch (the graph count plus one and a
    feature width, say) would be traced as one symbol and compiled again once they differ: TorchDynamo's
    duck shaping is off while the model is called.

    With ``dynamic=False`` (``data.pad_to``: every batch packed to one size, or to one of ``auto``'s two)
    the graphs are compiled for each shape instead, with no symbolic size (another shape compiles again,
    and TorchDynamo's automatic dynamic shapes stay off).

    With ``cuda_graphs`` (``optim.cuda_graphs``, on a CUDA model with static shapes) the graphs are compiled
    as ``mode="reduce-overhead"`` compiles them, with inductor's graph partition on: inductor captures them
    in CUDA graphs and replays them, one launch for the kernels that a step would otherwise launch one by
    one. The kmipgt attention operators route every call on the host from the batch's offsets, so they are
    kept out of the captured parts and run eagerly between them (:data:`kmipgt.ops.library.HOST_ROUTED`).
    A replay writes its outputs into memory that the next replay reuses: each call here starts a new step
    of the captured graphs and returns a copy of the output, which stays valid.

    Args:
        model: a kmipgt model (its forward takes ``ptr``, as every kmipgt model's does).
        backend: the ``torch.compile`` backend (default: inductor).
        dynamic: symbolic batch sizes (default), or the static shapes of padded batches.
        cuda_graphs: capture the compiled graphs in CUDA graphs (inductor, a CUDA model, ``dynamic=False``).
    """

    def __init__(
        self, model: torch.nn.Module, backend: str = "inductor", dynamic: bool = True,
        cuda_graphs: bool = False,
    ):
        super().__init__()
        options = None
        if cuda_graphs:
            _check_cuda_graphs(model, backend, dynamic)
            # mode="reduce-overhead"'s option, with the partition that splits the graphs around the attention
            # operators and the CPU offsets on: not every torch turns it on by default.
            options = {"triton.cudagraphs": True, "graph_partition": True}
        elif backend == "inductor" and all(p.device.type == "cpu" for p in model.parameters()):
            _aten_batch_norm()
            # Inductor's own CPU random numbers take 3 times aten's: dropout runs aten's in the graph.
            options = {"fallback_random": True}
        self.cuda_graphs = cuda_graphs
        self.compiled = torch.compile(model, dynamic=dynamic, fullgraph=_traceable(model), backend=backend,
                                      options=options)
        self._graphs_before = counters["stats"]["unique_graphs"]

    @property
    def graphs(self) -> int:
        """The graphs TorchDynamo has compiled since this module was built (those of this model, in a run)."""
        return counters["stats"]["unique_graphs"] - self._graphs_before

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with fx_config.patch(use_duck_shape=False):
            out = self.compiled(*args, **kwargs)
        return out.clone() if self.cuda_graphs else out
