"""Fake mode on models users build by hand (issue 27): PyTorch's own transformer modules, a constructor that
reads integers back from tensors (torchvision's RegNet), cuDNN's recurrent layers, transposed and 3-D
convolutions."""

import copy

import pytest
import torch
import torch.nn as nn

from labkit.memory.trace.fake.conv_workspace import TRANSPOSED_PASS, conv_workspace_bytes
from labkit.memory.trace.fake.cudnn_rnn import ASSUMPTION, reserve_bytes, workspace_bytes
from labkit.memory.trace.step import Probes, measure_step
from labkit.workloads.corpus import get_case, predict


def test_deepcopy_of_a_module_made_in_fake_mode_stays_in_that_mode():
    """nn.TransformerEncoder clones its layer with copy.deepcopy: the clones' parameters are new fake tensors of
    the same fake mode (not a new mode, as Tensor.__deepcopy__ makes them), flagged as parameters."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from labkit.memory.trace.fake.fake_runtime import fake_deepcopy

    with FakeTensorMode() as mode, fake_deepcopy():
        lin = nn.Linear(8, 8)
        lin.weight.note = "kept"
        twin = copy.deepcopy(lin)
    assert twin.weight.fake_mode is mode and twin.weight is not lin.weight
    assert twin.weight.untyped_storage() is not lin.weight.untyped_storage()
    assert isinstance(twin.weight, nn.Parameter) and twin.weight.requires_grad and twin.weight.note == "kept"


@pytest.mark.parametrize("name", ["hand-encoder-b16-s512-amp-bf16@tiny", "hand-decoder-b16-s512-fp32@tiny",
                                  "hand-mha-b16-s512-amp-bf16@tiny"])
def test_pytorch_transformer_modules_with_masks_are_predicted(name):
    from labkit.workloads.corpus import build_model

    case = get_case(name)
    rep = predict(case, steps=1)
    assert rep.peak_bytes > 0
    # every cloned layer has its own parameters: counted, not aliased
    assert rep.num_params == sum(p.numel() for p in build_model(case).parameters())


def test_regnet_stage_widths_are_read_back_at_construction():
    """torchvision's RegNet computes its widths with torch ops and reads them with .tolist(): fake mode knows
    values computed from Python numbers alone (constants.py), so it builds the model as the GPU run does."""
    case = get_case("tv-regnet_y_1_6gf-b128-fp32@tiny")
    rep = predict(case, steps=1)
    from labkit.workloads.corpus import build_model

    real = sum(p.numel() for p in build_model(case).parameters())
    assert rep.num_params == real


class _ReadsBack(nn.Module):
    """A constructor that sizes its layers from a tensor's values (the RegNet pattern)."""

    def __init__(self) -> None:
        super().__init__()
        widths = (torch.arange(3) * 16 + 16).tolist()           # [16, 32, 48]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip([8] + widths, widths))

    def forward(self, x):
        for lin in self.layers:
            x = lin(x)
        return x


def test_known_values_are_only_those_computed_from_python_numbers():
    rep = measure_step(_ReadsBack, torch.randn(4, 8), loss_fn=lambda out, batch: out.sum(), device="fake-cuda",
                       steps=1)
    assert rep.num_params == sum(p.numel() for p in _ReadsBack().parameters())

    class ReadsData(nn.Module):         # an integer read of the *input* still refuses: its value is unknown
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            return self.lin(x)[: int(x.abs().sum().long())]

    from labkit.core.errors import LabkitError

    with pytest.raises(LabkitError, match="integer"):
        measure_step(ReadsData, torch.randn(4, 8), loss_fn=lambda out, batch: out.sum(), device="fake-cuda", steps=1)


def test_lstm_runs_as_cudnn_with_its_reserve_space():
    """nn.LSTM in fake mode is cuDNN's _cudnn_rnn (not the CPU's oneDNN layer with an empty workspace): the
    reserve space is held from forward to backward, on top of the output."""
    from dataclasses import replace

    tiny = get_case("hand-lstm-b64-s256-fp32@tiny")
    case = replace(tiny, micro_batch=16, seq=256, overrides=dict(tiny.overrides, hidden=256))
    rep = predict(case, steps=1, probes=Probes(op_log=True))
    ops = {o.name for o in rep.op_log}
    assert not any("mkldnn_rnn" in o for o in ops)
    assert ASSUMPTION in rep.emulation["assumptions"]
    o = case.overrides
    reserve = reserve_bytes("lstm", o["layers"], 1, case.seq, case.micro_batch, o["hidden"], 4)
    assert reserve == (o["layers"] * 5 + o["layers"] - 1) * case.seq * case.micro_batch * o["hidden"] * 4 + 256
    # the same model with the reserve rule zeroed predicts less by about the reserve
    import labkit.memory.trace.fake.cudnn_rnn as rnn

    orig = rnn.reserve_bytes
    rnn.reserve_bytes = lambda *a, **k: 0
    try:
        without = predict(case, steps=1).peak_bytes
    finally:
        rnn.reserve_bytes = orig
    assert rep.peak_bytes - without >= reserve - 4096


