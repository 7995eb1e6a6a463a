"""The allocator figures build from the chapter's own results (no computation in the viz layer)."""

from labkit.allocator import compare, replay_with_sim
from labkit.allocator.sim.synthetic import training_like
from labkit.viz import allocator as vz


def test_figures_build():
    t = training_like(steps=2)
    res = compare(t, ["", "expandable_segments:True"], timeline_points=50)
    assert vz.whatif_figure(res, title="model").title.text == "model"
    vz.timeline_figure({r.config: r.timeline for r in res}, title="model")
    segs = replay_with_sim(t, "").segments()
    vz.segment_map_figure(segs, title="model")


def test_the_segment_map_says_what_it_leaves_out_and_has_a_legend():
    segs = [{"total_size": (i + 1) * 2**21, "segment_type": "small", "blocks": [
        {"size": 2**20, "state": "active_allocated"}, {"size": i * 2**21 + 2**20, "state": "inactive"}]} for i in range(55)]
    fig = vz.segment_map_figure(segs, title="55 segments", max_segments=40)
    assert len(fig.y_range.factors) == 40
    notes = [t.text for t in fig.above if hasattr(t, "text")]
    assert any("the 40 largest of 55 segments; the 15 smaller ones" in n for n in notes), notes
    labels = [item.label["value"] for item in fig.legend[0].items]
    assert labels == [vz.STATE_WORDS[s] for s in vz.STATE_COLORS]
    few = vz.segment_map_figure(segs[:3], title="3 segments")
    assert not any("largest of" in getattr(t, "text", "") for t in few.above)


def test_lines_that_coincide_stay_visible():
    """Two settings with the same allocated curve (it does not depend on the allocator's setting): the earlier
    line is drawn wider, so the later one on top leaves it showing."""
    t = training_like(steps=2)
    res = compare(t, ["", "expandable_segments:True"], timeline_points=50)
    fig = vz.timeline_figure({r.config or "default": r.timeline for r in res}, title="model")
    widths = [r.glyph.line_width for r in fig.renderers]
    assert widths[0] > widths[2] and widths[1] > widths[3]   # series 1 (reserved, allocated) over series 2
