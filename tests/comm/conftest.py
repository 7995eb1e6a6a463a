from functools import partial

import pytest

from labkit.comm.launch import run_ranks
from labkit.comm.tour import live_tour

SIZES = (0.05, 0.2)  # bucket caps (MiB) of the shared run's sweep


@pytest.fixture(scope="session")
def gloo2():
    """One spawned 2-rank gloo run shared by the chapter's tests (spawning costs seconds on 2 cores)."""
    return run_ranks(partial(live_tour, sizes=[4096, 65536], bucket_sizes_mb=SIZES, workload="tiny", steps=2,
                             repeats=2, trace_bucket_mb=0.05, lever_bytes=1 << 20, observe_buckets_mb=SIZES),
                     backend="gloo", world=2, timeout_s=120)
