"""cuDNN's recurrent layers in fake mode (``labkit/memory/trace/fake/cudnn_rnn.py``): what ``_cudnn_rnn`` and its
backward allocate, in ``aten/src/ATen/native/cudnn/RNN.cpp``'s order, against the H200's recordings."""

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


def _grid():
    from labkit.core.provenance import load_measurement
    from labkit.memory.trace.recorded import measure_dir
    from labkit.workloads.corpus import split_of

    doc = load_measurement(measure_dir() / "rnn_grid__h200.json", kind="cudnn_rnn_grid")["data"]
    rows = [dict(r, split=split_of(r["name"]), e=4 if r["dtype"] == "fp32" else 2) for r in doc["rows"]]
    assert len(rows) == 157 and not any("error" in r for r in rows)
    return doc, rows


def _args(r):
    tokens = r["tokens"] if r["packed"] else None
    return (r["mode"], r["layers"], r["dirs"], r["seq"], r["batch"], r["hidden"], r["e"]), tokens


def test_the_reserve_is_what_cudnn_returned_for_every_grid_configuration():
    """record_rnn.py on the H200: bidirectional, packed (the tokens, not seq x batch), plain RNNs, projections
    (5 projection-sized vectors more per layer and direction), dropout (a bit per element of every later layer's
    input, per direction), small hidden sizes: every reserve to the byte, held-out third included."""
    _, rows = _grid()
    for r in rows:
        args, tokens = _args(r)
        assert reserve_bytes(*args, tokens=tokens, proj=r["proj"], dropout=r["dropout"] > 0) == r["reserve_bytes"], \
            r["name"]
        assert r["inference_reserve_bytes"] == 0


def test_the_standard_workspace_rule_on_the_grid_reference_and_held_out():
    """The training workspace (one block, the same in forward and both backward calls) of the standard algorithm:
    unpacked within 0.75% on the reference rows and 0.6% on the held-out (but one: a 2-layer unidirectional LSTM with
    dropout took 16 MiB more, which no other dropout row did); packed exact on the reference rows, within 1.5% on the
    held-out but a stacked unidirectional plain RNN's (+21%: a kind no reference row had)."""
    from labkit.memory.trace.fake.cudnn_rnn import workspace_bytes

    _, rows = _grid()
    worst: dict[tuple[bool, str], float] = {}
    for r in rows:
        ws = max(r["forward"]["transient_blocks"])
        assert r["backward"]["transient_blocks"] == [max(r["backward"]["transient_blocks"])] * 2
        odd = r["name"] == "lstm-L2-D1-H512-I512-B64-S128-fp32-drop0.2"
        if r["algo_forward"] != "standard" or r["algo_backward"] != "standard" or odd:
            continue
        assert max(r["backward"]["transient_blocks"]) == ws
        args, tokens = _args(r)
        err = abs(workspace_bytes(*args, r["input_size"], tokens=tokens, proj=r["proj"]) - ws) / ws
        key = (r["packed"], r["split"] + ("-rnn-stacked-uni" if r["mode"].startswith("rnn") and r["layers"] > 1
                                          and r["dirs"] == 1 and r["packed"] else ""))
        worst[key] = max(worst.get(key, 0.0), err)
    assert worst[(False, "reference")] < 0.0075 and worst[(False, "held-out")] < 0.006, worst
    assert worst[(True, "reference")] < 0.001 and worst[(True, "held-out")] < 0.015, worst
    assert worst[(True, "held-out-rnn-stacked-uni")] < 0.22, worst


def test_the_algorithm_is_rnn_cpps_choice_and_the_dropout_state_its_size():
    """cudnn_algo follows RNN.cpp's get_algo as the recorder's own copy labelled every grid row on the H200
    (sm 9.0, 132 SMs); the dropout state is the bytes torch._cudnn_init_dropout_state returned there."""
    from labkit.memory.trace.fake.cudnn_rnn import DROPOUT_STATE_BYTES, cudnn_algo

    doc, rows = _grid()
    assert doc["sm"] == [9, 0, 132] and doc["dropout_state_bytes"] == DROPOUT_STATE_BYTES
    for r in rows:
        for fwd, key in ((True, "algo_forward"), (False, "algo_backward")):
            assert cudnn_algo(r["mode"], r["layers"], r["dirs"], r["hidden"], r["input_size"], r["batch"], r["seq"],
                              r["dtype"] == "fp16", r["packed"], r["proj"], fwd, (9, 0), 132) == r[key], r["name"]


def test_bidirectional_packed_projected_rnns_against_the_fresh_recording():
    """The H200's fresh processes: the bidirectional LSTM tagger (+25% before), the packed GRU (+96%), and a case
    predicted before its recording (a packed encoder padded back, +23%): every peak within 0.5% (the target is 3%;
    the other RNN cases: README's plain validation)."""
    from labkit.memory.trace.corpus_check import load_plain, validate

    names = {"hand-bilstm-b64-s256-fp32", "hand-packed-gru-b64-s256-amp-bf16", "hand-packed-gru-enc-b64-s200-amp-bf16"}
    rows = validate([r for r in load_plain(process="fresh") if r.name in names])
    assert {v.name for v in rows} == names
    assert all(abs(v.peak_error_pct) <= 0.5 for v in rows), [(v.name, v.peak_error_pct) for v in rows]


def test_a_training_rnn_with_dropout_holds_cudnns_dropout_state():
    """RNN.cpp get_dropout_state: a training RNN with inter-layer dropout makes the state once and keeps it: the
    tagger with dropout predicts at least that much more than the same model without, in its first step."""
    from dataclasses import replace

    from labkit.memory.trace.fake.cudnn_rnn import DROPOUT_STATE_BYTES

    case = get_case("hand-bilstm3-drop-b32-s256-fp32@tiny")
    without = replace(case, overrides=dict(case.overrides, dropout=0.0))
    assert predict(case, steps=1).peak_bytes - predict(without, steps=1).peak_bytes >= DROPOUT_STATE_BYTES
