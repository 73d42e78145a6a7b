"""``torch.compile(fullgraph=True, dynamic=True)`` of the attention modules and of whole models: one graph
for every batch shape, equal to eager.

The compiled forward traces every op of the model, so any host read of a value (a layout looked up, an
offset validated, a loop over edges) is a graph break and fails here. ``aot_eager`` traces forward and
backward through AOTAutograd, as inductor does, without generating code (kept for the one test that
checks inductor itself).
"""

from __future__ import annotations

import pytest
import torch
import torch.fx.experimental._config as fx_config
from torch._dynamo.utils import counters
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from kmipgt.nn import GraphTransformer, build_global_attention
from kmipgt.nn.local_kinds import LOCAL_KINDS, NO_LOCAL
from kmipgt.ops.ragged import batch_layout

# Three batches of graphs of other sizes and counts.
SHAPES = ([5, 9, 7], [12, 3], [4, 4, 8, 6, 2])
IN_CHANNELS, EDGE_CHANNELS, RWSE = 9, 3, 4


def _batch(sizes: list[int], generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A mini-batch as the loader gives it: features, edges within each graph, PyG batch and CPU ptr."""
    ptr = torch.tensor([0, *sizes]).cumsum(0)
    edges = [torch.randint(int(ptr[g]), int(ptr[g + 1]), (2, 2 * n), generator=generator)
             for g, n in enumerate(sizes)]
    edge_index = torch.cat(edges, 1)
    num_nodes = int(ptr[-1])
    return {
        "x": torch.randn(num_nodes, IN_CHANNELS, generator=generator),
        "edge_index": edge_index,
        "batch": torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes)),
        "edge_attr": torch.randn(edge_index.shape[1], EDGE_CHANNELS, generator=generator),
        "rwse": torch.rand(num_nodes, RWSE, generator=generator),
        "ptr": ptr,
    }


def _attention_options(attention: str) -> dict:
    return {"heads": 2, "k": 3} if attention == "kmip" else {"heads": 2}


def _model(local: str, attention: str, task: str = "graph") -> GraphTransformer:
    torch.manual_seed(0)
    return GraphTransformer(
        IN_CHANNELS, 16, 3, num_layers=2, task=task, edge_channels=EDGE_CHANNELS, local=local,
        attention=attention, encoder={"rwse_dim": RWSE}, attn_kwargs=_attention_options(attention),
    )


def compiled_runs(module, inputs: list[dict], backend: str = "aot_eager"):
    """``module`` compiled once and run on each of ``inputs``: (compiled, eager) outputs and gradients of
    the parameters per input, and the number of graphs compiled (TorchDynamo's count of distinct graphs:
    an analysis it restarts within one compilation makes no second graph)."""
    torch._dynamo.reset()
    graphs_before = counters["stats"]["unique_graphs"]
    compiled = torch.compile(module, fullgraph=True, dynamic=True, backend=backend)
    results = []
    with fx_config.patch(use_duck_shape=False):
        for kwargs in inputs:
            pair = []
            for run in (compiled, module):
                module.zero_grad()
                out = run(**kwargs)
                out.square().sum().backward()
                grads = [p.grad.clone() for p in module.parameters() if p.grad is not None]
                pair.append((out.detach(), grads))
            results.append(pair)
    return results, counters["stats"]["unique_graphs"] - graphs_before


def _assert_equal_to_eager(results) -> None:
    for (out, grads), (expected, expected_grads) in results:
        torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
        assert len(grads) == len(expected_grads)
        for grad, expected_grad in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(grad, expected_grad, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("local", [name for name in LOCAL_KINDS.names() if name != NO_LOCAL])
def test_every_local_kind_compiles_once_for_every_batch_shape(local):
    generator = torch.Generator().manual_seed(0)
    model = _model(local, "none")
    results, graphs = compiled_runs(model, [_batch(sizes, generator) for sizes in SHAPES])
    _assert_equal_to_eager(results)
    assert graphs == 1


@pytest.mark.parametrize("attention", ["kmip", "full", "performer"])
def test_every_attention_kind_compiles_once_for_every_batch_shape(attention):
    generator = torch.Generator().manual_seed(0)
    model = _model("gatedgcn", attention)
    results, graphs = compiled_runs(model, [_batch(sizes, generator) for sizes in SHAPES])
    _assert_equal_to_eager(results)
    assert graphs == 1


@pytest.mark.parametrize("attention", ["kmip", "full", "performer"])
def test_an_attention_module_compiles_once_for_every_batch_shape(attention):
    generator = torch.Generator().manual_seed(1)
    core = {"k": 3} if attention == "kmip" else {}
    module = build_global_attention(attention, 16, heads=2, attn_kwargs=core)
    inputs = []
    for sizes in SHAPES:
        batch = _batch(sizes, generator)
        x = torch.randn(batch["x"].shape[0], 16, generator=generator)
        inputs.append({"x": x, "batch": batch["batch"], "ptr": batch["ptr"]})
    results, graphs = compiled_runs(_WithPtr(module), inputs)
    _assert_equal_to_eager(results)
    assert graphs == 1


class _WithPtr(torch.nn.Module):
    """An attention module called as a model calls it: the layout built from ``ptr`` in the forward."""

    def __init__(self, attention: torch.nn.Module):
        super().__init__()
        self.attention = attention

    def forward(self, x, batch, ptr):
        layout = batch_layout(x.shape[0], x.device, ptr=ptr, batch=batch)
        return self.attention(x, batch=batch, layout=layout)


def test_a_compiled_model_needs_ptr_for_several_graphs():
    generator = torch.Generator().manual_seed(2)
    batch = _batch([4, 5], generator)
    batch.pop("ptr")
    compiled = torch.compile(_model("gine", "none"), fullgraph=True, dynamic=True, backend="eager")
    with pytest.raises(Exception, match="needs `ptr`"):
        compiled(**batch)


@pytest.mark.parametrize("task", ["node", "edge"])
def test_node_and_edge_models_compile_on_one_graph(task):
    generator = torch.Generator().manual_seed(3)
    model = _model("gine", "performer", task=task)
    inputs = []
    for sizes in ([11], [17], [8]):
        batch = _batch(sizes, generator)
        for key in ("batch", "ptr"):
            batch.pop(key)
        if task == "edge":
            batch["edge_label_index"] = torch.randint(0, sizes[0], (2, 6), generator=generator)
        inputs.append(batch)
    results, graphs = compiled_runs(model, inputs)
    _assert_equal_to_eager(results)
    assert graphs == 1


def test_grf_attention_runs_eagerly_between_compiled_graphs():
    """GRF samples and caches its walks on the host: inside a compiled model it runs eagerly, and the graphs
    around it (split at every GRF layer) serve every batch shape: a second pass compiles nothing."""
    generator = torch.Generator().manual_seed(4)
    model = _model("gine", "grf")
    inputs = [_batch(sizes, generator) for sizes in SHAPES]
    torch._dynamo.reset()
    graphs_before = counters["stats"]["unique_graphs"]
    compiled = torch.compile(model, dynamic=True, backend="aot_eager")
    with fx_config.patch(use_duck_shape=False):
        for kwargs in inputs:
            torch.testing.assert_close(compiled(**kwargs), model(**kwargs), atol=1e-5, rtol=1e-5)
        first_pass = counters["stats"]["unique_graphs"] - graphs_before
        for kwargs in inputs:
            compiled(**kwargs)
    assert counters["stats"]["unique_graphs"] - graphs_before == first_pass


def _unbacked_sizes(module, kwargs) -> list[str]:
    """The nodes of ``module``'s compiled graph whose output has a size read from data (an unbacked
    symbol): inductor cannot always generate code for those mixed with other sizes."""
    found = []

    def backend(graph_module, example_inputs):
        for node in graph_module.graph.nodes:
            value = node.meta.get("example_value", node.meta.get("val"))
            if isinstance(value, torch.Tensor) and free_unbacked_symbols(value):
                found.append(node.format_node())
        return graph_module.forward

    torch._dynamo.reset()
    with fx_config.patch(use_duck_shape=False):
        torch.compile(module, fullgraph=True, dynamic=True, backend=backend)(**kwargs)
    return found


@pytest.mark.parametrize("local", [name for name in LOCAL_KINDS.names() if name != NO_LOCAL])
def test_no_local_kind_has_a_size_read_from_data(local):
    batch = _batch(SHAPES[0], torch.Generator().manual_seed(4))
    assert _unbacked_sizes(_model(local, "kmip"), batch) == []


def test_the_reference_peptides_model_compiles_once_for_every_batch_shape():
    """``peptides_func_paper`` as shipped (embedded atoms and bonds, per-graph LayerNorm, GatedGCN without its
    node residual, no output projection, batch-normalised RWSE in channels of their own): one graph."""
    from kmipgt.data.lrgb import OGB_ATOM_DIMS, OGB_BOND_DIMS
    from kmipgt.train import load_config
    from kmipgt.train.datasets import PreparedData
    from kmipgt.train.models import build_model

    config = load_config("peptides_func_paper", ["model.num_layers=2", "model.attention.k=3"])
    data = PreparedData("graph", None, None, len(OGB_ATOM_DIMS), len(OGB_BOND_DIMS), 10, "lrgb",
                        OGB_ATOM_DIMS, OGB_BOND_DIMS)
    torch.manual_seed(0)
    model = build_model(config, data)
    generator = torch.Generator().manual_seed(5)
    inputs = []
    for sizes in SHAPES:
        batch = _batch(sizes, generator)
        nodes, edges = batch["x"].shape[0], batch["edge_index"].shape[1]
        ids = [torch.randint(0, n, (nodes,), generator=generator) for n in OGB_ATOM_DIMS]
        batch["x"] = torch.stack(ids, 1)
        ids = [torch.randint(0, n, (edges,), generator=generator) for n in OGB_BOND_DIMS]
        batch["edge_attr"] = torch.stack(ids, 1)
        batch["rwse"] = torch.rand(nodes, config.data.rwse_dim, generator=generator)
        inputs.append(batch)
    model.eval()  # batch norm by its running statistics, the same in both runs of each input
    results, graphs = compiled_runs(model, inputs)
    _assert_equal_to_eager(results)
    assert graphs == 1


@pytest.mark.parametrize(("local", "attention"), [("gatedgcn", "kmip"), ("gine", "full")])
def test_an_activation_checkpointed_model_compiles_once_for_every_batch_shape(local, attention):
    generator = torch.Generator().manual_seed(6)
    torch.manual_seed(0)
    model = GraphTransformer(
        IN_CHANNELS, 16, 3, num_layers=2, task="graph", edge_channels=EDGE_CHANNELS, local=local,
        attention=attention, checkpoint=True, encoder={"rwse_dim": RWSE},
        attn_kwargs=_attention_options(attention),
    )
    results, graphs = compiled_runs(model, [_batch(sizes, generator) for sizes in SHAPES])
    _assert_equal_to_eager(results)
    assert graphs == 1


def test_compiled_dropout_on_the_cpu_draws_the_eager_models_masks():
    """On the CPU, ``CompiledModel`` keeps aten's random numbers (inductor's own take 3 times as long): in
    training, with dropout, one seed gives the eager model's outputs and gradients."""
    from kmipgt.train.compiled import CompiledModel

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GraphTransformer(
        IN_CHANNELS, 16, 3, num_layers=1, task="graph", edge_channels=EDGE_CHANNELS, local="gatedgcn",
        attention="none", dropout=0.5, encoder={"rwse_dim": RWSE},
    )
    batch = _batch(SHAPES[0], torch.Generator().manual_seed(7))
    results = []
    for run in (CompiledModel(model), model):
        model.zero_grad()
        torch.manual_seed(3)
        out = run(**batch)
        out.square().sum().backward()
        results.append((out.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    _assert_equal_to_eager([results])
