"""HTML for the report: each executed notebook (offline: no CDN), and the run's index page."""

from __future__ import annotations

import html
from pathlib import Path

import nbformat

TEMPLATES = Path(__file__).parent / "templates"


def notebook_html(ipynb: Path, out: Path) -> Path:
    """Render an executed notebook to self-contained HTML (Bokeh is inline in its outputs)."""
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import CoalesceStreamsPreprocessor

    nb = nbformat.read(str(ipynb), as_version=4)
    nb.metadata.pop("widgets", None)  # widget state needs a CDN-loaded manager; the template notes widgets instead
    exporter = HTMLExporter(template_name="lab", extra_template_paths=[str(TEMPLATES)])
    exporter.template_file = "offline.html.j2"
    # one stream output per cell, with carriage returns applied: a progress bar shows its last line only
    exporter.register_preprocessor(CoalesceStreamsPreprocessor(enabled=True), enabled=True)
    body, _ = exporter.from_notebook_node(nb)
    out.write_text(body, encoding="utf-8")
    return out


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }
.passed { color: #11772d; font-weight: bold; } .failed { color: #b00020; font-weight: bold; }
.incomplete { color: #b26a00; font-weight: bold; } .changed { background: #ffe9a8; }
.src { color: #666; font-size: 90%; max-width: 24em; } pre { white-space: pre-wrap; margin: 0; }
table table { font-size: 90%; margin: 0; } table table td:nth-child(2) { white-space: nowrap; }
"""


def _fmt(v, unit: str = "") -> str:
    if unit in ("bytes", "B") and isinstance(v, (int, float)):
        from labkit.core.units import fmt_bytes

        return fmt_bytes(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def _short_source(src: str) -> str:
    """'recorded on 1 x H200, 2026-11-29 (driver ...); command: ...' -> the part before the details."""
    for cut in (" (driver", "; command"):
        src = src.split(cut, 1)[0]
    return src


def index_html(summary: dict, comparison: dict, previous_id: str | None) -> str:
    e = html.escape
    state = summary.get("state")
    status = summary.get("status")
    head = "incomplete" if state != "finished" else status
    env = summary.get("environment") or {}
    rows = []
    for nb in summary.get("notebooks", []):
        cls = nb["status"] if nb["status"] in ("passed", "failed") else "incomplete"
        links = " ".join(f"<a href='{e(nb[k])}'>{k}</a>" for k in ("html", "ipynb") if nb.get(k))
        err = ""
        if nb.get("error"):
            er = nb["error"]
            err = f"<pre>cell {e(str(er.get('cell')))}: {e(str(er.get('ename')))}: {e(str(er.get('evalue')))[:2000]}</pre>"
        res_rows = []
        for rname, r in (nb.get("results") or {}).items():
            c = comparison.get(nb["name"], {}).get(rname, {})
            flag = " class='changed'" if c.get("flagged") else ""
            delta = f"{c['rel_change'] * 100:+.1f}%" if c.get("rel_change") is not None else ""
            unit = r.get("unit", "")
            shown_unit = "" if unit in ("bytes", "B") else f" {unit}"
            prev = _fmt(c.get("previous"), unit) + shown_unit if "previous" in c else "—"
            src = r.get("source", "")
            res_rows.append(f"<tr{flag}><td>{e(rname)}</td><td>{e(_fmt(r['value'], unit) + shown_unit)}</td>"
                            f"<td>{e(prev)}</td><td>{e(delta)}{' changed' if c.get('flagged') else ''}</td>"
                            f"<td class='src' title='{e(src)}'>{e(_short_source(src))}</td></tr>")
        results = ("<table><tr><th>result</th><th>value</th><th>previous</th><th>change</th><th>source</th></tr>"
                   + "".join(res_rows) + "</table>") if res_rows else ""
        params = e(", ".join(f"{k}={v!r}" for k, v in (nb.get("parameters") or {}).items()))
        dur = f"{nb['duration_s']:.1f} s" if nb.get("duration_s") is not None else ""
        rows.append(f"<tr><td><b>{e(nb['name'])}</b><br>{links}</td><td class='{cls}'>{e(nb['status'])}</td>"
                    f"<td>{dur}</td><td class='src'>{params}</td><td>{results}{err}</td></tr>")
    gpu = f"{env.get('gpu_count')} x {env.get('gpu_name')}" if env.get("gpu_count") else "no GPU"
    prev = f"compared with the previous run <b>{e(previous_id)}</b>" if previous_id else "no previous run in this folder to compare with"
    return f"""<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>GPU Memory Lab report {e(summary['run_id'])}</title>
<style>{_CSS}</style></head><body>
<h1>GPU Memory Lab report</h1>
<p>Run <b>{e(summary['run_id'])}</b>, profile <b>{e(summary.get('profile', ''))}</b>: <span class='{e(head or '')}'>{e(head or '')}</span>
({e(str(summary.get('started')))} to {e(str(summary.get('finished') or '—'))}).</p>
<p class='src'>{e(env.get('host', ''))}: {e(gpu)}, driver {e(str(env.get('driver')))}, CUDA {e(str(env.get('cuda')))}, torch {e(str(env.get('torch')))},
labkit {e(str(env.get('labkit')))} ({e(str(env.get('git_commit')))}); command: <code>{e(str(summary.get('command')))}</code></p>
<p>{prev}; changes beyond each result's tolerance are highlighted.</p>
<table><tr><th>notebook</th><th>status</th><th>duration</th><th>parameters</th><th>key results</th></tr>
{''.join(rows)}</table></body></html>
"""
