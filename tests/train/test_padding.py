"""``data.pad_to``: batches packed to a fixed node, edge and graph budget give the unpadded batch's loss,
gradients, BatchNorm statistics and metrics, and a compiled model sees one shape for every batch."""

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Batch, Data

from kmipgt.data.lrgb import OGB_ATOM_DIMS, OGB_BOND_DIMS
from kmipgt.nn import GraphTransformer
from kmipgt.train import Trainer, load_config
from kmipgt.train.batches import model_inputs
from kmipgt.train.datasets import PreparedData
from kmipgt.train.metrics import compute_metric
from kmipgt.train.pad_budget import PadBudget
from kmipgt.train.padding import REAL_GRAPHS, pad_batch, pad_to_fit, required_budget
from kmipgt.train.resident import HOST_PTR, ResidentGraphs
from kmipgt.train.tasks.levels import make_task
from kmipgt.train.validation import validate_config

RWSE, LABELS = 6, 5
BUDGET = PadBudget(nodes=160, edges=400, graphs=8)


def _molecules(count: int, seed: int = 0) -> list[Data]:
    """Molecule-shaped graphs: 4 to 24 atoms on a chain with a ring closure, bonds both ways, OGB-style atom
    and bond category ids, RWSE-like encodings and multi-label targets."""
    gen = torch.Generator().manual_seed(seed)
    graphs = []
    for _ in range(count):
        n = int(torch.randint(4, 25, (1,), generator=gen))
        src = torch.arange(n - 1)
        pairs = torch.stack([src, src + 1], 0)
        pairs = torch.cat([pairs, torch.tensor([[0], [n - 1]])], 1)  # a ring
        edge_index = torch.cat([pairs, pairs.flip(0)], 1)
        x = torch.stack([torch.randint(0, size, (n,), generator=gen) for size in OGB_ATOM_DIMS], 1)
        edge_attr = torch.stack(
            [torch.randint(0, size, (edge_index.shape[1],), generator=gen) for size in OGB_BOND_DIMS], 1
        )
        graphs.append(Data(x=x, edge_index=edge_index, edge_attr=edge_attr,
                           rwse=torch.rand(n, RWSE, generator=gen, dtype=torch.float64),
                           y=torch.randint(0, 2, (1, LABELS), generator=gen).double()))
    return graphs


def _model(norm: str) -> GraphTransformer:
    """A Peptides-shaped GatedGCN + k-MIP GPS model (embedded atoms and bonds, batch-normalised RWSE) in
    float64, so that padded and unpadded batches agree to float64 rounding."""
    torch.manual_seed(0)
    model = GraphTransformer(
        len(OGB_ATOM_DIMS), 16, LABELS, num_layers=2, task="graph", edge_channels=len(OGB_BOND_DIMS),
        local="gatedgcn", attention="kmip", norm=norm, edge_categories=OGB_BOND_DIMS, head_layers=2,
        encoder={"rwse_dim": RWSE, "rwse_norm": True, "categories": OGB_ATOM_DIMS},
        attn_kwargs={"heads": 2, "k": 5},
    )
    return model.double()


def _inputs(batch: Batch) -> dict:
    out = {key: batch[key] for key in ("x", "edge_index", "batch", "edge_attr", "rwse")}
    out["ptr"] = batch.ptr
    for key in ("node_mask", "edge_mask"):
        if key in batch:
            out[key] = batch[key]
    return out


