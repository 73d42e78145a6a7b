"""The fused Triton k-MIP attention against a dense float64 oracle, in Triton's interpreter and on CUDA.

Without a GPU the kernels run on CPU tensors under ``TRITON_INTERPRET=1``, in one subprocess that runs
every case of this file (run as a script) and reports each; with CUDA the same cases run compiled.
Inputs are multiples of 1/8 (small integers where ties are the point), so every score is exact in
float32, tf32x3 and half precision alike and the selection must equal the oracle's exactly.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch

import kmipgt
from ties_at_zero import ties_at_zero

_HAS_TRITON = importlib.util.find_spec("triton") is not None
if _HAS_TRITON:
    import triton

    from positive_zero_kernel import positive_zero_kernel


def _release(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


# Triton's interpreter before 3.7 reads a loop bound such as ``range(k)`` as ``int(one-element array)``,
# which NumPy 2.4 refuses (the compiled kernels on a GPU are not affected).
_INTERPRETER_BREAKS = (_HAS_TRITON and _release(triton.__version__) < (3, 7)
                       and _release(np.__version__) >= (2, 4))

_DEVICE_DTYPES = {"cpu": (torch.float32, torch.float16), "cuda": (torch.float32, torch.bfloat16)}


def dense_kmip_attention(query, key, value, k, ptr, scale):
    """float64 reference: per graph and head every score, the top k by a stable sort of the negated
    scores (index ascending among ties), softmax, weighted sum. Differentiable through autograd.

    Returns ``(out [N, H, dv], index [N, H, k], score [N, H, k], weight [N, H, k])``.
    """
    num_nodes, heads, _ = query.shape
    index = torch.full((num_nodes, heads, k), -1, dtype=torch.long)
    score = torch.full((num_nodes, heads, k), float("-inf"), dtype=torch.float64)
    weight = torch.zeros(num_nodes, heads, k, dtype=torch.float64)
    outs = [query.new_zeros(0, heads, value.shape[-1])]
    for start, end in itertools.pairwise(ptr.tolist()):
        if end == start:
            continue
        width = min(k, end - start)
        per_head = []
        for h in range(heads):
            scores = query[start:end, h] @ key[start:end, h].T
            order = torch.sort(-scores.detach(), dim=1, stable=True).indices[:, :width]
            top = scores.gather(1, order)
            w = torch.softmax(scale * top, dim=1)
            per_head.append((w[:, :, None] * value[start:end, h][order]).sum(1))
            index[start:end, h, :width] = order + start
            score[start:end, h, :width] = top.detach()
            weight[start:end, h, :width] = w.detach()
        outs.append(torch.stack(per_head, dim=1))
    return torch.cat(outs), index, score, weight


def _tokens(sizes, heads, dims, *, seed, integer=False):
    """Tensors ``[N, heads, d]`` for each d of ``dims``, exact on a grid, and the graphs' ``ptr``."""
    gen = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    ptr = torch.tensor([0, *torch.tensor(sizes, dtype=torch.long).cumsum(0).tolist()])
    if integer:
        return [torch.randint(-2, 3, (n, heads, d), generator=gen).double() for d in dims], ptr
    return [torch.randint(-16, 17, (n, heads, d), generator=gen).double() / 8 for d in dims], ptr


def _fused(query, key, value, k, ptr, max_nodes, scale, grad_out):
    """The fused outputs and the gradients of ``(out * grad_out).sum()``, or of ``out.sum()`` (None)."""
    from kmipgt.ops.triton_attention import triton_kmip_attention

    leaves = [t.detach().requires_grad_() for t in (query, key, value)]
    out, index, score, weight = triton_kmip_attention(*leaves, k, ptr, max_nodes, scale)
    loss = out.sum() if grad_out is None else (out * grad_out).sum()
    return (out, index, score, weight), torch.autograd.grad(loss, leaves)


