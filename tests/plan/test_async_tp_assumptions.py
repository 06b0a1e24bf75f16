"""What ``step_time.unpipelined_reduce_scatter_seconds`` rests on, checked against the installed torch, on the CPU:
torch's async TP pass pairs a reduce-scatter only with a matmul that produces its input, not with a sum of matmuls;
and AOTAutograd traces projections' weight gradients before the sum of their input gradients, so the reduce-scatter
of that sum comes after every GEMM of those projections in the compiled backward (docs/planner.md, "TP overlap with
projections apart")."""

from __future__ import annotations

import torch
from functorch.compile import aot_function, make_boxed_func
from torch._inductor.fx_passes.micro_pipeline_tp import _find_producer_matmul
from torch.fx.experimental.proxy_tensor import make_fx

aten = torch.ops.aten


def _traced(x: torch.Tensor, *weights: torch.Tensor) -> torch.fx.Graph:
    """x·w, or the sum of x·w over several weights, as aten ops."""

    def summed(a: torch.Tensor, *ws: torch.Tensor) -> torch.Tensor:
        out = torch.mm(a, ws[0])
        for w in ws[1:]:
            out = out + torch.mm(a, w)
        return out

    return make_fx(summed)(x, *weights).graph


def _output_node(graph: torch.fx.Graph) -> torch.fx.Node:
    output = next(node for node in graph.nodes if node.op == "output")
    return output.args[0]


def test_a_reduce_scatter_of_one_matmul_finds_its_producer_and_of_a_sum_does_not() -> None:
    x, w = torch.randn(16, 8), torch.randn(8, 4)
    one = _traced(x, w)
    assert _find_producer_matmul(_output_node(one)) is not None
    summed = _traced(x, w, torch.randn(8, 4), torch.randn(8, 4))
    last = _output_node(summed)
    assert last.target is aten.add.Tensor
    assert _find_producer_matmul(last) is None


def test_the_backward_sums_the_input_gradients_after_every_weight_gradient() -> None:
    graphs: list[torch.fx.GraphModule] = []

    def backward_compiler(module: torch.fx.GraphModule, _inputs: object) -> object:
        graphs.append(module)
        return make_boxed_func(module.forward)

    def projections(x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor) -> torch.Tensor:
        return (x @ wq.t()).sum(-1) + (x @ wk.t()).sum(-1) + (x @ wv.t()).sum(-1)

    compiled = aot_function(
        projections, fw_compiler=lambda m, _: make_boxed_func(m.forward), bw_compiler=backward_compiler
    )
    x = torch.randn(16, 8, requires_grad=True)
    weights = [torch.randn(n, 8, requires_grad=True) for n in (8, 4, 4)]
    compiled(x, *weights).sum().backward()
    nodes = list(graphs[0].graph.nodes)
    matmuls = [i for i, node in enumerate(nodes) if node.target is aten.mm.default]
    assert len(matmuls) == 6  # each projection's input and weight gradient
    input_gradient = nodes.index(_output_node(graphs[0].graph)[0])  # the gradient of x, returned first
    assert nodes[input_gradient].target is aten.add.Tensor
    assert max(matmuls) < input_gradient
