#!/usr/bin/env bash
# One run of the CUDA backend on the lent H200 (python3 + torch 2.11 + Triton 3.6, no network).
#
# Usage (from the repository root, copied to the current directory):
#     OUT=/path/to/results RLKERNEL_COMMIT=<sha> bash tools/device_run.sh
# Give <sha> as this machine's `git rev-parse --short HEAD`, written into the command: the device's
# copy of the tree may carry a stale .git whose HEAD is an older commit (reports would name it).
#
# No pip install: the package-dir mapping of setup.py (rlkernel.contracts -> contracts/, ...) is
# rebuilt as symlinks in a staging dir put on PYTHONPATH, and `rlkernel` is a shim for
# `python3 -m rlkernel.cli`. Every step has its own time limit and a failing step never stops the
# next one; a conformance run stopped by its limit still writes a report of what ran.
#
# Phase A runs the cuda suite in op groups, the generic suite and the GPU tests side by side (they
# compile the Triton kernels into one cache); phase B runs the whole cuda suite in one process
# (warm cache), the accuracy suite at full sizes, then the benchmark.
# RLK_LIMIT_{PARTS,GENERIC,PYTEST,CUDA,ACCURACY,VALIDATE,BENCH} set the limits in
# seconds (0 skips a step; the defaults add up to 11.5 minutes, lower them to fit one call) and
# RLK_BENCH_OPS="--op rms_norm ..." narrows the benchmark; RLK_VALIDATE_RUNS="args\nargs" runs
# `rlkernel validate` once per line; RLK_OP_GROUPS / RLK_GENERIC_OPS narrow the conformance runs;
# RLK_COMMANDS="name|seconds|command" lines run after validate ($WORK, $PY and rlkernel available);
# RLK_PARALLEL lines of the same form start beside phase A.
#
# Step outputs go to $WORK/<step>.log and report folders under $WORK; after every step $WORK is
# packed into $OUT/results.tgz (the device tool returns at most 8 files), and $OUT/summary.txt
# lists every step with its exit status and seconds.
set -u

OUT="${OUT:-$PWD/device-out}"
WORK="${RLK_WORK:-/tmp/rlk-work}"
REPO="$(pwd)"
STAGE="${RLK_STAGE:-/tmp/rlk}"
PY="${PYTHON:-python3} -P"  # -P: the repository root (cwd) must not shadow the staged package
mkdir -p "$OUT"
export WORK PY
rm -rf "$WORK"; mkdir -p "$WORK"

