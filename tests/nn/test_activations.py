"""kmipgt's ReLU: torch.relu's values and gradients, and no boolean mask saved by a compiled CPU graph."""

import functools

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch._inductor.decomposition import select_decomp_table

from kmipgt.nn.activations import relu


def _saved_dtypes(fn, *inputs) -> tuple[list[torch.dtype], torch.Tensor]:
    """The dtypes of what the compiled forward of ``fn`` hands to its backward (inductor's decompositions
    and partitioner, no code generated), and the gradient of the first input."""
    saved: list[torch.dtype] = []

    def forward_compiler(graph: torch.fx.GraphModule, _):
        outputs = next(node for node in graph.graph.nodes if node.op == "output").args[0]
        saved.extend(node.meta["val"].dtype for node in outputs if isinstance(node, torch.fx.Node))
        return make_boxed_func(graph)

    partition = functools.partial(min_cut_rematerialization_partition, compiler="inductor")
    backend = aot_autograd(fw_compiler=forward_compiler, bw_compiler=lambda graph, _: make_boxed_func(graph),
                           decompositions=select_decomp_table(), partition_fn=partition)
    torch._dynamo.reset()
    (grad,) = torch.autograd.grad(torch.compile(fn, backend=backend, fullgraph=True)(*inputs), inputs[0])
    return saved, grad


def test_relu_has_torch_relus_values_and_gradients_eager_and_compiled():
    x = torch.tensor([[-2.0, 0.0, 3.5, -0.0], [1e-30, -1e-30, 7.0, 0.0]], requires_grad=True)
    weight = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])

    def loss(x, activation):
        return (activation(x) * weight).sum()

    (expected,) = torch.autograd.grad(loss(x, torch.relu), x)
    assert torch.equal(relu(x), torch.relu(x))
    assert torch.equal(torch.autograd.grad(loss(x, relu), x)[0], expected)
    _, compiled = _saved_dtypes(lambda x: loss(x, relu), x)
    assert torch.equal(compiled, expected)


def test_a_compiled_relu_before_a_residual_sum_saves_no_boolean_mask():
    """GatedGCN's pattern: a ReLU between two linear maps, its output summed with a residual, so the
    ReLU's output is not kept for the backward and only its gradient's mask needs saving."""
    x = torch.randn(64, 8, requires_grad=True)
    weight, residual = torch.randn(8, 8), torch.randn(64, 8)

    def loss(x, activation):
        return ((residual + activation(x @ weight)) @ weight).sum()

    saved, grad = _saved_dtypes(lambda x: loss(x, relu), x)
    torch.testing.assert_close(grad, torch.autograd.grad(loss(x, torch.relu), x)[0])
    if torch.__version__ < "2.13":
        pytest.skip("before torch 2.13 the partitioner saves a mask all the same (seen on 2.11)")
    assert saved and torch.bool not in saved
