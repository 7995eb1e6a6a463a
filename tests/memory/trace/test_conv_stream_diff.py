"""benchmarks/conv_stream_diff.py: fake mode's convolution workspaces paired with the H200's own (recorded allocator
streams of reference cases); held-out cases are refused."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
STREAMS = ROOT / "data/measurements/measure/alloc_stream"
MiB = 1 << 20


def test_held_out_cases_are_refused(capsys, bench_script):
    assert bench_script("conv_stream_diff").main(["tv-regnet_x_800mf-b128-fp32"]) == 2
    assert "held-out, never used for diagnosis" in capsys.readouterr().err


def test_transients_are_paired_in_order_and_labelled_with_their_pass(bench_script):
    mod = bench_script("conv_stream_diff")
    a, b = ("forward", (8, 64, 56, 56)), ("backward_data", (8, 64, 56, 56))
    calls = [(a, 12 * MiB), (("forward", (8, 3)), 0), (b, 20 * MiB - 100)]
    events = [(1, 40 * MiB, 0), (2, 12 * MiB, 0), (2, -12 * MiB, 0), (3, 512, 0), (3, -512, 0),
              (4, 20 * MiB, 0), (4, -20 * MiB, 0), (1, -40 * MiB, 0)]
    assert mod.pair(calls, events, [12 * MiB, 22 * MiB]) == [(a, 12 * MiB, 12 * MiB), (b, 20 * MiB, 22 * MiB)]


def test_regnet_x_400mf_stream_shows_the_engine_choices_the_shape_rule_misses(bench_script):
    """RegNet-X 400MF b128 fp32 on the H200 (a cold process): the weight gradient of the grouped 3x3 (64 channels,
    16 per group) at 28x28 took 209.5 MiB, and that of the 1x1/2 shortcut from 32 channels 74.4 MiB, in every
    step (conv_workspace.py's rule: 49.5 MiB and none)."""
    mod = bench_script("conv_stream_diff")
    path = str(STREAMS / "stream__tv-regnet_x_400mf-b128-fp32__cold.json.gz")
    for step in ("step2", "step3", "step4"):
        seen = mod.recorded_transients(path, step)
        assert seen.count(219_676_736) == 1 and seen.count(78_028_944) == 1