def _rnn_rows():
    from labkit.core.provenance import load_measurement
    from labkit.memory.trace.recorded import measure_dir

    doc = load_measurement(measure_dir() / "rnn_cudnn__h200.json", kind="cudnn_rnn")
    return [r for r in doc["data"]["rows"] if "error" not in r]


def _rnn_args(r):
    return (r["mode"], r["layers"], 2 if r["bidirectional"] else 1, r["steps"], r["batch"], r["hidden"],
            4 if r["dtype"] == "fp32" else 2)


def test_rnn_reserve_is_what_cudnn_returned_on_the_h200():
    """record_handmade.py --part rnn: the reserve torch._cudnn_rnn returned (cudnnGetRNNTempSpaceSizes), LSTM and
    GRU, 1-2 layers, hidden 256/1024, batch 16/64, 64/256 steps, float32/bf16: the rule to the byte."""
    rows = _rnn_rows()
    assert len(rows) == 64
    for r in rows:
        assert reserve_bytes(*_rnn_args(r)) == r["reserve_bytes"], _rnn_args(r)


def test_rnn_workspace_is_the_block_cudnn_took_in_forward_and_backward():
    """The largest block taken and freed inside the module's forward (and again inside its backward) is the
    workspace: the rule within 0.3% for every LSTM shape, 1.2% for every GRU shape."""
    for r in _rnn_rows():
        seen = max(r["forward"]["transient_blocks"])
        assert seen in r["backward"]["transient_blocks"]
        got = workspace_bytes(*_rnn_args(r), r["input_size"])
        tol = 0.003 if r["mode"] == "lstm" else 0.012
        assert abs(got - seen) <= tol * seen, (_rnn_args(r), got, seen)


@pytest.mark.parametrize("name", ["hand-lstm-b64-s256-fp32", "hand-gru-b64-s256-amp-bf16"])
def test_rnn_language_models_against_the_fresh_recording(name):
    """With the recorded reserve and workspace sizes the LSTM / GRU language models' peaks are within 0.2% of the
    H200's fresh-process recording (they were 0.5-0.8% high), reserved within 1%."""
    from labkit.memory.trace.corpus_check import load_plain, validate

    (rec,) = [r for r in load_plain(process="fresh") if r.name == name]
    (v,) = validate([rec])
    assert abs(v.peak_error_pct) <= 0.2 and abs(v.reserved_error_pct) <= 1.0, (v.peak_error_pct, v.reserved_error_pct)


def test_amp_rnn_keeps_a_float16_copy_of_the_weights():
    """Under autocast _cudnn_rnn_cast_reflatten (AutocastRNN.cpp) casts the weights into one new flat float16
    buffer (kHalf, also under bfloat16 autocast), kept for backward; fp32 runs on the module's own weights."""
    from labkit.workloads.corpus import build_model

    case = get_case("hand-gru-b64-s256-amp-bf16@tiny")
    n = sum(p.numel() for p in build_model(case).rnn.parameters())
    amp = predict(case, steps=1, probes=Probes(op_log=True))
    fp32 = predict(get_case("hand-gru-b64-s256-fp32@tiny"), steps=1, probes=Probes(op_log=True))
    flat = f"-> float16[{n}]"
    assert any(o.name == "aten.empty.memory_format" and o.shapes.endswith(flat) for o in amp.op_log)
    assert not any(o.shapes.endswith(flat) or o.shapes.endswith(f"-> float32[{n}]") for o in fp32.op_log
                   if o.phase == "forward")


def test_transposed_convolution_passes_are_the_passes_they_run():
    """ConvShared.cpp: a transposed convolution's forward is cuDNN's backward-data of the convolution it
    transposes, its input gradient that convolution's forward, its weight gradient its backward-filter."""
    x, w, y = (8, 1024, 16, 16), (1024, 512, 2, 2), (8, 512, 32, 32)
    for p in ("forward", "backward_data", "backward_filter"):
        t = conv_workspace_bytes(p, x, w, y, (2, 2), (0, 0), (1, 1), 1, torch.bfloat16, transposed=True)
        plain = conv_workspace_bytes(TRANSPOSED_PASS[p], y, w, x, (2, 2), (0, 0), (1, 1), 1, torch.bfloat16)
        assert t == plain and t[0] > 0


