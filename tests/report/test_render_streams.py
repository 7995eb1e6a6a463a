"""The report's HTML shows a progress bar's last line, not every update the kernel sent."""

import nbformat

from labkit.report.render import notebook_html


def test_stream_updates_with_carriage_returns_collapse_to_the_last(tmp_path):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("lesson.live_run(machine)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stderr", text=f"\rwork: 00:0{i} elapsed") for i in range(5)]
    cell.outputs.append(nbformat.v4.new_output("stream", name="stderr", text="\n"))
    nb.cells = [cell]
    src = tmp_path / "nb.ipynb"
    nbformat.write(nb, str(src))
    html = notebook_html(src, tmp_path / "nb.html").read_text()
    assert "work: 00:04 elapsed" in html and "work: 00:03 elapsed" not in html
