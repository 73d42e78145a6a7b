"""Independent dense references for the ops tests (numpy selection, explicit softmax)."""

from __future__ import annotations

import itertools

import numpy as np
import torch
from torch import Tensor


def reference_topk(
    query: Tensor, key: Tensor, k: int, ptr: list[int], key_ptr: list[int] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k by (score desc, index asc) with numpy's lexsort over each graph's full score matrix.

    ``key_ptr``: the keys' own graph offsets (default ``ptr``: the keys are the queries' nodes).
    """
    q, kk = query.detach().double().numpy(), key.detach().double().numpy()
    num_nodes, heads, _ = q.shape
    ptr = [int(p) for p in ptr]
    key_ptr = ptr if key_ptr is None else [int(p) for p in key_ptr]
    scores = np.full((num_nodes, heads, k), -np.inf)
    index = np.full((num_nodes, heads, k), -1, dtype=np.int64)
    for (q0, q1), (k0, k1) in zip(itertools.pairwise(ptr), itertools.pairwise(key_ptr), strict=True):
        width = min(k, k1 - k0)
        for h in range(heads):
            block = q[q0:q1, h] @ kk[k0:k1, h].T
            for row in range(q1 - q0):
                order = np.lexsort((np.arange(k1 - k0), -block[row]))[:width]
                scores[q0 + row, h, :width] = block[row, order]
                index[q0 + row, h, :width] = order + k0
    return scores, index


def reference_attention(query: Tensor, key: Tensor, value: Tensor, k: int, ptr: list[int], scale=None):
    """Dense masked softmax: full scores per graph, -inf outside the reference top-k set."""
    _, index = reference_topk(query, key, k, ptr)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    out = torch.zeros(query.shape[0], query.shape[1], value.shape[-1], dtype=value.dtype)
    rows = []
    for start, end in itertools.pairwise(ptr):
        if end == start:
            continue
        heads_out = []
        for h in range(query.shape[1]):
            logits = scale * query[start:end, h] @ key[start:end, h].T
            mask = torch.zeros_like(logits, dtype=torch.bool)
            local = torch.from_numpy(index[start:end, h]) - start
            for row in range(end - start):
                mask[row, local[row][local[row] >= 0]] = True
            weights = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
            heads_out.append(weights @ value[start:end, h])
        rows.append(torch.stack(heads_out, dim=1))
    return torch.cat(rows) if rows else out
