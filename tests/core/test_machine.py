from labkit.core.machine import REDACTED, GPUInfo, probe, redact_env
from labkit.env import load_recorded_machine, machine_rows


def test_redacts_secret_looking_variables():
    env = {"HF_TOKEN": "hf_abcdefghijklmnop", "NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": "0,1",
           "TORCH_API_KEY": "x", "NCCL_IB_HCA": "mlx5", "PATH": "/usr/bin", "LABKIT_DB_PASSWORD": "hunter2",
           "NCCL_SOCKET_IFNAME": "ghp_abcdefghijklmnopqrstuvwxyz012345"}
    out = redact_env(env)
    assert out["NCCL_DEBUG"] == "INFO" and out["CUDA_VISIBLE_DEVICES"] == "0,1" and out["NCCL_IB_HCA"] == "mlx5"
    assert out["TORCH_API_KEY"] == REDACTED and out["LABKIT_DB_PASSWORD"] == REDACTED
    assert out["NCCL_SOCKET_IFNAME"] == REDACTED  # a token-shaped value under an innocent name
    assert "PATH" not in out and "HF_TOKEN" not in out  # only GPU-relevant prefixes are captured


def test_probe_without_gpu_says_so_and_carries_on():
    m = probe()
    assert m.cpu_logical_cores >= 1 and m.numa_nodes >= 1
    if not m.gpus:
        assert m.notes, "a machine without GPUs must say why there is no GPU data"
    rows = dict(machine_rows(m))
    assert rows["GPUs"] == str(len(m.gpus))


def test_warns_when_gpus_differ_in_memory(monkeypatch):
    import labkit.core.machine as mach

    gpus = [GPUInfo(0, "A", 80 * 2**30), GPUInfo(1, "B", 40 * 2**30)]
    monkeypatch.setattr(mach, "_nvml_gpus", lambda notes: (gpus, "ok", "999.0"))
    m = mach.probe()
    assert any("differ in memory" in w for w in m.warnings)


def test_recorded_gpu_server_loads_with_provenance():
    m, prov = load_recorded_machine()
    assert m.gpus and m.gpus[0].memory_total_bytes > 0
    assert prov["gpu_name"] == m.gpus[0].name and prov["date"]
