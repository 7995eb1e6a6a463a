"""Where GPU memory goes: the analytical per-GPU model and planner (estimate), and the
phase-by-phase tracer that measures real or fake-GPU steps (measure).

Two engineers own parts of this package; each adds its public names below.
"""