def _step(model: GraphTransformer, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Loss, outputs of the real graphs and parameter gradients of one training forward and backward."""
    model.zero_grad()
    out = model(**_inputs(batch))[: getattr(batch, REAL_GRAPHS, batch.num_graphs)]
    loss = F.binary_cross_entropy_with_logits(out, batch.y)
    loss.backward()
    # (The last layer's edge update reaches no output: its parameters get no gradient on either side.)
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    return loss.detach(), out.detach(), grads


def _assert_close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_a_padded_batch_keeps_its_graphs_and_marks_its_padding():
    graphs = _molecules(5)
    batch = Batch.from_data_list(graphs)
    padded = pad_batch(batch, BUDGET)
    n, e, g = batch.num_nodes, batch.edge_index.shape[1], batch.num_graphs
    assert padded.x.shape[0] == padded.rwse.shape[0] == padded.batch.shape[0] == BUDGET.nodes
    assert padded.edge_index.shape[1] == padded.edge_attr.shape[0] == BUDGET.edges
    assert padded.ptr.tolist()[: g + 1] == batch.ptr.tolist() and padded.ptr.numel() == BUDGET.graphs + 1
    assert getattr(padded, REAL_GRAPHS) == g and torch.equal(padded.y, batch.y)
    assert padded.node_mask.sum() == n and padded.node_mask[:n].all()
    assert padded.edge_mask.sum() == e and padded.edge_mask[:e].all()
    assert torch.equal(padded.x[:n], batch.x) and torch.equal(padded.edge_index[:, :e], batch.edge_index)
    # The padding edges join padding nodes only, and every padding node lies in a padding graph.
    assert (padded.edge_index[:, e:] >= n).all()
    assert (padded.batch[n:] >= g).all()
    assert torch.equal(padded.batch, torch.repeat_interleave(torch.arange(BUDGET.graphs), padded.ptr.diff()))
    sizes = padded.ptr.diff()[g:]
    assert int(sizes.max() - sizes.min()) <= 1  # spread evenly over the padding graphs


@pytest.mark.parametrize("norm", ["batch", "graph", "layer"])
def test_padding_changes_no_loss_gradient_or_norm_statistic(norm):
    graphs = _molecules(17, seed=1)
    model, padded_model = _model(norm), _model(norm)
    for start in (0, 7, 14):  # batches of 7, 7 and 3 graphs, each of other raw sizes
        batch = Batch.from_data_list(graphs[start:start + 7])
        padded = pad_batch(batch, BUDGET)
        loss, out, grads = _step(model, batch)
        padded_loss, padded_out, padded_grads = _step(padded_model, padded)
        _assert_close(padded_loss, loss)
        _assert_close(padded_out, out)
        assert len(grads) == len(padded_grads)
        assert [g is None for g in grads] == [g is None for g in padded_grads]
        assert sum(g is not None for g in grads) > 30
        for grad, padded_grad in zip(grads, padded_grads, strict=True):
            if grad is not None:
                _assert_close(padded_grad, grad)
        with torch.no_grad():  # the next batch starts from the same weights on both sides
            for p, q in zip(model.parameters(), padded_model.parameters(), strict=True):
                if p.grad is not None:
                    p.sub_(0.1 * p.grad)
                    q.sub_(0.1 * q.grad)
    for (name, buffer), (_, padded_buffer) in zip(model.named_buffers(), padded_model.named_buffers(),
                                                  strict=True):
        _assert_close(padded_buffer.double(), buffer.double()), name  # running statistics too
    model.eval(), padded_model.eval()
    batch = Batch.from_data_list(graphs[:5])
    with torch.no_grad():
        _assert_close(padded_model(**_inputs(pad_batch(batch, BUDGET)))[:5], model(**_inputs(batch)))


def _data(count: int = 30, seed: int = 2) -> PreparedData:
    """``count`` molecules in splits of 60%, 20% and 20%."""
    graphs = _molecules(count, seed=seed)
    for graph in graphs:  # the run's models are float32
        graph.rwse, graph.y = graph.rwse.float(), graph.y.float()
    train, val = int(0.6 * count), int(0.8 * count)
    splits = {"train": graphs[:train], "val": graphs[train:val], "test": graphs[val:]}
    return PreparedData("graph", None, splits, in_channels=len(OGB_ATOM_DIMS),
                        edge_channels=len(OGB_BOND_DIMS), out_channels=LABELS, name="toy",
                        node_categories=OGB_ATOM_DIMS, edge_categories=OGB_BOND_DIMS)


def _config(out_dir, norm="batch", pad=True, extra=()):
    pad_to = f"{{nodes: {BUDGET.nodes}, edges: {BUDGET.edges}, graphs: {BUDGET.graphs}}}" if pad else "{}"
    return load_config(None, [
        f"out_dir={out_dir}", "task.level=graph", "task.loss=bce", "task.metric=ap", "data.batch_size=5",
        f"data.pad_to={pad_to}", f"data.rwse_dim={RWSE}", "model.encoder.rwse_norm=true",
        f"model.norm={norm}",
        "optim.epochs=2", "optim.warmup_epochs=1", "model.channels=8", "model.num_layers=2",
        "model.attention.k=3",
        "device=cpu", "threads=1", *extra,
    ])


@pytest.mark.parametrize("norm", ["batch", "graph"])
def test_a_padded_run_trains_and_scores_as_an_unpadded_one(tmp_path, norm):
    data = _data()
    runs = [Trainer(_config(tmp_path / str(pad), norm, pad), data) for pad in (False, True)]
    histories = []
    for trainer in runs:
        trainer.fit(progress=False)
        histories.append([(row["train_loss"], row["val"], row["test"]) for row in trainer.state.history])
    for row, padded_row in zip(*histories, strict=True):
        assert padded_row == pytest.approx(row, rel=1e-5, abs=1e-6)
    with torch.no_grad():
        outputs = [list(t.task.split_outputs(t._predict, ("test",), t.device)) for t in runs]
    (_, output, target), (_, padded_output, padded_target) = outputs[0][0], outputs[1][0]
    assert padded_output.shape == output.shape and torch.equal(padded_target, target)
    # float32 training: AdamW's first steps move each weight by about lr whatever its gradient's size, so
    # float rounding in a near-zero gradient shows in the weights after a few steps (the float64 test above
    # compares one step at 1e-10).
    torch.testing.assert_close(padded_output, output, rtol=1e-3, atol=2e-4)
    assert compute_metric("ap", padded_output, padded_target) == pytest.approx(
        compute_metric("ap", output, target), abs=1e-4)


def test_resident_batches_pad_as_collated_ones(tmp_path):
    data = _data()
    config = _config(tmp_path, extra=("data.on_device=true",))
    task = make_task(config, data, torch.Generator().manual_seed(0))
    resident = ResidentGraphs(data.splits["val"], "cpu")
    for step in task.train_steps(torch.device("cpu")):
        assert step.batch.x.shape[0] == BUDGET.nodes and step.batch.edge_index.shape[1] == BUDGET.edges
    cut = pad_batch(resident.batch([0, 1, 2]), BUDGET)
    collated = pad_batch(Batch.from_data_list(data.splits["val"][:3]), BUDGET)
    for key in ("x", "edge_index", "edge_attr", "rwse", "batch", "ptr", "node_mask", "edge_mask", "y"):
        assert torch.equal(cut[key], collated[key]), key
    assert torch.equal(getattr(cut, HOST_PTR), collated.ptr)


def test_a_fast_dev_run_checks_the_padded_batches_an_epoch_runs(tmp_path):
    from kmipgt.train.fast_dev_run import fast_dev_run

    checks = fast_dev_run(_config(tmp_path), batches=2, echo=lambda line: None, data=_data())
    assert [check.phase for check in checks] == ["train", "train", "val", "val", "test", "test"]
    assert all(check.shapes["x"][0] == BUDGET.nodes for check in checks)
    evaluated = [check for check in checks if check.phase != "train"]
    assert all(check.shapes["output"] == [BUDGET.graphs, LABELS] for check in evaluated)


def test_a_budget_too_small_is_a_clear_error(tmp_path):
    data = _data()
    needed = required_budget(data.splits["train"], 5)
    small = f"data.pad_to={{nodes: {needed.nodes - 1}, edges: {needed.edges}, graphs: {needed.graphs}}}"
    config = load_config(None, [f"out_dir={tmp_path}", "task.level=graph", "data.batch_size=5", small])
    with pytest.raises(ValueError, match=rf"too small for the train split.*nodes >= {needed.nodes}"):
        make_task(config, data, torch.Generator())
    with pytest.raises(ValueError, match=r"does not fit data\.pad_to"):
        pad_batch(Batch.from_data_list(data.splits["train"][:5]), PadBudget(50, 400, 8))
    # Exactly the required budget serves every batch of the split.
    exact = PadBudget(needed.nodes, needed.edges, needed.graphs)
    largest = sorted(data.splits["train"], key=lambda g: -g.num_nodes)[:5]
    assert pad_batch(Batch.from_data_list(largest), exact).x.shape[0] == needed.nodes


def _padding_graph_sizes(batch: Batch) -> list[int]:
    sizes = batch.ptr.diff().tolist()
    return sizes[getattr(batch, REAL_GRAPHS):]


def _many_molecules() -> PreparedData:
    """200 molecules: batches of 40 vary in size far less than from the 40 smallest to the 40 largest."""
    return _data(200, seed=3)


def test_auto_pads_nearly_every_batch_to_a_smaller_budget_and_any_batch_to_a_larger(tmp_path, caplog):
    data = _many_molecules()
    config = load_config(None, [f"out_dir={tmp_path}", "task.level=graph", "data.batch_size=40",
                                "data.pad_to=auto"])
    validate_config(config)
    with caplog.at_level("INFO", logger="kmipgt"):
        typical, largest_budget = make_task(config, data, torch.Generator()).pad_budgets
    assert f"data.pad_to: auto is {typical}, then {largest_budget}" in caplog.text
    # The larger: the nodes and edges of the largest batch of 40 any split can draw, plus a padding node.
    largest = {name: sorted(split, key=lambda g: -g.num_nodes)[:40] for name, split in data.splits.items()}
    most_nodes = max(sum(g.num_nodes for g in batch) for batch in largest.values())
    most_edges = max(sum(sorted((g.num_edges for g in split), reverse=True)[:40])
                     for split in data.splits.values())
    assert (largest_budget.nodes, largest_budget.edges) == (most_nodes + 1, most_edges)
    padded = [pad_to_fit(Batch.from_data_list(batch), (typical, largest_budget)).x.shape[0]
              for batch in largest.values()]
    assert padded == [largest_budget.nodes, typical.nodes, typical.nodes]  # train's 856 nodes; 509, 535
    # The smaller holds every one of 2,000 random batches of each split, with fewer rows.
    assert typical.nodes < largest_budget.nodes and typical.edges < largest_budget.edges
    generator = torch.Generator().manual_seed(0)
    for split in data.splits.values():
        for _ in range(2000):
            drawn = [split[i] for i in torch.randperm(len(split), generator=generator)[:40].tolist()]
            sizes = (sum(g.num_nodes for g in drawn), sum(g.num_edges for g in drawn), len(drawn))
            assert typical.holds(*sizes)
    # The most padding nodes (one smallest graph) and the fewest padding graphs (a full batch of the
    # smallest graphs): in either budget the padding graphs stay within the real graphs' sizes.
    graphs = sorted((g for split in data.splits.values() for g in split), key=lambda g: g.num_nodes)
    for budget in (typical, largest_budget):
        for batch in (graphs[:1], graphs[:40]):
            sizes = _padding_graph_sizes(pad_batch(Batch.from_data_list(batch), budget))
            assert sum(sizes) == budget.nodes - sum(g.num_nodes for g in batch)
            assert max(sizes) <= graphs[-1].num_nodes


def test_auto_on_few_graphs_is_one_budget(tmp_path):
    config = load_config(None, [f"out_dir={tmp_path}", "task.level=graph", "data.batch_size=5",
                                "data.pad_to=auto"])
    budgets = make_task(config, _data(), torch.Generator()).pad_budgets
    assert budgets == (budgets[0],)  # 5 of 6 to 18 graphs: the spread reaches the largest batch


def test_an_auto_padded_run_trains_and_scores_as_an_unpadded_one(tmp_path):
    data = _many_molecules()
    runs = [Trainer(_config(tmp_path / str(pad), pad=False, extra=("data.batch_size=40", *pad)), data)
            for pad in ((), ("data.pad_to=auto",))]
    assert len(runs[1].task.pad_budgets) == 2
    histories = []
    for trainer in runs:
        trainer.fit(progress=False)
        histories.append([(row["train_loss"], row["val"], row["test"]) for row in trainer.state.history])
    for (loss, val, test), (padded_loss, padded_val, padded_test) in zip(*histories, strict=True):
        assert padded_loss == pytest.approx(loss, rel=1e-5)
        # Average precision ranks 40 graphs: float rounding may swap two near-tied scores.
        assert (padded_val, padded_test) == pytest.approx((val, test), abs=2e-3)


@pytest.mark.parametrize(("override", "match"), [
    ("data.pad_to=largest", "takes \\{nodes: N, edges: E, graphs: G\\} or 'auto'"),
    ("data.pad_to={nodes: 10, edges: 10}", "missing \\['graphs'\\]"),
    ("data.pad_to={nodes: 10, edges: 10, graphs: 0}", "pad_to.graphs' must be a positive int"),
    ("task.level=node", "needs task.level 'graph'"),
    ("model.kind=gcn", "needs model.kind 'gps'"),
])
def test_bad_padding_configs_are_refused(tmp_path, override, match):
    base = [f"out_dir={tmp_path}", "task.level=graph", "data.pad_to={nodes: 10, edges: 10, graphs: 2}"]
    with pytest.raises(ValueError, match=match):
        validate_config(load_config(None, [*base, override]))


def test_padding_is_off_by_default():
    assert load_config(None, []).data.pad_to == {}
    inputs = model_inputs(Batch.from_data_list(_molecules(2)))
    assert "node_mask" not in inputs and "edge_mask" not in inputs


def test_a_compiled_model_sees_one_shape_for_every_padded_batch():
    """Padded batches of other raw sizes (and graph counts): one static graph, compiled once, no recompile
    (``error_on_recompile``), outputs and gradients of the eager model."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from kmipgt.train.compiled import CompiledModel

    graphs = _molecules(15, seed=3)
    model = _model("batch").float()
    batches = []
    for start, stop in ((0, 7), (7, 13), (13, 15)):
        padded = pad_batch(Batch.from_data_list(graphs[start:stop]), BUDGET)
        padded.rwse, padded.y = padded.rwse.float(), padded.y.float()
        batches.append(padded)
    assert len({(b.num_nodes, b.edge_index.shape[1], getattr(b, REAL_GRAPHS)) for b in batches}) == 3
    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    compiled = CompiledModel(model, backend="aot_eager", dynamic=False)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for batch in batches:
            results = []
            for run in (compiled, model):
                model.zero_grad()
                out = run(**_inputs(batch))[: getattr(batch, REAL_GRAPHS)]
                F.binary_cross_entropy_with_logits(out, batch.y).backward()
                grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
                results.append((out.detach(), grads))
            (out, grads), (expected, expected_grads) = results
            torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
            for grad, expected_grad in zip(grads, expected_grads, strict=True):
                torch.testing.assert_close(grad, expected_grad, rtol=1e-3, atol=1e-5)
    assert counters["stats"]["unique_graphs"] - before == compiled.graphs == 1


def test_a_compiled_model_sees_one_shape_per_budget_of_auto():
    """Batches packed to the smaller of two budgets where it holds them, else the larger: two graphs,
    each reused (no third compilation), outputs of the eager model."""
    import torch._dynamo

    from kmipgt.train.compiled import CompiledModel

    graphs = _molecules(15, seed=3)
    chunks = [Batch.from_data_list(graphs[start:stop]) for start, stop in ((0, 2), (2, 9), (9, 11), (11, 15))]
    small_chunks = [chunk for chunk in chunks if chunk.num_graphs <= 4]
    small = PadBudget(max(c.num_nodes for c in small_chunks) + 4, max(c.num_edges for c in small_chunks) + 8,
                      graphs=6)
    assert not small.holds(chunks[1].num_nodes, chunks[1].num_edges, chunks[1].num_graphs)
    model = _model("batch").float()
    torch._dynamo.reset()
    compiled = CompiledModel(model, backend="aot_eager", dynamic=False)
    shapes = []
    with torch._dynamo.config.patch(recompile_limit=2, fail_on_recompile_limit_hit=True):
        for chunk in chunks:
            batch = pad_to_fit(chunk, (small, BUDGET))
            batch.rwse = batch.rwse.float()
            shapes.append(batch.num_nodes)
            with torch.no_grad():
                out, expected = (run(**_inputs(batch))[: chunk.num_graphs] for run in (compiled, model))
            torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    assert shapes == [small.nodes, BUDGET.nodes, small.nodes, small.nodes]
    assert compiled.graphs == 2


@pytest.mark.parametrize(("override", "match"), [
    ("optim.compile=false", "needs 'optim.compile: true'"),
    ("data.pad_to={}", "needs 'data.pad_to'"),
    ("device=cpu", "needs a CUDA device, got device 'cpu'"),
])
def test_cuda_graphs_configs_without_what_they_need_are_refused(tmp_path, override, match):
    base = [f"out_dir={tmp_path}", "task.level=graph", "data.pad_to={nodes: 10, edges: 10, graphs: 2}",
            "optim.compile=true", "optim.cuda_graphs=true", "device=cuda"]
    validate_config(load_config(None, base))
    with pytest.raises(ValueError, match=match):
        validate_config(load_config(None, [*base, override]))


def test_cuda_graphs_refuse_a_model_on_the_cpu():
    from kmipgt.train.compiled import CompiledModel

    with pytest.raises(ValueError, match=r"need the model on a CUDA device, got \['cpu'\]"):
        CompiledModel(_model("batch"), dynamic=False, cuda_graphs=True)


@pytest.mark.cuda
def test_a_run_captured_in_cuda_graphs_trains_and_scores_as_the_eager_one(tmp_path):
    """Padded batches of other graph layouts step after step: the attention operators route each one
    afresh between the replayed parts, so the captured run's losses and metrics are the eager run's."""
    from torch._dynamo.utils import counters

    data = _data()
    skips = counters["inductor"]["cudagraph_skips"]
    histories = []
    for compiled in (False, True):
        extra = ("device=cuda", f"optim.compile={compiled}", f"optim.cuda_graphs={compiled}")
        trainer = Trainer(_config(tmp_path / str(compiled), extra=extra), data)
        trainer.fit(progress=False)
        histories.append([(row["train_loss"], row["val"], row["test"]) for row in trainer.state.history])
    assert counters["inductor"]["cudagraph_skips"] == skips
    for row, captured_row in zip(*histories, strict=True):
        assert captured_row == pytest.approx(row, rel=1e-4, abs=1e-5)
