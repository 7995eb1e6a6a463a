#!/usr/bin/env bash
# Run GPU recording scripts on a lent GPU machine and pack their results into $OUT/results.tar.gz.
# Usage (from the repository root): bash benchmarks/gpu/run_all.sh CHAPTER [CHAPTER ...]
# Each CHAPTER runs benchmarks/gpu/record_<CHAPTER>.py --out $RESULTS/<CHAPTER>; its log goes to
# $RESULTS/logs/<CHAPTER>.log. NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:?set OUT to the folder that comes back}
RESULTS=${RESULTS:-/tmp/labkit-results}
mkdir -p "$RESULTS/logs"
status=0
for chapter in "$@"; do
  script="benchmarks/gpu/record_${chapter}.py"
  echo "=== $chapter ($(date -u +%H:%M:%S))"
  t0=$SECONDS
  python3 "$script" --out "$RESULTS/$chapter" > "$RESULTS/logs/$chapter.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  echo "=== $chapter rc=$rc in $((SECONDS - t0)) s"
  tail -n 15 "$RESULTS/logs/$chapter.log"
done
tar -C "$RESULTS" -czf "$OUT/results.tar.gz" .
ls -la "$OUT"
exit $status
