"""k-MIP attention over a batch split across processes, checked against one process, with the bytes sent.

    torchrun --standalone --nproc-per-node 2 examples/sharded_attention.py --nodes 10000

Every rank draws the same global batch (two graphs, the second straddling the rank boundary), keeps its
own rows, runs ``sharded_kmip_attention`` forward and backward, and compares its rows of the output and
the gradients with the single-process ``kmip_attention`` over the whole batch. Rank 0 prints the bytes
each rank sent next to the formula of docs/distributed.md.
"""

import argparse

import torch
import torch.distributed as dist

from kmipgt.distributed import count_communication, require_torchrun, sharded_kmip_attention
from kmipgt.ops import kmip_attention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10000, help="N, nodes of the global batch")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=16, help="head dimension of queries, keys and values")
    parser.add_argument("-k", type=int, default=16)
    args = parser.parse_args()
    require_torchrun("torchrun --standalone --nproc-per-node 2 examples/sharded_attention.py --nodes 10000")
    dist.init_process_group("gloo")
    rank, ranks = dist.get_rank(), dist.get_world_size()

    gen = torch.Generator().manual_seed(0)
    shape = (args.nodes, args.heads, args.dim)
    query, key, value, grad_out = (torch.randn(shape, generator=gen) for _ in range(4))
    ptr = torch.tensor([0, args.nodes // 3, args.nodes])  # graph 1 straddles every rank boundary here
    bounds = [r * args.nodes // ranks for r in range(ranks + 1)]
    rows = slice(bounds[rank], bounds[rank + 1])

    q, k, v = (t[rows].clone().requires_grad_() for t in (query, key, value))
    with count_communication() as sent:
        out = sharded_kmip_attention(q, k, v, args.k, ptr=ptr)
        out.backward(grad_out[rows])

    full = [t.clone().requires_grad_() for t in (query, key, value)]
    reference = kmip_attention(*full, args.k, ptr=ptr)
    reference.backward(grad_out)
    pairs = [(out, reference[rows]), *((t.grad, f.grad[rows]) for t, f in zip((q, k, v), full))]
    error = max(float((a - b).detach().abs().max()) for a, b in pairs)

    report = [None] * ranks
    dist.all_gather_object(report, (rank, rows.stop - rows.start, sent.sent, error))
    if rank == 0:
        row_bytes = args.heads * 2 * args.dim * 4  # one key row and one value row, float32
        for r, n, counted, err in report:
            nxt = report[(r + 1) % ranks][1]
            formula = {"forward": (ranks - 1) * n * row_bytes,
                       "backward": (ranks - 1) * n * 2 * row_bytes + nxt * row_bytes}
            print(f"rank {r}: {n} rows, max |sharded - single process| = {err:.2e}")
            for phase in ("metadata", "forward", "backward"):
                expected = f" (formula {formula[phase]:,})" if phase in formula else ""
                print(f"  {phase:9s} {counted.get(phase, 0):>12,} bytes{expected}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
