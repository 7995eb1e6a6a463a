import os

import pytest

from labkit.comm.launch import run_ranks
from labkit.comm.timeline import reduce_trace


@pytest.fixture(scope="session")
def gloo2(tmp_path_factory):
    """One spawned 2-rank gloo run shared by the chapter's tests (spawning costs seconds on 2 cores)."""
    import ranks

    trace = str(tmp_path_factory.mktemp("comm") / "trace.json")
    out = run_ranks(ranks.everything, trace, backend="gloo", world=2)
    out["timeline"] = reduce_trace(out["trace"])
    return out
