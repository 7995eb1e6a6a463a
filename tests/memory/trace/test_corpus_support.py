"""The compatibility corpus in fake mode (CI sizes): every case is predicted, or refused with one
line naming the op and/or module fake mode cannot run and what to use instead. No crash."""

import pytest

from labkit.core.paths import REPO_ROOT
from labkit.lessons.recompute_precision import support_section
from labkit.memory.trace.corpus_check import support, support_markdown
from labkit.workloads.corpus import compat_cases


# The corpus in shards (every case in exactly one), so that under pytest-xdist both CI workers share it. A shard
# holds whole architectures (a process's first case of an architecture imports its modules and fills fake mode's
# dispatch cache for the rest), cut where the cost so far reaches a quarter: a torchvision or timm model, traced at its
# full depth, costs about two transformers cases at CI size.
SHARDS = 4


def _shard(i: int) -> list:
    cases = compat_cases()
    first = {}
    for n, c in enumerate(cases):
        first.setdefault(c.arch, n)
    ordered = sorted(cases, key=lambda c: first[c.arch])   # stable: each architecture's cases stay in corpus order
    cost = [2 if c.family in ("torchvision", "timm") else 1 for c in ordered]
    total, acc, cut = sum(cost), 0, [0]
    for n, w in enumerate(cost):
        acc += w
        arch_ends = n + 1 == len(ordered) or ordered[n + 1].arch != ordered[n].arch
        if len(cut) < SHARDS and acc >= total * len(cut) / SHARDS and arch_ends:
            cut.append(n + 1)
    cut += [len(ordered)] * (SHARDS + 1 - len(cut))
    return ordered[cut[i]:cut[i + 1]]


def test_corpus_covers_what_engineers_bring():
    cases = compat_cases()
    hf = {c.arch for c in cases if c.family == "transformers"}
    tv = {c.arch for c in cases if c.family == "torchvision"}
    assert len(hf) >= 30 and len(tv) >= 6
    assert any(c.lora and c.precision == "bf16" for c in cases)
    for impl in ("hf", "hf-reentrant"):
        assert {c.precision for c in cases if c.checkpoint_impl == impl} == {"fp32", "amp-bf16", "bf16"}
    assert any(c.checkpoint_impl == "torch" and c.recompute != "none" and c.precision == "amp-bf16" for c in cases)


def test_the_shards_hold_every_case_once():
    names = [c.name for i in range(SHARDS) for c in _shard(i)]
    assert sorted(names) == sorted(c.name for c in compat_cases()) and len(set(names)) == len(names)


@pytest.mark.parametrize("shard", range(SHARDS))
def test_every_case_is_predicted_or_refused_in_one_line(shard):
    cases = _shard(shard)
    results = support(cases)
    assert [r.case for r in results] == [c.name for c in cases]
    for r in results:
        assert r.status in ("predicted", "refused"), (r.case, r.status, r.reason)   # unavailable: test extra missing
        if r.status == "predicted":
            assert r.peak_bytes and r.peak_bytes > 0
        else:
            assert "\n" not in r.reason and "Traceback" not in r.reason
            assert r.reason.startswith("fake mode cannot run ")
            assert " op " in r.reason or " in module " in r.reason, r.reason
            assert ("--device cpu" in r.reason and "labkit estimate" in r.reason) or \
                r.reason.endswith("--no-kv-cache"), r.reason
    # the README's table says the same of every case of the shard (regenerate it with support_markdown)
    readme, shard_table = _table(README.read_text()), _table(support_markdown(results))
    for (group, col), cell in shard_table.items():
        assert readme.get((group, col), "").split(" ")[0] == cell.split(" ")[0], \
            f"README says {readme.get((group, col))!r} for {group} {col}; fake mode here: {cell!r}"
    # the support section lists every case it is given
    sec = support_section(results)
    assert sec.headers == ["case", "what", "status", "reason"] and len(sec.rows) == len(results)
    assert sec.value("fake_corpus_predicted") == sum(r.status == "predicted" for r in results)
    assert "fake mode" in str(sec)


README = REPO_ROOT / "README.md"


def _table(markdown: str) -> dict[tuple[str, str], str]:
    """The support table's cells, {(case group, precision): "yes" | "refused (n)" ...}."""
    lines = markdown[markdown.index("| case | fp32 |"):].splitlines()
    cols = [c.strip() for c in lines[0].strip("|").split("|")][1:]
    out = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        out.update({(cells[0], col): cell for col, cell in zip(cols, cells[1:]) if cell})
    return out


def test_the_readme_count_is_the_corpus_count():
    """The README's headline count is over the whole corpus and agrees with its own table (each cell is
    checked against fake mode, shard by shard, above)."""
    import re

    text = README.read_text()
    m = re.search(r"(\d+) of (\d+) cases predicted", text)
    cells = _table(text)
    assert m and int(m.group(2)) == len(compat_cases()) == len(cells)
    assert int(m.group(1)) == sum(c == "yes" for c in cells.values())


def test_a_refusal_the_model_itself_causes_names_a_command_that_runs(capsys):
    """Issue 27: Gemma 2 checkpointed by torch.utils.checkpoint with its KV cache on fails in the recomputation
    under the installed transformers (real tensors too: --device cpu is no way out); the corpus refusal names the
    `labkit measure ... --no-kv-cache` command, and that command runs."""
    import shlex

    from labkit.cli import main
    from labkit.memory.trace.corpus_check import cache_free_command, check_case
    from labkit.workloads.corpus import get_case

    case = get_case("gemma2-b2-ckpt2-amp-bf16@tiny")
    r = check_case(case)
    line = shlex.join(cache_free_command(case))
    # transformers 5.17 (the H200 recording's) recomputed without growing the cache: predicted there
    assert r.status == "predicted" or ("--device cpu" not in r.reason and r.reason.endswith(": " + line)), r.reason
    rc = main(shlex.split(line)[1:])
    out = capsys.readouterr()
    assert rc == 0 and "predicted for an H200" in out.out, out.err
