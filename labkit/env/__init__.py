"""This machine: ``labkit env``. The probe itself lives in :mod:`labkit.core.machine`."""

from labkit.core.machine import GPUInfo, MachineInfo, probe, redact_env
from labkit.env.server import ServerView, this_server
from labkit.env.summary import gpu_line, load_recorded_machine, machine_rows

__all__ = ["GPUInfo", "MachineInfo", "probe", "redact_env", "machine_rows", "load_recorded_machine", "gpu_line",
           "ServerView", "this_server"]
