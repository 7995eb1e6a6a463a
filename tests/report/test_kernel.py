"""The report runner's kernel client polls the shell and iopub sockets in slices (labkit.report.kernel)."""

import asyncio
import time
from queue import Empty

import pytest

from labkit.report import kernel
from labkit.report.kernel import SlicedPollChannel, SlicedPollKernelManager


class _MissedEdgeSocket:
    """A socket whose first poll sleeps through its whole timeout though a message is waiting (the missed
    edge); a new poll sees the message at once, as pyzmq's readiness check does."""

    def __init__(self, waiting=True):
        self.waiting, self.polls = waiting, []

    async def poll(self, timeout_ms):
        self.polls.append(timeout_ms)
        if len(self.polls) == 1 or not self.waiting:
            await asyncio.sleep(timeout_ms / 1000)
            return 0
        return 1


def _channel(sock):
    ch = SlicedPollChannel.__new__(SlicedPollChannel)
    ch.socket = sock

    async def _recv():
        return {"msg_type": "execute_reply"}

    ch._recv = _recv
    return ch


def test_a_missed_edge_costs_one_slice_not_the_cell_timeout(monkeypatch):
    monkeypatch.setattr(kernel, "POLL_SLICE_S", 0.05)
    sock = _MissedEdgeSocket()
    t0 = time.monotonic()
    msg = asyncio.run(_channel(sock).get_msg(timeout=30))
    assert msg["msg_type"] == "execute_reply"
    assert time.monotonic() - t0 < 1.0 and len(sock.polls) == 2 and max(sock.polls) <= 50


def test_the_overall_timeout_still_holds(monkeypatch):
    monkeypatch.setattr(kernel, "POLL_SLICE_S", 0.05)
    sock = _MissedEdgeSocket(waiting=False)
    t0 = time.monotonic()
    with pytest.raises(Empty):
        asyncio.run(_channel(sock).get_msg(timeout=0.2))
    assert 0.19 <= time.monotonic() - t0 < 1.0 and len(sock.polls) >= 4


def test_the_runner_gives_papermill_this_kernel_manager(monkeypatch, tmp_path):
    import papermill

    from labkit.report import runner

    seen = {}
    monkeypatch.setattr(papermill, "execute_notebook", lambda *a, **kw: seen.update(kw))
    runner._execute(tmp_path / "a.ipynb", tmp_path / "b.ipynb", {}, tmp_path / "r.json")
    from traitlets.utils.importstring import import_item

    km = import_item(seen["kernel_manager_class"])
    assert km is SlicedPollKernelManager
    assert km().client_factory.shell_channel_class.default_value is SlicedPollChannel
