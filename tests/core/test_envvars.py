"""`labkit env`: only the variables that matter for GPUs, and no credential in clear, whatever its name."""

import json
import os
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.core.envvars import REDACTED, secret_value, shown, shown_environment

# (name, value, the part that must never print). Names are allowlisted, so only redaction can hide them.
SECRETS = [
    ("NCCL_IB_PASS", "hunter2-nccl", "hunter2-nccl"),
    ("NCCL_IB_PASSWORD", "s3cr3t", "s3cr3t"),
    ("NCCL_FOO_KEYS", "k1,k2,k3", "k1,k2,k3"),
    ("NCCL_NET_KEY", "nk-zq81x", "nk-zq81x"),
    ("TORCH_SSH_PRIVKEY", "MIIEvQIBADANBgkqhkiG9w0B", "MIIEvQIBADANBgkq"),
    ("TORCH_SESSION_COOKIE", "sid=ck77q123", "ck77q123"),
    ("TORCH_DIST_CERT", "/etc/ssl/private/dist.pem", "dist.pem"),
    ("TORCH_HUB_URL", "https://alice:pa55w0rd@hub.example.com/models", "pa55w0rd"),
    ("TORCH_HUB_MIRROR", "https://ghp_abcdefghijklmnopqrstuvwxyz0123@github.com/x", "ghp_abcdefgh"),
    ("PYTORCH_DOWNLOAD_BASE", "https://bucket.s3.amazonaws.com/w.pt?X-Amz-Signature=deadbeef99&X-Amz-Credential=A",
     "deadbeef99"),
    ("NCCL_PLUGIN_CONFIG", "endpoint=http://h:1 token=tok_live_123", "tok_live_123"),
    ("CUDA_LICENSE", "-----BEGIN PRIVATE KEY-----\nMIIBVQIBADANBg\n-----END PRIVATE KEY-----", "MIIBVQIBADANBg"),
    ("OMP_EXTRA", "Authorization: Bearer abc.def.ghi", "abc.def.ghi"),
    ("TORCH_LOGS_SINK", "hf_AbCdEfGhIjKlMnOpQrStUv", "hf_AbCdEfGh"),
    ("NCCL_SOCKET_IFNAME", "ghp_abcdefghijklmnopqrstuvwxyz012345", "ghp_abcdef"),
    ("LABKIT_WEBHOOK", "https://hooks.slack.com/x?token=xoxb-1234567890-abcdef", "xoxb-1234567890"),
    ("TORCH_OPENAI", "sk-proj-abcdefghijklmnopqrstuvwx", "sk-proj-abcdefgh"),
    ("MASTER_ADDR", "user:pwzz81@10.0.0.1", "pwzz81"),
    ("NCCL_AWS", "AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    ("TORCH_JWT_HOLDER", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abcdefghijk", "eyJhbGciOiJIUzI1NiJ9"),
    ("CUDA_RANDOM_BLOB", "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZmdo", "Zm9vYmFyYmF6"),
    ("NCCL_DB", "postgres://svc:Pa%24%24@db:5432/x", "Pa%24%24"),
    ("TORCH_HEX_KEYLIKE", "0123456789abcdef0123456789abcdef0123", "0123456789abcdef0123"),
    ("PYTORCH_ÜBER_TOKEN", "ünïcødé-sëcret", "ünïcødé"),
    # issue 29: credentials found only by their values
    ("NCCL_TOPO_DUMP_FILE", "https://hooks.slack.com/services/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", "Xy7zXy7z"),
    ("NCCL_NET_PLUGIN", "https://discord.com/api/webhooks/112233445566778899/Zq-Wx_Ec9Rv8Tb7Yn6Um5Il4Ok3Pj2", "Zq-Wx_Ec9"),
    ("TORCH_EXTRA_HEADERS", "Authorization: Basic YWxpY2U6d29uZGVybGFuZA==", "YWxpY2U6d29uZGVy"),
    ("TORCH_HUB_BASE", "https://alice:wo#nder@hub.example.com/models", "wo#nder"),
    ("CUDA_DB_URI", "odbc://db.example.com;uid=svc;pwd=Tr0ub4dor", "Tr0ub4dor"),
    ("NCCL_REGISTRY", '{"auths": {"registry.example.com": {"auth": "c3ZjOmh1bnRlcjI="}}}', "c3ZjOmh1bnRlcjI="),
    ("TORCH_CI_RUNNER", "glrt-t1_AbCdEfGhIjKlMnOpQr", "glrt-t1_AbCd"),
    ("OMP_HOOK", "https://ci.example.com/hooks/8f14e45fceea167a5a36", "8f14e45fceea"),
    ("LABKIT_GIT_COMMIT", "https://deploy:s3cr3tpw@git.example.com/lab.git", "s3cr3tpw"),
]

# Values that are not secrets and must stay readable.
PLAIN = {
    "CUDA_VISIBLE_DEVICES": "GPU-5c1b2d3e-aaaa-bbbb-cccc-0123456789ab,MIG-6f0e2a11-1234-5678-9abc-def012345678",
    "NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_IB_PKEY": "0", "NCCL_NVLS_ENABLE": "0",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:128",
    "LD_LIBRARY_PATH": "/usr/local/cuda-12.4/lib64:/opt/conda/lib/python3.11/site-packages/nvidia/nccl/lib",
    "OMP_NUM_THREADS": "8", "MASTER_PORT": "29500", "TORCH_HOME": "/data/torch",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "KMP_AFFINITY": "granularity=fine,compact",
}

