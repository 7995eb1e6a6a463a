"""The fake GPU in this process (``labkit.memory.fake_gpu``): placement, torch.cuda's answers, the allocator,
phases and steps. Byte counts are exact: storages round up to 512 bytes and the simulated caching allocator
hands out blocks as CUDACachingAllocator.cpp does (small requests from 2 MiB segments)."""

import copy

import pytest
import torch
import torch.nn as nn

from labkit.core.errors import LabkitError
from labkit.memory.script.runtime import fake_gpu


def test_placement_follows_the_gpu_program():
    with fake_gpu() as gpu:
        host = torch.randn(100, 1000)                       # 400,000 B on the host: not the GPU's
        assert torch.cuda.memory_allocated() == 0
        x = host.cuda()
        assert x.device == torch.device("cuda", 0) and x.is_cuda and x.get_device() == 0
        assert torch.cuda.memory_allocated() == 400_384     # rounded up to 512 B
        assert x.to("cuda") is x and x.cuda() is x         # already there: Tensor.to aliases
        y = x.to(torch.bfloat16)                            # a new GPU tensor
        z = x.to(y)                                         # dtype of y, same device
        assert y.device.type == z.device.type == "cuda" and z.dtype == torch.bfloat16
        back = x.cpu()
        assert back.device.type == "cpu" and not back.is_cuda
        assert torch.cuda.memory_allocated() == 400_384 + 2 * 200_192
        w = torch.empty(1000, device=x.device)              # device taken from a GPU tensor
        with torch.device("cuda"):
            v = torch.zeros(1000)
        assert w.is_cuda and v.is_cuda
        small = torch.arange(5)                             # small host tensors keep their values
        assert small.tolist() == [0, 1, 2, 3, 4]
    assert gpu.report().peak_bytes >= 400_384 + 2 * 200_192


def test_module_to_keeps_the_optimizer_and_deepcopy_copies_on_the_gpu():
    with fake_gpu() as gpu:
        model = nn.Linear(1000, 1000)
        opt = torch.optim.AdamW(model.parameters())         # made before the move, as accelerate.prepare does
        model.to(device="cuda", dtype=torch.bfloat16)
        assert model.weight.is_cuda and model.weight.dtype == torch.bfloat16
        params = torch.cuda.memory_allocated()
        assert params == 2_000_384 + 2_048                  # weight and bias, bf16
        ema = copy.deepcopy(model)
        assert ema.weight.is_cuda and torch.cuda.memory_allocated() == 2 * params
        model(torch.randn(8, 1000, device="cuda", dtype=torch.bfloat16)).sum().backward()
        opt.step()                                          # the optimizer follows the moved parameters
        assert all(st["exp_avg"].is_cuda for st in opt.state.values()) and len(opt.state) == 2
    rep = gpu.report()
    assert len(rep.steps) == 1 and rep.peak_by_category["optimizer_state"] >= 2 * params


def test_torch_cuda_answers_as_the_h200():
    with fake_gpu():
        assert torch.cuda.is_available() and torch.cuda.device_count() == 1
        assert torch.cuda.get_device_name() == "NVIDIA H200"
        props = torch.cuda.get_device_properties(0)
        assert (props.major, props.minor) == (9, 0) and props.total_memory == 150_109_880_320
        assert torch.cuda.is_bf16_supported()
        assert torch.accelerator.current_accelerator().type == "cuda"
        a = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        free, total = torch.cuda.mem_get_info()
        from labkit.memory.estimate.buffers import CUDA_CONTEXT_BYTES

        assert total - free == 256 * (1 << 20) + CUDA_CONTEXT_BYTES   # the segment + the recorded context
        assert torch.cuda.memory_reserved() == 256 << 20
        del a
        assert torch.cuda.memory_allocated() == 0 and torch.cuda.memory_reserved() == 256 << 20
        torch.cuda.empty_cache()
        assert torch.cuda.memory_reserved() == 0 and torch.cuda.max_memory_reserved() == 256 << 20
        torch.cuda.reset_peak_memory_stats()
        assert torch.cuda.max_memory_allocated() == 0
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        end.record()
        torch.cuda.synchronize()
        assert start.elapsed_time(end) == 0.0
    assert not torch.cuda.is_available()                        # restored


