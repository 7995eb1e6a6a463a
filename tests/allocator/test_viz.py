"""The allocator figures build from the chapter's own results (no computation in the viz layer)."""

from labkit.allocator import compare, replay_with_sim
from labkit.allocator.synthetic import training_like
from labkit.viz import allocator as vz


def test_figures_build():
    t = training_like(steps=2)
    res = compare(t, ["", "expandable_segments:True"], timeline_points=50)
    assert vz.whatif_figure(res, title="model").title.text == "model"
    vz.timeline_figure({r.config: r.timeline for r in res}, title="model")
    segs = replay_with_sim(t, "").segments()
    vz.segment_map_figure(segs, title="model")
