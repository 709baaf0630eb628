#!/usr/bin/env bash
# The device run of record (issue 31): on a lent GPU machine, ONE command that installs the
# carried pydantic wheels, runs the harness's accuracy benchmark (benchmarks/gpu_overhead.py)
# and scripts/gpu-check (conformance, quick tensor workloads, the generative workloads on
# every generative engine), and leaves what a reader needs under $OUT.
#
# 1. Here, once, from the repository root (the GPU image has no pydantic; these are
#    pydantic and what it needs for the image's Python 3.12, about 3 MB; shared/wheels is
#    in .gitignore: never commit them):
#
#      python3 -m pip download --only-binary=:all: --python-version 3.12 --implementation cp \
#          --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
#          --platform manylinux_2_28_x86_64 -d shared/wheels pydantic==2.14.4
#
# 2. There, through the device tool: run with command "bash scripts/device-run.sh",
#    carry ["shared/wheels"], timeout_s 600. Then give the machine back.
#
# Under $OUT (the device tool returns at most 8 files, two folders down):
#   device-run.log          everything printed, this script's steps included
#   gpu-overhead.json, .md  the benchmark: plain loop vs the harness, ratio of medians
#   summary.json            gpu-check's verdict, per engine, per generative workload
#   cells.json              one line per cell: status, headline, TTFT/ITL, tok/s, energy
#   conformance.xml         the conformance suite's junit file
#   records.tar.gz          the runs' manifests and cell records (logs and plots left out)
#
# Settings (environment): DEVICE (cuda), DEVICE_RUN_S (540: the whole script, inside the
# tool's 600 s limit), BENCH_ITERATIONS (1000), BENCH_MODEL (the benchmark's default),
# PYTHON (python3), WHEELS (shared/wheels), OUT (/tmp/device-run when not on the tool),
# GPU_CHECK_ARGS (more gpu-check arguments, split on spaces; default --requests=100, the
# fewest closed-loop requests a p99 needs, so that more workloads fit the budget).
# Exit status: gpu-check's (0 pass, 1 fail, 2 packages missing, 3 nothing ran), else 4
# when the benchmark failed.
set -uo pipefail

cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/device-run}"
DEVICE="${DEVICE:-cuda}"
DEVICE_RUN_S="${DEVICE_RUN_S:-540}"
BENCH_ITERATIONS="${BENCH_ITERATIONS:-1000}"
PYTHON="${PYTHON:-python3}"
WHEELS="${WHEELS:-shared/wheels}"
WORK="$(mktemp -d /tmp/device-run.XXXXXX)"
mkdir -p "$OUT"
exec > >(tee "$OUT/device-run.log") 2>&1
START=$SECONDS
export PYTHONUNBUFFERED=1 HARNESS_CACHE_DIR="${HARNESS_CACHE_DIR:-$WORK/cache}"
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export RAY_USAGE_STATS_ENABLED=0

say() { echo; echo "=== device-run ($((SECONDS - START)) s): $*"; }

say "machine"
date -u +%Y-%m-%dT%H:%M:%SZ
git log -1 --format='commit %H %s' 2>/dev/null || echo "commit: not a git checkout"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || echo "no nvidia-smi"
"$PYTHON" --version

say "pydantic"
if "$PYTHON" -c "import pydantic" 2>/dev/null; then
    echo "already installed: $("$PYTHON" -c 'import pydantic; print(pydantic.VERSION)')"
elif compgen -G "$WHEELS/*.whl" >/dev/null; then
    # --target beside the image's packages, first on the path: the image is not changed
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$WORK/site" "$WHEELS"/*.whl || exit 2
    export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
    "$PYTHON" -c "import pydantic; print('installed from $WHEELS:', pydantic.VERSION)" || exit 2
else
    echo "no pydantic and no wheels in $WHEELS: download them here first (this script's header)"
    exit 2
fi

say "the harness's accuracy: benchmarks/gpu_overhead.py on $DEVICE"
model=()
[ -n "${BENCH_MODEL:-}" ] && model=(--model "$BENCH_MODEL")
timeout 150 "$PYTHON" -m benchmarks.gpu_overhead --device "$DEVICE" "${model[@]}" \
    --iterations "$BENCH_ITERATIONS" --out "$OUT/gpu-overhead.json" --md "$OUT/gpu-overhead.md"
bench=$?
[ "$bench" -ne 0 ] && echo "device-run: the benchmark exited $bench"

# what is left of the whole script's time, less the copying after it; at most gpu-check's 8 min
budget=$((DEVICE_RUN_S - (SECONDS - START) - 20))
[ "$budget" -gt 480 ] && budget=480
say "scripts/gpu-check on $DEVICE, budget $budget s"
# shellcheck disable=SC2086  # GPU_CHECK_ARGS is a list of words on purpose
"$PYTHON" scripts/gpu_check.py --device "$DEVICE" --out "$WORK/gpu-check" --budget-s "$budget" \
    ${GPU_CHECK_ARGS---requests=100}
check=$?

say "collecting under $OUT"
for f in summary.json cells.json conformance.xml; do
    [ -f "$WORK/gpu-check/$f" ] && cp "$WORK/gpu-check/$f" "$OUT/$f"
done
if [ -d "$WORK/gpu-check/runs" ]; then
    (cd "$WORK/gpu-check" &&
        find runs \( -name manifest.json -o -name matrix.md -o -path '*/cells/*.json' \) -print0 |
        tar czf "$OUT/records.tar.gz" --null -T -)
fi
ls -l "$OUT"
say "done: gpu-check exit $check, benchmark exit $bench"
[ "$check" -ne 0 ] && exit "$check"
[ "$bench" -ne 0 ] && exit 4
exit 0