def test_out_of_memory_is_raised_inside_the_program():
    with fake_gpu() as gpu:
        keep = [torch.empty(40 << 30, dtype=torch.uint8, device="cuda") for _ in range(3)]
        with pytest.raises(torch.OutOfMemoryError, match="labkit's fake GPU"):
            keep.append(torch.empty(40 << 30, dtype=torch.uint8, device="cuda"))
    rep = gpu.report()
    assert rep.oom is not None and rep.oom["requested"] == 40 << 30 and not rep.fits


def test_phases_steps_autocast_and_inference_mode_cache():
    """Autocast follows the program's own torch.autocast("cuda"); its weight cache is off in inference_mode
    (autocast_mode.cpp cached_cast, pytorch/pytorch#158232): there each cast copy is freed after its op."""
    layers = nn.Sequential(*[nn.Linear(1024, 1024, bias=False) for _ in range(4)])
    with fake_gpu(max_steps=2) as gpu:
        model = layers.cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(8, 1024, device="cuda")
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            model(x)
            cached = torch.cuda.max_memory_allocated() - base
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()            # now with the forward thread's cuBLAS workspace
            model(x)
            uncached = torch.cuda.max_memory_allocated() - base
        copy_bytes = 1024 * 1024 * 2
        assert cached >= 32 * (1 << 20) + 4 * copy_bytes    # the workspace (first matmul) and four cached copies
        assert copy_bytes <= uncached < 2 * copy_bytes      # one weight copy at a time, freed after its op
        for _ in range(5):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        raise AssertionError("max_steps=2 must stop the program at the second step")  # pragma: no cover
    rep = gpu.report()
    assert rep.outcome == "stopped after 2 optimizer steps" and [s.step for s in rep.steps] == [1, 2]
    assert {s.peak_phase for s in rep.steps} <= {"forward", "loss", "backward", "optimizer", "other"}


def test_bad_arguments():
    with pytest.raises(LabkitError, match="max_steps"):
        fake_gpu(max_steps=0)


SAVE_ADAPTERS = '''
import sys
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512)
model = get_peft_model(LlamaForCausalLM(cfg).to(torch.bfloat16),
                       LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")).cuda()
ids = torch.randint(0, 512, (2, 32), device="cuda")
model(input_ids=ids, labels=ids).loss.backward()
model.save_pretrained(sys.argv[1])
'''


def test_a_script_that_saves_its_adapters_runs_and_writes_nothing(tmp_path):
    """peft's save_pretrained (the usual last line of a LoRA script) writes with safetensors' save_file, bound
    under another name at import: on the fake GPU it writes no tensors, says so, and the real functions are
    back after the run, under every name that held them."""
    import peft.peft_model
    import safetensors.torch
    import transformers.modeling_utils

    from labkit.memory.script.run import run_script

    real = safetensors.torch.save_file
    script = tmp_path / "lora_save.py"
    script.write_text(SAVE_ADAPTERS)
    rep = run_script(str(script), [str(tmp_path / "adapters")], banner=False)
    assert rep.peak_bytes > 0
    assert any("save_file" in n and "nothing was written" in n for n in rep.notes), rep.notes
    assert not list((tmp_path / "adapters").glob("*.safetensors"))
    assert safetensors.torch.save_file is real
    assert peft.peft_model.safe_save_file is real and transformers.modeling_utils.safe_save_file is real
    safetensors.torch.save_file({"x": torch.ones(2)}, str(tmp_path / "real.safetensors"))  # a real save still writes
    assert (tmp_path / "real.safetensors").stat().st_size > 0
