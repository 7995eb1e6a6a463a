"""The fake GPU in this process (``labkit.memory.fake_gpu``): placement, torch.cuda's answers, the allocator,
phases and steps. Byte counts are exact: storages round up to 512 bytes and the simulated caching allocator
hands out blocks as CUDACachingAllocator.cpp does (small requests from 2 MiB segments)."""

import copy

import pytest
import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import is_fake

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


def test_meta_tensors_stay_shapes_without_memory():
    """``.to("meta")`` keeps a tensor's shape and nothing else, on the GPU as here: torch 2.11's pipelining stage
    takes ``.to("meta")`` of its example inputs (``_RootArgPlaceholder``), which are meta tensors already. Script mode
    once copied them to the host and refused the program ("Cannot copy out of meta tensor")."""
    with fake_gpu():
        m = torch.empty(4, 8, device="meta", requires_grad=True)
        g = torch.randn(256, 256, device="cuda")
        before = torch.cuda.memory_allocated()
        for t in (m.to("meta"), g.to("meta"), g.to(torch.device("meta"), torch.bfloat16), m.to(device="meta")):
            assert t.device.type == "meta" and not t.is_cuda
        assert m.to("meta").shape == (4, 8) and g.to("meta").dtype == torch.float32
        assert torch.cuda.memory_allocated() == before           # no copy anywhere
        with pytest.raises(NotImplementedError, match="meta"):    # as on a GPU: a meta tensor has no data to copy
            m.to("cuda")


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


def test_values_read_from_tensors_made_under_inference_mode():
    """A tensor made under inference_mode has no Autograd key, so ``.item()`` and ``bool(t)`` reach the fake GPU as
    aten.item and aten.is_nonzero rather than _local_scalar_dense (an evaluation loop's ``total += loss.item()``):
    read as outside it."""
    with fake_gpu() as gpu:
        x = torch.randn(64, 64, device="cuda") @ torch.randn(64, 64, device="cuda")     # values unknown (as a model's)
        with torch.inference_mode():
            assert x.sum().item() == 0.0                    # a float read: the placeholder 0.0
            assert (x.argmax(1) == 3).sum().item() == 0     # an integer count: 0, with its line
            assert not bool((x > 0).any())                  # a boolean read: False
            assert bool(torch.isfinite(x.sum()))            # a NaN/infinity check: finite
            assert not x.sum()                              # if t: 0.0 is false
            assert x[0, :3].tolist() == [0.0, 0.0, 0.0]
    notes = gpu.report().notes
    assert any("float .item()" in n for n in notes) and any("integer .item()" in n for n in notes)


def test_data_parallel_streams_and_cuda_graphs():
    """nn.DataParallel on the one GPU scatters its input as comm.cpp does (a CPU build has no torch._C._scatter);
    record_stream on the program's own stream is accepted; CUDA graph capture is refused in one line."""
    with fake_gpu() as gpu:
        model = nn.DataParallel(nn.Linear(256, 256)).cuda()
        x = torch.randn(64, 256, device="cuda")
        with torch.no_grad():
            model(x)                                        # the first matmul takes cuBLAS's workspace
            before = torch.cuda.memory_allocated()
            y = model(x)                                    # the whole batch, already there: no copy
        assert y.is_cuda and torch.cuda.memory_allocated() - before == 64 * 256 * 4
        host = torch.randn(32, 256)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            z = host.cuda(non_blocking=True)
        z.record_stream(torch.cuda.current_stream())
        with pytest.raises(LabkitError, match=r"CUDA graph capture .* at .*test_fake_gpu.py:\d+ is not modelled.*"
                                              r"labkit watch -- python"):
            torch.cuda.CUDAGraph()
    assert not hasattr(torch._C, "_scatter") and gpu.report().peak_bytes > 0


