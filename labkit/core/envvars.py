"""Which environment variables a GPU report shows, and how their secrets are kept out of it.

Two rules, applied in this order:

1. **An allowlist of names.** Only variables that change what a GPU job does are shown: the CUDA
   runtime and driver (``CUDA_*``, ``NVIDIA_*`` as container runtimes set them, ``CUBLAS_*`` and
   ``CUDNN_*`` for workspace and determinism), NCCL and Gloo (``NCCL_*``, ``NVSHMEM_*``,
   ``GLOO_SOCKET_IFNAME``/``GLOO_DEVICE_TRANSPORT``), PyTorch (``PYTORCH_*`` holds the caching
   allocator's settings, ``TORCH_*``, ``TORCHELASTIC_*``), CPU threading and placement (``OMP_*``,
   ``KMP_*``, ``GOMP_CPU_AFFINITY``, ``MKL_NUM_THREADS``), the launcher's rendezvous (``MASTER_ADDR``,
   ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``),
   ``LD_LIBRARY_PATH`` and ``LD_PRELOAD`` (which libcudart/libnccl a process loads) and
   ``LABKIT_*``. Everything else (``PATH``, ``HOME``, ``HF_TOKEN``, cloud keys, ...) is left out.
2. **Redaction whatever the name.** A shown variable's value becomes ``<redacted>`` when its name
   says it holds a credential (a word such as PASS, PASSWORD, SECRET, TOKEN, KEY(S), PRIVKEY, CERT,
   COOKIE, CREDENTIAL(S), AUTH, SESSION, SIGNATURE) or its value looks like one: URL user info
   (``https://user:pw@host``, ``https://token@host``), a query parameter named like a secret, a PEM
   block, a ``password=...``/``Bearer ...`` pair, a known token prefix (GitHub, Hugging Face, OpenAI,
   Slack, GitLab, AWS, Google, npm, JWT), or a long random-looking string. A GPU UUID (``GPU-...``,
   ``MIG-...``) is not a secret and stays.

A false positive costs one hidden value; a false negative leaks a credential into a report that is
shared, so the rules err on the side of hiding.
"""

from __future__ import annotations

import re

REDACTED = "<redacted>"

SHOWN_PREFIXES = ("CUDA_", "NVIDIA_", "CUBLAS_", "CUDNN_", "NCCL_", "NVSHMEM_", "PYTORCH_", "TORCH_", "TORCHELASTIC_",
                  "OMP_", "KMP_", "LABKIT_")
SHOWN_NAMES = frozenset({"GLOO_SOCKET_IFNAME", "GLOO_DEVICE_TRANSPORT", "GOMP_CPU_AFFINITY", "MKL_NUM_THREADS",
                         "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                         "GROUP_RANK", "LD_LIBRARY_PATH", "LD_PRELOAD"})

# Words of a name (split on '_') that mark a credential, and fragments that do so inside a word.
_SECRET_WORDS = frozenset({"PASS", "PASSWD", "PASSWORD", "PASSPHRASE", "PW", "PWD", "SECRET", "SECRETS", "TOKEN",
                           "TOKENS", "KEY", "KEYS", "PRIVKEY", "PRIVATE", "CERT", "CERTS", "CERTIFICATE", "COOKIE",
                           "COOKIES", "CREDENTIAL", "CREDENTIALS", "CREDS", "AUTH", "SESSION", "SIG", "SIGNATURE",
                           "SAS", "JWT", "BEARER", "APIKEY", "PEM", "P12", "PFX"})
_SECRET_FRAGMENTS = ("PASSW", "SECRET", "TOKEN", "PRIVKEY", "APIKEY", "COOKIE", "CREDENTIAL", "CERTIFICATE",
                     "PASSPHRASE", "AUTHORIZATION")

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://([^/\s?#]*)([^\s]*)")
_BARE_USERINFO = re.compile(r"(?<![A-Za-z0-9+.\-/])[^\s/@:,;]+:[^\s/@,;]+@[A-Za-z0-9.\-\[\]]+")  # user:pw@host
_PEM = re.compile(r"-----BEGIN [A-Z0-9 ]+-----")
_PAIR = re.compile(r"(?i)(?<![A-Za-z0-9])(pass(word|wd)?|secret|token|api[_-]?key|auth|bearer|cookie|session|sig(nature)?)\s*[=:\s]\s*\S")
_TOKEN_PREFIX = re.compile(r"(?<![A-Za-z0-9])(ghp_|gho_|ghu_|ghs_|ghr_|github_pat_|hf_|sk-|sk_live_|rk_live_|xox[abprs]-|"
                           r"glpat-|AKIA|ASIA|AIza|npm_)[A-Za-z0-9_\-]{8,}")
_JWT = re.compile(r"eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]{5,}")
_GPU_UUID = re.compile(r"(GPU|MIG)-[0-9a-fA-F\-/]+|[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")
_RANDOM = re.compile(r"[A-Za-z0-9+/=_\-]{32,}")


def shown(name: str) -> bool:
    """Is ``name`` one of the variables that matter for GPUs and training (rule 1)?"""
    return name in SHOWN_NAMES or name.startswith(SHOWN_PREFIXES)


def secret_name(name: str) -> bool:
    upper = name.upper()
    return any(w in _SECRET_WORDS for w in re.split(r"[_\-.]+", upper)) or any(f in upper for f in _SECRET_FRAGMENTS)


def _looks_random(piece: str) -> bool:
    if _GPU_UUID.fullmatch(piece) or piece.startswith("/"):
        return False
    return bool(_RANDOM.fullmatch(piece)) and any(c.isdigit() for c in piece) and any(c.isalpha() for c in piece)


def secret_value(value: str) -> bool:
    """Does ``value`` hold a credential, whatever the variable is called (rule 2)?"""
    for m in _URL.finditer(value):
        if "@" in m.group(1):
            return True                      # user info: user:password@ or token@
        query = m.group(2).partition("?")[2]
        if any(secret_name(k) for k in re.findall(r"([^&=;]+)=", query)):
            return True
    if _BARE_USERINFO.search(value) or _PEM.search(value) or _PAIR.search(value) or _TOKEN_PREFIX.search(value) or _JWT.search(value):
        return True
    return any(_looks_random(p) for p in re.split(r"[\s,;:|]+", value) if p)


def shown_environment(environ: dict[str, str]) -> dict[str, str]:
    """The allowlisted variables of ``environ``, sorted by name, credentials replaced by ``<redacted>``."""
    out: dict[str, str] = {}
    for name in sorted(environ):
        if not shown(name):
            continue
        value = str(environ[name])
        out[name] = REDACTED if (secret_name(name) or secret_value(value)) else value
    return out
