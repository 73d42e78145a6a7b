"""Sharded k-MIP attention on 2 gloo ranks equals the single-process op: output, gradients, bytes sent.

One spawn runs every case (each spawn imports torch anew); each test then checks one case's saved rank
results against :func:`kmipgt.ops.kmip_attention` over the whole batch in this process.
"""

import os
import re
from pathlib import Path

import pytest
import torch

from kmipgt.ops import kmip_attention
from sharded_attention_cases import CASES, case_inputs, nan_on_rank_one, rank_one_dies, run_cases
from spawn_ranks import RanksFailed, run_torchrun, spawn_ranks

pytestmark = pytest.mark.distributed

WORLD = 2


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory):
    """``{case name: [rank 0's result, rank 1's result]}`` of one spawned run over every case."""
    out_dir = tmp_path_factory.mktemp("sharded")
    spawn_ranks(run_cases, WORLD, str(tmp_path_factory.mktemp("cache")), list(CASES), str(out_dir))
    return {name: [torch.load(out_dir / f"{name}_{r}.pt") for r in range(WORLD)] for name in CASES}


def _reference(case):
    query, key, value, grad_out, ptr = case_inputs(case)
    q, k, v = (t.clone().requires_grad_() for t in (query, key, value))
    out = kmip_attention(q, k, v, case.k, ptr=ptr)
    out.backward(grad_out)
    return {"out": out.detach(), "query": q.grad, "key": k.grad, "value": v.grad}


@pytest.mark.parametrize("name", list(CASES))
def test_output_and_gradients_equal_the_single_process_op(rank_results, name):
    expected = _reference(CASES[name])
    for field, value in expected.items():
        got = torch.cat([result[field] for result in rank_results[name]])
        message = lambda m, field=field: f"{name} {field}: {m}"  # noqa: E731
        torch.testing.assert_close(got, value, rtol=1e-5, atol=1e-5, msg=message)


def test_remote_cases_select_only_the_other_ranks_keys():
    """The remote-top-k inputs do what they claim: no query's top-k holds a key of its own rank."""
    case = CASES["remote_topk_1000_k16"]
    query, key, _, _, ptr = case_inputs(case)
    _, output = kmip_attention(query, key, key, case.k, ptr=ptr, return_selection=True)
    own_rank = torch.arange(query.shape[0]) >= case.split[0]
    assert bool(((output.index >= case.split[0]) != own_rank[:, None, None]).all())


@pytest.mark.parametrize("name", ["one_graph_1000_k16", "ragged_1000_k1"])
def test_bytes_sent_follow_the_formula(rank_results, name):
    """Forward: each rank's block once (keys, then values); backward: keys, values and their gradient
    accumulators once, and the accumulators home; metadata: two all-gathers of 2 and 4 int64."""
    case = CASES[name]
    for rank, result in enumerate(rank_results[name]):
        own, other = case.split[rank], case.split[1 - rank]
        row_bytes = case.heads * (case.dim + case.dim) * 4  # key + value rows, float32
        assert result["sent"] == {
            "metadata": (2 + 4) * 8,
            "forward": own * row_bytes,
            "backward": 2 * own * row_bytes + other * row_bytes,
        }


def test_bad_input_on_one_rank_raises_on_every_rank(tmp_path):
    with pytest.raises(RanksFailed, match=r"holds NaN"):
        spawn_ranks(nan_on_rank_one, WORLD, str(tmp_path))


def test_a_failing_rank_fails_the_run_with_its_error(tmp_path):
    with pytest.raises(RanksFailed, match=re.escape("rank 1 failed on purpose")):
        spawn_ranks(rank_one_dies, WORLD, str(tmp_path))


def test_the_example_under_torchrun_matches_one_process_and_the_formula(tmp_path):
    example = Path(__file__).resolve().parents[2] / "examples" / "sharded_attention.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KMIPGT_CACHE": str(tmp_path)}
    args = ["--nproc-per-node", "2", str(example), "--nodes", "2000", "--heads", "2", "--dim", "8"]
    done = run_torchrun(args, env, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    errors = [float(e) for e in re.findall(r"single process\| = (\S+)", done.stdout)]
    counted = re.findall(r"([\d,]+) bytes \(formula ([\d,]+)\)", done.stdout)
    assert len(errors) == 2 and max(errors) < 1e-4
    assert len(counted) == 4 and all(got == formula for got, formula in counted)
