"""The report runner's kernel keeps ipykernel's start-up notice off the terminal; a cell's own stderr stays."""

import nbformat

from labkit.report import runner


def test_kernel_start_notice_is_not_printed_but_cell_stderr_is_kept(tmp_path, capfd):
    src, dst = tmp_path / "nb.ipynb", tmp_path / "out.ipynb"
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"},
                                            "language_info": {"name": "python"}})
    params = nbformat.v4.new_code_cell("smoke = False", metadata={"tags": ["parameters"]})
    nb.cells = [params, nbformat.v4.new_code_cell("import sys; print('cell says hello', file=sys.stderr)")]
    nbformat.write(nb, str(src))
    runner._execute(src, dst, {"smoke": True}, tmp_path / "results.jsonl")
    out, err = capfd.readouterr()
    assert "Kernel is running over TCP" not in out + err
    cell = nbformat.read(str(dst), as_version=4).cells[-1]
    assert any("cell says hello" in o.get("text", "") for o in cell.outputs)