LEFT_OUT = {"PATH": "/usr/bin", "HOME": "/root", "HF_TOKEN": "hf_visible", "AWS_SECRET_ACCESS_KEY": "aws_visible",
            "GITHUB_TOKEN": "gh_visible", "SSH_AUTH_SOCK": "/tmp/agent"}


def test_only_the_allowlist_is_shown():
    env = {**PLAIN, **LEFT_OUT}
    out = shown_environment(env)
    assert out == PLAIN
    assert shown_environment({"MASTER_ADDR": "10.0.0.1"}) == {"MASTER_ADDR": "10.0.0.1"}
    assert not any(shown(n) for n in LEFT_OUT)


@pytest.mark.parametrize("name,value,secret", SECRETS)
def test_each_secret_is_redacted(name, value, secret):
    assert shown(name)
    assert shown_environment({name: value}) == {name: REDACTED}


def test_secret_values_are_found_whatever_the_name():
    # these hold their credential in the value: it is found under any name
    neutral = [v for n, v, _ in SECRETS if n in ("TORCH_HUB_URL", "TORCH_HUB_MIRROR", "PYTORCH_DOWNLOAD_BASE",
                                               "NCCL_PLUGIN_CONFIG", "CUDA_LICENSE", "OMP_EXTRA", "TORCH_LOGS_SINK",
                                               "NCCL_SOCKET_IFNAME", "TORCH_OPENAI", "MASTER_ADDR", "NCCL_AWS",
                                               "CUDA_RANDOM_BLOB", "NCCL_DB", "NCCL_TOPO_DUMP_FILE", "NCCL_NET_PLUGIN",
                                               "TORCH_EXTRA_HEADERS", "TORCH_HUB_BASE", "CUDA_DB_URI", "NCCL_REGISTRY",
                                               "TORCH_CI_RUNNER", "OMP_HOOK", "LABKIT_GIT_COMMIT")]
    for v in neutral:
        assert secret_value(v), v
    for v in PLAIN.values():
        assert not secret_value(v), v


def test_labkit_env_prints_no_secret_in_clear(monkeypatch, capsys):
    from labkit.cli import main

    for k in list(os.environ):
        if shown(k):
            monkeypatch.delenv(k)
    for n, v in [(n, v) for n, v, _ in SECRETS] + list(PLAIN.items()) + list(LEFT_OUT.items()):
        monkeypatch.setenv(n, v)
    for argv in (["env"], ["env", "--json"]):
        assert main(argv) == 0
        out, err = capsys.readouterr()
        text = out + err
        for name, _value, secret in SECRETS:
            assert secret not in text, (name, argv)
        for v in LEFT_OUT.values():
            assert v not in text
        if "--json" in argv:
            shown_env = json.loads(out)["env"]
            assert all(shown_env[n] == REDACTED for n, _, _ in SECRETS)
            assert all(shown_env[n] == v for n, v in PLAIN.items())


def test_the_commit_is_redacted_in_every_output_format_unless_a_commit_id(monkeypatch, capsys):
    """issue 29: LABKIT_GIT_COMMIT was redacted in the table and printed in `env --json` (as git_commit)."""
    from labkit.cli import main

    monkeypatch.setenv("LABKIT_GIT_COMMIT", "https://ci:hunter2@git.example.com/x.git")
    for argv in (["env"], ["env", "--json"]):
        assert main(argv) == 0
        assert "hunter2" not in capsys.readouterr().out
    monkeypatch.setenv("LABKIT_GIT_COMMIT", "d852111e4f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c")   # a commit id stays
    assert main(["env", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["git_commit"] == doc["env"]["LABKIT_GIT_COMMIT"] == "d852111e4f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c"


@pytest.mark.parametrize("value", ["verbose", "", " INFO"])
def test_an_invalid_torch_distributed_debug_is_one_line(monkeypatch, capsys, value):
    """torch.distributed raises ValueError on import for these; every verb refuses them in one line."""
    from labkit.cli import main

    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", value)
    assert main(["env"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "TORCH_DISTRIBUTED_DEBUG" in err and "OFF, INFO or DETAIL" in err
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "detail")
    assert main(["env", "--json"]) == 0


_SECRET_TEXT = st.text(alphabet=string.ascii_letters + string.digits + "#%!~*", min_size=6, max_size=20).filter(
    lambda t: any(c.isdigit() for c in t) and any(c.isalpha() for c in t))


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(secret=_SECRET_TEXT, host=st.sampled_from(["db.example.com", "10.0.0.1", "hub"]),
       form=st.sampled_from(["https://u:{s}@{h}/x", "mlx5_0,https://u:{s}@{h}", "{h} pwd={s}", "password={s};{h}",
                             '{{"auth": "{s}"}}', "Authorization: Basic {s}", "Bearer {s}",
                             "https://hooks.slack.com/services/{s}", "https://{h}/api/webhooks/1/{s}",
                             "glrt-{a}{a}", "xoxb-{a}{a}", "ghp_{a}{a}"]))
def test_a_credential_in_any_value_form_is_redacted(secret, host, form):
    alnum = "".join(c for c in secret if c.isalnum()) + "x1"   # tokens are letters, digits, _ and -
    value = form.format(s=secret, h=host, a=alnum * 2)
    assert shown_environment({"NCCL_SOCKET_IFNAME": value}) == {"NCCL_SOCKET_IFNAME": REDACTED}, value


def test_a_credential_on_the_command_line_is_not_written_into_a_report_header():
    from labkit.core.provenance import header

    h = header("labkit report -p hf_config=https://ci:hunter2@hub.example.com/c.json --out reports")
    assert "hunter2" not in h["command"] and h["command"].startswith("labkit report -p <redacted> --out reports")
