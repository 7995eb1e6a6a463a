"""What the GPU recording script wrote (data/measurements/topology/), checked for physical sense."""

from labkit.core.provenance import load_measurement
from labkit.topology import compare_links, generation_for, load_sample, recorded_links, recorded_topology
from labkit.topology.links import pcie_bps
from labkit.topology.recorded import measurements_dir


def test_recorded_links_on_h200():
    rec = recorded_links()
    assert rec is not None, "data/measurements/topology/links.json is part of the repository"
    m, prov = rec
    assert "H200" in prov["gpu_name"] and prov["gpu_count"] >= 1
    assert m.gpus and all("H200" in g for g in m.gpus)
    gen = generation_for(m.gpus[0])
    by = {(r.gpu, r.what, r.memory): r for r in m.host}
    for g in range(len(m.gpus)):
        for what in ("host->device", "device->host"):
            pinned, pageable = by[(g, what, "pinned")], by[(g, what, "pageable")]
            # Pinned beats pageable at the largest size; neither exceeds the PCIe Gen5 x16 figure.
            assert pinned.largest.bytes_per_s > 2 * pageable.largest.bytes_per_s
            assert pinned.peak_Bps < gen.pcie_Bps == pcie_bps(5)
            assert pinned.peak_Bps > 0.5 * gen.pcie_Bps
            # Bandwidth grows with size until the link saturates (small copies pay the latency).
            assert pinned.points[0].bytes_per_s < pinned.largest.bytes_per_s
            assert all(p.median_s > 0 and len(p.times_s) >= 3 for p in pinned.points)
    for r in m.device_copy:
        # An on-device copy is far faster than any host link (HBM vs PCIe).
        assert r.largest.bytes_per_s > 10 * gen.pcie_Bps
    # Every part either ran or says why not.
    ran = {"device copy": bool(m.device_copy), "NUMA": bool(m.numa), "P2P": m.p2p is not None}
    for part, did in ran.items():
        assert did or any(part.split()[0] in s.part for s in m.skipped)
    if m.p2p is not None:
        n = m.p2p.n
        on = m.p2p.uni_Bps.get("p2p_on")
        assert on and all(on[i][j] > 0 for i in range(n) for j in range(n) if on[i][j] is not None)
    rec_topo = recorded_topology()
    topo = rec_topo[0] if rec_topo else None
    if m.p2p is not None:
        assert topo is not None and topo.n == m.p2p.n  # the link labels were recorded with the matrix
    rows = compare_links(m, topo, gen=gen)
    assert all(r.ratio is None or 0 < r.ratio < 1.0 for r in rows)


def test_recorded_topo_text_became_a_sample():
    t = load_sample("h200_1gpu_live_ansi")
    assert t.n == 1 and t.gpus[0].cpu_affinity and t.gpus[0].numa == 0
    assert "H200" in (t.origin or "") and t.generation.pcie_gen == 5
    assert (measurements_dir() / "nvidia_smi_topo.txt").exists()
    load_measurement(measurements_dir() / "links.json", "topology.links")
