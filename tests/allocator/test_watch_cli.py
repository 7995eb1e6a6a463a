

def test_a_command_that_does_not_exist_is_refused_in_one_line(capsys, tmp_path):
    from labkit.cli import main

    assert main(["watch", "--out", str(tmp_path / "w"), "--", "/nonexistent/cmd"]) == 2
    err = capsys.readouterr().err.strip()
    assert "not found" in err and len(err.splitlines()) == 1
