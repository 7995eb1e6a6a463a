"""`labkit measure` for the user's own model: --hf-config, --factory, batch shape, --lora, --recompute,
--loop, the deprecated aliases, and fake mode's one-line refusal."""

import json
import sys
import textwrap

import pytest

from labkit.cli import main

TINY_LLAMA = ["--hf-config", "llama", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256",
              "--micro-batch", "2", "--seq", "32"]


def run(capsys, *args):
    rc = main(["measure", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def run_suggested(capsys, line):
    """Run the command a refusal suggests (the text after its last ': labkit ')."""
    import shlex

    cmd = shlex.split("labkit " + line.rsplit(": labkit ", 1)[1])
    assert cmd[:2] == ["labkit", "measure"], cmd
    rc = main(cmd[1:])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_gemma2_checkpointed_with_its_kv_cache_suggests_what_runs(capsys):
    """Issue 27: Gemma 2 under torch.utils.checkpoint with use_cache on fails in the recomputation (on the CPU too);
    the refusal suggests --no-kv-cache, and that command runs."""
    args = ["--hf-config", "gemma2", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "512",
            "--micro-batch", "2", "--seq", "32", "--precision", "amp-bf16", "--recompute", "full"]
    rc, out, err = run(capsys, *args)
    assert rc == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.endswith(" ".join(args) + " --no-kv-cache") and "--device cpu" not in line, line
    rc, out, err = run_suggested(capsys, line)
    assert rc == 0 and "predicted for an H200" in out, err


def test_hf_config_model_type_with_size_overrides(capsys):
    rc, out, err = run(capsys, *TINY_LLAMA, "--precision", "bf16", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["device"] == "fake-cuda" and doc["policy"]["loop"] == "plain" and doc["policy"]["precision"] == "bf16"
    # 2 layers of hidden 64, MLP 11008 (llama's default intermediate size), vocabulary 256 untied
    assert doc["num_params"] == 2 * (4 * 64 * 64 + 3 * 64 * 11008 + 2 * 64) + 2 * 256 * 64 + 64


def test_hf_config_file_and_folder(tmp_path, capsys):
    cfg = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 3,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 300,
           "torch_dtype": "bfloat16", "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    rc, out, err = run(capsys, "--hf-config", str(tmp_path / "config.json"), "--seq", "16", "--json")
    assert rc == 0, err
    three = json.loads(out)["num_params"]
    rc, out, err = run(capsys, "--hf-config", str(tmp_path), "--layers", "2", "--seq", "16", "--json")
    assert rc == 0, err
    two = json.loads(out)["num_params"]
    # q and o, k and v (2 kv heads of 16), the gated MLP, two norms, the q/k/v biases
    per_layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64 + (64 + 32 + 32)
    assert three - two == per_layer


def test_deprecated_aliases_say_so_once_and_match_the_canonical_flags(capsys):
    size = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256", "--seq", "32"]
    rc, new, err = run(capsys, "--hf-config", "gpt2", *size, "--micro-batch", "2", "--recompute", "full", "--json")
    assert rc == 0 and err.count("deprecated") == 0, err
    rc, old, err = run(capsys, "--model", "hf-gpt2", *size, "--batch", "2", "--checkpointing", "full", "--json")
    assert rc == 0
    lines = [ln for ln in err.splitlines() if "deprecated" in ln]
    assert len(lines) == 3 and any("--recompute" in ln for ln in lines) and any("--micro-batch" in ln for ln in lines)
    assert json.loads(old)["peak_bytes"] == json.loads(new)["peak_bytes"]


def test_keep_output_loop_keeps_the_logits(capsys):
    rc, plain, _ = run(capsys, *TINY_LLAMA, "--json")
    rc2, keep, _ = run(capsys, *TINY_LLAMA, "--loop", "keep-output", "--json")
    assert rc == rc2 == 0
    plain, keep = json.loads(plain), json.loads(keep)
    assert keep["policy"]["loop"] == "keep-output"
    logits = 2 * 32 * 256 * 4
    assert keep["peak_bytes"] >= plain["peak_bytes"] + logits - 4096


def _write_module(tmp_path, name, body):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    sys.path.insert(0, str(tmp_path))


def test_factory_language_model_and_vision(tmp_path, capsys):
    _write_module(tmp_path, "corpus_cli_models", """
        import torch.nn as nn

        class LM(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb, self.out = nn.Embedding(1000, 64), nn.Linear(64, 1000)

            def forward(self, input_ids, labels):
                logits = self.out(self.emb(input_ids))
                return {"loss": nn.functional.cross_entropy(logits.view(-1, 1000), labels.view(-1))}

        def lm():
            return LM()

        def cnn():
            return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    """)
    try:
        rc, out, err = run(capsys, "--factory", "corpus_cli_models:lm", "--micro-batch", "2", "--seq", "32", "--json")
        assert rc == 0, err
        assert json.loads(out)["num_params"] == 1000 * 64 + 64 * 1000 + 1000
        rc, out, err = run(capsys, "--factory", "corpus_cli_models:cnn", "--image-size", "32", "--micro-batch", "4",
                           "--precision", "amp-bf16")
        assert rc == 0, err
        assert "(image-classification): peak" in out and "predicted for an H200" in out
        rc, out, err = run(capsys, "--factory", "corpus_cli_models:missing")
        assert rc == 2 and err.strip().count("\n") == 0 and "has no function missing" in err
    finally:
        sys.path.remove(str(tmp_path))


def test_fake_mode_refusal_is_one_line_naming_op_and_module(tmp_path, capsys):
    """An op without a fake kernel (a custom op with only a CPU implementation) is refused by name."""
    _write_module(tmp_path, "corpus_cli_opaque", """
        import torch
        import torch.nn as nn

        @torch.library.custom_op("corpus_cli::opaque", mutates_args=())
        def opaque(x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        opaque.register_autograd(lambda ctx, grad: grad)     # differentiable, but no fake kernel

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(16, 16)

            def forward(self, x):
                return opaque(self.lin(x))

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb, self.block, self.head = nn.Embedding(64, 16), Block(), nn.Linear(16, 64)

            def forward(self, input_ids, labels):
                logits = self.head(self.block(self.emb(input_ids)))
                return {"loss": nn.functional.cross_entropy(logits.view(-1, 64), labels.view(-1))}

        def net():
            return Net()
    """)
    try:
        rc, out, err = run(capsys, "--factory", "corpus_cli_opaque:net", "--micro-batch", "2", "--seq", "8")
        assert rc == 2 and out == ""
        (line,) = err.strip().splitlines()
        assert "fake mode cannot run op corpus_cli.opaque" in line and "in module block (Block)" in line
        assert "during forward" in line and "--device cpu" in line and "labkit estimate" in line
        assert "Traceback" not in err
        rc, out, err = run_suggested(capsys, line)           # the command the refusal names, as it stands
        assert rc == 0 and "measured on this CPU" in out, err
    finally:
        sys.path.remove(str(tmp_path))


def test_a_factory_model_that_does_not_take_the_batch_is_one_line_on_any_device(tmp_path, capsys):
    """A video model given --task image-classification's images fails in its forward on any device (meta tensors
    show it without running it): fake mode does not suggest --device cpu, which would fail the same way, and
    --device cpu itself says so in one line instead of a traceback; both name --script."""
    _write_module(tmp_path, "corpus_cli_clip", """
        import torch.nn as nn

        class Clip(nn.Module):               # takes (batch, 3, frames, side, side), as torchvision's video models
            def __init__(self):
                super().__init__()
                self.conv, self.head = nn.Conv3d(3, 8, 3, padding=1), nn.Linear(8, 10)

            def forward(self, x):
                b, c, t, h, w = x.shape
                return self.head(self.conv(x).reshape(b, 8, t * h * w).mean(-1))

        def clip():
            return Clip()
    """)
    try:
        for device in ("fake-cuda", "cpu"):
            rc, out, err = run(capsys, "--factory", "corpus_cli_clip:clip", "--image-size", "16", "--micro-batch", "2",
                               "--device", device)
            assert rc == 2 and out == "" and "Traceback" not in err, err
            (line,) = err.strip().splitlines()
            assert "--factory corpus_cli_clip:clip: the model raised on the batch labkit makes for --task " \
                   "image-classification (pixel_values (2, 3, 16, 16), labels (2,))" in line, line
            assert "ValueError: not enough values to unpack" in line and "--device cpu" not in line
            assert line.endswith("labkit measure --script YOUR_TRAIN.py")
    finally:
        sys.path.remove(str(tmp_path))


@pytest.mark.parametrize("args, msg", [
    (["--hf-config", "lama"], "did you mean llama"),
    (["--hf-config", "llama", "--factory", "a:b"], "give one model"),
    (["--lora"], "--lora applies to a Hugging Face model"),
    (["--factory", "nomodule"], "expected MODULE:FUNCTION"),
    (["--micro-batch", "0"], "argument --micro-batch: must be an integer from 1"),
])
def test_bad_input_is_one_line(capsys, args, msg):
    rc, out, err = run(capsys, *args)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, err


def test_reserved_over_other_segment_placements(capsys):
    rc, out, err = run(capsys, *TINY_LLAMA, "--precision", "bf16", "--reserved-placements", "3")
    assert rc == 0, err
    assert "reserved over 4 segment placements:" in out
    rc, out, err = run(capsys, *TINY_LLAMA, "--precision", "bf16", "--reserved-placements", "3", "--json")
    doc = json.loads(out)
    lo, hi = doc["reserved_range"]
    assert lo <= doc["reserved_bytes"] <= hi
    rc, out, err = run(capsys, *TINY_LLAMA, "--precision", "bf16", "--json")
    assert json.loads(out)["reserved_range"] is None


def test_checkpointing_a_causal_lm_points_at_its_kv_cache_and_no_kv_cache_drops_it(capsys):
    rc, out, err = run(capsys, *TINY_LLAMA, "--precision", "amp-bf16", "--recompute", "every-1", "--seq", "256")
    assert rc == 0, err
    assert "note: the model builds its KV cache in every training forward" in out and "--no-kv-cache" in out
    rc, out, err = run(capsys, *TINY_LLAMA, "--precision", "amp-bf16", "--recompute", "every-1", "--seq", "256", "--json")
    with_cache = json.loads(out)
    rc, out, err = run(capsys, *TINY_LLAMA, "--precision", "amp-bf16", "--recompute", "every-1", "--seq", "256",
                       "--no-kv-cache", "--json")
    without = json.loads(out)
    assert without["notes"] == [] and without["peak_bytes"] < with_cache["peak_bytes"]
    rc, out, err = run(capsys, "--no-kv-cache")
    assert rc == 2 and "--no-kv-cache applies to a Hugging Face model" in err


def test_the_process_is_fresh_unless_told_warm(capsys):
    # a training script starts a fresh process: its cuBLAS workspaces are allocated at the first matmuls, from the
    # cache (CudaTarget.warm_process False, the API's default too); a warm one (a notebook that ran matmuls) holds
    # them in segments of their own before the model
    from labkit.memory.trace.fake.fake_cuda import CudaTarget
    from labkit.memory.trace.step import FakeCuda
    from labkit.workloads.corpus import Case, predict
    from labkit.workloads.user_model import config_source

    rc, out, err = run(capsys, *TINY_LLAMA)
    assert rc == 0, err
    assert "a fresh process: an empty cache, the cuBLAS workspaces allocated at the first matmuls" in out
    rc, out, err = run(capsys, *TINY_LLAMA, "--process", "warm")
    assert rc == 0 and "a warm process: an empty cache and the cuBLAS workspaces" in out, err
    fresh = json.loads(run(capsys, *TINY_LLAMA, "--json")[1])
    warm = json.loads(run(capsys, *TINY_LLAMA, "--process", "warm", "--json")[1])
    assert fresh["peak_bytes"] == warm["peak_bytes"]
    arch, overrides, task = config_source("llama", layers=2, hidden=64, heads=4, vocab=256)
    case = Case(name="cli-llama", family="transformers", arch=arch, task=task, overrides=overrides, micro_batch=2,
                seq=32, precision="fp32")
    assert fresh["reserved_bytes"] == predict(case).reserved_bytes
    assert warm["reserved_bytes"] == predict(case, fake=FakeCuda(target=CudaTarget(warm_process=True))).reserved_bytes
