"""A toy graph-level dataset and the runs of the DDP tests (spawned ranks and torchrun import this module).

Every process builds the same toy splits and makes the dataset loader return them, so ``kmipgt.train.train``
runs its whole path (config checks, run directory, data preparation) without a dataset on disk.
"""

from __future__ import annotations

import sys

from torch_geometric.data import Data

import kmipgt.train.datasets
from kmipgt.cli import main
from kmipgt.train import load_config, train
from tiny_runs import sign_graphs


def toy_graph_splits(num_graphs: int = 46, seed: int = 0) -> dict[str, list[Data]]:
    """:func:`tiny_runs.sign_graphs` in a 30/8/8 split."""
    graphs = sign_graphs(num_graphs, seed)
    return {"train": graphs[:30], "val": graphs[30:38], "test": graphs[38:]}


def use_toy_graphs() -> None:
    """Make this process's dataset loader return :func:`toy_graph_splits` whatever the config names."""
    kmipgt.train.datasets.load_raw = lambda config: toy_graph_splits()


# 30 training graphs in global batches of 8: three full steps and a last one of 6 (3 per rank).
TOY_OVERRIDES = [
    "task.level=graph", "data.batch_size=8", "optim.epochs=3", "optim.warmup_epochs=1", "model.channels=16",
    "model.num_layers=2", "model.attention.k=4", "model.attention.heads=2", "model.dropout=0.0",
    "model.attention.dropout=0.0",
    "device=cpu", "threads=1",
]


def toy_config(out_dir: str, strategy: str):
    return load_config(None, [*TOY_OVERRIDES, f"out_dir={out_dir}", f"distributed.strategy={strategy}"])


def ddp_runs(rank: int, world: int, straight_dir: str, resumed_dir: str) -> None:
    """On each rank: 3 DDP epochs in one go, and 2 epochs then a resume to 3 in another directory."""
    use_toy_graphs()
    train(toy_config(straight_dir, "ddp"), progress=False)
    train(toy_config(resumed_dir, "ddp"), stop_after=2, progress=False)
    train(toy_config(resumed_dir, "ddp"), resume=True, progress=False)


if __name__ == "__main__":  # under torchrun: `kmipgt` with the toy graphs, arguments as the command's
    use_toy_graphs()
    raise SystemExit(main(sys.argv[1:]))
