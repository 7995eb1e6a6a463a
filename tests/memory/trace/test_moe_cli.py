"""`labkit measure --moe-routing`: the routing a mixture-of-experts prediction assumed is in the JSON and
the text report; a malformed distribution (or one that does not fit the model) is one line, exit 2."""

import json

import pytest

from labkit.cli import main

MIXTRAL = {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_size": 32,
           "intermediate_size": 256, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 128, "max_position_embeddings": 64}
SIZE = ["--micro-batch", "2", "--seq", "16"]


def run(capsys, *args):
    rc = main(["measure", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def eager_config(tmp_path):
    """A Mixtral config.json asking for the eager experts (the per-expert loop whose shapes follow the routing)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(MIXTRAL, experts_implementation="eager")))
    return str(path)


def test_the_routing_assumed_is_in_the_json_and_the_text(capsys, eager_config):
    rc, out, err = run(capsys, "--hf-config", eager_config, *SIZE, "--json")
    assert rc == 0, err
    doc = json.loads(out)
    routing = doc["emulation"]["moe_routing"]
    assert routing["assumed"] == "balanced" and routing["default"] is True
    (text,) = routing["used_by"]
    assert "MixtralExperts" in text and "32 tokens x top-2 = 64 rows over 4 experts, 16 each" in text
    assert text in doc["emulation"]["assumptions"]

    rc, out, err = run(capsys, "--hf-config", eager_config, *SIZE, "--moe-routing", "0.5,0.25,0.125,0.125", "--json")
    assert rc == 0, err
    skewed = json.loads(out)
    assert skewed["emulation"]["moe_routing"]["assumed"] == "0.5,0.25,0.125,0.125"
    assert any("32, 16, 8, 8" in a for a in skewed["emulation"]["assumptions"])
    assert skewed["peak_bytes"] != doc["peak_bytes"]     # the eager loop's shapes follow the routing

    rc, out, err = run(capsys, "--hf-config", eager_config, *SIZE, "--moe-routing", "0.5,0.25,0.125,0.125")
    assert rc == 0, err
    assert "MoE routing assumed: 0.5,0.25,0.125,0.125" in out and "takes its shapes from it" in out


def test_grouped_mm_default_says_the_routing_is_not_needed(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MIXTRAL))
    peaks = []
    for routing in ("balanced", "0.7,0.1,0.1,0.1"):
        rc, out, err = run(capsys, "--hf-config", str(path), *SIZE, "--moe-routing", routing, "--json")
        assert rc == 0, err
        doc = json.loads(out)
        (text,) = doc["emulation"]["moe_routing"]["not_needed_by"]
        assert "grouped expert matmul" in text and "does not depend on how tokens are routed" in text
        peaks.append(doc["peak_bytes"])
    assert peaks[0] == peaks[1]


@pytest.mark.parametrize("args, msg", [
    (["--moe-routing", "0.5,x"], "argument --moe-routing: moe routing '0.5,x': share 1 ('x') is not a number"),
    (["--moe-routing=-0.5,1.5"], "share 0 (-0.5) is negative"),
    (["--moe-routing", "-0.5,1.5"], "expected one argument"),   # argparse reads a leading minus as a flag
    (["--moe-routing", "0.5,0.4"], "the shares sum to 0.9, not 1"),
    (["--moe-routing", "nan,1"], "is not a finite number"),
    (["--moe-routing", ""], "is not a number"),
    (["--moe-routing", "0.5,0.5", "--device", "cpu"], "--moe-routing applies to fake mode (--device fake-cuda)"),
])
def test_malformed_routing_is_one_line(capsys, args, msg):
    rc, out, err = run(capsys, "--layers", "1", "--hidden", "32", "--heads", "2", "--seq", "8", "--vocab", "64", *args)
    assert rc == 2 and out == "" and msg in err and len(err.strip().splitlines()) == 1, err


def test_shares_that_do_not_fit_the_model_are_one_line(capsys, eager_config):
    rc, out, err = run(capsys, "--hf-config", eager_config, *SIZE, "--moe-routing", "0.5,0.3,0.2")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "moe routing '0.5,0.3,0.2': 3 shares given but" in err and "routes to 4 experts; give 4 shares" in err
    assert "Traceback" not in err
