#!/usr/bin/env bash
# One run of the CUDA backend on the lent H200 (python3 + torch 2.11 + Triton 3.6, no network).
#
# Usage (from the repository root, copied to the current directory):
#     OUT=/path/to/results bash tools/device_run.sh
#
# No pip install: the package-dir mapping of setup.py (rlkernel.contracts -> contracts/, ...) is
# rebuilt as symlinks in a staging dir put on PYTHONPATH, and `rlkernel` is a shim for
# `python3 -m rlkernel.cli`. Every step has its own time limit (the whole script fits in 9
# minutes) and a failing step never stops the next one. Each step's output goes to $OUT/<step>.log;
# $OUT/summary.txt lists every step with its exit status and seconds.
set -u

OUT="${OUT:-$PWD/device-out}"
REPO="$(pwd)"
STAGE="${RLK_STAGE:-/tmp/rlk}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"

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
step() {  # step NAME SECONDS CMD...
    local name="$1" limit="$2"
    shift 2
    local t0=$SECONDS
    echo "=== $name (limit ${limit}s): $*" | tee -a "$OUT/$name.log"
    timeout --kill-after=10 "$limit" "$@" >> "$OUT/$name.log" 2>&1
    local rc=$?
    local note=""
    [ "$rc" = 124 ] || [ "$rc" = 137 ] && note=" (TIMED OUT)"
    echo "$name rc=$rc$note seconds=$((SECONDS - t0))" | tee -a "$SUMMARY"
    tail -n 5 "$OUT/$name.log"
}

step env 30 bash -c "nvidia-smi; $PY -c 'import torch, triton, sys; print(sys.version); print(\"torch\", torch.__version__, torch.version.cuda, \"triton\", triton.__version__, torch.cuda.get_device_name(0))'; rlkernel info"
step static 80 $PY -c "from rlkernel.backends.cuda import CudaBackend
r = CudaBackend().static_checks()
for op, case, ok, d in r: print('PASS' if ok else 'FAIL', op, case, d[:200])
print(sum(x[2] for x in r), 'passed,', sum(not x[2] for x in r), 'failed')"
step conformance_cuda 190 rlkernel conformance --backend cuda --device cuda --full --out "$OUT/cuda"
step conformance_generic 90 rlkernel conformance --backend generic --device cuda --full --out "$OUT/generic"
step pytest_gpu 80 $PY -m pytest -m gpu tests -q -p no:cacheprovider
step bench 40 rlkernel bench --device cuda --out "$OUT/bench"
echo "--- summary"; cat "$SUMMARY"
