"""The H200 kernel-recording script (benchmarks/gpu/record_kernels.py) runs end to end on the CPU
(--smoke) and writes every table advise's step-time model reads, with provenance."""


from labkit.core.provenance import load_measurement


def test_smoke_run_writes_every_table_with_provenance(tmp_path, capsys, bench_script):
    mod = bench_script("record_kernels")
    assert mod.main(["--smoke", "--budget", "0", "--out", str(tmp_path)]) == 0
    assert "# command: python3 benchmarks/gpu/record_kernels.py" in capsys.readouterr().out   # the header
    doc = load_measurement(tmp_path / "kernel_rates.json", "kernel_rates")
    data = doc["data"]
    assert not [k for k in data if k.endswith("_error")], data
    assert {(r["dtype"], r["layout"]) for r in data["gemm"]} == {(d, lay) for d in ("bf16", "fp32")
                                                                 for lay in ("nt", "nn", "tn")}
    assert all(r["seconds"] > 0 and r["flops"] == 2 * r["m"] * r["n"] * r["k"] for r in data["gemm"])
    kinds = {r["kind"] for r in data["memory"]}
    assert kinds == {"copy", "binary", "unary", "reduce", "softmax", "layer_norm"}
    assert all(r["bytes"] > 0 and r["seconds"] > 0 for r in data["memory"] + data["adamw"])
    assert {r["backend"] for r in data["sdpa"]} == {"math"}   # the CPU has only the math backend
    assert all(r["fwd_bwd_s"] > 0 for r in data["sdpa"])
    host = data["host"]
    for key in ("op_inplace_s", "op_alloc_s", "module_call_nop_s", "backward_node_s", "nonzero_s", "item_s"):
        assert host[key] >= 0
    assert load_measurement(tmp_path / "step_profiles.json", "step_profiles")["data"]["cases"] == []  # budget 0


def test_profiled_kernels_are_classed_by_name(bench_script):
    mod = bench_script("record_kernels")
    assert mod.kernel_class("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNN") == "gemm"
    assert mod.kernel_class("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>") == "attention"
    assert mod.kernel_class("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamW>") == "optimizer"
    assert mod.kernel_class("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>") == "elementwise"


def test_smoke_run_of_the_second_recording(tmp_path, bench_script):
    mod = bench_script("record_kernels")
    assert mod.main(["--smoke", "--only", "extra", "--budget", "0", "--out", str(tmp_path)]) == 0
    data = load_measurement(tmp_path / "kernel_rates_extra.json", "kernel_rates")["data"]
    assert not [k for k in data if k.endswith("_error")], data
    mis = data["gemm_misaligned"]
    assert {r["layout"] for r in mis} == {"nt", "nn", "tn"}
    assert {r["align_bytes"] for r in mis} == {2, 4}          # bf16 and fp32 one element off
    assert all(r["flops"] == 2 * r["m"] * r["n"] * r["k"] for r in mis)
    assert {r["kind"] for r in data["memory_paths"]} == {"broadcast", "cast", "mixed", "strided", "softmax_wide"}
    assert data["grouped_mm"] == []                             # CUDA only
    assert {r["name"] for r in data["conv"]} == {"dense3x3", "depthwise"}
    assert all(r["fwd_s"] > 0 and r["fwd_bwd_s"] > 0 and r["flops"] > 0 for r in data["conv"])


def test_smoke_run_of_the_third_recording(tmp_path, bench_script):
    mod = bench_script("record_kernels")
    assert mod.main(["--smoke", "--only", "extra2", "--budget", "0", "--out", str(tmp_path)]) == 0
    data = load_measurement(tmp_path / "kernel_rates_extra2.json", "kernel_rates")["data"]
    assert not [k for k in data if k.endswith("_error")], data
    rows = [r for k, v in data.items() if k.startswith("norm_index_") for r in v]
    assert {r["kind"] for r in rows} == {"batch_norm", "gather", "embedding", "index_put_acc"}
    assert all(r["fwd_s"] > 0 and r["bytes"] > 0 for r in rows)
    assert data["conv"] and all(r["fwd_s"] > 0 for r in data["conv"])
