# Sourced by the load scripts (bench-load.sh, soak.sh): builds frigg, converts the tiny fixture
# to $tiny, and starts servers on loopback.
frigg=./target/release/frigg
cargo build --release --locked >/dev/null
mkdir -p docs/bench
tiny="$(mktemp -d)/tiny-q8_0.gguf"
$frigg convert tests/fixtures/ckpt/tiny-packed -o "$tiny" --type q8_0 --quiet

# start_server MODEL SERVE-ARGS...: starts `frigg serve MODEL` on a random loopback port with all
# cores and waits until /health answers; sets server_pid and server_url (exits if it dies).
start_server() {
    local port=$((20000 + RANDOM % 20000))
    local log="/tmp/frigg-serve-$port.log"
    $frigg serve "$1" --port "$port" --threads "$(nproc)" "${@:2}" 2>"$log" &
    server_pid=$!
    server_url="http://127.0.0.1:$port"
    for _ in $(seq 600); do
        curl -sf "$server_url/health" >/dev/null && return 0
        kill -0 $server_pid 2>/dev/null || { cat "$log"; exit 1; }
        sleep 0.5
    done
    echo "frigg serve did not become healthy in 300 s (log: $log)"
    exit 1
}
