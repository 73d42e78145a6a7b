"""Where one full-batch training step's memory goes: state, autograd-saved bytes per component, RSS per phase.

Three views of the same step (forward, backward, optimiser step, then an evaluation forward):

- **state**: bytes of what lives for the whole run (the prepared graph's tensors, the GRF layers' walk
  caches, parameters, gradients, AdamW moments), counted from the tensors;
- **saved**: bytes autograd keeps from the forward for the backward, per model component (the innermost
  module that saved it, or the GPS layer's own ops: dropout masks, residual sums, the FFN activation),
  each storage counted once. With ``model.checkpoint`` the layers' saves happen inside the checkpoint and
  are recomputed one layer at a time in backward, so they do not show here; the layer inputs it keeps
  instead are reported as ``checkpointed layer inputs``;
- **rss**: the process's resident set sampled every 5 ms, its peak per phase. Run it with the config key
  ``allocator: live`` (``kmipgt bench memory --set allocator=live``) to see live memory: every buffer
  above 1 MiB is then mapped on allocation and unmapped on free, so freed memory leaves the resident set
  at once.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from kmipgt.nn import GRFCore
from kmipgt.train.config import Config
from kmipgt.train.loop import Trainer
from kmipgt.train.losses import compute_loss

__all__ = ["memory_breakdown"]

_MIB = 2**20
GLUE = "GPS layer ops (dropout, residuals, FFN activation)"


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def _rss_mib() -> float:
    # The current resident set (statm counts pages), not ru_maxrss: each phase needs its own peak.
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE_BYTES / _MIB


class _PeakSampler:
    """Peak resident set per named phase, from a thread sampling every 5 ms."""

    def __init__(self) -> None:
        self.peak, self.phases = _rss_mib(), {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_mib())
            time.sleep(0.005)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.peak = _rss_mib()
        yield
        time.sleep(0.02)
        end = _rss_mib()
        self.phases[name] = {"peak_mib": round(max(self.peak, end), 1), "end_mib": round(end, 1)}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _component(path: str) -> str:
    """Component of a module path inside :class:`~kmipgt.nn.GraphTransformer` (``layers.3.local.lin_a``)."""
    parts = path.split(".")
    if parts[0] != "layers":
        return {"node_encoder": "node encoder", "edge_encoder": "edge encoder", "head": "head"}.get(
            parts[0], "other"
        )
    inner = parts[2] if len(parts) > 2 else ""
    if inner == "local":
        return "local MPNN (GatedGCN)"
    if inner == "attention":
        return "attention (projections, search, gathers)"
    if inner.startswith("ffn_"):
        return "FFN linears"
    if inner.startswith("norm_"):
        return "norms"
    return GLUE


class _SavedBytes:
    """Bytes autograd saves for backward per component; each storage once, parameters left out."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.by_component: Counter[str] = Counter()
        self._seen = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self._stack = ["other"]
        for path, module in model.named_modules():
            if path:
                component = _component(path)
                module.register_forward_pre_hook(lambda *_, c=component: self._enter(c))
                module.register_forward_hook(lambda *_: self._leave())

    # Hooks that return something replace the module's input or output: these return None.
    def _enter(self, component: str) -> None:
        self._stack.append(component)

    def _leave(self) -> None:
        self._stack.pop()

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.layout != torch.strided:  # GRF's sparse masks: no storage of their own to share
            self.by_component[self._stack[-1]] += sum(part.nbytes for part in _sparse_parts(tensor))
            return tensor
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self._seen:
            self._seen.add(storage.data_ptr())
            self.by_component[self._stack[-1]] += storage.nbytes()
        return tensor


def _sparse_parts(tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
    if tensor.layout == torch.sparse_coo:
        return tensor._indices(), tensor._values()
    return tensor.crow_indices(), tensor.col_indices(), tensor.values()


def _state_bytes(trainer: Trainer) -> dict[str, int]:
    graph = trainer.data.graph
    params = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
    moments = sum(t.numel() * t.element_size() for s in trainer.optimizer.state.values()
                  for t in s.values() if torch.is_tensor(t))
    caches = {id(m.walk_cache): m.walk_cache for m in trainer.model.modules() if isinstance(m, GRFCore)}
    return {
        "graph tensors": sum(v.numel() * v.element_size() for _, v in graph if torch.is_tensor(v)),
        "GRF walk caches": sum(cache.nbytes() for cache in caches.values()),
        "parameters": params,
        "gradients": params,
        "optimizer moments": moments,
    }


def _checkpointed_inputs(trainer: Trainer) -> int:
    """Bytes of the ``(h, e)`` inputs each checkpointed layer keeps: ``[N, C]`` and ``[E, C]`` fp32."""
    graph, model = trainer.data.graph, trainer.model
    channels = model.layers[0].channels if len(model.layers) else 0
    edges = graph.edge_index.size(1) if model.edge_encoder is not None else 0
    return len(model.layers) * (graph.num_nodes + edges) * channels * 4


def memory_breakdown(config: Config) -> dict[str, Any]:
    """One training step and one evaluation of ``config``'s node-level run, measured three ways (module
    docstring). Returns ``{"nodes", "edges", "state_mib", "saved_mib", "rss_mib"}``."""
    if config.task.level != "node":
        raise ValueError("memory_breakdown measures full-batch node-level runs (task.level: node)")
    sampler = _PeakSampler()
    with sampler.phase("data and model"):
        trainer = Trainer(config)
    if trainer.data.graph is None:
        raise ValueError(f"memory_breakdown measures one full-batch graph; dataset {config.data.name!r} is a "
                         "set of graphs")
    model, saved = trainer.model, _SavedBytes(trainer.model)
    model.train()
    step = next(iter(trainer.task.train_steps(trainer.device)))
    with sampler.phase("training forward"), torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
        output, target = trainer.task.loss_inputs(trainer._predict(step.batch, trainer.network), step)
        loss = compute_loss(config.task.loss, output, target)
    with sampler.phase("backward"):
        trainer.optimizer.zero_grad()
        loss.backward()
    with sampler.phase("optimizer step"):
        trainer.optimizer.step()
    del output, loss
    with sampler.phase("evaluation forward"):
        trainer.evaluate(("val",))
    sampler.stop()
    saved_mib = {name: round(b / _MIB, 1) for name, b in saved.by_component.most_common()}
    if config.model.checkpoint:
        saved_mib["checkpointed layer inputs"] = round(_checkpointed_inputs(trainer) / _MIB, 1)
    return {
        "nodes": trainer.data.graph.num_nodes,
        "edges": trainer.data.graph.edge_index.size(1),
        "state_mib": {name: round(b / _MIB, 1) for name, b in _state_bytes(trainer).items()},
        "saved_mib": saved_mib,
        "rss_mib": sampler.phases,
    }
