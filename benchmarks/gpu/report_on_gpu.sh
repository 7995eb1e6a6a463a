#!/usr/bin/env bash
# Execute the notebooks on a lent GPU machine that has torch but no Jupyter stack, and pack the report.
# Usage (repository root): bash benchmarks/gpu/report_on_gpu.sh [labkit report options...]
# Python wheels for papermill/nbconvert/ipykernel/bokeh/ipywidgets travel in .whl/ (git-ignored);
# they are installed into /tmp/site, outside the machine's own site-packages, so its torch stays.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT to the folder that comes back}
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="/tmp/site/bin:$PATH"
  export JUPYTER_PATH="/tmp/site/share/jupyter"  # nbconvert templates and widget/bokeh extensions installed with --target
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
python3 -m labkit env
python3 -m labkit report --out /tmp/labkit-reports "$@"
rc=$?
tar -C /tmp/labkit-reports -czf "$OUT/report.tar.gz" .
exit $rc
