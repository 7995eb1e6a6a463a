"""benchmarks/gpu/record_ckpt_nodes.py (the per-node memory trace of a checkpointed math-SDPA step) runs
on the CPU in its smoke mode and hooks every autograd node of the step."""

from labkit.core.provenance import load_measurement


def test_ckpt_node_trace_smoke_runs_on_cpu(tmp_path, bench_script):
    assert bench_script("record_ckpt_nodes").main(["--out", str(tmp_path), "--smoke"]) == 0
    cases = load_measurement(tmp_path / "ckpt_nodes.json", kind="ckpt_nodes")["data"]["cases"]
    assert [c["case"]["checkpoint_impl"] for c in cases] == ["hf", "torch"]
    for c in cases:
        names = [n["node"] for n in c["nodes"]["nodes"]]
        # every node ran under both hooks (one row each), the attention's softmax among them
        assert names[0] == "NllLossBackward0" and "SafeSoftmaxBackward0" in names
        assert all(n["before"] is not None for n in c["nodes"]["nodes"])