def test_boolean_masks_select_as_many_as_their_values_say():
    """x[mask], mask.nonzero(), torch.unique and masked_select have sizes that follow from values: counted from the
    values a small integer or boolean GPU tensor carries; a mask of unknown values selects every element (noted)."""
    with fake_gpu() as gpu:
        labels = torch.tensor([3, -100, 7, -100, 3, 1] * 100).cuda()         # copied from the host: known values
        keep = labels != -100
        x = torch.randn(600, 256, device="cuda", requires_grad=True)
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        picked = x[keep]                                       # 400 rows; nonzero's (400, 1) indices, freed after
        assert picked.shape == (400, 256) and torch.cuda.memory_allocated() - base == 400 * 256 * 4
        assert torch.cuda.max_memory_allocated() - base == 400 * 256 * 4 + 3584       # 3,200 B rounded to 512
        assert keep.nonzero().shape == (400, 1)
        assert torch.unique(labels[keep]).tolist() == [1, 3, 7]
        assert torch.masked_select(labels, keep).shape == (400,)
        x.grad = None
        picked.sum().backward()
        assert x.grad.shape == (600, 256)
        x2 = torch.randn(600, 256, device="cuda")
        x2[keep] = torch.zeros(400, 256, device="cuda")       # index_put_ with the mask's indices
        unknown = torch.randn(1000, 8, device="cuda") @ torch.randn(8, device="cuda") > 0   # unknown float values
        assert torch.randn(1000, device="cuda")[unknown].shape == (1000,)
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        assert torch.masked_select(torch.randn(4, 1000, device="cuda"), unknown).shape == (4000,)   # broadcast
        assert torch.cuda.max_memory_allocated() - before == 16384 + 16384 + 4000 * 2 * 8   # x, out, nonzero indices
    assert any("a mask of unknown values" in n for n in gpu.report().notes)


def test_a_mask_drawn_at_random_selects_its_share():
    """A comparison of a float draw with a number (a masked LM's ``torch.rand(ids.shape) < 0.15``) is made from the
    draw's values, drawn on the host: it selects about that share, not every element. A one-element draw (a coin
    flip) and other uses of a draw (its argmax: randn stands in for data) stay unknown."""
    with fake_gpu() as gpu:
        picked = torch.randn(8192, 64, device="cuda")[torch.rand(8192, device="cuda") < 0.15]
        assert 0.12 * 8192 < picked.shape[0] < 0.18 * 8192
        assert 0.45 * 4096 < int((torch.randn(4096, device="cuda") > 0).sum()) < 0.55 * 4096
        assert torch.nonzero(torch.randn(64, 64, device="cuda").argmax(1) == 3).shape == (64, 1)   # unknown: all
        assert torch.nonzero(torch.rand(1, device="cuda") < 0.5).shape == (1, 1)
    notes = gpu.report().notes
    assert any("drawn on the host" in n and "x[mask]" in n for n in notes)
    assert any("a mask of unknown values" in n for n in notes)


def test_unique_of_unknown_values_holds_what_the_gpu_kernel_allocates():
    """torch.unique of unknown values finds every value distinct (the largest output), and its memory is what
    UniqueCub.cu allocates whatever the values: the values and counts at the input's length, the inverse indices at
    its shape; inside the op a sorted copy, an arange, the sorted indices and their running sum. A boolean has two
    values at most; a ``dim`` is refused."""
    n = 1 << 20
    with fake_gpu() as gpu:
        x = torch.randint(0, 50000, (n,), device="cuda") + torch.zeros(n, dtype=torch.long, device="cuda")
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        values, inverse, counts = torch.unique(x, return_inverse=True, return_counts=True)
        assert values.shape == inverse.shape == counts.shape == (n,)
        assert torch.cuda.memory_allocated() - base == 3 * 8 * n
        inside = 4 * 8 * n + 512                             # a sorted copy, an arange, two int64 arrays, the length
        assert torch.cuda.max_memory_allocated() - base == 3 * 8 * n + inside
        del values, inverse, counts
        torch.cuda.reset_peak_memory_stats()
        assert torch.unique(x).shape == (n,) and torch.cuda.max_memory_allocated() - base == 2 * 8 * n + 512
        assert torch.unique_consecutive(x, return_counts=True)[1].shape == (n,)
        assert torch.unique(x > 5).shape == (2,)
        known = torch.unique(torch.tensor([3, 1, 3, 7] * 100).cuda())                  # values carried: counted
        assert known.tolist() == [1, 3, 7] and known.untyped_storage().nbytes() == 400 * 8   # the input's length
        with pytest.raises(Exception, match="unique_dim"):
            torch.unique(x.view(1024, -1), dim=0)
    notes = [m for m in gpu.report().notes if "of unknown values" in m]
    assert any("torch.unique of unknown values" in m and f"{n} of them" in m for m in notes)
    assert any("torch.unique_consecutive" in m for m in notes) and any("2 of them" in m for m in notes)