def _check(tensors, ptr, k, *, device, dtype, scale=0.5, grad_sum=False):
    """The fused kernels on ``device``/``dtype`` against the oracle on the same (rounded) inputs."""
    query, key, value = (t.to(device, dtype) for t in tensors)
    max_nodes = int(ptr.diff().max()) if ptr.numel() > 1 else 0
    grad_out = None if grad_sum else torch.linspace(-1, 1, value.numel()).view(value.shape).to(device, dtype)
    fused, grads = _fused(query, key, value, k, ptr.to(device), max_nodes, scale, grad_out)
    out, index, score, weight = fused
    leaves = [t.detach().cpu().double().requires_grad_() for t in (query, key, value)]
    ref_out, ref_index, ref_score, ref_weight = dense_kmip_attention(*leaves, k, ptr, scale)
    ref_loss = ref_out.sum() if grad_out is None else (ref_out * grad_out.cpu().double()).sum()
    ref_grads = torch.autograd.grad(ref_loss, leaves)
    assert torch.equal(index.cpu(), ref_index)
    assert score.dtype == torch.float32 and weight.dtype == torch.float32 and out.dtype == dtype
    torch.testing.assert_close(score.cpu().double(), ref_score, rtol=0, atol=0)
    torch.testing.assert_close(weight.cpu().double(), ref_weight, rtol=1e-5, atol=1e-6)
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(out.cpu().double(), ref_out.detach(), **tol)
    for name, grad, ref in zip(("query", "key", "value"), grads, ref_grads, strict=True):
        torch.testing.assert_close(grad.cpu().double(), ref, **tol, msg=lambda m, n=name: f"grad of {n}: {m}")


def case_ties(device, dtype):
    """Small integers: many equal scores, ranked by index."""
    tensors, ptr = _tokens([7, 3, 12], heads=2, dims=(3, 3, 3), seed=0, integer=True)
    _check(tensors, ptr, 4, device=device, dtype=dtype)


def case_ragged_strided(device, dtype):
    """Uneven and empty graphs (repeated offsets, first and last too), d_v != d, and q/k/v as
    non-contiguous views of one packed tensor."""
    (packed,), ptr = _tokens([0, 5, 0, 0, 37, 2, 20, 0], heads=2, dims=(6 + 6 + 3,), seed=1)
    tensors = packed.split([6, 6, 3], dim=-1)
    _check(tensors, ptr, 4, device=device, dtype=dtype)


def case_graphs_smaller_than_k(device, dtype):
    """Padding slots (-1, -inf, 0) where a graph has fewer than k nodes; k = the largest graph."""
    tensors, ptr = _tokens([2, 1, 9, 5], heads=3, dims=(4, 4, 2), seed=2)
    _check(tensors, ptr, 9, device=device, dtype=dtype)


def case_large_logits(device, dtype):
    """Logits up to 480, whose exponentials overflow float32 unless the softmax subtracts the maximum."""
    tensors, ptr = _tokens([5, 8], heads=2, dims=(4, 4, 3), seed=7, integer=True)
    _check(tensors, ptr, 4, device=device, dtype=dtype, scale=30.0)


def case_k1(device, dtype):
    """One key per query, and an expanded (stride 0) output gradient from ``out.sum()``."""
    tensors, ptr = _tokens([4, 17, 1], heads=1, dims=(5, 5, 5), seed=3)
    _check(tensors, ptr, 1, device=device, dtype=dtype, grad_sum=True)


def case_large_graph(device, dtype):
    """A graph past one query tile and one backward key chunk (150 nodes), next to a tiny one."""
    tensors, ptr = _tokens([150, 3], heads=1, dims=(4, 4, 3), seed=4)
    _check(tensors, ptr, 3, device=device, dtype=dtype)