def test_3d_convolutions_take_their_ndhwc_copies_and_1d_ones_those_of_their_2d_view():
    n, why = conv_workspace_bytes("forward", (8, 64, 16, 56, 56), (64, 64, 3, 3, 3), (8, 64, 16, 56, 56), (1, 1, 1),
                                  (1, 1, 1), (1, 1, 1), 1, torch.bfloat16)
    assert why is None and n == (2 * 8 * 64 * 16 * 56 * 56 + 64 * 64 * 27) * 2
    # Convolution.cpp views a 1-D convolution as a 2-D one of height 1 (conv_workspace.py; was assumed none)
    n, why = conv_workspace_bytes("forward", (8, 64, 56), (64, 64, 3), (8, 64, 56), (1,), (1,), (1,), 1, torch.float32)
    assert why is None and n == (2 * 8 * 64 * 56 + 64 * 64 * 3) * 4


class _PackedLSTM(nn.Module):
    """The usual variable-length recipe: pack_padded_sequence, a bidirectional LSTM, pad_packed_sequence."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.head = nn.Embedding(100, 32), nn.Linear(64, 100)
        self.rnn = nn.LSTM(32, 32, 2, batch_first=True, bidirectional=True)

    def forward(self, x, lengths, y):
        packed = nn.utils.rnn.pack_padded_sequence(self.emb(x), lengths, batch_first=True, enforce_sorted=False)
        out, _ = nn.utils.rnn.pad_packed_sequence(self.rnn(packed)[0], batch_first=True, total_length=x.shape[1])
        return nn.functional.cross_entropy(self.head(out).flatten(0, 1), y.flatten())


def test_packed_sequences_run_at_the_batch_lengths_or_at_their_full_length():
    """pack_padded_sequence's lengths are values: the batch's own lengths (a small integer tensor of the batch,
    whose values fake mode keeps) pack exactly sum(lengths) tokens, as on the GPU; lengths fake mode cannot know
    (computed from the data on the device) take every sequence at its full length (stated). Either way the packed
    LSTM runs as cuDNN's RNN."""
    from labkit.memory.trace.fake.cudnn_rnn import PACKED_ASSUMPTION

    batch = {"x": torch.randint(0, 100, (4, 16)), "lengths": torch.tensor([16, 12, 9, 3]),
             "y": torch.randint(0, 100, (4, 16))}
    packed: list[torch.Size] = []

    def run(model_cls):
        return measure_step(model_cls, batch, loss_fn=lambda out, b: out, call=lambda m, b: m(**b),
                            device="fake-cuda", steps=1)

    class Seen(_PackedLSTM):
        def forward(self, x, lengths, y):
            packed.append(nn.utils.rnn.pack_padded_sequence(self.emb(x), lengths, batch_first=True,
                                                            enforce_sorted=False).data.shape)
            return super().forward(x, lengths, y)

    rep = run(Seen)
    assert rep.peak_bytes > 0 and packed[0] == (16 + 12 + 9 + 3, 32)
    assert PACKED_ASSUMPTION not in rep.emulation["assumptions"] and ASSUMPTION in rep.emulation["assumptions"]

    class FromData(_PackedLSTM):       # lengths computed on the device from the embeddings: values unknown
        def forward(self, x, lengths, y):
            return super().forward(x, (self.emb(x)[..., 0] > -1e9).sum(1).cpu(), y)

    rep = run(FromData)
    assert PACKED_ASSUMPTION in rep.emulation["assumptions"] and ASSUMPTION in rep.emulation["assumptions"]


class _CTCHead(nn.Module):
    """Wav2Vec2ForCTC's loss in small: padded labels (-100) flattened with ``masked_select``, their lengths summed
    from the mask, float32 log-probabilities (time, batch, classes), ``F.ctc_loss``."""

    def __init__(self, lengths_from_data: bool = False) -> None:
        super().__init__()
        self.lin, self.lengths_from_data = nn.Linear(8, 6), lengths_from_data

    def forward(self, x, labels):
        lp = self.lin(x).log_softmax(-1).transpose(0, 1)
        mask = labels >= 0
        lengths = (lp[0, :, 0] < 1).sum() * torch.ones_like(labels[:, 0]) if self.lengths_from_data else mask.sum(-1)
        inputs = torch.full((x.shape[0],), x.shape[1], dtype=torch.long)
        return nn.functional.ctc_loss(lp, labels.masked_select(mask), inputs, lengths)