def test_a_hand_written_moe_routes_as_measure_step_assumes():
    """A user's own mixture of experts (``topk`` over the router's scores, then ``torch.where(ids == e)`` per expert):
    each expert's rows follow the assumed routing (balanced by default, as measure_step), not every token x top-k row
    for every expert; a loop over the experts hit reads their ids."""
    tokens, experts, k, d = 64, 4, 2, 32
    with fake_gpu() as gpu:
        scores = torch.randn(tokens, experts, device="cuda")
        _, ids = torch.topk(scores.softmax(-1), k, dim=-1)
        rows = [torch.where(ids == e)[0].shape[0] for e in range(experts)]
        hit = torch.nonzero(torch.zeros(experts, device="cuda").index_add_(0, ids.flatten(), torch.ones(tokens * k,
                                                                                                      device="cuda")))
        x = torch.randn(tokens, d, device="cuda")
        picked = x[torch.where(ids == 0)[0]]
        assert hit.shape == (experts, 1) and hit.flatten().tolist() == list(range(experts))
    assert rows == [tokens * k // experts] * experts and picked.shape == (tokens * k // experts, d)
    notes = gpu.report().notes
    assert any("MoE routing balanced" in n for n in notes) and not any("a mask of unknown values" in n for n in notes)


def test_metrics_on_the_host_run():
    """An evaluation's metric code: a host copy of a tensor that carries values is real (accelerate's
    pad_across_processes reads the sizes it gathered), .numpy() of unknown values is zeros (a placeholder, noted),
    bincount of unknown values with a minlength is that long."""
    with fake_gpu() as gpu:
        sizes = torch.tensor([16, 2], device="cuda")[None].cpu()
        assert not is_fake(sizes) and max(s[1] for s in sizes) == 2
        logits = torch.randn(16, 2, device="cuda")
        preds = logits.cpu().numpy()
        assert preds.shape == (16, 2) and not preds.any()
        cm = torch.bincount(logits.argmax(1) * 2 + torch.tensor([0, 1] * 8, device="cuda"), minlength=4)
        assert cm.shape == (4,) and cm.dtype == torch.long
        with pytest.raises(Exception, match="aten.bincount"):   # (measure --script makes it one line)
            torch.bincount(logits.argmax(1))               # no minlength: its length is unknown
    notes = gpu.report().notes
    assert any("Tensor.numpy()" in n for n in notes) and any("torch.bincount of unknown values" in n for n in notes)


def test_sampling_with_generate_stops_at_its_length_limit():
    """transformers' generate() samples unknown tokens; its stopping check ORs the length limit (known) with the
    EOS check (unknown), so once the limit is reached the OR is all true whatever the tokens: it stops there."""
    from transformers import GPT2Config, GPT2LMHeadModel

    with fake_gpu():
        model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=64, n_head=2)).cuda().eval()
        prompt = torch.randint(0, 50257, (2, 4), device="cuda")
        out = model.generate(prompt, max_new_tokens=3, do_sample=True, top_k=5, pad_token_id=0,
                             max_time=20.0)                 # without the rule: stopped by the clock, longer
        assert out.shape == (2, 7)
        done = torch.zeros(2, dtype=torch.long, device="cuda") & (torch.randn(2, device="cuda") > 0)
        assert done.max().item() == 0                       # AND with a known zero side: zero


def test_bad_arguments():
    with pytest.raises(LabkitError, match="max_steps"):
        fake_gpu(max_steps=0)


