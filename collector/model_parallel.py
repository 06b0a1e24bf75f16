"""A small helper for hand-written layer-wise model parallelism (no micro-batches).

Consecutive layers live on consecutive ranks and activations travel with send/recv::

    stage = collector.LayerwiseStage(stage=rank, num_stages=world, module=model_part)
    x = stage.recv_activation(torch.empty(b, h))      # from rank - 1 (not on the first stage)
    with stage.forward():
        y = model_part(x)
    stage.send_activation(y)                           # to rank + 1 (not on the last stage)
    grad = stage.recv_gradient(torch.empty_like(y))    # from rank + 1
    with stage.backward():
        y.backward(grad)
    stage.send_gradient(x.grad)                        # to rank - 1

Every call records a span with the stage, micro-batch (0 unless given), peer and bytes, named
"fwd"/"bwd" like the pipelining integration, so the service splits each recv into dependency
wait and transfer the same way. The first use registers the run as ``naive`` model parallelism
with p stages and one micro-batch, whose bubble floor is (p-1)/p. Works with the collector
disabled: then it is plain send/recv. ``module`` (optional) is this rank's part of the model: its
layers and parameters are counted (``stage_size``) so that unequal stages can be rebalanced.
"""

from __future__ import annotations

import contextlib
from typing import Any

from bubblescope import wire


class LayerwiseStage:
    def __init__(self, stage: int, num_stages: int, group: Any = None, module: Any = None) -> None:
        self.stage = stage
        self.num_stages = num_stages
        self.group = group
        self.module = module  # the stage's layers, counted for the service's rebalancing (optional)
        self._registered = False

    def _span(self, kind: str, microbatch: int, **fields: Any) -> contextlib.AbstractContextManager[Any]:
        from bubblescope import collector

        if not self._registered:
            self._registered = True
            collector.describe_pipeline(
                schedule=wire.LAYERWISE_SCHEDULE,
                num_stages=self.num_stages,
                num_microbatches=1,
                stages=[self.stage],
                modules=None if self.module is None else [self.module],
            )
        return collector.span(kind, stage=self.stage, microbatch=microbatch, **fields)

    def forward(self, microbatch: int = 0) -> contextlib.AbstractContextManager[Any]:
        return self._span("forward", microbatch)

    def backward(self, microbatch: int = 0) -> contextlib.AbstractContextManager[Any]:
        return self._span("backward", microbatch)

    def _transfer(self, kind: str, tensor: Any, peer: int, name: str, microbatch: int) -> Any:
        import torch.distributed as dist

        size = int(tensor.numel() * tensor.element_size())
        with self._span(kind, microbatch, peer=peer, bytes=size, group=wire.PIPELINE_GROUP, name=name):
            if kind == "send":
                dist.send(tensor, dst=peer, group=self.group)
            else:
                dist.recv(tensor, src=peer, group=self.group)
        return tensor

    def send_activation(self, tensor: Any, microbatch: int = 0) -> None:
        self._transfer("send", tensor.detach(), self.stage + 1, wire.P2P_FORWARD, microbatch)

    def recv_activation(self, buffer: Any, microbatch: int = 0) -> Any:
        """Receive into ``buffer``; returns it as a leaf that requires grad (for ``send_gradient``)."""
        self._transfer("recv", buffer, self.stage - 1, wire.P2P_FORWARD, microbatch)
        return buffer.requires_grad_()

    def send_gradient(self, tensor: Any, microbatch: int = 0) -> None:
        self._transfer("send", tensor, self.stage - 1, wire.P2P_BACKWARD, microbatch)

    def recv_gradient(self, buffer: Any, microbatch: int = 0) -> Any:
        return self._transfer("recv", buffer, self.stage + 1, wire.P2P_BACKWARD, microbatch)
