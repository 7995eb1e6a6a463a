"""The kernel client the report runner executes notebooks with: jupyter_client's, polling in slices.

nbclient waits for a cell's ``execute_reply`` with one ``poll`` of the shell socket for the whole cell
timeout (``AsyncZMQSocketChannel.get_msg``). A ZMQ socket signals readiness through an edge-triggered
file descriptor, and a reply that lands in the window between pyzmq's readiness check and its
registration of that descriptor with the event loop raises no new edge: the poll then sleeps until its
timeout, and only then sees the reply that was waiting all along. Reproduced here with two papermill
runs of notebook 00 at once on two cores (3 of 40 runs stalled, each for exactly the cell timeout,
90 s, after the kernel had reported the cell idle; with no timeout such a stall never ends, which is
how the earlier two-worker test runs hung). The channels below poll in slices of
:data:`POLL_SLICE_S`: each new poll checks the socket at once, so a missed edge costs at most one
slice, and the overall timeout is kept.
"""

from __future__ import annotations

import time
from queue import Empty
from typing import Any

from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.manager import AsyncKernelManager
from traitlets import DottedObjectName, Type

POLL_SLICE_S = 0.5


class SlicedPollChannel(AsyncZMQSocketChannel):
    """``get_msg`` as jupyter_client's, with the wait cut into polls of at most ``POLL_SLICE_S``."""

    async def get_msg(self, timeout: float | None = None) -> dict[str, Any]:  # type: ignore[override]
        assert self.socket is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = POLL_SLICE_S if deadline is None else max(0.0, deadline - time.monotonic())
            if await self.socket.poll(int(min(POLL_SLICE_S, left) * 1000)):
                return await self._recv()
            if deadline is not None and time.monotonic() >= deadline:
                raise Empty


class SlicedPollKernelClient(AsyncKernelClient):
    shell_channel_class = Type(SlicedPollChannel)    # type: ignore[assignment]
    iopub_channel_class = Type(SlicedPollChannel)    # type: ignore[assignment]
    stdin_channel_class = Type(SlicedPollChannel)    # type: ignore[assignment]
    control_channel_class = Type(SlicedPollChannel)  # type: ignore[assignment]


class SlicedPollKernelManager(AsyncKernelManager):
    """The kernel manager papermill is given (``kernel_manager_class``): its clients poll in slices."""

    client_class = DottedObjectName("labkit.report.kernel.SlicedPollKernelClient")
    client_factory = Type(klass=SlicedPollKernelClient)   # AsyncKernelManager's own default ignores client_class


__all__ = ["POLL_SLICE_S", "SlicedPollChannel", "SlicedPollKernelClient", "SlicedPollKernelManager"]