def test_fake_storages_have_unique_stable_addresses():
    """data_ptr(): a GPU storage answers its simulated block's address, a host one an address of its own range;
    views add their offset; tensors that share a storage share its address; 0 bytes answer 0; deepcopy still
    copies on the GPU (gradient included) without reading any pointer."""
    with fake_gpu() as gpu:
        a = torch.empty(1000, device="cuda")
        b = torch.empty(1000, device="cuda")
        h = torch.empty(100_000)                            # a large host tensor: fake
        assert len({a.data_ptr(), b.data_ptr(), h.data_ptr()}) == 3 and 0 not in (a.data_ptr(), h.data_ptr())
        assert b.data_ptr() - a.data_ptr() == 4096          # 4,000 B rounded to 512 B, next in the small segment
        assert a.data_ptr() == a.untyped_storage().data_ptr() and a.data_ptr() % 512 == 0
        assert a[10:].data_ptr() == a.data_ptr() + 40 and a.view(10, 100).data_ptr() == a.data_ptr()
        assert h.data_ptr() == h.data_ptr() and h[1:].untyped_storage().data_ptr() == h.data_ptr()
        assert torch.empty(0, device="cuda").data_ptr() == 0
        model = nn.Linear(100, 100).cuda()
        model(torch.randn(3, 100, device="cuda")).sum().backward()
        before = torch.cuda.memory_allocated()
        twin = copy.deepcopy(model)
        assert twin.weight.is_cuda and twin.weight.grad is not None and twin.weight.grad.is_cuda
        assert twin.weight.data_ptr() != model.weight.data_ptr()
        assert torch.cuda.memory_allocated() - before == 2 * (40_448 + 512)   # weights, biases and their grads
        del a
        c = torch.empty(1000, device="cuda")               # the freed block is reused, as the allocator does
        assert c.data_ptr() == b.data_ptr() - 4096
    assert gpu.report().peak_bytes > 0


SAVE_AND_LOAD = '''
import os
import sys
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
out = sys.argv[1]
cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True)
LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(os.path.join(out, "base"))   # every weight: unique pointers
base = AutoModelForCausalLM.from_pretrained(os.path.join(out, "base"), device_map="cuda")
assert base.lm_head.weight is base.model.embed_tokens.weight and base.dtype == torch.bfloat16
model = get_peft_model(base, LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
ids = torch.randint(0, 512, (2, 32), device="cuda")
model(input_ids=ids, labels=ids).loss.backward()
model.save_pretrained(os.path.join(out, "adapters"))
torch.save({"model": model.state_dict(), "step": torch.tensor(7), "rng": torch.get_rng_state()},
           os.path.join(out, "ckpt.pt"))
ckpt = torch.load(os.path.join(out, "ckpt.pt"))
assert ckpt["step"].item() == 7 and all(t.is_cuda for t in ckpt["model"].values())
torch.set_rng_state(ckpt["rng"])
again = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(os.path.join(out, "base")),
                                  os.path.join(out, "adapters"))
w = again.base_model.model.model.layers[0].self_attn.q_proj.lora_A["default"].weight
print("loaded", tuple(w.shape), w.dtype, torch.cuda.memory_allocated())
'''


def test_a_script_that_saves_and_loads_its_own_checkpoints(tmp_path):
    """save_pretrained of a whole model (every weight has its own pointer now: nothing looks shared), peft's
    adapters and torch.save write placeholders; from_pretrained, PeftModel.from_pretrained and torch.load of them
    give tensors of the saved shapes and dtypes, on the GPU where they were saved from (a small host tensor keeps
    its values). A real reader refuses a placeholder; the real functions are back after the run, under every
    name that held them, and a real save still writes."""
    import peft.peft_model
    import safetensors.torch
    import transformers.modeling_utils

    from labkit.memory.script.checkpoints import MAGIC
    from labkit.memory.script.run import run_script

    real = safetensors.torch.save_file, safetensors.torch.safe_open, torch.save, torch.load
    script = tmp_path / "save_load.py"
    script.write_text(SAVE_AND_LOAD)
    existing = tmp_path / "ckpt.pt"
    existing.write_bytes(b"a real checkpoint")
    rep = run_script(str(script), [str(tmp_path)], banner=False)
    assert rep.peak_bytes > 0 and "failed" not in str(rep.outcome), rep.outcome
    assert any("save_file" in n and "placeholder" in n for n in rep.notes), rep.notes
    assert any("ckpt.pt" in n and "was kept" in n for n in rep.notes), rep.notes
    assert existing.read_bytes() == b"a real checkpoint"            # nothing already written is lost
    placeholder = tmp_path / "base" / "model.safetensors"
    assert 0 < placeholder.stat().st_size < 20_000                 # a header: no data
    with pytest.raises(Exception, match="header|metadata|covered"):
        safetensors.torch.load_file(str(placeholder))
    assert (safetensors.torch.save_file, safetensors.torch.safe_open, torch.save, torch.load) == real
    assert peft.peft_model.safe_save_file is real[0] and transformers.modeling_utils.safe_open is real[1]
    safetensors.torch.save_file({"x": torch.ones(2)}, str(tmp_path / "real.safetensors"))  # a real save still writes
    assert safetensors.torch.load_file(str(tmp_path / "real.safetensors"))["x"].tolist() == [1.0, 1.0]
    assert not MAGIC.startswith(b"PK")                             # not a zip: torch.load refuses it outside


