"""The GPU target's facts and the SDPA version gates live in data files with their sources, and fake mode
reads them there; it says which torch its rules are for and warns once when another torch is installed."""

import ast
import json
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import torch

from labkit.core.errors import LabkitError
from labkit.core.facts import load_facts
from labkit.memory.trace.fake import fake_cuda, sdpa
from labkit.memory.trace.fake.fake_cuda import CudaTarget, TorchVersionWarning, torch_versions, warn_if_other_torch
from labkit.memory.trace.fake.sdpa import SdpaTarget, parse_version, select_backend
from labkit.memory.trace.fake.targets import H200, HERE, SDPA_GATES

TRACE = Path(sdpa.__file__).parents[1]          # labkit/memory/trace


@pytest.mark.parametrize("facts", [H200, SDPA_GATES], ids=["h200", "sdpa_gates"])
def test_every_fact_says_where_it_comes_from(facts):
    assert len(facts) >= 10
    for name in facts:
        src = facts.source(name)
        assert "http" in src or "PyTorch" in src or "data/measurements/" in src, (name, src)
        for path in (w.rstrip(",;)") for w in src.split() if w.startswith("data/measurements/")):
            assert (TRACE.parents[2] / path).exists(), (name, path)


def test_cuda_target_defaults_are_the_h200_facts():
    t = CudaTarget()
    facts = {f.name for f in fields(CudaTarget)} & set(H200)
    assert facts == set(H200)                       # every fact of the file is a field
    for name in facts:
        assert getattr(t, name) == (tuple(H200[name]) if name == "sm" else H200[name]), name
    assert (t.torch_version, t.cudnn_version, t.sm_count) == ("2.11", 91900, 132)
    assert "CublasHandlePool.cpp" in CudaTarget.source("cublas_workspace_bytes")
    s = SdpaTarget()
    assert (s.sm, s.torch_version, s.cudnn_version, s.cudnn_frontend_d256) == \
        ((9, 0), (2, 11), H200["cudnn_version"], H200["cudnn_frontend_d256"])
    assert t.sdpa == s


def test_another_target_is_another_facts_file(tmp_path):
    doc = json.loads((HERE / "h200.json").read_text())
    doc["facts"]["name"]["value"] = "an A100-like GPU"
    doc["facts"]["sm"]["value"] = [8, 0]
    doc["facts"]["sm_count"]["value"] = 108
    (tmp_path / "a100.json").write_text(json.dumps(doc))
    t = CudaTarget.from_facts(load_facts(tmp_path / "a100.json"), warm_process=False)
    assert (t.name, t.sm, t.sm_count, t.warm_process) == ("an A100-like GPU", (8, 0), 108, False)
    assert CudaTarget.from_facts(H200) == CudaTarget()
    q = torch.empty(2, 8, 128, 64, dtype=torch.bfloat16, device="meta", requires_grad=True)
    assert select_backend(q, q, q, is_causal=True, target=t.sdpa).backend == "flash"   # sm80: cuDNN not first


@pytest.mark.parametrize("entry, msg", [
    ({"value": 1}, "does not say its source"),
    ({"value": 1, "source": " "}, "does not say its source"),
    ({"source": "x"}, "has no value"),
    ({"value": 1, "source": "x", "unit": "B"}, "has unknown keys"),
])
def test_a_fact_without_its_source_is_refused(tmp_path, entry, msg):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"facts": {"sm_count": entry}}))
    with pytest.raises(LabkitError, match=f"{p.name}.*'sm_count' {msg}"):
        load_facts(p)
    with pytest.raises(LabkitError, match="no fact 'nope'"):
        H200.fact("nope")