# ---- staging: /tmp/rlk/rlkernel = rlkernel/* + contracts, backends, conformance --------------
rm -rf "$STAGE"
mkdir -p "$STAGE/rlkernel" "$STAGE/bin"
for f in "$REPO"/rlkernel/*; do
    ln -s "$f" "$STAGE/rlkernel/$(basename "$f")"
done
ln -s "$REPO/contracts" "$STAGE/rlkernel/contracts"
ln -s "$REPO/backends" "$STAGE/rlkernel/backends"
ln -s "$REPO/conformance" "$STAGE/rlkernel/conformance"
cat > "$STAGE/bin/rlkernel" <<SHIM
#!/usr/bin/env bash
exec $PY -m rlkernel.cli "\$@"
SHIM
chmod +x "$STAGE/bin/rlkernel"
export PYTHONPATH="$STAGE${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$STAGE/bin:$PATH"
# Triton's cache inside $OUT would be copied back; keep it local
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/rlk-triton-cache}"

SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
pack() {  # steps of phase A pack side by side: each into its own temporary file first
    local tmp="/tmp/rlk-results.$BASHPID.tgz"
    tar czf "$tmp" -C "$WORK" . 2>/dev/null
    mv -f "$tmp" "$OUT/results.tgz"
}
step() {  # step NAME SECONDS CMD...; a limit of 0 skips a step
    local name="$1" limit="$2"
    shift 2
    local t0=$SECONDS
    echo "=== $name (limit ${limit}s): $*" >> "$WORK/$name.log"
    timeout --signal=TERM --kill-after=15 "$limit" "$@" >> "$WORK/$name.log" 2>&1
    local rc=$?
    local note=""
    { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && note=" (TIMED OUT)"
    echo "$name rc=$rc$note seconds=$((SECONDS - t0)) last: $(tail -n 1 "$WORK/$name.log" | cut -c1-160)" >> "$SUMMARY"
    pack
}

step env 40 bash -c "nvidia-smi; $PY -c 'import torch, triton, sys; print(sys.version); print(\"torch\", torch.__version__, torch.version.cuda, \"triton\", triton.__version__, torch.cuda.get_device_name(0))'; rlkernel info"
# phase A, side by side: the cuda suite in op groups (each a report of its own; together they
# fill Triton's cache, JIT compilation being most of a cold run), the generic suite and the GPU tests
OP_GROUPS=("linear" "token_logprobs" "attention" "embedding rms_norm rope silu_mul softmax log_softmax"
        "all_reduce sample group_advantages ppo_loss kl_k3 masked_mean adamw sgd")
# RLK_OP_GROUPS="a b;c;d e" replaces the groups (';' between groups)
if [ -n "${RLK_OP_GROUPS:-}" ]; then IFS=';' read -r -a OP_GROUPS <<< "$RLK_OP_GROUPS"; fi
if [ "${RLK_LIMIT_PARTS:-250}" != 0 ]; then
    for i in "${!OP_GROUPS[@]}"; do
        ops=""
        for op in ${OP_GROUPS[$i]}; do ops="$ops --op $op"; done
        step "cuda_part$i" "${RLK_LIMIT_PARTS:-250}" rlkernel conformance --backend cuda --device cuda --full $ops --out "$WORK/cuda-part$i" &
    done
fi
# RLK_PARALLEL: "name|seconds|command" lines started now, beside phase A (e.g. a long GPU run)
while IFS='|' read -r name limit cmd; do
    [ -z "$name" ] && continue
    step "$name" "$limit" bash -c "$cmd" &
done <<< "${RLK_PARALLEL:-}"
GENERIC_OPS=""
for op in ${RLK_GENERIC_OPS:-}; do GENERIC_OPS="$GENERIC_OPS --op $op"; done
[ "${RLK_LIMIT_GENERIC:-250}" != 0 ] && step conformance_generic "${RLK_LIMIT_GENERIC:-250}" rlkernel conformance --backend generic --device cuda --full $GENERIC_OPS --out "$WORK/generic" &
# RLK_PYTEST_K narrows the GPU tests (pytest -k): the whole set does not fit one call with a cold Triton
# cache (its per-op quick conformance cases alone took over 6 minutes on an H100);
# RLK_PYTEST_K="not test_cuda_quick_conformance" runs the GPU-only checks (about 4 minutes)
[ "${RLK_LIMIT_PYTEST:-250}" != 0 ] && step pytest_gpu "${RLK_LIMIT_PYTEST:-250}" $PY -m pytest -m gpu tests -q -p no:cacheprovider -rfE ${RLK_PYTEST_K:+-k "$RLK_PYTEST_K"} &
wait
# the op groups' reports as one report of the whole suite (refused if they overlap or differ in commit)
if [ "${RLK_LIMIT_PARTS:-250}" != 0 ]; then
    step cuda_merge 60 $PY -m rlkernel.conformance.merge --out "$WORK/cuda-merged" "$WORK"/cuda-part*
fi
# phase B, alone on the GPU: the whole cuda suite in one process (the report that is committed),
# then the benchmark
[ "${RLK_LIMIT_CUDA:-250}" != 0 ] && step conformance_cuda "${RLK_LIMIT_CUDA:-250}" rlkernel conformance --backend cuda --device cuda --full --out "$WORK/cuda"
[ "${RLK_LIMIT_ACCURACY:-200}" != 0 ] && step accuracy "${RLK_LIMIT_ACCURACY:-200}" rlkernel accuracy --device cuda --size full --out "$WORK/accuracy" ${RLK_ACCURACY_OPS:-}
# rlkernel validate: RLK_VALIDATE_RUNS holds one argument list per line (each run writes to
# $WORK/validate-<n>); the limit is per run
n=0
while IFS= read -r args; do
    [ -z "$args" ] && continue
    step "validate_$n" "${RLK_LIMIT_VALIDATE:-300}" rlkernel validate $args --out "$WORK/validate-$n"
    n=$((n + 1))
done <<< "${RLK_VALIDATE_RUNS:-}"
# RLK_COMMANDS: one "name|seconds|command" per line, run in order after validate (e.g. the GRPO run)
while IFS='|' read -r name limit cmd; do
    [ -z "$name" ] && continue
    step "$name" "$limit" bash -c "$cmd"
done <<< "${RLK_COMMANDS:-}"
[ "${RLK_LIMIT_BENCH:-150}" != 0 ] && step bench "${RLK_LIMIT_BENCH:-150}" rlkernel bench --device cuda --out "$WORK/bench" ${RLK_BENCH_OPS:-}
cat "$SUMMARY"
