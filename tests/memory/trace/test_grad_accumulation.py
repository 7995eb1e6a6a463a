"""The autograd engine sums a tensor's two gradients in place on plain tensors (input_buffer.cpp) and
out of place under any dispatch mode or on fake tensors; fake mode sums in place where a plain loop does."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from labkit.memory.trace.fake.fake_cuda import CudaTarget
from labkit.memory.trace.fake.grad_accumulation import engine_accumulation
from labkit.memory.trace.step import FakeCuda, Probes, measure_step
from labkit.workloads import StepPolicy

ADD = torch.ops.aten.add.Tensor


def _sum_reuses_the_first_gradient(mode=None) -> bool:
    """Whether the engine's sum of sin's and cos's gradients of ``x`` lands in one of them."""
    w = torch.randn(64, 32, requires_grad=True)
    x = w * 1
    y = torch.sin(x) + torch.cos(x)
    seen = {}
    for node in (y.grad_fn.next_functions[0][0], y.grad_fn.next_functions[1][0]):
        node.register_hook(lambda gi, go, n=node.name(): seen.__setitem__(n, gi[0].data_ptr()))
    x.grad_fn.register_prehook(lambda go: seen.__setitem__("sum", go[0].data_ptr()))
    if mode is None:
        y.sum().backward()
    else:
        with mode:
            y.sum().backward()
    return seen["sum"] in (seen["SinBackward0"], seen["CosBackward0"])


class _Quiet(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_plain_backward_sums_in_place_and_a_dispatch_mode_makes_it_out_of_place():
    # the ground truth the rule follows, on this machine's torch (real CPU tensors)
    assert _sum_reuses_the_first_gradient()
    assert not _sum_reuses_the_first_gradient(_Quiet())


def test_engine_accumulation_sums_in_place_only_where_a_plain_tensor_would_be():
    with FakeTensorMode():
        a, b = torch.randn(8, 4), torch.randn(8, 4)
        with torch.no_grad():
            assert engine_accumulation(ADD, (a, b), {}, "backward") is a
            assert engine_accumulation(ADD, (a, a), {}, "backward") is NotImplemented          # one tensor twice
            assert engine_accumulation(ADD, (a.t().t()[:], b), {}, "backward") is NotImplemented  # a view
            assert engine_accumulation(ADD, (a, b.bfloat16()), {}, "backward") is NotImplemented  # promotion
            assert engine_accumulation(ADD, (a, b[:1]), {}, "backward") is NotImplemented         # broadcast
            assert engine_accumulation(ADD, (a.expand(2, 8, 4), b), {}, "backward") is NotImplemented
            assert engine_accumulation(ADD, (a, b), {}, "forward") is NotImplemented
        # grad mode on in backward: a recomputation or create_graph, not the engine's sum
        assert engine_accumulation(ADD, (a, b), {}, "backward") is NotImplemented


class _TiedLM(nn.Module):
    """Tied input and output embeddings (Gemma, BERT): under autocast the output projection's weight
    gradient reaches the weight through the float32 cast, a tensor of its own, summed in place with
    the embedding's gradient on the GPU."""

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.linear(self.emb(ids), self.emb.weight).float().logsumexp(-1).mean()


def test_a_tied_embedding_gradient_is_summed_in_place_in_fake_mode():
    V, H = 4096, 256
    ids = torch.randint(0, V, (2, 8))

    def sums(target):
        rep = measure_step(lambda: _TiedLM(V, H), ids, StepPolicy(precision="amp-bf16"), device="fake-cuda",
                           call=lambda m, b: m(b), loss_fn=lambda out, b: out, steps=1, fake=FakeCuda(target=target),
                           probes=Probes(op_log=True))
        return [(r.name, r.out_bytes) for r in rep.op_log
                if r.phase == "backward" and r.name.startswith("aten.add") and "[4096, 256]" in r.shapes]

    # the plain target keeps what the traced CPU run does (out of place: the tracker is a dispatch mode)
    assert sums(CudaTarget.plain()) == [("aten.add.Tensor", V * H * 4)]
    assert sums(None) == [("aten.add.Tensor", 0)]      # summed into the first gradient: nothing allocated
