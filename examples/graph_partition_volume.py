"""Bytes a training step of ``distributed.strategy: graph`` sends per rank and GPS layer, beside the formula.

    torchrun --standalone --nproc-per-node 2 examples/graph_partition_volume.py \\
        --config configs/synthetic_city_graphgps.yaml --set threads=1

Builds the run's trainer on every rank (the same partition, halo plan and model a ``kmipgt train`` run with
``distributed.strategy=graph`` builds), runs one forward and backward of the partitioned model on the
rank's nodes inside ``count_communication`` and prints, per rank, the bytes sent next to the formulas of
docs/distributed.md: the halo exchange of each MPNN and the ring of each sharded k-MIP attention.
"""

import argparse

import torch.distributed as dist

from kmipgt.distributed import count_communication, require_torchrun
from kmipgt.train import Trainer, load_config
from kmipgt.train.batches import forward


def layer_formula(trainer: Trainer, ranks: int) -> dict[str, int]:
    """Bytes this rank sends per GPS layer (float32): halo rows each way, the attention ring."""
    m, a, plan, b = trainer.config.model, trainer.config.model.attention, trainer.shard.plan, 4
    sent_rows = sum(rows.numel() for rows in plan.send.values())
    head_dim = a.head_dim or m.channels // a.heads
    kv = plan.num_nodes * a.heads * 2 * head_dim * b  # one block of keys and values (equal shares)
    return {
        "halo forward": sent_rows * m.channels * b,
        "halo backward": plan.num_halo * m.channels * b,
        "attention forward": (ranks - 1) * kv,
        "attention backward": (ranks - 1) * 2 * kv + kv,
        "attention metadata": 48 * (ranks - 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/synthetic_city_graphgps.yaml")
    parser.add_argument("--set", action="append", default=[], help="config override key.sub=value")
    args = parser.parse_args()
    require_torchrun("torchrun --standalone --nproc-per-node 2 examples/graph_partition_volume.py "
                     "--config configs/synthetic_city_graphgps.yaml --set threads=1")
    dist.init_process_group("gloo")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    config = load_config(args.config, [*args.set, "distributed.strategy=graph", "device=cpu"])
    trainer = Trainer(config)
    with count_communication() as sent:
        forward(trainer.network, trainer.shard.graph).sum().backward()
    layers = config.model.num_layers
    plan, report = trainer.shard.plan, [None] * ranks
    mine = (rank, plan.num_nodes, plan.num_halo, sent.sent, layer_formula(trainer, ranks))
    dist.all_gather_object(report, mine)
    if rank == 0:
        print(f"{layers} GPS layers; bytes per rank and layer (measured: one step's total / {layers})")
        for r, nodes, halo, counted, formula in report:
            print(f"rank {r}: {nodes} nodes, halo {halo} nodes")
            for phase in ("forward", "backward", "metadata"):
                parts = {k: v for k, v in formula.items() if k.endswith(phase)}
                print(f"  {phase:9s} measured {counted.get(phase, 0) / layers:>12,.0f}   formula "
                      f"{sum(parts.values()):>12,}  ({', '.join(f'{k} {v:,}' for k, v in parts.items())})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
