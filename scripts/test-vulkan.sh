#!/usr/bin/env bash
# The device tests on ggml's Vulkan backend, on Mesa's software Vulkan device (lavapipe) where
# there is no GPU: the engine's device path — weights, KV cache and every op on the device,
# uploads and downloads through ggml's backend API — runs as it would on a real GPU.
#
#   scripts/test-vulkan.sh           the device tests and a named subset of the server suite
#   scripts/test-vulkan.sh --full    the whole Python server suite against
#                                    `frigg serve --device gpu` instead of the subset
# (the reviewers' run: not part of scripts/test.sh, whose CI machine has no time for a second
# ggml build with its shaders).
#
# The device tests go twice: with f32 shaders (GGML_VK_DISABLE_F16=1) and with f16 shaders, as a
# GPU with fp16 arithmetic runs them (FRIGG_VK_SHADERS="f16" runs one); the server suite runs
# with f16 shaders (FRIGG_VK_SERVER_SHADERS names others). The result lands in
# docs/bench/vulkan-check.json (dated).
#
# Builds into target-vulkan/ (a second ggml build: the CPU one in target/ stays as it is).
# GGML_VK_VISIBLE_DEVICES=0 is set only for the test processes, never for cargo: llama-cpp-sys-2
# forwards every GGML_* variable to ggml's CMake, so setting it for a build reconfigures ggml.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
full=0
for arg in "$@"; do
    case "$arg" in
        --full) full=1 ;;
        *) echo "test-vulkan: unknown argument $arg (known: --full)" >&2; exit 2 ;;
    esac
done

scripts/bootstrap.sh --vulkan
export CARGO_TARGET_DIR="$root/target-vulkan"
start=$(date +%s)
cargo build --release --locked --features vulkan
build_s=$(( $(date +%s) - start ))
frigg="$CARGO_TARGET_DIR/release/frigg"
# The test executables, built without running them (so cargo never sees the device variables).
mapfile -t tests < <(cargo test --release --locked --features vulkan --no-run --message-format=json --test device --test engine \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])')
declare -A exe
for t in "${tests[@]}"; do exe[${t%% *}]="${t#* }"; done

venv="${FRIGG_TEST_VENV:-$root/venv-test}"
[ -x "$venv/bin/python" ] || { echo "test-vulkan: no test venv at $venv (scripts/test.sh makes it)" >&2; exit 1; }

# Every log of this run stays here (the pytest log names a failed test's assertion).
report="$CARGO_TARGET_DIR/test-vulkan-report"
rm -rf "$report"
mkdir -p "$report"
# Mesa 22.3's lavapipe (Debian bookworm's own) killed processes now and then — SIGSEGV in a
# lavapipe worker, or glibc's "corrupted double-linked list" in vkCmdBindDescriptorSets —
# (docs/parity.md, "On a GPU device"); bootstrap's Mesa 25.0 has not, so far. Each check still
# runs in its own process, and a process killed by a signal is run again, at most four times,
# every such crash counted in the report, so that a lavapipe crash is told from a test failure
# and seen. A test that fails is never run again.
crashes=0
suite_failed=0
# run LOG CMD...: runs CMD (appending to LOG); retries a signal death; fails on a test failure.
run() {
    local log="$1"; shift
    local try rc
    for try in 1 2 3 4 5; do
        set +e
        "$@" >>"$log" 2>&1
        rc=$?
        set -e
        if ((rc < 128)); then
            ((rc == 0)) || { tail -n 40 "$log" >&2; echo "test-vulkan: failed: $*" >&2; exit 1; }
            return 0
        fi
        crashes=$((crashes + 1))
        echo "test-vulkan: signal $((rc - 128)) inside lavapipe?, try $try: ${FRIGG_DEVICE_TIERS:-} ${FRIGG_DEVICE_FIXTURES:-} $*" | tee -a "$report/crashes.txt" >&2
    done
    echo "test-vulkan: $* crashed five times" >&2
    exit 1
}
export GGML_VK_VISIBLE_DEVICES=0 FRIGG_TEST_DEVICE=gpu
echo "test-vulkan: $("$frigg" --version)" >&2
for shaders in ${FRIGG_VK_SHADERS:-f32 f16}; do
    if [ "$shaders" = f32 ]; then export GGML_VK_DISABLE_F16=1; else unset GGML_VK_DISABLE_F16; fi
    echo "test-vulkan: $shaders shaders" >&2
    t0=$(date +%s)
    log="$report/device-$shaders.log"
    export FRIGG_DEVICE_REPORT="$report/device-$shaders.json"
    for fixture in tiny-packed tiny-split tiny-packed-bf16 small-h3l2-packed; do
        for tier in f32 f32-kv-f16 bf16 q8_0 q4_0; do
            FRIGG_DEVICE_TIERS=$tier FRIGG_DEVICE_FIXTURES=$fixture run "$log" "${exe[device]}" --exact every_tier_on_the_device_stays_within_its_bounds --nocapture
        done
    done
    run "$log" "${exe[device]}" --exact wide_checkpoint_on_the_device_matches_the_cpu --nocapture
    run "$log" "${exe[device]}" --exact batched_decode_on_the_device --nocapture
    run "$log" "${exe[device]}" --exact cancelled_prefill_on_the_device_frees_the_stream_and_changes_nothing --nocapture
    run "$log" "${exe[engine]}" --exact decode_graphs_are_reused_once_warm --nocapture
    unset FRIGG_DEVICE_REPORT
    echo "$(( $(date +%s) - t0 ))" >"$report/seconds-$shaders"
    [[ " ${FRIGG_VK_SERVER_SHADERS:-f16} " == *" $shaders "* ]] || continue
    t0=$(date +%s)
    if ((full)); then
        suite=(tests/python)
    else
        suite=(tests/python/test_server.py -k "decode_graphs_are_reused or bundled_demo_model_answers")
    fi
    # the suite's result is recorded whatever it is; a failure fails this script after the report
    set +e
    FRIGG_BIN="$frigg" "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider --junitxml="$report/server-$shaders.xml" "${suite[@]}" 2>&1 | tee "$report/server-$shaders.log" | tail -n 15
    ((PIPESTATUS[0] == 0)) || suite_failed=1
    set -e
    echo "$(( $(date +%s) - t0 ))" >"$report/server-seconds-$shaders"
done
echo "$crashes" >"$report/crashes"
python3 scripts/vulkan_report.py "$report" --build-seconds "$build_s" --full "$full" --frigg "$frigg" --out docs/bench/vulkan-check.json
((suite_failed == 0)) || { echo "test-vulkan: the server suite failed on the device (docs/bench/vulkan-check.json names the tests; the log: $report/server-*.log)" >&2; exit 1; }
