"""Advise's step time against recorded plain-loop step times (``benchmarks/gpu/record_plain.py``):
each recorded case of the corpus is run in fake mode with the :class:`Roofline` observer and its
predicted step compared with the median step the H200 ran; reference and held-out cases apart."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from labkit.advise.roofline import Roofline
from labkit.core import paths
from labkit.core.errors import LabkitError
from labkit.core.provenance import load_measurement
from labkit.memory.trace.corpus_check import predict_as_recorded
from labkit.memory.trace.step import FakeModeUnsupported, Probes
from labkit.workloads import corpus

# The step times advise's pricing was built against (reference cases) and held out from: the first plain-loop
# recording. The second (plain__corpus.json, which adds each case's starting allocator state for the memory
# validation) agrees on memory but its host-bound steps ran up to 40% slower: ``bench_advise.py --validate``
# prints the errors against both.
PLAIN_FILE = paths.DATA_DIR / "measurements" / "measure" / "plain__corpus_run1.json"
SECOND_RUN = paths.DATA_DIR / "measurements" / "measure" / "plain__corpus.json"


@dataclass
class StepTimeCheck:
    name: str
    split: str
    measured_s: float
    predicted_s: float
    kernels: int
    gpu_busy_s: float = 0.0      # the priced kernels alone
    host_s: float = 0.0          # the priced host issue alone
    syncs: int = 0

    @property
    def rel_error(self) -> float:
        return self.predicted_s / self.measured_s - 1


def recorded_step_times(path: Path | str = PLAIN_FILE) -> dict[str, dict]:
    """name -> recorded row (with its ``provenance``: the row's own, or the recording's)."""
    p = Path(path)
    if not p.exists():
        raise LabkitError(f"{p}: no plain-loop recording (benchmarks/gpu/record_plain.py writes it)")
    doc = load_measurement(p)
    return {c["name"]: {"provenance": doc["provenance"], **c} for c in doc["data"]["cases"] if c.get("median_step_s")}


# Every recording of the plain loops' step times: the two corpus runs and the host-split runs (record_host.py
# times the plain step too, in its own process; pair_1x64 beside its shrunk step, --shrink 1,64 --pair). A
# host-bound step's time varies between runs on the same kind of machine (mixtral-b4-bf16: 24.7 to 37.9 ms in
# five runs; opt-b4-ckpt2-amp-bf16: 74.3 ms in one, 46.5 ms in another), so each case is also compared with the
# median of its recordings.
STEP_TIME_FILES = (PLAIN_FILE, SECOND_RUN) + tuple(
    paths.DATA_DIR / "measurements" / "advise" / f"host_split__{tag}.json"
    for tag in ("whole", "per_block", "chunks400", "pair_1x64"))


def recorded_runs(files: tuple[Path | str, ...] = STEP_TIME_FILES) -> dict[str, list[float]]:
    """Each case's median step time in every recording that has it: name -> seconds, one per run."""
    out: dict[str, list[float]] = {}
    for f in files:
        p = Path(f)
        if not p.exists():
            continue
        for c in load_measurement(p)["data"]["cases"]:
            if c.get("median_step_s"):
                out.setdefault(c["name"], []).append(c["median_step_s"])
    return out


def predict_step_time(case, table=None, recorded: dict | None = None) -> dict:
    """The priced steady step of one corpus case on the target GPU (:meth:`Roofline.describe`). ``recorded``: a
    recorded row, whose program is run where the installed ``transformers`` differs from the recorded one
    (its attention implementation, rotary embedding, KV-cache dtype: ``corpus_check.predict_as_recorded``)."""
    row = recorded or {}
    with Roofline(table=table) as rf:
        predict_as_recorded(case, (row.get("provenance") or {}).get("transformers"), row.get("attn_implementation"),
                            probes=Probes(observers=(rf,)))
    return rf.describe()


def check(names: list[str] | None = None, path: Path | str = PLAIN_FILE) -> list[StepTimeCheck]:
    rec = recorded_step_times(path)
    out = []
    for name in names or sorted(rec):
        row = rec[name]
        try:
            case = corpus.get_case(name)
        except LabkitError:
            continue
        d = predict_step_time(case, recorded=row)
        out.append(StepTimeCheck(name, row.get("split", case.split), row["median_step_s"], d["step_s"], d["kernels"],
                                 d["gpu_busy_s"], d["host_s"], d["syncs"]))
    return out


# The plain steps recorded shrunk (record_host.py --shrink B,S: batch and sequence tiny, layers and widths kept),
# so that the GPU outruns the host and the synchronised step is close to the host's issue time, for steps of any
# number of kernels.
SHRUNK_FILES = tuple(paths.DATA_DIR / "measurements" / "advise" / f"host_split__{tag}.json"
                     for tag in ("shrink_1x64", "shrink_2x128", "pair_1x64"))


@dataclass
class ShrunkCheck:
    """One shrunk recorded step beside the priced step of the same shrunk case."""

    name: str
    split: str
    shrink: tuple[int, int]
    checkpointed: bool
    measured_s: float
    predicted_s: float
    predicted_host_s: float
    predicted_gpu_s: float

    @property
    def ratio(self) -> float:
        return self.measured_s / self.predicted_s


def shrunk_checks(path: Path | str = SHRUNK_FILES[0], names: list[str] | None = None) -> list[ShrunkCheck]:
    """Price every shrunk step of ``path`` (a ``record_host.py --shrink`` recording) as it ran: the case at the
    recorded batch and sequence. A case the installed ``transformers`` cannot run is left out."""
    out = []
    for row in load_measurement(Path(path), kind="host_split")["data"]["cases"]:
        measured = row.get("shrunk_step_s") if row.get("paired") else row.get("median_step_s")
        if "shrink" not in row or not measured or (names and row["name"] not in names):
            continue
        base = corpus.get_case(row["name"])
        case = dataclasses.replace(base, micro_batch=row["shrink"][0], seq=row["shrink"][1])
        try:
            d = predict_step_time(case)
        except FakeModeUnsupported:
            continue
        out.append(ShrunkCheck(row["name"], base.split, tuple(row["shrink"]), base.recompute != "none",
                               measured, d["step_s"], d["host_s"], d["gpu_busy_s"]))
    return out
