"""How well k-MIP attention approximates full softmax attention, on a trained model's own tokens.

The approximation study of the k-MIP paper (App. B.1), redone with the selection the model really uses
(the k *largest* inner products; the reference sorted ascending, ``docs/experiments.md``):

- per k-MIP layer and head, for k on a grid up to N: the relative error of the attention output against
  full attention, the full-softmax mass the k selected keys carry, and the overlap of the selected set
  with the keys holding the k largest full-attention weights;
- end to end: the model's validation/test metric with every k-MIP layer run at another inference k, and
  with full attention (same weights) in place of k-MIP.

Full attention is computed one block of queries at a time, so memory stays ``O(H·B·N)`` for a block of
B queries, never ``N×N``.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from torch import Tensor
from torch_geometric.data import Data
from tqdm import tqdm

from kmipgt.analysis.tokens import LayerTokens, collect_tokens, kmip_layers
from kmipgt.analysis.tokens import save_tokens as save_token_file
from kmipgt.atomic import save_figure
from kmipgt.bench import common
from kmipgt.logs import quiet
from kmipgt.machine import machine_info
from kmipgt.nn import FullAttention
from kmipgt.ops import topk_inner_product

__all__ = [
    "approximation_curves",
    "full_attention_swap",
    "inference_k",
    "k_grid",
    "run_approx_benchmark",
]

# Score elements [H, B, N] of one query block: bounds the dense full-attention working set.
_BLOCK_ELEMENTS = 1 << 22
# Largest N·H·k selection of the library search kept at once (int64 index + score: ~1 GiB); beyond it
# the exact top-k is taken from the dense block scores instead and the overlap is not checked.
_SELECTION_ELEMENTS = 1 << 26


def k_grid(num_nodes: int, ks: list[int] | None = None) -> list[int]:
    """``ks`` sorted, each checked to lie in ``1..num_nodes``; default ``1, 2, 4, …`` and ``num_nodes``."""
    if num_nodes < 1:
        raise ValueError(f"the graph has no nodes (N = {num_nodes})")
    if ks is None:
        powers = [2**i for i in range(num_nodes.bit_length()) if 2**i < num_nodes]
        return [*powers, num_nodes]
    if not ks:
        raise ValueError("the k grid is empty")
    bad = [k for k in ks if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= num_nodes]
    if bad:
        raise ValueError(f"k values must be integers in 1..N = 1..{num_nodes}, got {bad[0]!r}")
    return sorted(set(ks))


def _block_rows(heads: int, num_nodes: int) -> int:
    return max(1, _BLOCK_ELEMENTS // (heads * num_nodes))


def approximation_curves(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    ks: list[int],
    *,
    backend: str = "auto",
    scale: float | None = None,
) -> dict[str, Tensor]:
    r"""k-MIP against full softmax attention on one graph's tokens, for every k of ``ks``.

    With :math:`A` the full softmax weights and :math:`A_k` k-MIP's (softmax over the k keys of largest
    :math:`q_i \cdot k_j`, found by :func:`~kmipgt.ops.topk_inner_product` with ``backend``), per head:

    - ``error``: :math:`\lVert A_k V - A V \rVert_F / \lVert A V \rVert_F` over all queries;
    - ``mass``: mean over queries of :math:`\sum_{j \in T_k(i)} A_{ij}`, the full-softmax weight k-MIP keeps;
    - ``overlap``: mean over queries of :math:`|T_k(i) \cap F_k(i)| / k`, with :math:`F_k(i)` the keys
      whose full-attention weight is at least the k-th largest (computed from the dense scores); NaN
      where the selection was too large to keep (``N·H·k`` above ~6.7e7: then :math:`T_k` is taken from
      the dense scores, all keys tied with the k-th counted in).

    Args:
        query: ``[N, H, d]``. key: ``[N, H, d]``. value: ``[N, H, d_v]``. One graph.
        ks: keys per query, each in ``1..N`` (ValueError otherwise).
        backend: the search backend of the k-MIP layer (approximate ones give overlap below 1).
        scale: logit scale, default ``1/sqrt(d)`` (what the layers use).

    Returns:
        ``{"error", "mass", "overlap"}``, each ``[len(ks), H]`` float64 on the CPU (the dense pass runs
        on the tokens' device), rows by increasing k.
    """
    num_nodes, heads, dim = query.shape
    ks = k_grid(num_nodes, ks)
    scale = dim**-0.5 if scale is None else float(scale)
    accumulate = torch.promote_types(query.dtype, torch.float32)
    q, k_all, v = (t.transpose(0, 1).to(accumulate) for t in (query, key, value))
    shape = (len(ks), heads)
    out = {name: torch.zeros(shape, dtype=torch.float64) for name in ("error", "mass", "overlap")}
    step = _block_rows(heads, num_nodes)
    for row, k in enumerate(ks):
        index = None
        if num_nodes * heads * k <= _SELECTION_ELEMENTS:
            index = topk_inner_product(query, key, k, backend=backend)[1].transpose(0, 1)  # [H, N, k]
        error_sq = torch.zeros(heads, dtype=torch.float64)
        norm_sq = torch.zeros(heads, dtype=torch.float64)
        for r0 in range(0, num_nodes, step):
            rows = slice(r0, r0 + step)
            block = _block_curves(q[:, rows], k_all, v, k, scale, None if index is None else index[:, rows])
            error_sq += block["error_sq"]
            norm_sq += block["norm_sq"]
            out["mass"][row] += block["mass"]
            out["overlap"][row] += block["overlap"]
        out["error"][row] = (error_sq / norm_sq.clamp(min=1e-300)).sqrt()
        if index is None:
            out["overlap"][row] = float("nan")
    out["mass"] /= num_nodes
    out["overlap"] /= num_nodes
    return out


def _block_curves(
    q: Tensor, keys: Tensor, values: Tensor, k: int, scale: float, index: Tensor | None
) -> dict[str, Tensor]:
    """Sums over a block of queries ``q [H, B, d]`` (keys ``[H, N, d]``, index ``[H, B, k]`` or None)."""
    logits = torch.matmul(q, keys.transpose(1, 2)) * scale  # [H, B, N]
    weights = torch.softmax(logits, dim=-1)
    full = torch.matmul(weights, values)
    # The k-th largest logit: softmax is monotone, so these are also the k largest full weights.
    kth = logits.topk(k, dim=-1).values[..., -1:]
    largest = logits >= kth
    selected = largest if index is None else _index_mask(index, logits.shape[-1])
    approx = torch.matmul(torch.softmax(logits.masked_fill(~selected, float("-inf")), dim=-1), values)
    sums = {
        "error_sq": (approx - full).double().square().sum((1, 2)),
        "norm_sq": full.double().square().sum((1, 2)),
        "mass": (weights * selected).double().sum(-1).sum(-1),
        "overlap": (selected & largest).double().sum(-1).sum(-1) / k,
    }
    return {name: value.cpu() for name, value in sums.items()}


def _index_mask(index: Tensor, num_keys: int) -> Tensor:
    """``[..., num_keys]`` bool, true at the keys of ``index [..., k]``; ``-1`` (not found) marks none."""
    # Misses go to an extra last column that is dropped, so they never overwrite a real key's mark.
    slots = torch.where(index < 0, num_keys, index)
    mask = torch.zeros(*index.shape[:-1], num_keys + 1, dtype=torch.bool, device=index.device)
    return mask.scatter_(-1, slots, True)[..., :num_keys]


@contextlib.contextmanager
def inference_k(model: torch.nn.Module, k: int) -> Iterator[None]:
    """While active, every k-MIP layer of ``model`` attends to ``k`` keys per query (restored after)."""
    modules = kmip_layers(model)
    trained = {number: module.k for number, module in modules.items()}
    for module in modules.values():
        module.k = k
    try:
        yield
    finally:
        for number, module in modules.items():
            module.k = trained[number]


@contextlib.contextmanager
def full_attention_swap(model: torch.nn.Module) -> Iterator[None]:
    """While active, each k-MIP layer is replaced by full attention with the same projection weights."""
    modules = kmip_layers(model)
    for number, module in modules.items():
        full = FullAttention(
            module.channels, module.heads, module.head_dim, module.dropout, module.qk_channels
        )
        full.load_state_dict(module.state_dict())
        full.train(module.training)
        model.layers[number].attention = full.to(next(module.parameters()).device)
    try:
        yield
    finally:
        for number, module in modules.items():
            model.layers[number].attention = module


def _token_records(
    tokens: list[LayerTokens], ks: list[int], device: torch.device, progress: bool
) -> list[dict[str, Any]]:
    records = []
    for entry in tqdm(tokens, desc="bench approx: layers", disable=not progress or quiet(), file=sys.stderr):
        query, key, value = (t.to(device) for t in (entry.query, entry.key, entry.value))
        curves = approximation_curves(query, key, value, ks, backend=entry.backend)
        for head in range(entry.query.shape[1]):
            for row, k in enumerate(ks):
                overlap = float(curves["overlap"][row, head])
                records.append(
                    {
                        "layer": entry.layer,
                        "head": head,
                        "k": k,
                        "error": float(curves["error"][row, head]),
                        "mass": float(curves["mass"][row, head]),
                        "overlap": None if math.isnan(overlap) else overlap,
                    }
                )
    return records


def _metric_records(
    model: torch.nn.Module, evaluate: Callable[[], dict[str, float]], ks: list[int], progress: bool
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    rows = []
    for k in tqdm(ks, desc="bench approx: inference k", disable=not progress or quiet(), file=sys.stderr):
        with inference_k(model, k):
            rows.append({"k": k, **evaluate()})
    with full_attention_swap(model):
        full = evaluate()
    return rows, full


def run_approx_benchmark(
    model: torch.nn.Module,
    graph: Data,
    evaluate: Callable[[], dict[str, float]],
    out_dir: Path,
    *,
    ks: list[int] | None = None,
    metric: str = "metric",
    meta: dict[str, Any] | None = None,
    save_tokens: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """Token-level curves on ``graph`` and the end-to-end metric vs inference k; writes JSON and plots.

    Args:
        model: a trained :class:`~kmipgt.nn.GraphTransformer` with at least one k-MIP layer.
        graph: the graph whose tokens are studied (N = its node count bounds the k grid).
        evaluate: the run's metric on its splits with the model as it stands (e.g. ``{"val", "test"}``).
        out_dir: receives ``approx.json``, ``approx.png`` (error, mass and overlap vs k, one line per
            layer) and ``approx_metric.png`` (metric vs inference k, full attention as a line).
        ks: the k grid (default ``1, 2, 4, …, N``). metric: the metric's name for the plot.
        meta: extra fields for the JSON (run, dataset, split).
        save_tokens: also write every k-MIP layer's tokens to ``out_dir/tokens.pt``
            (:func:`~kmipgt.analysis.tokens.save_tokens`; ``N·H·(2d + d_v)`` floats per layer).
    """
    modules = kmip_layers(model)
    ks = k_grid(graph.num_nodes, ks)
    tokens = collect_tokens(model, graph)
    # The dense pass costs O(N²) per k, layer and head: it runs where the model does (a GPU if it has one).
    device = next(model.parameters()).device
    records = _token_records(tokens, ks, device, progress)
    metric_rows, full = _metric_records(model, evaluate, ks, progress)
    first = next(iter(modules.values()))
    result = {
        **(meta or {}),
        "num_nodes": graph.num_nodes,
        "heads": first.heads,
        "trained_k": first.k,
        "backend": first.backend,
        "ks": ks,
        "machine": machine_info(str(device)),
        "records": records,
        "layers": layer_summary(records),
        "metric": {"name": metric, "inference_k": metric_rows, "full_attention": full},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    if save_tokens:
        save_token_file(out_dir / "tokens.pt", tokens, **(meta or {}))
    common.write_json(result, out_dir / "approx.json")
    plot_curves(result, out_dir / "approx.png")
    plot_metric(result, out_dir / "approx_metric.png")
    return result


def layer_summary(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per layer and k: error, mass and overlap averaged over heads (overlap None where unchecked)."""
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault((record["layer"], record["k"]), []).append(record)
    rows = []
    for (layer, k), group in sorted(groups.items()):
        row = {"layer": layer, "k": k}
        for name in ("error", "mass", "overlap"):
            values = [r[name] for r in group]
            row[name] = None if None in values else sum(values) / len(values)
        rows.append(row)
    return rows


def _plot_against_k(axis, rows: list[dict[str, Any]], name: str, colour: int, label: str) -> None:
    """One line of ``row[name]`` against ``row["k"]`` over ``rows``, in the ``colour``-th colour."""
    axis.plot(
        [r["k"] for r in rows],
        [r[name] for r in rows],
        marker="o",
        ms=3,
        color=f"C{colour % 10}",
        label=label,
    )


def plot_curves(result: dict[str, Any], path: Path) -> None:
    """Error, mass and overlap (mean over heads) against k, one line per layer, log x."""
    panels = [("error", "relative error ‖A_k V − A V‖ / ‖A V‖"), ("mass", "full-softmax mass kept")]
    panels.append(("overlap", "overlap with full attention's top-k"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2))
    layers = sorted({row["layer"] for row in result["layers"]})
    for axis, (name, label) in zip(axes, panels):
        for colour, layer in enumerate(layers):
            rows = [r for r in result["layers"] if r["layer"] == layer and r[name] is not None]
            _plot_against_k(axis, rows, name, colour, f"layer {layer}")
        axis.axvline(result["trained_k"], color="grey", ls=":", label=f"trained k = {result['trained_k']}")
        axis.set(xscale="log", xlabel="k (keys per query)", ylabel=label)
        axis.grid(True, which="both", alpha=0.3)
    # Uniform attention keeps k/N of the mass: the yardstick for how peaked the trained weights are.
    ks = result["ks"]
    uniform = [k / result["num_nodes"] for k in ks]
    axes[1].plot(ks, uniform, color="black", ls="--", lw=1, label="uniform, k/N")
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=8)
    fig.suptitle(f"k-MIP vs full attention on trained tokens (N = {result['num_nodes']:,})")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def plot_metric(result: dict[str, Any], path: Path) -> None:
    """Validation/test metric against the inference k of every k-MIP layer; full attention dashed."""
    metric = result["metric"]
    fig, axis = plt.subplots(figsize=(6, 4.2))
    rows = metric["inference_k"]
    for colour, split in enumerate(s for s in ("val", "test") if s in metric["full_attention"]):
        _plot_against_k(axis, rows, split, colour, split)
        axis.axhline(
            metric["full_attention"][split], color=f"C{colour}", ls="--", label=f"{split}, full attention"
        )
    axis.axvline(result["trained_k"], color="grey", ls=":", label=f"trained k = {result['trained_k']}")
    axis.set(xscale="log", xlabel="inference k (every k-MIP layer)", ylabel=metric["name"])
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)
