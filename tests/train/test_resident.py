"""Graph-level data kept on the device (kmipgt.train.resident, ``data.on_device``) against PyG's collate."""

import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.loader import DataLoader

from kmipgt.nn.model import assert_node_pairs
from kmipgt.train import Trainer, load_config
from kmipgt.train.config import config_differences, config_to_dict
from kmipgt.train.datasets import PreparedData
from kmipgt.train.resident import HOST_PTR, ResidentGraphs, graphs_nbytes, resident_by_default
from kmipgt.train.tasks.levels import make_task
from sync_detector import HostSyncs
from tiny_runs import sign_graphs

KEYS = ("x", "edge_index", "edge_attr", "batch", "ptr", "y")


def _graphs(count=11, seed=0) -> list[Data]:
    """Graphs of 1 to 8 nodes (some without edges) with node, edge and graph attributes."""
    gen = torch.Generator().manual_seed(seed)
    graphs = []
    for _ in range(count):
        n, e = int(torch.randint(1, 9, (1,), generator=gen)), int(torch.randint(0, 12, (1,), generator=gen))
        edge_index = torch.randint(0, n, (2, e), generator=gen)
        graphs.append(Data(x=torch.randn(n, 3, generator=gen), edge_index=edge_index,
                           edge_attr=torch.randn(e, 2, generator=gen), y=torch.randn(1, 4, generator=gen),
                           rwse=torch.randn(n, 5, generator=gen)))
    return graphs


def _assert_same_batch(cut: Batch, collated: Batch, keys=(*KEYS, "rwse")) -> None:
    assert cut.num_graphs == collated.num_graphs
    for key in keys:
        assert torch.equal(cut[key], collated[key]), key


def test_a_cut_equals_collating_the_same_graphs():
    graphs = _graphs()
    resident = ResidentGraphs(graphs, "cpu")
    assert len(resident) == len(graphs)
    for index in ([3, 0, 10, 7, 7], [5], list(range(11))[::-1]):
        cut = resident.batch(torch.tensor(index))
        collated = Batch.from_data_list([graphs[i] for i in index])
        _assert_same_batch(cut, collated)
        for mine, theirs in zip(cut.to_data_list(), collated.to_data_list(), strict=True):
            for key in ("x", "edge_index", "edge_attr", "y", "rwse"):
                assert torch.equal(mine[key], theirs[key])


def test_bad_input_names_the_problem():
    with pytest.raises(ValueError, match="at least one graph"):
        ResidentGraphs([], "cpu")
    with pytest.raises(ValueError, match="'name' is not a tensor"):
        ResidentGraphs([Data(x=torch.ones(2, 1), name="a")], "cpu")
    chain = torch.tensor([[0, 1], [1, 2]])
    outside = torch.tensor([[0, 1], [1, 3]])  # node 3 is graph 2's first node in a collated batch
    graphs = [Data(x=torch.randn(3, 1), edge_index=edges) for edges in (chain, outside, chain)]
    match = r"graph 1's edge_index must hold node ids in \[0, 3\) for 3 nodes, got ids in \[0, 3\]"
    with pytest.raises(ValueError, match=match):
        ResidentGraphs(graphs, "cpu")
    resident = ResidentGraphs(_graphs(3), "cpu")
    with pytest.raises(ValueError, match=r"graph indices in \[0, 3\)"):
        resident.batch(torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="non-empty 1-D"):
        resident.batch(torch.tensor([], dtype=torch.long))


def test_the_model_does_not_read_the_edges_of_a_cut_back():
    cut = ResidentGraphs(_graphs(), "cpu").batch(torch.tensor([3, 0, 10]))
    with HostSyncs() as syncs:
        assert_node_pairs("edge_index", cut.edge_index, cut.num_nodes)
    assert syncs.syncs == []
    assert getattr(cut, HOST_PTR).tolist() == cut.ptr.tolist()


def _data(num_graphs=23) -> PreparedData:
    graphs = sign_graphs(num_graphs, seed=3, edge_dim=2)
    splits = {"train": graphs[:15], "val": graphs[15:19], "test": graphs[19:]}
    return PreparedData("graph", None, splits, in_channels=4, edge_channels=2, out_channels=2, name="toy")


def _overrides(out_dir) -> list[str]:
    return [f"out_dir={out_dir}", "task.level=graph", "data.batch_size=4", "optim.epochs=3",
            "optim.warmup_epochs=1", "model.channels=8", "model.num_layers=2", "model.attention.k=3",
            "device=cpu",
            "threads=1"]


def _config(out_dir, on_device: bool):
    return load_config(None, [*_overrides(out_dir), f"data.on_device={str(on_device).lower()}"])


def test_the_task_on_device_steps_through_the_loader_batches(tmp_path):
    data, device = _data(), torch.device("cpu")
    task = make_task(_config(tmp_path, True), data, torch.Generator().manual_seed(5))
    generator = torch.Generator().manual_seed(5)
    loader = DataLoader(data.splits["train"], batch_size=4, shuffle=True, generator=generator)
    for _ in range(2):  # two epochs, two shuffles drawn from the generator
        steps = list(task.train_steps(device))
        assert len(steps) == task.steps_per_epoch() == 4
        for step, batch in zip(steps, loader, strict=True):
            _assert_same_batch(step.batch, batch, KEYS)
    assert torch.equal(task.generator.get_state(), generator.get_state())

    def predict(batch):
        return batch.x[batch.ptr[1:] - 1]

    collating = make_task(_config(tmp_path, False), data, torch.Generator())
    outputs = [list(t.split_outputs(predict, ("val", "test"), device)) for t in (task, collating)]
    for (split, output, target), (split_b, output_b, target_b) in zip(*outputs, strict=True):
        assert split == split_b and torch.equal(output, output_b) and torch.equal(target, target_b)


