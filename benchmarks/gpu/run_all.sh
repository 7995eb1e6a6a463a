#!/usr/bin/env bash
# Run GPU recording scripts on a lent GPU machine and pack their results into $OUT/results.tar.gz.
# Usage (from the repository root): bash benchmarks/gpu/run_all.sh CHAPTER[:SECONDS][:ARGS] ...
# Each CHAPTER runs `benchmarks/gpu/record_<CHAPTER>.py --out $RESULTS/<CHAPTER> ARGS` under a hard
# time limit (default 300 s); its log goes to $OUT/<CHAPTER>.log as it runs, and the results are
# re-packed after every chapter, so a call cut short still brings back what finished.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:?set OUT to the folder that comes back}
RESULTS=${RESULTS:-/tmp/labkit-results}
mkdir -p "$RESULTS"
status=0
for spec in "$@"; do
  IFS=: read -r chapter secs args <<< "$spec"
  secs=${secs:-300}
  echo "=== $chapter (limit ${secs} s, $(date -u +%H:%M:%S))"
  t0=$SECONDS
  # shellcheck disable=SC2086
  timeout -k 10 "$secs" python3 "benchmarks/gpu/record_${chapter}.py" --out "$RESULTS/$chapter" $args > "$OUT/$chapter.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  echo "=== $chapter rc=$rc in $((SECONDS - t0)) s"
  tail -n 12 "$OUT/$chapter.log"
  tar -C "$RESULTS" -czf "$OUT/results.tar.gz" .
done
exit $status