def test_torch_save_placeholders_in_this_process(tmp_path):
    """torch.save/torch.load on the fake GPU: views keep sharing one storage, map_location moves tensors, a real
    host tensor keeps its values, weights_only refuses what PyTorch refuses, and a file object works as a path
    does."""
    import io
    import pickle

    with fake_gpu():
        w = torch.empty(64, 32, device="cuda", dtype=torch.bfloat16)
        idx = torch.arange(10_000)                                  # a real host tensor (80 KB): values kept
        torch.save({"w": w, "half": w[:32], "p": nn.Parameter(torch.empty(8)), "idx": idx}, tmp_path / "x.pt")
        before = torch.cuda.memory_allocated()
        got = torch.load(tmp_path / "x.pt")
        assert torch.cuda.memory_allocated() - before == 4096      # one storage: the view shares it
        assert got["w"].is_cuda and got["w"].dtype == torch.bfloat16 and got["half"].shape == (32, 32)
        assert got["half"].data_ptr() == got["w"].data_ptr() and isinstance(got["p"], nn.Parameter)
        assert got["idx"].sum().item() == 49_995_000 and not got["idx"].is_cuda
        host = torch.load(tmp_path / "x.pt", map_location="cpu")
        assert not host["w"].is_cuda and torch.cuda.memory_allocated() - before == 4096
        buf = io.BytesIO()
        torch.save(fake_gpu, buf)                                   # a function: not a weights-only global
        buf.seek(0)
        with pytest.raises(pickle.UnpicklingError, match="Weights only"):
            torch.load(buf)
        buf.seek(0)
        assert torch.load(buf, weights_only=False) is fake_gpu


def test_a_real_safetensors_file_is_read_from_its_header(tmp_path):
    """safe_open of a real checkpoint on the fake GPU reads no values: tensors of its shapes and dtypes, on the
    device asked for, and a note says so."""
    from safetensors.torch import load_file, save_file

    save_file({"w": torch.ones(300, 300, dtype=torch.float16), "b": torch.arange(3)}, str(tmp_path / "real.safetensors"))
    with fake_gpu() as gpu:
        got = load_file(str(tmp_path / "real.safetensors"), device="cuda")
        assert got["w"].is_cuda and got["w"].shape == (300, 300) and got["w"].dtype == torch.float16
        assert got["b"].dtype == torch.int64 and torch.cuda.memory_allocated() == 180_224 + 512
    assert any("read from its header" in n for n in gpu.report().notes)


def test_small_integer_gpu_tensors_carry_their_values():
    """A padding mask made on the GPU from ids and lengths drawn there: every op on known values is run again on
    the host, random draws come from a host stream of their own (the program's host draws are unchanged), and a
    write from unknown values makes the storage's values unknown, every view of it included."""
    torch.manual_seed(1)
    expected = torch.randint(0, 1000, (3,)).tolist()
    torch.manual_seed(1)
    with fake_gpu() as gpu:
        lengths = torch.randint(8, 17, (4,), device="cuda")
        ids = torch.randint(1, 100, (4, 16), device="cuda")
        ids = ids.masked_fill(torch.arange(16, device="cuda")[None, :] >= lengths[:, None], 0)
        mask = (ids != 0).long()
        known, n = gpu.tracker.host_values(mask), gpu.tracker.host_values(lengths)
        assert known is not None and known.sum(1).tolist() == n.tolist() and known.dtype == torch.int64
        assert torch.randint(0, 1000, (3,)).tolist() == expected      # host draws: the program's own stream
        row = mask[0]
        assert gpu.tracker.host_values(row).tolist() == known[0].tolist()
        mask.copy_(torch.randn(4, 16, device="cuda").exp() > 1)         # unknown values written into it
        assert gpu.tracker.host_values(mask) is None and gpu.tracker.host_values(row) is None
        assert gpu.tracker.host_values(torch.randn(4, device="cuda")) is None   # floats carry no values
    assert any("drawn on the host" in n for n in gpu.report().notes)