def _inline_gates(source: str) -> list[str]:
    """Comparisons of a torch or cuDNN version, or of the GPU's compute capability as a whole, with a literal."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        text = " ".join(ast.unparse(x) for x in sides)
        literal = [x for x in sides if isinstance(x, ast.Constant) and isinstance(x.value, int)
                   or isinstance(x, ast.Tuple) and all(isinstance(e, ast.Constant) and isinstance(e.value, int)
                                                       for e in x.elts)]
        versions = "torch_version" in text or "cudnn_version" in text
        whole_sm = any(isinstance(x, ast.Tuple) and len(x.elts) == 2 for x in literal) and "sm" in text
        if literal and (versions or whole_sm):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_version_gates_are_read_by_name_not_written_inline():
    found = {str(p.relative_to(TRACE.parents[2])): f for p in sorted((TRACE.parents[1]).rglob("*.py"))
             if (f := _inline_gates(p.read_text()))}
    assert found == {}                                         # nowhere in labkit.memory
    for gate in ("t.torch_version >= (2, 13)", "t.cudnn_version > 92200", "(8, 0) <= t.sm <= (12, 1)"):
        assert len(_inline_gates(f"ok = {gate}")) == 1, gate     # the rule sees one when there is one
    assert _inline_gates("ok = mask.dim() not in (2, 4) or t.sm[0] >= 8") == []
    text = (TRACE / "fake" / "sdpa.py").read_text()
    unused = [name for name in SDPA_GATES if f'"{name}"' not in text]
    assert unused == []


def test_the_rules_follow_the_gates_file(monkeypatch):
    """Moving a gate in the file moves the choice: mem-efficient GQA in float32 on torch 2.11."""
    q = torch.empty(2, 8, 128, 64, dtype=torch.float32, device="meta", requires_grad=True)
    kv = torch.empty(2, 2, 128, 64, dtype=torch.float32, device="meta", requires_grad=True)
    assert select_backend(q, kv, kv, is_causal=True, enable_gqa=True).backend == "math"
    facts = dict(SDPA_GATES._facts)
    old = facts["efficient_gqa"]
    facts["efficient_gqa"] = type(old)(old.name, {"torch": "2.11"}, old.source)
    monkeypatch.setattr(sdpa, "SDPA_GATES", type(SDPA_GATES)(SDPA_GATES.path, "", facts))
    assert select_backend(q, kv, kv, is_causal=True, enable_gqa=True).backend == "efficient"


def _other_than_installed() -> str:
    major, minor = parse_version(torch.__version__)
    return f"{major}.{minor - 1}" if minor else f"{major - 1}.9"


def test_fake_mode_names_the_installed_torch_when_it_differs(monkeypatch):
    monkeypatch.setattr(fake_cuda, "_WARNED", set())
    other = CudaTarget(torch_version=_other_than_installed())
    with pytest.warns(TorchVersionWarning) as rec:
        info = warn_if_other_torch(other)
        assert warn_if_other_torch(other) == info                     # once per process
    assert len(rec) == 1
    assert info["rules"] == other.torch_version and info["installed"] == torch.__version__ and not info["same"]
    assert f"rules are for torch {other.torch_version}" in info["note"] and torch.__version__ in info["note"]
    same = torch_versions(CudaTarget(torch_version=torch.__version__))
    assert same["same"] and "note" not in same


def test_the_report_and_stderr_say_it_once():
    code = f"""
import torch, labkit
from labkit.memory.trace.fake.fake_cuda import CudaTarget
t = CudaTarget(torch_version={_other_than_installed()!r})
for _ in range(2):
    rep = labkit.measure_step(lambda: torch.nn.Linear(8, 8), torch.randn(4, 8), loss_fn=lambda o, b: o.sum(),
                              fake=labkit.FakeCuda(target=t), steps=1)
print(rep.emulation["torch"]["installed"], rep.emulation["torch"]["rules"])
rep = labkit.measure_step(lambda: torch.nn.Linear(8, 8), torch.randn(4, 8), loss_fn=lambda o, b: o.sum(), steps=1,
                          fake=labkit.FakeCuda(target=CudaTarget(torch_version=torch.__version__)))
print(rep.emulation["torch"]["same"])
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [torch.__version__, _other_than_installed(), "True"]
    assert r.stderr.count("TorchVersionWarning") == 1 and f"installed torch is {torch.__version__}" in r.stderr