def test_a_ctc_loss_on_the_batch_labels_is_predicted_with_cudas_outputs():
    """The batch's small integer tensors keep their values in fake mode (the GPU run computes with the same), so
    ``masked_select`` and the CTC loss's shapes are known; the loss's outputs and its backward's are CUDA's
    (LossCTC.cu: log_alpha (batch, time, 2 * longest target + 1), then the loss; backward log_beta, then the
    gradient). Lengths computed from the data on the device stay unknown: one line refuses the op."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from labkit.memory.trace.fake.fake_cuda import ctc_loss_outputs
    from labkit.memory.trace.step import FakeModeUnsupported

    labels = torch.tensor([[1, 2, 3, -100], [4, 5, -100, -100], [1, 1, 2, 2]])
    batch = {"x": torch.randn(3, 10, 8), "labels": labels}
    rep = measure_step(_CTCHead, batch, loss_fn=lambda out, b: out, call=lambda m, b: m(**b), device="fake-cuda",
                       steps=1)
    assert rep.peak_bytes > 0
    with pytest.raises(FakeModeUnsupported, match=r"^fake mode cannot run op aten\._ctc_loss\.Tensor in module "
                                                  r"_CTCHead during forward \(fake tensors: its output shape"):
        measure_step(lambda: _CTCHead(lengths_from_data=True), batch, loss_fn=lambda out, b: out,
                     call=lambda m, b: m(**b), device="fake-cuda", steps=1)

    lp = torch.randn(10, 3, 6).log_softmax(-1)
    flat, lens = labels[labels >= 0], (labels >= 0).sum(-1)
    real = torch.ops.aten._ctc_loss.Tensor(lp, flat, torch.full((3,), 10), lens)
    grad = torch.ops.aten._ctc_loss_backward.Tensor(torch.ones(3), lp, flat, torch.full((3,), 10), lens, *real, 0)

    class Books:
        def __init__(self):
            self.shapes = []

        def track(self, t):
            self.shapes.append(tuple(t.shape))

    books, padded = Books(), labels.clamp(min=0)
    with FakeTensorMode() as mode:
        conv = mode.fake_tensor_converter
        f = {k: conv.from_real_tensor(mode, v, make_constant=k == "lens") for k, v in
             {"lp": lp, "flat": flat, "il": torch.full((3,), 10), "lens": lens}.items()}
        nll, alpha = ctc_loss_outputs(torch.ops.aten._ctc_loss.Tensor, (f["lp"], f["flat"], f["il"], f["lens"], 0),
                                      {}, books)
        g = ctc_loss_outputs(torch.ops.aten._ctc_loss_backward.Tensor,
                             (torch.ones(3), f["lp"], f["flat"], f["il"], f["lens"], nll, alpha, 0), {}, books)
        f2 = conv.from_real_tensor(mode, padded)              # (batch, longest) targets: no values needed
        _, alpha2 = ctc_loss_outputs(torch.ops.aten._ctc_loss.Tensor, (f["lp"], f2, f["il"], conv.from_real_tensor(
            mode, lens), 0), {}, books)
    assert (nll.shape, alpha.shape, g.shape) == (real[0].shape, real[1].shape, grad.shape) == (
        (3,), (3, 10, 2 * 4 + 1), (10, 3, 6))
    assert alpha2.shape == (3, 10, 2 * 4 + 1)
    # the order the CUDA kernels allocate in: log_alpha, (the loss, tracked by the caller), log_beta, the gradient
    assert books.shapes == [(3, 10, 9), (3, 10, 9), (10, 3, 6), (3, 10, 9)]


def test_boolean_mask_indexing_with_a_mask_made_on_the_host_is_predicted():
    """Wav2Vec2's SpecAugment: ``hidden[mask] = embed`` with a mask made from a NumPy array in the forward
    (``torch.tensor`` of host data keeps its values in every phase); its backward indexes the gradient with the
    mask. Fake mode indexes with the mask's nonzero indices, as ATen does (IndexingUtils.h, expandTensors)."""
    import numpy as np
    from torch._subclasses.fake_tensor import FakeTensorMode

    from labkit.memory.trace.fake.constants import known_mask_indexing

    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.embed = nn.Linear(8, 8), nn.Parameter(torch.zeros(8))

        def forward(self, x):
            h = self.lin(x)
            mask = torch.tensor(np.arange(h.shape[0] * h.shape[1]).reshape(h.shape[:2]) % 3 == 0, device=h.device)
            h[mask] = self.embed
            return h[mask].sum() + h.sum()

    rep = measure_step(Masked, torch.randn(4, 6, 8), loss_fn=lambda out, b: out, device="fake-cuda", steps=1)
    assert rep.peak_bytes > 0

    x, mask = torch.randn(4, 6, 8), torch.rand(4, 6) > 0.5
    other = mask.clone()                       # a fake of its own, without values
    with FakeTensorMode() as mode:
        fx = mode.from_tensor(x)
        fm = mode.fake_tensor_converter.from_real_tensor(mode, mask, make_constant=True)
        out, nbytes = known_mask_indexing(torch.ops.aten.index.Tensor, (fx, [fm]), {})
        unknown, _ = known_mask_indexing(torch.ops.aten.index.Tensor, (fx, [mode.from_tensor(other)]), {})
    assert out.shape == x[mask].shape and nbytes == int(mask.sum()) * 2 * 8 and unknown is NotImplemented