def case_nan_isolation(device, dtype):
    """A NaN in the query, key or value of some graphs leaves every other graph's outputs, selection and
    gradients equal to the NaN-free run's, bit for bit."""
    sizes = [6, 9, 0, 11, 4, 7]
    tensors, ptr = _tokens(sizes, heads=2, dims=(4, 4, 3), seed=5)
    clean = [t.to(device, dtype) for t in tensors]
    dirty = [t.clone() for t in clean]
    dirty[0][6 + 2, 1, 0] = float("nan")  # graph 1's query
    dirty[1][15 + 3, 0, 2] = float("nan")  # graph 3's key
    dirty[2][26 + 1, 1, 1] = float("nan")  # graph 4's value
    grad_out = torch.linspace(-1, 1, clean[2].numel()).view(clean[2].shape).to(device, dtype)
    ptr_device, max_nodes = ptr.to(device), max(sizes)
    outputs, grads = _fused(*clean, 3, ptr_device, max_nodes, 0.5, grad_out)
    dirty_outputs, dirty_grads = _fused(*dirty, 3, ptr_device, max_nodes, 0.5, grad_out)
    untouched = torch.cat([torch.arange(0, 6), torch.arange(30, 37)]).to(device)
    for ours, theirs in zip((*outputs, *grads), (*dirty_outputs, *dirty_grads), strict=True):
        assert torch.equal(ours[untouched], theirs[untouched])
        assert torch.isfinite(theirs[untouched].float()).all()
    assert not torch.isfinite(dirty_outputs[0][6:15]).all()


def case_ties_at_zero(device, dtype):
    """Scores of exactly zero, some of them sums of -0.0 products, tie with +0.0 and rank by index."""
    query, key, value, ptr = ties_at_zero()
    _check((query, key, value), ptr, 12, device=device, dtype=dtype)


def case_positive_zero(device, dtype):
    """The select the kernels apply after their dots makes -0.0 +0.0 and leaves every other value."""
    x = torch.tensor([-0.0, 0.0, -1.5, 2.0, float("-inf"), -(2.0**-14)], dtype=dtype, device=device)
    out = torch.empty_like(x)
    positive_zero_kernel[(1,)](x, out, x.numel(), BLOCK=8)
    assert not torch.signbit(out[:2]).any()
    assert torch.equal(out[2:], x[2:])


def case_wide_heads(device, dtype):
    """Head dim 160 (blocks of 256) with values of 24."""
    tensors, ptr = _tokens([40, 7], heads=1, dims=(160, 160, 24), seed=8)
    _check(tensors, ptr, 4, device=device, dtype=dtype)


def case_k_in_one_bucket(device, dtype):
    """k = 5, 6 and 7 share one compiled kernel (8 slots), each with its own result."""
    tensors, ptr = _tokens([9, 6, 12], heads=2, dims=(4, 4, 3), seed=9, integer=True)
    for k in (5, 6, 7):
        _check(tensors, ptr, k, device=device, dtype=dtype)


CASES = {name: case for name, case in globals().items() if name.startswith("case_")}


def _label(name: str, dtype: torch.dtype) -> str:
    return f"{name}[{str(dtype).removeprefix('torch.')}]"


def _run_cases(device: str) -> dict[str, str]:
    """Every case for every dtype of ``device``: ``{"case[dtype]": "ok" or the traceback}``."""
    results = {}
    for name, case in CASES.items():
        for dtype in _DEVICE_DTYPES[device]:
            label = _label(name, dtype)
            try:
                case(device, dtype)
                results[label] = "ok"
            except Exception:  # each case reports its own failure to the parent test
                results[label] = traceback.format_exc()
    return results


_LABELS = [_label(name, dtype) for name in CASES for dtype in _DEVICE_DTYPES["cpu"]]


