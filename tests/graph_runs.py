"""Tiny node-level runs of ``distributed.strategy: graph`` (spawned ranks import this module).

A 300-node synthetic city, 2 GPS layers (GatedGCN + position-keyed k-MIP, as
``synthetic_city_graphgps.yaml``) with every dropout off, so the runs are deterministic and one process is
the reference.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch_geometric.data import Data
from torch_geometric.utils import to_undirected

import kmipgt.train.datasets
from kmipgt.train import Trainer, load_config, train

GRAPH_OVERRIDES = [
    "data.options={num_nodes: 300, seed: 0}", "model.num_layers=2", "model.channels=16",
    "model.attention.k=8",
    "model.dropout=0.0", "model.attention.dropout=0.0", "optim.epochs=3", "optim.warmup_epochs=1",
    "device=cpu",
    "threads=1",
]


def graph_config(out_dir: str, strategy: str, *overrides: str):
    """``synthetic_city_graphgps.yaml`` shrunk by :data:`GRAPH_OVERRIDES`, then ``overrides``."""
    run = [f"out_dir={out_dir}", f"distributed.strategy={strategy}"]
    return load_config("synthetic_city_graphgps", [*GRAPH_OVERRIDES, *run, *overrides])


def first_step_gradients(config) -> dict[str, torch.Tensor]:
    """The parameter gradients of the first optimiser step (summed over ranks, clipped) of ``config``."""
    trainer = Trainer(config)
    trainer._train_epoch()  # one full-batch step; the gradients stay on the parameters
    return {name: p.grad for name, p in trainer.model.named_parameters() if p.grad is not None}


def graph_runs(rank: int, world: int, runs: list[tuple[str, list[str]]], resumed_dir: str) -> None:
    """On each rank: one ``strategy: graph`` run per ``(out_dir, overrides)``, then its first step's
    gradients, which rank 0 saves to ``out_dir/gradients.pt``; and in ``resumed_dir`` the first run
    stopped after 2 epochs and resumed."""
    for out_dir, overrides in runs:
        config = graph_config(out_dir, "graph", *overrides)
        train(config, progress=False)
        gradients = first_step_gradients(config)
        if rank == 0:
            torch.save(gradients, Path(out_dir) / "gradients.pt")
    resumed = graph_config(resumed_dir, "graph", *runs[0][1])
    train(resumed, stop_after=2, progress=False)
    train(resumed, resume=True, progress=False)


def one_sided_graph(num_nodes: int = 60) -> Data:
    """A random graph without coordinates whose training nodes all come first: on 2 ranks of the stored
    order, rank 1 has none (and rank 0 no validation or test node)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(num_nodes, 4, generator=gen)
    quarter = torch.arange(num_nodes) * 4 // num_nodes
    return Data(x=x, edge_index=to_undirected(torch.randint(0, num_nodes, (2, 3 * num_nodes), generator=gen)),
                y=(x[:, 0] > 0).long(), train_mask=quarter < 2, val_mask=quarter == 2, test_mask=quarter == 3)


ONE_SIDED_OVERRIDES = [
    "model.channels=8", "model.num_layers=2", "model.attention.k=4", "optim.epochs=2",
    "optim.warmup_epochs=1",
    "device=cpu", "threads=1",
]


def one_sided_config(out_dir: str, strategy: str):
    return load_config(None, [*ONE_SIDED_OVERRIDES, f"out_dir={out_dir}", f"distributed.strategy={strategy}"])


def one_sided_runs(rank: int, world: int, out_dir: str) -> None:
    """On each rank: :func:`one_sided_graph` under ``strategy: graph`` (the dataset loader returns it)."""
    kmipgt.train.datasets.load_raw = lambda config: one_sided_graph()
    train(one_sided_config(out_dir, "graph"), progress=False)
