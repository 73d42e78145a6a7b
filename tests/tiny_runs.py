"""Tiny data and runs shared by tests: toy node- and graph-level data, a node-level config, a trained tiny
synthetic city, the arguments of a tiny digits run."""

from pathlib import Path

import torch
from torch_geometric.data import Data
from torch_geometric.utils import to_undirected

from kmipgt.cli import main
from kmipgt.train import load_config
from kmipgt.train.datasets import PreparedData

DEFAULTS = Path(__file__).resolve().parent / "defaults.yaml"
# `kmipgt train` arguments of a one-layer, 8-channel GPS run on the digits kNN graph, on one CPU thread.
TINY_DIGITS = ["--config", str(DEFAULTS), "--set", "data.name=digits_knn", "--set", "model.num_layers=1",
               "--set", "model.channels=8", "--set", "model.attention.k=4", "--set", "device=cpu",
               "--set", "threads=1"]


def sign_graphs(num_graphs: int, seed: int = 0, edge_dim: int = 0) -> list[Data]:
    """Random graphs of 3 to 8 nodes with 4 features (and ``edge_dim`` edge features), each labelled by the
    sign of its mean first feature."""
    gen = torch.Generator().manual_seed(seed)
    graphs = []
    for _ in range(num_graphs):
        n = int(torch.randint(3, 9, (1,), generator=gen))
        x = torch.randn(n, 4, generator=gen)
        graph = Data(x=x, edge_index=torch.randint(0, n, (2, 2 * n), generator=gen))
        if edge_dim:
            graph.edge_attr = torch.randn(2 * n, edge_dim, generator=gen)
        graph.y = (x[:, 0].mean() > 0).long().view(1)
        graphs.append(graph)
    return graphs


def train_tiny_city(out, attention: str = "kmip", num_nodes: int = 600) -> None:
    """Two epochs of a 2-layer, 16-channel GPS model on a small synthetic city, written to ``out``."""
    code = main([
        "train", "--no-progress", "--config", "configs/synthetic_city_graphgps.yaml",
        *("--set", f"out_dir={out}", "--set", f"data.options={{num_nodes: {num_nodes}, seed: 0}}"),
        *("--set", "model.num_layers=2", "--set", "model.channels=16", "--set", "threads=1"),
        *("--set", f"model.attention={attention}", "--set", "optim.epochs=2"),
        *("--set", "optim.warmup_epochs=1", "--set", "device=cpu"),
    ])
    assert code == 0


def toy_node_data(num_nodes=60, seed=0) -> PreparedData:
    """A random node-classification graph with a 1/3 train/val/test split."""
    gen = torch.Generator().manual_seed(seed)
    edge_index = to_undirected(torch.randint(0, num_nodes, (2, 3 * num_nodes), generator=gen))
    x = torch.randn(num_nodes, 5, generator=gen)
    masks = torch.arange(num_nodes) % 3
    graph = Data(x=x, edge_index=edge_index, edge_attr=torch.randn(edge_index.size(1), 1, generator=gen),
                 y=(x[:, 0] > 0).long(), train_mask=masks == 0, val_mask=masks == 1, test_mask=masks == 2)
    return PreparedData("node", graph, None, in_channels=5, edge_channels=1, out_channels=2, name="toy")


def toy_node_config(out_dir, local="gatedgcn", epochs=3):
    """A 2-layer, 8-channel GPS run on CPU with branch logging, written to ``out_dir``."""
    return load_config(None, [
        f"out_dir={out_dir}", f"optim.epochs={epochs}", "optim.warmup_epochs=0", "optim.grad_clip=0",
        "model.channels=8", "model.num_layers=2", f"model.local={local}", "model.attention.k=4", "device=cpu",
        "log_branches=true",
    ])