def test_training_on_device_equals_training_from_the_loader(tmp_path):
    runs = [Trainer(_config(tmp_path / str(on_device), on_device), _data()) for on_device in (False, True)]
    metrics = [trainer.fit(progress=False) for trainer in runs]
    histories = [[(row["train_loss"], row["val"], row["test"]) for row in t.state.history] for t in runs]
    assert histories[0] == histories[1]
    assert metrics[0]["test"] == metrics[1]["test"]


def test_on_device_needs_graph_level_data(tmp_path):
    config = load_config(None, ["data.on_device=true", f"out_dir={tmp_path}"])
    graph = Data(x=torch.randn(4, 2), edge_index=torch.tensor([[0, 1], [1, 0]]), y=torch.tensor([0, 1, 0, 1]))
    data = PreparedData("node", graph, None, in_channels=2, edge_channels=0, out_channels=2, name="toy")
    with pytest.raises(ValueError, match=r"data\.on_device needs a graph-level task"):
        make_task(config, data, torch.Generator())


@pytest.mark.cuda
def test_batches_on_cuda_equal_those_on_the_cpu(tmp_path):
    data, cuda = _data(), torch.device("cuda")
    reference = list(make_task(_config(tmp_path, False), data, torch.Generator().manual_seed(2)).train_steps(
        torch.device("cpu")))
    for on_device in (False, True):
        task = make_task(_config(tmp_path, on_device), data, torch.Generator().manual_seed(2))
        for step, expected in zip(task.train_steps(cuda), reference, strict=True):
            assert step.batch.x.is_cuda and step.batch.ptr.is_cuda
            _assert_same_batch(step.batch.cpu(), expected.batch, KEYS)


def test_the_default_keeps_graphs_on_a_cuda_device_with_four_times_their_size_free(monkeypatch):
    graphs = _graphs(5)
    nbytes = graphs_nbytes(graphs)
    assert nbytes == sum(t.nbytes for g in graphs for t in (g.x, g.edge_index, g.edge_attr, g.y, g.rwse))
    assert not resident_by_default(nbytes, torch.device("cpu"))
    cuda = torch.device("cuda", 0)
    for free, expected in ((4 * nbytes, True), (4 * nbytes - 1, False)):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device, free=free: (free, 8 * free))
        assert resident_by_default(nbytes, cuda) is expected


def test_the_default_cuts_batches_where_the_graphs_fit_and_else_collates(tmp_path, monkeypatch):
    """``data.on_device`` unset: the splits kept on the device where they fit (here: a stand-in decision on
    the CPU), the same batches as the loader's; graphs that only collating takes (an attribute that is not
    a tensor) are collated on the host, where ``data.on_device: true`` refuses them."""
    import kmipgt.train.tasks.graph as graph_task

    monkeypatch.setattr(graph_task, "resident_by_default", lambda nbytes, device: True)
    device, config = torch.device("cpu"), load_config(None, [*_overrides(tmp_path), "data.on_device=null"])
    assert config.data.on_device is None
    task = make_task(config, _data(), torch.Generator().manual_seed(5))
    loader = DataLoader(_data().splits["train"], batch_size=4, shuffle=True,
                        generator=torch.Generator().manual_seed(5))
    for step, batch in zip(task.train_steps(device), loader, strict=True):
        _assert_same_batch(step.batch, batch, KEYS)
    assert isinstance(task._resident[("train", device)], ResidentGraphs)

    named = _data()
    for graph in named.splits["train"]:
        graph.name = "a molecule"
    task = make_task(config, named, torch.Generator().manual_seed(5))
    assert len(list(task.train_steps(device))) == 4 and task._resident[("train", device)] is None
    with pytest.raises(ValueError, match="'name' is not a tensor"):
        list(make_task(_config(tmp_path, True), named, torch.Generator()).train_steps(device))


def test_a_run_resumes_with_another_on_device_setting(tmp_path):
    saved, current = (config_to_dict(_config(tmp_path, on_device)) for on_device in (False, True))
    assert config_differences(saved, current) == []


@pytest.mark.cuda
def test_a_run_on_cuda_keeps_its_graphs_there_and_fuses_its_optimiser(tmp_path):
    """The defaults on a CUDA device: the splits resident (they fit), AdamW as one fused kernel."""
    config = load_config(None, [*_overrides(tmp_path), "device=cuda"])
    trainer = Trainer(config, _data())
    assert trainer.optimizer.defaults["fused"] is True
    steps = list(trainer.task.train_steps(trainer.device))
    assert steps[0].batch.x.is_cuda
    assert isinstance(trainer.task._resident[("train", trainer.device)], ResidentGraphs)
    trainer.fit(progress=False)
