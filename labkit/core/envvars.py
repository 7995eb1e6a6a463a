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
   block, a ``password=...``/``pwd=``/``Bearer ...``/``Authorization: Basic ...`` pair or a JSON
   credential (``{"auth": ...}`` as docker writes it), a webhook URL (Slack, Discord, Teams, or any
   ``/hooks/``/``/webhook/`` path), a known token prefix (GitHub, Hugging Face, OpenAI, Slack, GitLab
   incl. runner ``glrt-``, AWS, Google, npm, PyPI, JWT), or a long random-looking string.
   :func:`redact_values` applies the same rule to every string of a report before any output format
   (``labkit env``'s table and ``--json`` alike, ``LABKIT_GIT_COMMIT`` included). A GPU UUID (``GPU-...``,
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
_PAIR = re.compile(r"(?i)(?<![A-Za-z0-9])(pass(word|wd|phrase)?|pwd|pw|secret|token|api[_-]?key|auth|authorization|"
                   r"bearer|basic|digest|cookie|session|sig(nature)?|credentials?)[\"']?\s*[=:\s]\s*\S")
_TOKEN_PREFIX = re.compile(r"(?<![A-Za-z0-9])(ghp_|gho_|ghu_|ghs_|ghr_|github_pat_|hf_|sk-|sk_live_|rk_live_|"
                           r"xox[abeprs]-|xapp-|glpat-|glrt-|glptt-|gldt-|glcbt-|glsoat-|glft-|glimt-|GR1348941|"
                           r"AKIA|ASIA|AIza|npm_|pypi-|dop_v1_|SG\.)[A-Za-z0-9_\-.]{8,}")
# webhook URLs hold their credential in the path (Slack, Discord, Teams, Zapier, generic /hooks/ and /webhook/)
_WEBHOOK = re.compile(r"(?i)(hooks\.slack\.com|discord(app)?\.com/api/webhooks|webhook\.office\.com|"
                      r"hooks\.zapier\.com|/webhooks?/|/hooks/)")
_JWT = re.compile(r"eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]{5,}")
_GPU_UUID = re.compile(r"(GPU|MIG)-[0-9a-fA-F\-/]+|[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")
_RANDOM = re.compile(r"[A-Za-z0-9+/=_\-]{32,}")
# a git commit id (what LABKIT_GIT_COMMIT and a report's git_commit hold): hex, not a secret
_COMMIT = re.compile(r"[0-9a-f]{7,40}(-dirty)?")
COMMIT_NAMES = frozenset({"LABKIT_GIT_COMMIT", "git_commit"})


def commit_id(name: str, value: str) -> bool:
    """Is ``value`` of the variable or field ``name`` a plain git commit id (shown as it is)?"""
    return name in COMMIT_NAMES and bool(_COMMIT.fullmatch(value))


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
    if _WEBHOOK.search(value):
        return True
    for m in _URL.finditer(value):
        if "@" in m.group(1) or "@" in m.group(2):
            return True                      # user info: user:password@ or token@ (a password may hold # or /)
        query = m.group(2).partition("?")[2]
        if any(secret_name(k) for k in re.findall(r"([^&=;]+)=", query)):
            return True
    if _BARE_USERINFO.search(value) or _PEM.search(value) or _PAIR.search(value) or _TOKEN_PREFIX.search(value) or _JWT.search(value):
        return True
    return any(_looks_random(p) for p in re.split(r"[\s,;:|/?&=]+", value) if p)


def redact_values(doc, name: str = ""):
    """``doc`` (nested dicts and lists of a report) with every string that :func:`secret_value` flags, or whose
    key :func:`secret_name` flags, replaced by ``<redacted>``: the last pass before any output format."""
    if isinstance(doc, dict):
        return {k: redact_values(v, str(k)) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [redact_values(v, name) for v in doc]
    if isinstance(doc, str) and not commit_id(name, doc) and (secret_value(doc) or (name and secret_name(name))):
        return REDACTED
    return doc


def shown_environment(environ: dict[str, str]) -> dict[str, str]:
    """The allowlisted variables of ``environ``, sorted by name, credentials replaced by ``<redacted>``."""
    out: dict[str, str] = {}
    for name in sorted(environ):
        if not shown(name):
            continue
        value = str(environ[name])
        out[name] = value if commit_id(name, value) else REDACTED if (secret_name(name) or secret_value(value)) else value
    return out