@pytest.fixture(scope="module")
def interpreted():
    """The cases' results in a subprocess under ``TRITON_INTERPRET=1`` (one interpreter start for all)."""
    # The kmipgt this test imported (src/, or an installed wheel's), and the tests' helpers.
    package_parent, tests = Path(kmipgt.__file__).resolve().parents[1], Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(package_parent), str(tests)])}
    done = subprocess.run(
        [sys.executable, __file__], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1])


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the compiled kernels are tested below")
@pytest.mark.skipif(not _HAS_TRITON, reason="needs triton")
@pytest.mark.skipif(_INTERPRETER_BREAKS, reason="Triton's interpreter before 3.7 fails under NumPy 2.4")
@pytest.mark.parametrize("label", _LABELS)
def test_interpreted_kernels_match_the_dense_oracle(interpreted, label):
    assert interpreted[label] == "ok", interpreted[label]


@pytest.mark.requires("triton")
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"max_nodes": 257}, ValueError, "MAX_FUSED_NODES = 256"),
        ({"k": 65}, ValueError, "MAX_FUSED_K = 64"),
        ({"k": 0}, ValueError, "`k`"),
        ({"ptr": torch.tensor([0, 4], dtype=torch.int32)}, TypeError, "`ptr`"),
        ({"value": torch.zeros(4, 1, 2, dtype=torch.float64)}, TypeError, "`value`"),
    ],
)
def test_bad_input_names_the_argument_and_limit(kwargs, error, match):
    from kmipgt.ops.triton_attention import triton_kmip_attention

    args = {"query": torch.zeros(4, 1, 2), "key": torch.zeros(4, 1, 2), "value": torch.zeros(4, 1, 2),
            "k": 2, "ptr": torch.tensor([0, 4]), "max_nodes": 4, "scale": 1.0}
    with pytest.raises(error, match=match):
        triton_kmip_attention(**{**args, **kwargs})


@pytest.mark.cuda
@pytest.mark.requires("triton")
@pytest.mark.parametrize("dtype", _DEVICE_DTYPES["cuda"], ids=str)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_compiled_kernels_match_the_dense_oracle(case, dtype):
    case("cuda", dtype)


@pytest.mark.cuda
@pytest.mark.requires("triton")
def test_peptides_shaped_batch_is_deterministic_and_never_syncs():
    """200 graphs of 100-199 nodes, 4 heads, d = 19, k = 5: no host sync in forward and backward with a
    device ``ptr``, the same bits twice, and the oracle's selection and gradients."""
    from kmipgt.ops.triton_attention import triton_kmip_attention

    sizes = torch.randint(100, 200, (200,), generator=torch.Generator().manual_seed(0)).tolist()
    tensors, ptr = _tokens(sizes, heads=4, dims=(19, 19, 19), seed=6)
    query, key, value = (t.float().cuda().requires_grad_() for t in tensors)
    ptr_device, grad_out, scale = ptr.cuda(), torch.randn_like(value), 19**-0.5
    runs = []
    for _ in range(3):  # the first run compiles, outside the sync check
        torch.cuda.set_sync_debug_mode("error" if runs else 0)
        try:
            fused = triton_kmip_attention(query, key, value, 5, ptr_device, max(sizes), scale)
            grads = torch.autograd.grad(fused[0], (query, key, value), grad_out)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        runs.append((*fused, *grads))
    for first, second in zip(runs[1], runs[2], strict=True):
        assert torch.equal(first, second)
    leaves = [t.detach().cpu().double().requires_grad_() for t in (query, key, value)]
    ref_out, ref_index, _, _ = dense_kmip_attention(*leaves, 5, ptr, scale)
    ref_grads = torch.autograd.grad((ref_out * grad_out.cpu().double()).sum(), leaves)
    assert torch.equal(runs[2][1].cpu(), ref_index)
    for ours, ref in zip((runs[2][0], *runs[2][4:]), (ref_out, *ref_grads), strict=True):
        torch.testing.assert_close(ours.cpu().double(), ref.detach(), rtol=1e-4, atol=1e-4)


if __name__ == "__main__":
    print(json.dumps(_run_cases("cuda" if torch.cuda.is_available() else "cpu")))
