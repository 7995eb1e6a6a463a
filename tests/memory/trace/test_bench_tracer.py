"""benchmarks/bench_tracer.py's 7B Llama benchmark (issue 11's speed target) runs, at a short sequence here."""


def test_the_7b_benchmark_runs_with_the_recompute_it_is_given(bench_script, capsys):
    assert bench_script("bench_tracer").main(["--model", "llama-7b", "--repeats", "1", "--seq", "256",
                                              "--recompute", "every-4"]) == 0
    out = capsys.readouterr().out
    assert "batch 1 x 256, bf16, recompute every-4" in out and "6.74B parameters" in out
    assert "median" in out and ": PASS" in out
