"""Record this GPU server's description (labkit env) as data/measurements/env/h200_env.json."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from labkit.core.machine import probe
from labkit.core.provenance import header, write_measurement


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--name", default="h200_env.json")
    args = ap.parse_args()
    m = probe()
    cmd = "python3 benchmarks/gpu/record_env.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    path = write_measurement(args.out / args.name, "env", m, provenance=header(cmd, machine=m))
    print(f"wrote {path}: {len(m.gpus)} GPU(s)", flush=True)


if __name__ == "__main__":
    main()
