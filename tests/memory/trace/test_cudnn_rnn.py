"""cuDNN's recurrent layers in fake mode (``labkit/memory/trace/fake/cudnn_rnn.py``): what ``_cudnn_rnn`` and its
backward allocate, in ``aten/src/ATen/native/cudnn/RNN.cpp``'s order, against the H200's recordings."""

import pytest
import torch

from labkit.memory.trace.fake.cudnn_rnn import reserve_bytes
from labkit.memory.trace.step import Probes
from labkit.workloads.corpus import get_case, predict


def _backward_ops(name: str) -> list:
    rep = predict(get_case(name), steps=1, probes=Probes(op_log=True))
    return [o for o in rep.op_log if o.phase == "backward"]


def test_the_reserve_space_gets_no_gradient():
    """The reserve is an output autograd keeps for backward, not differentiable (derivatives.yaml: _cudnn_rnn's
    backward takes grads[0..2]): no zero gradient of its size is made (fake mode made one in every backward, +25% on
    the bidirectional LSTM tagger whose RNN backward is the peak)."""
    case = get_case("hand-bilstm-b64-s256-fp32@tiny")
    o = case.overrides
    n = reserve_bytes("lstm", o["layers"], 2, case.seq, case.micro_batch, o["hidden"], 4)
    ops = _backward_ops(case.name)
    assert not any(op.shapes.endswith(f"-> uint8[{n}]") for op in ops)
    # the backward's workspaces and copies are taken and freed inside it: the weights' flat gradient is kept
    assert any(op.name == "aten.zeros.default" and op.shapes.startswith(" -> float32[") for op in ops)


def test_an_unused_output_gets_a_zero_gradient_as_rnn_cpp_makes_it():
    """_cudnn_rnn_backward: a gradient nobody gave (the packed GRU classifier reads only the last hidden states, not
    the output) is ``zeros_like(output)``: (tokens, 2 x hidden), float32."""
    case = get_case("hand-packed-gru-b64-s256-fp32@tiny")
    ops = _backward_ops(case.name)
    assert any(op.name == "aten.zeros_like.default" and op.shapes.endswith(f", {2 * case.overrides['hidden']}]")
               for op in ops)
