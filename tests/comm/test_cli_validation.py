"""``labkit comm``: bad numbers and flags are refused at the boundary (exit 2, one line naming the
flag) before any rank is spawned; the benchmark's buffer budget covers all ranks of a machine."""

import pytest

from labkit.cli import main


@pytest.mark.parametrize("argv,needle", [
    (["buckets", "--batch-size", "0"], "argument --batch-size: must be an integer >= 1, got '0'"),
    (["buckets", "--micro-batch", "-2"], "argument --micro-batch: must be an integer from 1 to 65536"),
    (["buckets", "--amp", "float99"], "argument --amp: 'float99' is not an autocast dtype"),
    (["buckets", "--precision", "bf16-mixed"], "argument --precision: 'bf16-mixed' does not apply here"),
    (["buckets", "--precision", "fp99"], "argument --precision: precision 'fp99' is not one of"),
    (["buckets", "--sizes", "inf"], "--sizes: bucket size must be a positive finite number of MiB, got 'inf'"),
    (["buckets", "--sizes", "1,nan"], "--sizes: bucket size must be a positive finite number"),
    (["buckets", "--sizes", "1e9"], "--sizes: bucket size 1e+09 MiB is above"),
    (["buckets", "--steps", "0"], "argument --steps: must be an integer from 1 to 1000"),
    (["buckets", "--warmup", "1"], "argument --warmup: must be an integer from 2 to 1000"),
    (["buckets", "--world", "0"], "argument --world: must be an integer >= 1"),
    (["buckets", "--world", "1000"], "--world 1000: at most 64 processes"),
    (["bench", "--world", "24", "--min-bytes", "100MiB", "--max-bytes", "1TB"], "above its"),
    (["bench", "--max-bytes", "1e400"], "largest size: '1e400' is not a finite size"),
    (["bench", "--factor", "1"], "argument --factor: must be an integer >= 2"),
    (["bench", "--repeats", "0"], "argument --repeats: must be an integer from 1 to 10000"),
    (["bench", "--warmup", "-1"], "argument --warmup: must be an integer from 0 to 1000"),
])
def test_refused_before_spawning(capsys, argv, needle):
    rc = main(["comm", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and needle in err, err


def test_buffer_bytes_count_every_rank_of_the_machine():
    from labkit.comm.bench import machine_buffer_bytes, rank_buffer_bytes

    assert rank_buffer_bytes("all_reduce", 1 << 20, 4) == 1 << 20
    assert rank_buffer_bytes("all_gather", 1 << 20, 4) == (1 << 20) + (1 << 18)   # output + this rank's input
    # CPU ranks share the host's memory: 24 ranks of 1 GiB are 24 GiB of it; a GPU rank has its own GPU
    assert machine_buffer_bytes("all_reduce", 1 << 30, 24, 24, is_cuda=False) == 24 << 30
    assert machine_buffer_bytes("all_reduce", 1 << 30, 24, 8, is_cuda=True) == 1 << 30


def test_cpu_budget_is_for_the_whole_machine():
    from labkit.comm.bench import CPU_BUFFER_BUDGET, buffer_budget

    budget, what = buffer_budget(False)
    assert 0 < budget <= CPU_BUFFER_BUDGET and "together" in what
