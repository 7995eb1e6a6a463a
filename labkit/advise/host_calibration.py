"""How much slower eager PyTorch issues a real training step than its per-op microbenchmarks say.

The host costs of :mod:`labkit.advise.kernel_table` are tight loops of one tiny op
(``record_kernels.py``: ``x * 1.0001`` 5000 times, an ``nn.Module`` that returns its input...). A
model's step issues thousands of different ops from Python code that is not in any ATen op (the
model's own ``forward``, composite ops such as ``F.linear`` before they reach ATen, autocast's
wrappers), with colder caches: on the H200's host the step takes longer to issue than the sum of
its ops' microbenchmarked costs.

``record_host.py`` measured that issue time directly where a whole step fits the launch queue (the
step issued behind a sleeping GPU: ``host_split__whole.json``, 7 of 90 cases, all of the reference
split). The ratio of each to the priced host time of the same step is the host scale; the median
is applied to every host cost (:func:`host_scale`). Held-out cases take no part: none of them fits
the queue whole, and the scale is derived from the reference rows only.

``benchmarks/bench_advise.py --calibrate-host`` recomputes the ratios (a fake-mode run per case) and
writes ``host_scale.json``; a test checks that the stored figure is what the recording gives.
"""

from __future__ import annotations

import json
import statistics
from functools import lru_cache
from pathlib import Path

from labkit.core import paths
from labkit.core.errors import LabkitError
from labkit.core.provenance import load_measurement

HOST_SPLIT_FILE = paths.DATA_DIR / "measurements" / "advise" / "host_split__whole.json"
GPU_SPLIT_FILES = tuple(paths.DATA_DIR / "measurements" / "advise" / f"host_split__{tag}.json"
                        for tag in ("chunks400", "per_block"))
SCALE_FILE = paths.DATA_DIR / "measurements" / "advise" / "host_scale.json"


def whole_step_issues(path: Path | str = HOST_SPLIT_FILE) -> dict[str, float]:
    """Reference cases whose whole step the H200's host issued without waiting: name -> seconds."""
    doc = load_measurement(Path(path), "host_split")
    return {c["name"]: c["host_s"] for c in doc["data"]["cases"]
            if c.get("split") == "reference" and "host_s" in c and not c.get("host_blocked", True)}


def recorded_gpu_times(paths_: tuple[Path | str, ...] = GPU_SPLIT_FILES) -> dict[str, float]:
    """The step's kernels back to back on the H200 (chunks each behind a sleep, none outlasting it):
    name -> seconds, from the first file that has the case unblocked (the two chunked recordings agree
    within 2.2% on the 52 cases both have)."""
    out: dict[str, float] = {}
    for p in paths_:
        for c in load_measurement(Path(p), "host_split")["data"]["cases"]:
            if "gpu_s" in c and c.get("fine", c).get("chunks_blocked", 1) == 0:
                out.setdefault(c["name"], c["gpu_s"])
    return out


def derive(priced: dict[str, float], measured: dict[str, float]) -> dict:
    """The host scale from priced (unscaled) and measured host times of the same cases."""
    rows = [{"name": n, "measured_host_s": measured[n], "priced_host_s": priced[n],
             "ratio": measured[n] / priced[n]} for n in sorted(measured) if priced.get(n)]
    if not rows:
        raise LabkitError("host calibration: no case has both a measured and a priced host time")
    return {"scale": statistics.median(r["ratio"] for r in rows), "cases": rows,
            "method": "median over the cases of (host issue time measured whole on the GPU's host) / "
                      "(the step's host time priced from the per-op microbenchmarks)"}


@lru_cache(maxsize=1)
def host_scale() -> float:
    """The stored scale (1.0 when no calibration is stored)."""
    if not SCALE_FILE.exists():
        return 1.0
    doc = json.loads(SCALE_FILE.read_text())
    scale = float(doc["data"]["scale"])
    if not 0.2 <= scale <= 10:
        raise LabkitError(f"{SCALE_FILE}: host scale {scale} is outside 0.2-10")
    return scale