class _ScaledMatmul(torch.autograd.Function):
    """A user's custom Function with AMP decorators: its backward runs under the forward's autocast state."""
    seen: list = []

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        gx, gw = grad @ w.t(), x.t() @ grad
        _ScaledMatmul.seen.append((gx.dtype, gw.dtype))
        return gx, gw


def test_a_custom_functions_backward_casts_under_the_forwards_autocast():
    """torch.amp.custom_bwd opens the forward's autocast region in the backward, where torch function modes are not
    active: the fake GPU enters its autocast again there (runtime.custom_backward_modes), so the backward's matmuls
    run in bf16 as on the GPU (users' custom_function_mlp was 4.1% high when they ran in float32)."""
    _ScaledMatmul.seen.clear()
    with fake_gpu():
        x = torch.randn(64, 256, device="cuda", requires_grad=True)
        w = torch.randn(256, 256, device="cuda", requires_grad=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = _ScaledMatmul.apply(x, w)
        assert y.dtype == torch.bfloat16
        y.float().sum().backward()
    assert _ScaledMatmul.seen == [(torch.bfloat16, torch.bfloat16)]


def test_spectral_norm_registers_on_real_host_weights():
    """spectral_norm's registration writes a weight into itself (``weight.set_(weight)``, parametrize.py
    ``_maybe_set``): on host tensors that are real one by one (49,152 elements) but larger than the real-host
    limit together, the write stays real instead of being refused (data/scripts/users2/gan_spectral_bf16.py)."""
    from torch.nn.utils.parametrizations import spectral_norm

    with fake_gpu() as gpu:
        head = spectral_norm(nn.Linear(49_152, 1))
        assert not is_fake(head.parametrizations.weight.original)
        head.cuda()
        head(torch.randn(4, 49_152, device="cuda")).sum().backward()
        assert head.parametrizations.weight.original.grad.is_cuda
    assert gpu.report().peak_bytes >= 2 * 49_152 * 4


def test_a_cuda_generator_is_made_as_on_a_cuda_build():
    """``torch.Generator(device="cuda")`` (timm's ModelEmaV3 keeps one), which a CPU build refuses: a host generator
    stands in with the GPU as its device; torch's own generators stay what they were, and so does torch.Generator."""
    original = torch.Generator
    with fake_gpu() as gpu:
        g = torch.Generator(device="cuda")
        assert g.device == torch.device("cuda", 0) and g.manual_seed(3).initial_seed() == 3
        assert isinstance(g, torch.Generator) and isinstance(torch.default_generator, torch.Generator)
        assert torch.Generator().device.type == "cpu"
        x = torch.randn(256, 1024, device="cuda", generator=g)
        assert x.is_cuda and torch.cuda.memory_allocated() == 256 * 1024 * 4
    assert torch.Generator is original
    assert any("torch.Generator(device='cuda')" in n for n in gpu.report().notes)


def test_a_create_graph_backward_numbers_its_nodes_as_the_gpus_device_thread_does():
    """A gradient penalty (WGAN-GP: torch.autograd.grad with create_graph=True) makes its nodes on the CUDA autograd
    engine's thread, whose sequence numbers run below the forward's, so a later backward reaches the critic's other
    graphs (the real batch's) before the penalty's; on the calling thread the penalty's would come first and keep
    every graph alive through its double backward (users2 wgan_gp: +14.9% peak before)."""
    order = []

    def critic(d, x, name):
        h = d[1](d[0](x))
        h.register_hook(lambda g: order.append(name))
        return d[2](h.flatten(1)).mean()

    with fake_gpu():
        d = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1)).cuda()
        fake, real = torch.randn(8, 64, device="cuda"), torch.randn(8, 64, device="cuda")
        mixed = (0.5 * fake + 0.5 * real).requires_grad_(True)
        loss = critic(d, fake, "fake") - critic(d, real, "real")
        (grad,) = torch.autograd.grad(critic(d, mixed, "mixed"), mixed, create_graph=True)
        grad.register_hook(lambda g: order.append("penalty"))
        order.clear()                                       # the mixed batch's hook ran in the penalty's backward
        (loss + grad.norm(2, dim=1).sub(1).pow(2).mean()).backward()
    assert order[0] == "real" and set(order) == {"real", "penalty", "fake", "mixed"}   # the calling thread: penalty
