"""This machine: ``labkit env``. The probe itself lives in :mod:`labkit.core.machine`."""

from labkit.core.machine import GPUInfo, MachineInfo, probe, redact_env
from labkit.env.summary import machine_rows, load_recorded_machine

__all__ = ["GPUInfo", "MachineInfo", "probe", "redact_env", "machine_rows", "load_recorded_machine"]
