import json


def test_help_lists_commands(run_cli):
    r = run_cli("--help")
    assert r.returncode == 0
    for verb in ("env", "report"):
        assert verb in r.stdout


def test_env_json_is_one_document(run_cli):
    r = run_cli("env", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert {"gpus", "torch_version", "cpu_logical_cores", "numa_nodes", "ram_bytes", "env"} <= set(doc)


def test_env_table_redacts(run_cli):
    r = run_cli("env", env={"NCCL_SECRET_TOKEN": "abc"})
    assert r.returncode == 0, r.stderr
    assert "NCCL_SECRET_TOKEN" in r.stdout and "abc" not in r.stdout.split("NCCL_SECRET_TOKEN", 1)[1].splitlines()[0]


def test_user_error_is_exit_2_and_one_line(run_cli):
    r = run_cli("report", "--only", "no_such_notebook")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "unknown notebook" in r.stderr
