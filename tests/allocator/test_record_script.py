"""The GPU recording script runs its workloads on the CPU (smoke) and skips CUDA-only parts with a reason."""


from labkit.allocator.sim.config import NO_LIMIT, parse_alloc_conf
from labkit.allocator.experiments import CAPPED_CONFIGS, RECORDED_CONFIGS, train_then_eval, varlen_train

MiB = 1024**2
GiB = 1024**3


def _settings(cfg):
    """The options a configuration sets, in the words of the configuration names ("expandable", "max_split_128", ...)."""
    out = set()
    if cfg.expandable_segments:
        out.add("expandable")
    if cfg.max_split_size != NO_LIMIT:
        out.add(f"max_split_{cfg.max_split_size // MiB}")
    if cfg.garbage_collection_threshold:
        out.add(f"gc_{cfg.garbage_collection_threshold}")
    divisions = {cfg.divisions_for(mib * MiB) for mib in (1, 100, 300, 600, 1500, 3000, 100_000)}
    if divisions == {4}:
        out.add("roundup_4")
    elif divisions != {0}:
        out.add("roundup_list")
    return out


def test_each_recorded_configuration_sets_what_its_name_says():
    """The names label the recorded runs and the fidelity table; the strings are what the H200 ran."""
    for name, conf in RECORDED_CONFIGS.items():
        assert _settings(parse_alloc_conf(conf)) == (set() if name == "default" else set(name.split("+"))), name
    for name, (conf, caps) in CAPPED_CONFIGS.items():
        assert _settings(parse_alloc_conf(conf)) == set(name.split("+")[1:]), name
        assert caps and all(0 < cap < 140 * GiB for cap in caps.values()), name
    # the list form: 1 division below 512 MiB, 2 up to 1 GiB, 4 up to 2 GiB, 8 above
    lst = parse_alloc_conf(RECORDED_CONFIGS["roundup_list"])
    assert [lst.divisions_for(mib * MiB) for mib in (100, 300, 600, 1500, 3000)] == [1, 1, 2, 4, 8]


def test_workloads_run_on_cpu_smoke():
    import torch

    r = varlen_train(torch.device("cpu"), steps=3, smoke=True)
    assert len(r.steps) == 3 and len({s.tokens for s in r.steps}) >= 1
    r2 = train_then_eval(torch.device("cpu"), train_steps=2, eval_batches=1, smoke=True)
    assert [s.phase for s in r2.steps] == ["train", "train", "eval"]


def test_children_skip_cuda_parts_with_a_reason(tmp_path, capsys, bench_script):
    mod = bench_script("record_allocator")
    assert mod.main(["--out", str(tmp_path), "--smoke", "--child", "oom", "--case", "too_large"]) == 0
    assert mod.main(["--out", str(tmp_path), "--smoke", "--child", "empty_cache"]) == 0
    out = capsys.readouterr().out
    assert "skipped, needs CUDA" in out
