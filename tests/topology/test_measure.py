"""Link measurement without a GPU: every part is skipped with a reason; the recording script dry-runs."""

import json
import os
import subprocess
import sys
from pathlib import Path

from labkit.core.provenance import load_measurement
from labkit.topology.measure import CopyResult, Point, cuda_unavailable_reason, measure_links
from labkit.topology.measure.numa import expand_cpulist, numa_nodes_with_cpus
from labkit.topology.measure.results import copy_result_from_json, links_from_json
from labkit.core.serialize import to_jsonable

ROOT = Path(__file__).resolve().parents[2]


def test_without_gpu_every_part_is_skipped_with_a_reason():
    why = cuda_unavailable_reason()
    m = measure_links(smoke=True)
    if why is None:  # a GPU machine: something was measured
        assert m.device_copy and m.host
        return
    assert not m.device_copy and not m.host and m.p2p is None
    assert {s.part for s in m.skipped} >= {"device copy", "P2P matrix"}
    assert all(s.reason == why for s in m.skipped)


def test_cpulist_expansion():
    assert expand_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert expand_cpulist("") == []


def test_numa_nodes_from_a_sysfs_tree(tmp_path):
    for name, cpus in (("node0", "0-1\n"), ("node1", "\n"), ("node2", "2,x\n"), ("node3", "3\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "cpulist").write_text(cpus)
    (tmp_path / "node9").mkdir()  # no cpulist file
    # node1 has no CPUs (memory only) and node2's list is unreadable: both left out
    assert numa_nodes_with_cpus(tmp_path) == {0: [0, 1], 3: [3]}


def test_copy_result_round_trip():
    r = CopyResult("host->device", 1, "pinned", [Point(1024, 1e-6, 1.024e9, [1e-6, 1e-6])], numa_node=0, gpu_numa_node=1,
                   note="remote")
    back = copy_result_from_json(json.loads(json.dumps(to_jsonable(r))))
    assert back == r and back.peak_Bps == 1.024e9


def test_record_script_dry_run(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "benchmarks/gpu/record_topology.py", "--out", str(tmp_path), "--smoke"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("# ")  # the reproducibility header first
    doc = load_measurement(tmp_path / "links.json", "topology.links")
    m = links_from_json(doc["data"])
    if cuda_unavailable_reason():
        assert "skipped" in r.stdout and m.skipped


def test_numa_part_needs_two_nodes_and_reports_a_failing_child(monkeypatch):
    from labkit.topology.measure import numa_child

    monkeypatch.setattr(numa_child, "numa_nodes_with_cpus", lambda: {0: [0]})
    res, why = numa_child.measure_numa([0], 1024)
    assert res == [] and "1 NUMA node" in why
    # Two nodes: one child per node; without a GPU the child fails and the reason is reported, not raised.
    monkeypatch.setattr(numa_child, "numa_nodes_with_cpus", lambda: {0: [0], 1: [1]})
    monkeypatch.setattr(numa_child.shutil, "which", lambda name: None)  # CPU-affinity binding, no numactl
    res, why = numa_child.measure_numa([0], 1024, repeats=1)
    if cuda_unavailable_reason():
        assert res == [] and why.startswith("child bound to NUMA node 0 failed")
