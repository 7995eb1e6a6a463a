"""The corpus against fake mode: what fake mode supports, and how close its peaks come to the
recorded plain loops on the H200.

* :func:`support` runs every corpus case at CI size (``labkit.workloads.corpus.tiny``) in fake
  mode and says, per case, ``predicted`` or ``refused`` (with fake mode's one-line reason) or
  ``unavailable`` (a package the case needs is not installed); :func:`support_markdown` is the README's
  table (notebook 04's sections are built in :mod:`labkit.lessons.recompute_precision`).
* :func:`load_plain` reads the recorded ground truth, written by ``benchmarks/gpu/record_plain.py``
  (untraced loops, ``torch.cuda.max_memory_allocated`` of steps 2-4), in two recordings of the same
  corpus: ``fresh`` (``plain__fresh.json``: every case in its own new process, as a user runs one
  training script) and ``in-process`` (``plain__corpus.json``: the cases one after another in one
  process, each starting from the segments the earlier ones left, ``base_segments``; it also lists the
  kernels that ran). :func:`validate` predicts each recorded case in fake mode and compares peak and
  reserved bytes against the targets (peak within :data:`PEAK_TOLERANCE_PCT`, reserved within
  :data:`RESERVED_TOLERANCE_PCT`), reference and held-out cases apart (:func:`summary`, :func:`validation_rows`);
  :func:`process_pairs` sets the two recordings side by side: the peaks agree, reserved memory depends on
  the process's history.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shlex
import statistics
import sys
import time
import types
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from labkit.core.errors import LabkitError
from labkit.core.provenance import load_measurement
from labkit.core.units import GiB

# torch, transformers and the tracer are imported where a case runs: `labkit measure` imports this module for its
# KV-cache note, and `labkit --help` should not pay seconds of torch import for it.


PEAK_TOLERANCE_PCT = 3.0          # issue 11: every recorded case within 3% (held-out included)
RESERVED_TOLERANCE_PCT = 5.0
# A case recorded in a warm process (after other cases) starts from segments whose addresses the earlier cases'
# freed ranges decided; the recording keeps the segments but not those ranges. Where such a case misses on reserved
# alone, the validation replays its requests under this many other orders of the segments' addresses
# (measure_step's reserved_placements) and reports whether the recorded bytes lie in that range.
PLACEMENT_ORDERS = 12
PLAIN_FILE = "plain__corpus.json"
FRESH_FILE = "plain__fresh.json"
RECORDINGS = {"fresh": FRESH_FILE, "in-process": PLAIN_FILE}     # how the cases' processes ran


@dataclass
class Support:
    """Whether fake mode runs one corpus case (at CI size)."""

    case: str
    status: str                    # predicted, refused, unavailable
    reason: str = ""
    peak_bytes: int | None = None
    seconds: float = 0.0


def check_case(case: Any, *, steps: int = 1) -> Support:
    """Predict ``case`` in fake mode (one step: what fake mode cannot run fails in the first): a
    :class:`Support` (never raises for fake mode's limits)."""
    from labkit.memory.trace.step import FakeModeUnsupported
    from labkit.workloads.corpus import predict

    t = time.perf_counter()
    try:
        rep = predict(case, steps=steps)
    except FakeModeUnsupported as exc:
        return Support(case.name, "refused", _refusal(case, exc, steps), seconds=time.perf_counter() - t)
    except LabkitError as exc:
        if "not importable" in str(exc):
            return Support(case.name, "unavailable", str(exc), seconds=time.perf_counter() - t)
        raise
    return Support(case.name, "predicted", "", rep.peak_bytes, time.perf_counter() - t)


# the size flags of `labkit measure --hf-config`, by the configuration field they set
_SIZE_FLAGS = (("num_hidden_layers", "--layers"), ("hidden_size", "--hidden"), ("num_attention_heads", "--heads"),
               ("vocab_size", "--vocab"))


def cache_free_command(case: Any) -> list[str]:
    """The ``labkit measure`` command for a Hugging Face causal LM case (its model type and sizes, batch,
    precision, recompute) with ``--no-kv-cache``."""
    cmd = ["labkit", "measure", "--hf-config", case.arch]
    cmd += [a for key, flag in _SIZE_FLAGS if key in case.overrides for a in (flag, str(case.overrides[key]))]
    cmd += ["--micro-batch", str(case.micro_batch), "--seq", str(case.seq), "--precision", case.precision,
            "--recompute", case.recompute, "--no-kv-cache"]
    return cmd


def _refusal(case: Any, exc: Exception, steps: int) -> str:
    """The refusal's line. A Hugging Face causal LM checkpointed by torch.utils.checkpoint with its KV cache on
    can fail in the recomputation, which appends to the cache the forward filled (Gemma 2 under transformers 5.24:
    the recomputed keys no longer match the mask; real tensors fail the same way, so ``--device cpu`` is no way
    out): where the case runs with ``use_cache=False``, the line names that command instead."""
    from labkit.memory.trace.step import FakeModeUnsupported
    from labkit.workloads.corpus import predict

    reason = str(exc)
    if not (case.family == "transformers" and case.task == "causal-lm" and case.recompute != "none"
            and case.checkpoint_impl == "torch" and case.overrides.get("use_cache", True) is not False):
        return reason
    try:
        predict(replace(case, overrides={**case.overrides, "use_cache": False}), steps=steps)
    except FakeModeUnsupported:
        return reason

    import transformers

    return (reason.split("; run the step on a device instead", 1)[0] + "; the model's own recomputation grows the KV "
            f"cache its forward filled (transformers {transformers.__version__}; real tensors fail the same way); "
            f"without the cache it runs: {shlex.join(cache_free_command(case))}")


def support(cases: list[Any] | None = None) -> list[Support]:
    """Every case of the compatibility corpus (``labkit.workloads.corpus.compat_cases``, CI sizes)
    in fake mode, under a second each on a 2-core CPU."""
    from labkit.workloads.corpus import compat_cases

    return [check_case(c) for c in (cases if cases is not None else compat_cases())]


def support_markdown(results: list[Support] | None = None) -> str:
    """The support table for the README: one row per model or policy, one column per precision
    ("yes", or the op/module fake mode refuses), then the refusals' reasons.

        python -c "from labkit.memory.trace.corpus_check import support_markdown; print(support_markdown())"
    """
    from labkit.workloads.corpus import COMPAT_PRECISIONS

    results = results if results is not None else support()
    rows: dict[str, dict[str, str]] = {}
    reasons: dict[str, list[str]] = {}
    for r in results:
        base = r.case.removesuffix("@tiny")
        prec = next((p for p in sorted(COMPAT_PRECISIONS, key=len, reverse=True) if base.endswith("-" + p)), "")
        group = base[: len(base) - len(prec) - 1] if prec else base
        cell = "yes" if r.status == "predicted" else r.status
        if r.status != "predicted":
            why = short_reason(r.reason).removeprefix("fake mode cannot run ")
            reasons.setdefault(why, []).append(base)
            cell = f"{r.status} ({list(reasons).index(why) + 1})"
        rows.setdefault(group, {})[prec or "as named"] = cell
    cols = [c for c in (*COMPAT_PRECISIONS, "as named") if any(c in v for v in rows.values())]
    lines = ["| case | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    lines += [f"| {g} | " + " | ".join(v.get(c, "") for c in cols) + " |" for g, v in rows.items()]
    n_ok = sum(r.status == "predicted" for r in results)
    lines += ["", f"{n_ok} of {len(results)} cases predicted. Refused, with fake mode's reason:", ""]
    lines += [f"{i}. {why}" for i, why in enumerate(reasons, 1)]
    return "\n".join(lines)


def short_reason(reason: str) -> str:
    """The refusal without its fixed advice (the table says it once)."""
    return reason.split("; run the step on a device instead", 1)[0]


# ---------------------------------------------------------------------------------------------
# Validation against the recorded plain loops


@dataclass
class PlainRecord:
    """One case as recorded on the GPU by ``benchmarks/gpu/record_plain.py``."""

    name: str
    split: str
    case: Any                       # labkit.workloads.corpus.Case, as recorded
    peak_allocated: int
    peak_reserved: int | None
    median_step_s: float | None
    sdpa_backends: list[str]
    provenance: dict[str, Any] = field(default_factory=dict)
    attn_implementation: str | None = None   # the model config's, as the recorded transformers chose it
    base_segments: list | None = None        # the allocator's segments when the case started (record_plain.py)
    step_peaks: list[int] = field(default_factory=list)   # each recorded step's peak (steps 2-4), where recorded


@dataclass
class Validation:
    """A fake-mode prediction beside the recorded plain-loop peak."""

    name: str
    split: str
    status: str                     # predicted or refused
    recorded_peak: int
    recorded_reserved: int | None
    predicted_peak: int | None = None
    predicted_reserved: int | None = None
    reason: str = ""
    seconds: float = 0.0
    note: str = ""                  # what the prediction did to run the case as recorded
    reserved_range: tuple[int, int] | None = None   # a warm-process miss: over PLACEMENT_ORDERS address orders

    @property
    def peak_error_pct(self) -> float | None:
        if self.predicted_peak is None:
            return None
        return 100.0 * (self.predicted_peak - self.recorded_peak) / self.recorded_peak

    @property
    def reserved_error_pct(self) -> float | None:
        if self.predicted_reserved is None or not self.recorded_reserved:
            return None
        return 100.0 * (self.predicted_reserved - self.recorded_reserved) / self.recorded_reserved

    @property
    def within_targets(self) -> bool:
        pe, re_ = self.peak_error_pct, self.reserved_error_pct
        return (pe is not None and abs(pe) <= PEAK_TOLERANCE_PCT
                and (re_ is None or abs(re_) <= RESERVED_TOLERANCE_PCT))

    @property
    def within_placement_range(self) -> bool:
        """A miss on reserved alone whose recorded bytes one of the address orders reproduces or brackets."""
        pe, r = self.peak_error_pct, self.reserved_range
        return (not self.within_targets and r is not None and pe is not None and abs(pe) <= PEAK_TOLERANCE_PCT
                and self.recorded_reserved is not None and r[0] <= self.recorded_reserved <= r[1])


def plain_path(process: str = "in-process") -> Path:
    """The recording of the corpus whose cases ran ``process``: ``fresh`` or ``in-process`` (:data:`RECORDINGS`)."""
    from labkit.memory.trace.recorded import measure_dir

    if process not in RECORDINGS:
        raise LabkitError(f"process {process!r}: the corpus is recorded as {' or '.join(map(repr, RECORDINGS))}")
    return measure_dir() / RECORDINGS[process]


def load_plain(path: str | Path | None = None, *, process: str = "in-process") -> list[PlainRecord]:
    """The recorded corpus cases that ran (rows with an error or skipped are left out), from ``path`` or
    the recording of ``process`` (``fresh``: one new process per case; ``in-process``: one after another)."""
    from labkit.workloads.corpus import Case

    path = Path(path) if path is not None else plain_path(process)
    doc = load_measurement(path, kind="measure_plain")
    out = []
    for r in doc["data"]["cases"]:
        if r.get("peak_allocated") is None:
            continue
        try:
            case = Case(**r["case"])
            out.append(PlainRecord(r["name"], r["split"], case, int(r["peak_allocated"]),
                                   None if r.get("peak_reserved") is None else int(r["peak_reserved"]),
                                   r.get("median_step_s"), list(r.get("sdpa_backends") or []),
                                   r.get("provenance") or doc["provenance"],   # rows recorded later carry their own
                                   r.get("attn_implementation"), r.get("base_segments"),
                                   [int(p) for p in r.get("step_peaks_allocated") or []]))
        except (KeyError, TypeError, ValueError) as exc:
            raise LabkitError(f"{path}: case {r.get('name', '?')!r} is malformed ({exc})") from None
        if case.split != r["split"]:
            raise LabkitError(f"{path}: case {case.name!r} is stored as {r['split']} but its name hashes to "
                              f"{case.split}")
    return out


def validate(records: list[PlainRecord] | None = None) -> list[Validation]:
    """Fake mode's prediction of each recorded case beside its recording, in order, in this process
    (:func:`iter_validate` spreads them over processes)."""
    return list(map(validate_one, records if records is not None else load_plain()))


def iter_validate(records: list[PlainRecord], *, jobs: int = 1) -> Iterator[Validation]:
    """Fake mode's prediction of each recorded case (:func:`validate_one`), yielded in the records' order. ``jobs`` > 1
    predicts in that many processes of their own, forked from this one where the platform forks and this process has
    not initialised CUDA (nothing to import again), else spawned: a forked child of a process that has cannot use
    CUDA at all. (On the H200, ``bench_tracer.py --validate``, whose header probes the GPU first, got every case
    refused from forked workers, while the same call from a process that had not touched CUDA predicted them; the
    refusal's text was not recorded.) A case's figures do not depend on the process that predicts it (each
    prediction starts from the allocator state its recording started in)."""
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() and not _cuda_initialized() else "spawn"
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if jobs <= 1 or len(records) < 2 or (method == "spawn" and main is not None and not os.path.exists(main)):
        yield from map(validate_one, records)     # (a spawned worker runs __main__'s file again: `python - < x` has none)
        return
    with ProcessPoolExecutor(max_workers=min(jobs, len(records)), mp_context=multiprocessing.get_context(method),
                             initializer=_validation_worker) as pool:
        yield from pool.map(validate_one, records)


def _cuda_initialized() -> bool:
    import torch

    return torch.cuda.is_initialized()


def _validation_worker() -> None:
    """A validation worker computes with one thread: the workers are the parallelism (and a forked child must not
    reuse its parent's OpenMP pool). It keeps quiet about the installed torch, which the report states once (each
    worker would warn again, a line per process in a notebook's output)."""
    import torch

    from labkit.memory.trace.fake.fake_cuda import TorchVersionWarning

    torch.set_num_threads(1)
    warnings.simplefilter("ignore", TorchVersionWarning)


def validation_jobs(cases: int) -> int:
    """How many processes :func:`iter_validate` should use here for ``cases`` cases: one per core but one, and at most
    one per 3 GiB of memory (a worker holds torch, transformers and a traced model's fake graph), 1 for fewer than
    8 cases (spawning costs more than it saves)."""
    if cases < 8:
        return 1
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        mem = 0
    by_mem = max(1, mem // (3 * GiB)) if mem else 1
    return max(1, min((os.cpu_count() or 1) - 1, by_mem, cases))


def validate_one(rec: PlainRecord) -> Validation:
    """Fake mode's prediction of one recorded case (the program its recording's transformers ran, from the allocator
    state it started in) beside the recording; a warm-process miss also gets the range of segment-address orders."""
    from labkit.memory.trace.fake.healthy_values import RANDOM_DRAW   # torch: not at import (`labkit --help`)
    from labkit.memory.trace.step import FakeCuda, FakeModeUnsupported

    t = time.perf_counter()
    v = Validation(rec.name, rec.split, "predicted", rec.peak_allocated, rec.peak_reserved)
    notes: list[str] = []
    version = rec.provenance.get("transformers")

    def run(**kw: Any) -> Any:
        fake = FakeCuda(allocator_state=rec.base_segments, **recorded_process(rec.base_segments), **kw)
        rep, changed = predict_as_recorded(rec.case, version, rec.attn_implementation, fake=fake)
        notes.extend(changed)
        return rep

    try:
        rep = run()
        v.predicted_peak, v.predicted_reserved = rep.peak_bytes, rep.reserved_bytes
        if rec.step_peaks and any(a.startswith(RANDOM_DRAW) for a in rep.emulation.get("assumptions", ())):
            notes.append(f"random from step to step (a test of a random draw, such as LayerDrop's): the recorded "
                         f"steps peaked at {min(rec.step_peaks) / GiB:.2f}-{max(rec.step_peaks) / GiB:.2f} GiB, "
                         f"fake mode traced the step that skips nothing")
        if rec.base_segments and not v.within_targets and abs(v.peak_error_pct or 0) <= PEAK_TOLERANCE_PCT:
            notes.clear()
            v.reserved_range = run(reserved_placements=PLACEMENT_ORDERS).reserved_range
    except FakeModeUnsupported as exc:
        v.status, v.reason = "refused", short_reason(str(exc))
    v.seconds = time.perf_counter() - t
    v.note = "; ".join(n for n in notes if n)
    return v


def predict_as_recorded(case: Any, recorded_version: str | None, attn_implementation: str | None,
                        **kw: Any) -> tuple[Any, list[str]]:
    """``corpus.predict(case, **kw)`` running the program its recording ran where the installed ``transformers``
    differs from the recorded one: the recorded attention implementation, rotary embedding, KV-cache dtype and
    position-bias layout (:func:`recorded_attention`, :func:`recorded_rotary`, :func:`recorded_cache_dtype`,
    :func:`recorded_position_bias`). Returns the report and what was changed."""
    from labkit.workloads.corpus import predict

    notes: list[str] = []
    with recorded_cache_dtype(recorded_version) as note, recorded_position_bias(recorded_version) as bias_note:
        rep = predict(case, prepare=lambda m: notes.extend(
            (recorded_attention(m, attn_implementation, recorded_version), recorded_rotary(m, recorded_version))),
            **kw)
    notes += [note(), bias_note()]
    return rep, [n for n in notes if n]


def recorded_attention(model: Any, impl: str | None, recorded_version: str | None = None) -> str:
    """Run a ``transformers`` model with the attention implementation its recording names, where the
    installed version picks another; returns what was changed ("" when nothing was).

    Fake mode runs the installed library, so a user's prediction follows the installed version's
    choices (and :func:`validate` reports where they differ from the recorded one's). The recorded
    ground truth was produced by the transformers of its provenance, and a comparison must run the
    same program. The case in point: transformers 5.17 (the H200's) ran Gemma 2 through SDPA (the
    recording names ``sdpa``, and cuDNN attention kernels ran); ``F.scaled_dot_product_attention`` has
    no soft-capping argument, so that run did not soft-cap the attention scores. The installed 5.24
    declares Gemma 2 without SDPA (``Gemma2PreTrainedModel._supports_sdpa = False``, and
    ``integrations/sdpa_attention.py``'s ``sdpa_attention_forward`` raises on a ``softcap``) and runs
    eager attention, which keeps the (s x s) scores and probabilities. Under SDPA the attention
    modules' ``attn_logit_softcapping`` is therefore dropped, as the recorded run dropped it.
    """
    cfg = getattr(model, "config", None)
    now = getattr(cfg, "_attn_implementation", None)
    if not impl or now is None or now == impl:
        return ""
    import transformers

    for m in model.modules():
        c = getattr(m, "config", None)
        if isinstance(c, transformers.PretrainedConfig):
            c._attn_implementation = impl
        if impl == "sdpa" and getattr(m, "attn_logit_softcapping", None) is not None:
            m.attn_logit_softcapping = None
    return (f"attention {impl} as recorded (transformers {recorded_version or '?'}); "
            f"the installed {transformers.__version__} runs {now}")


# the first transformers release whose rotary embeddings multiply instead of calling a matmul (5.18.0 and earlier:
# ``(inv_freq_expanded @ position_ids_expanded).transpose(1, 2)`` in each model's ``*RotaryEmbedding.forward``)
ROTARY_BY_MULTIPLY = (5, 19)


def recorded_rotary(model: Any, recorded_version: str | None) -> str:
    """Run the rotary embeddings as the recording's transformers ran them, where the installed one differs;
    returns what was changed ("" when nothing was).

    Up to 5.18 every rotary embedding of the corpus' families (Llama, Mistral, Qwen2/3, Gemma 1-3, Phi-3,
    GPT-NeoX, Falcon, Mixtral, Qwen-MoE) computed its frequencies with a float32 batched matmul, a cuBLAS
    call: in a fresh process it is the forward thread's first one, and the H200's allocation stream shows its
    32 MiB cuBLAS workspace allocated there, before the first layer's norm (``llama-gqa-b8-ckpt3-amp-bf16``,
    ``stream__*__cold``). From 5.19 they multiply by broadcasting (no cuBLAS), and the workspace waits for
    the first projection. The order decides which free block later requests take. Only the default and the
    statically scaled rope types are run this way (a dynamic one updates its frequencies first)."""
    if (not recorded_version or _version(recorded_version) >= ROTARY_BY_MULTIPLY
            or _version(_installed_transformers()) < ROTARY_BY_MULTIPLY):
        return ""

    patched = 0
    for m in model.modules():
        if not type(m).__name__.endswith("RotaryEmbedding") or "dynamic" in str(getattr(m, "rope_type", "")):
            continue
        if hasattr(m, "inv_freq") and hasattr(m, "attention_scaling"):
            m.forward = types.MethodType(_rotary_by_matmul, m)
            patched += 1
        elif hasattr(m, "layer_types"):                        # Gemma 3: one frequency table per layer type
            m.forward = types.MethodType(_rotary_by_matmul_per_layer_type, m)
            patched += 1
    if not patched:
        return ""
    import transformers

    return (f"rotary frequencies by a matmul as recorded (transformers {recorded_version}); the installed "
            f"{transformers.__version__} multiplies")


def _rope(x: Any, position_ids: Any, inv_freq: Any, scaling: float) -> tuple[Any, Any]:
    import torch

    inv_freq_expanded = inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1).to(x.device)
    position_ids_expanded = position_ids[:, None, :].float()
    with torch.autocast(device_type=x.device.type if x.device.type != "mps" else "cpu", enabled=False):
        freqs = (inv_freq_expanded @ position_ids_expanded).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * scaling
        sin = emb.sin() * scaling
    return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def _rotary_by_matmul(self: Any, x: Any, position_ids: Any) -> tuple[Any, Any]:
    import torch

    with torch.no_grad():
        return _rope(x, position_ids, self.inv_freq, self.attention_scaling)


def _rotary_by_matmul_per_layer_type(self: Any, x: Any, position_ids: Any, layer_type: Any = None) -> tuple[Any, Any]:
    import torch

    with torch.no_grad():
        return _rope(x, position_ids, getattr(self, f"{layer_type}_inv_freq"),
                     getattr(self, f"{layer_type}_attention_scaling"))


def cache_pairs(records: list[PlainRecord] | None = None) -> list[tuple[PlainRecord, PlainRecord]]:
    """The recorded cases run with the KV cache off (``NAME-nocache-PRECISION``) beside the same case with it
    on (``NAME-PRECISION``, transformers' default ``use_cache=True``)."""
    records = records if records is not None else load_plain()
    by_name = {r.name: r for r in records}
    out = []
    for r in records:
        if "-nocache-" in r.name:
            with_cache = by_name.get(r.name.replace("-nocache-", "-"))
            if with_cache is not None:
                out.append((with_cache, r))
    return out


def recorded_process(base_segments: list | None) -> dict[str, Any]:
    """The fake target for a recording's process: a recording that started with no segments at all ran in a
    fresh process, whose cuBLAS workspaces are allocated at the first matmuls, inside the step
    (``CudaTarget.warm_process`` False); one that started from segments, or says nothing, ran warm."""
    from labkit.memory.trace.fake.fake_cuda import CudaTarget

    return {"target": CudaTarget(warm_process=base_segments is None or bool(base_segments))}


# the first transformers release whose DynamicLayer gives the cached values their own dtype (5.23.0 and earlier:
# the keys' dtype for both, cache_utils.py ``DynamicLayer.lazy_initialization``)
CACHE_VALUES_OWN_DTYPE = (5, 24)


@contextlib.contextmanager
def recorded_cache_dtype(recorded_version: str | None) -> Iterator[Callable[[], str]]:
    """Run ``transformers``' KV cache as the recording's version ran it, where the installed version differs.

    Up to 5.23 ``DynamicLayer.lazy_initialization`` starts the cached keys and values as empty tensors of the
    *keys'* dtype, so under autocast, where Llama-style rotary embeddings leave the keys float32 and the values
    bf16, ``torch.cat`` promotes the cached values to float32; 5.24 starts them in their own dtype. A training
    forward still fills the cache (``use_cache`` defaults on), and ``torch.utils.checkpoint`` keeps it alive
    through backward as an input of each checkpointed layer, whose recomputation appends to it again. The
    H200's stream of ``llama-gqa-b4-ckpt2-amp-bf16`` (transformers 5.17) shows the float32 blocks: 16 MiB per
    layer in forward where 5.24 takes 8, 32 MiB per recomputed layer. Yields a function giving the note
    ("" when no cache started with keys and values of different dtypes)."""
    patched, differed = False, []
    try:
        from transformers import cache_utils
    except ImportError:
        cache_utils = None
    layer = getattr(cache_utils, "DynamicLayer", None)
    original = getattr(layer, "lazy_initialization", None)
    if (original is not None and (0,) < _version(recorded_version) < CACHE_VALUES_OWN_DTYPE
            <= _version(_installed_transformers())):
        def keys_dtype(self: Any, key_states: Any, value_states: Any) -> None:
            if key_states.dtype != value_states.dtype and not differed:
                differed.append(f"{key_states.dtype} keys, {value_states.dtype} values")
            original(self, key_states, key_states)

        layer.lazy_initialization = keys_dtype
        patched = True
    try:
        yield lambda: (f"KV cache values started in the keys' dtype as recorded (transformers {recorded_version}; "
                       f"{differed[0]})" if differed else "")
    finally:
        if patched:
            layer.lazy_initialization = original


# the first transformers version the lab has seen hand T5's position bias to SDPA made contiguous (5.24, installed
# here: ``integrations/sdpa_attention.py`` ``create_position_bias_mask``); the H200's 5.17 did not (see below)
POSITION_BIAS_CONTIGUOUS = (5, 24)


@contextlib.contextmanager
def recorded_position_bias(recorded_version: str | None) -> Iterator[Callable[[], str]]:
    """Hand T5-style position biases to SDPA as the recording's ``transformers`` did, where the installed one differs.

    T5's relative-position bias comes out of ``compute_bias`` as a permuted view: (1, H, q, k) with a last-dimension
    stride of H. The installed 5.24 makes the mask it builds from it contiguous; the H200's 5.17 passed it in that
    layout, and a mask whose last stride is not 1 fails every fused kernel's check
    (``check_last_dim_stride_equals_1_dense``, ``sdp_utils_cpp.h``), so SDPA ran the math path: the recording's
    profiler shows ``_scaled_dot_product_attention_math`` for all 24 self-attention calls of T5-base and the fused
    kernels for its 12 cross-attention calls, whose bias is a contiguous zeros tensor. (A contiguous bias that
    requires grad runs mem-efficient there: ``sdpa_choice__h200.json``.) Predicted so, both T5 recordings match to the
    byte; with the installed layout they were 34% and 42% low. Yields a function giving the note ("" when no mask
    was built)."""
    built: list[int] = []
    try:
        from transformers.integrations import sdpa_attention
    except ImportError:
        sdpa_attention = None
    original = getattr(sdpa_attention, "create_position_bias_mask", None)
    patched = (original is not None and (0,) < _version(recorded_version) < POSITION_BIAS_CONTIGUOUS
               <= _version(_installed_transformers()))
    if patched:
        def in_its_own_layout(position_bias: Any, attention_mask: Any, is_causal: bool, query: Any, key: Any) -> Any:
            import torch

            built.append(1)
            low = torch.finfo(key.dtype).min
            if attention_mask is None and is_causal:
                q, k = query.shape[2], key.shape[2]
                allowed = torch.arange(q, device=key.device)[:, None] >= torch.arange(k, device=key.device)[None, :]
                return torch.where(allowed.view(1, 1, q, k), position_bias, low)
            if attention_mask is None:
                return position_bias
            if attention_mask.dtype == torch.bool:
                return torch.where(attention_mask, position_bias, low)
            return position_bias + attention_mask

        sdpa_attention.create_position_bias_mask = in_its_own_layout
    try:
        yield lambda: (f"position bias handed to SDPA in its own layout as recorded (transformers {recorded_version})"
                       if built else "")
    finally:
        if patched:
            sdpa_attention.create_position_bias_mask = original


def _installed_transformers() -> str | None:
    try:
        import transformers
    except ImportError:
        return None
    return transformers.__version__


def _version(text: str | None) -> tuple[int, ...]:
    """``"5.17.0"`` as (5, 17) (:func:`labkit.memory.trace.fake.sdpa.parse_version`); unknown or unparsable as (0,)."""
    from labkit.memory.trace.fake.sdpa import parse_version

    try:
        return parse_version(text) if text else (0,)
    except (ValueError, IndexError):
        return (0,)


def summary(vals: list[Validation]) -> dict[str, Any]:
    """Per split: cases, predicted, within targets, worst and median |peak error|, worst reserved error."""
    out: dict[str, Any] = {}
    for split in ("reference", "held-out"):
        vs = [v for v in vals if v.split == split]
        pe = [v.peak_error_pct for v in vs if v.peak_error_pct is not None]
        re_ = [v.reserved_error_pct for v in vs if v.reserved_error_pct is not None]
        out[split] = {
            "cases": len(vs), "predicted": len(pe), "refused": sum(v.status == "refused" for v in vs),
            "within_targets": sum(v.within_targets for v in vs),
            "within_placement_range": sum(v.within_placement_range for v in vs),
            "worst_peak_error_pct": max(pe, key=abs) if pe else None,
            "median_abs_peak_error_pct": statistics.median(abs(e) for e in pe) if pe else None,
            "worst_reserved_error_pct": max(re_, key=abs) if re_ else None,
            "median_abs_reserved_error_pct": statistics.median(abs(e) for e in re_) if re_ else None,
        }
    return out


def validation_order(vals: list[Validation]) -> list[Validation]:
    return sorted(vals, key=lambda v: (v.split != "reference", v.name))


def validation_rows(vals: list[Validation]) -> list[list[Any]]:
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:+.1f}%"

    rows = []
    for v in validation_order(vals):
        rows.append([v.split, v.name, f"{v.recorded_peak / GiB:.2f}",
                     "-" if v.predicted_peak is None else f"{v.predicted_peak / GiB:.2f}", pct(v.peak_error_pct),
                     "-" if not v.recorded_reserved else f"{v.recorded_reserved / GiB:.2f}",
                     "-" if v.predicted_reserved is None else f"{v.predicted_reserved / GiB:.2f}",
                     pct(v.reserved_error_pct), _verdict(v)])
    return rows


def _verdict(v: Validation) -> str:
    if v.within_targets:
        return "yes"
    if v.status == "refused":
        return "refused"
    if v.reserved_range is not None:
        lo, hi = v.reserved_range
        where = "in" if v.within_placement_range else "outside"
        return f"no: recorded {where} the {PLACEMENT_ORDERS} address orders' {lo / GiB:.2f}-{hi / GiB:.2f} GiB"
    return "no"


VALIDATION_HEADERS = ["split", "case", "recorded peak GiB", "fake peak GiB", "error", "recorded reserved GiB",
                      "fake reserved GiB", "error", "within targets"]  # GiB (2^30 B), as the rest of notebook 04


PROCESS_WORDS = {"fresh": "each case in its own new process",
                 "in-process": "the cases one after another in one process"}


@dataclass
class ProcessPair:
    """One case as recorded in a fresh process and after other cases in the same process."""

    name: str
    split: str
    fresh_peak: int
    in_process_peak: int
    fresh_reserved: int
    in_process_reserved: int
    source: str = ""                # where the recordings come from ("recorded on 1 x NVIDIA H200, ...")

    @property
    def peak_change_pct(self) -> float:
        return 100.0 * (self.in_process_peak - self.fresh_peak) / self.fresh_peak

    @property
    def reserved_change_pct(self) -> float:
        return 100.0 * (self.in_process_reserved - self.fresh_reserved) / self.fresh_reserved


def process_pairs() -> list[ProcessPair]:
    """The corpus cases recorded both ways, in the corpus' order."""
    from labkit.memory.trace.recorded import recorded_label

    fresh = {r.name: r for r in load_plain(process="fresh")}
    out = []
    for r in load_plain(process="in-process"):
        f = fresh.get(r.name)
        if f is not None and f.peak_reserved and r.peak_reserved:
            out.append(ProcessPair(r.name, r.split, f.peak_allocated, r.peak_allocated, f.peak_reserved,
                                   r.peak_reserved, recorded_label(f.provenance)))
    return out


__all__ = ["PEAK_TOLERANCE_PCT", "PROCESS_WORDS", "RECORDINGS", "RESERVED_TOLERANCE_PCT", "PlainRecord", "ProcessPair",
           "Support", "Validation", "cache_free_command", "cache_pairs", "check_case", "load_plain", "process_pairs",
           "recorded_attention", "recorded_cache_dtype", "recorded_process", "recorded_rotary", "short_reason", "summary",
           "support", "support_markdown", "validate", "validation_order", "validation_rows"]
