#!/usr/bin/env bash
# Everything a short GPU allocation records, most needed first, each step under its own limit and
# all of them under one deadline, so that a lease of a quarter of an hour ends with results:
#
#   1. tests/gpu                     (make gpu-check's tests stage: is normlab correct on the GPU)
#   2. bench_stacked_gpu.py          (is the stacked engine fast there: groups vs runs alone)
#   3. gpu_check.py and gpu_peers.py (make gpu-check's benchmark stages: GPT-2 small, compiled)
#   4. the whole test suite          (`pytest -n` on every core, as `make test` runs it; the
#                                     optional packages the machine lacks skip with their hint)
#   5. one part of the gpu study     (with the seconds left, resumable: `normlab study` again
#                                     with the same --out continues it)
#
#   bash benchmarks/gpu_lease.sh OUT_DIR [DEADLINE_S] [STUDY_PART]
#
# Writes OUT_DIR/lease.log (everything printed) and OUT_DIR/results.tar.gz (each step's results:
# gpu_check_all.*, gpu_check.*, gpu_peers.*, bench_stacked_gpu.*, the study part's export and
# log). Without a CUDA GPU it says so and exits 0. PY names the Python (default python3).
set -u
out=${1:?usage: gpu_lease.sh OUT_DIR [DEADLINE_S] [STUDY_PART]}
deadline=${2:-520}
part=${3:-post-ends-better}
py=${PY:-python3}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
mkdir -p "$out"
out=$(cd "$out" && pwd)
res=$(mktemp -d)
start=$(date +%s)
exec > >(tee "$out/lease.log") 2>&1

left() { echo $(( deadline - ($(date +%s) - start) )); }
# run STEP_LIMIT_S COMMAND...: the command under min(its limit, what is left less 15 s)
run() {
    local limit=$1; shift
    local l; l=$(( $(left) - 15 ))
    (( l < limit )) && limit=$l
    if (( limit < 20 )); then echo "=== not run (no time left): $*"; return 0; fi
    echo "=== $(date -u +%H:%M:%S) [${limit} s] $*"
    timeout --kill-after=10 "$limit" "$@"
    echo "=== exit status $? after $(( $(date +%s) - start )) s"
}

if ! "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_lease.sh: no CUDA GPU for $py, so nothing was run"
    exit 0
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
lscpu | grep -E 'Model name|^CPU\(s\)|Flags' | cut -c1-200
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
export NORMLAB_COMMIT=${NORMLAB_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}

run 200 "$py" benchmarks/gpu_check_all.py --stages tests --budget 190 --out-dir "$res/tests"
run 260 "$py" benchmarks/bench_stacked_gpu.py --steps 30 --skip 8 --out "$res/bench_stacked_gpu.json"
run 200 "$py" benchmarks/gpu_check_all.py --stages placements peers --budget 190 \
    --out-dir "$res/benchmarks"
run 240 "$py" -m pytest -q -n "$(nproc)" -p no:cacheprovider --junitxml="$res/test_suite.xml"
minutes=$(( ($(left) - 40) / 60 ))
if (( minutes >= 1 )); then
    run $(( minutes * 60 + 30 )) "$py" -m normlab study --profile gpu --device cuda --part "$part" \
        --time-limit "$minutes" --out "$res/study" --no-report
else
    echo "=== not run (no time left): the study part $part"
fi
# checkpoints stay out of the archive (16 MiB at most comes back); metrics and summaries go in
tar -C "$res" -czf "$out/results.tar.gz" --exclude='*.safetensors' --exclude='*.pt' . \
    && ls -la "$out/results.tar.gz"
echo "=== done in $(( $(date +%s) - start )) s"
