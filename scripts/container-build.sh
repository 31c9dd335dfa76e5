#!/usr/bin/env bash
# Builds the CPU image (Containerfile) with podman, from a Debian bookworm base made here by
# debootstrap, so no container registry is needed (this project's machines reach only the
# package registries: Debian's, crates.io, PyPI, and Rust's dist server for rustup).
#   scripts/container-build.sh [TAG]        # default frigg:cpu
#   CPU_VARIANTS="x86-64-v4-amx" scripts/container-build.sh   # fewer builds beside the baseline
# Then: podman run --rm -p 8080:8080 frigg:cpu   (the bundled demo model; see docs/deploy.md)
# Needs root. Installs podman and debootstrap when missing. Writes what it did, and how long,
# to docs/bench/container-build.json.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
tag="${1:-frigg:cpu}"
base=localhost/frigg-base:bookworm
missing=()
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if ((${#missing[@]})); then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
t0=$(date +%s)
if ! podman image exists "$base"; then
    rootfs="$(mktemp -d)"
    trap 'rm -rf "$rootfs"' EXIT
    debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian >/dev/null
    tar -C "$rootfs" -c . | podman import - "$base" >/dev/null
fi
# Some VMs (cgroup v1/v2 hybrid, no CAP_SYS_RESOURCE) refuse podman's defaults: crun cannot run
# on a hybrid hierarchy, and raising rlimits in the container is denied. Then runc, cgroupfs and
# the host's limits are used instead.
runtime_note="podman defaults"
if ! podman run --rm "$base" true >/dev/null 2>&1; then
    command -v runc >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runc >/dev/null
    conf="$(mktemp)"
    printf '[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\n' > "$conf"
    export CONTAINERS_CONF="$conf"
    podman run --rm "$base" true
    runtime_note="runc, cgroupfs, host rlimits (crun refused this machine's cgroup hierarchy and rlimits)"
fi
t1=$(date +%s)
# A host whose own trust store holds CAs beyond Debian's (a TLS-intercepting egress proxy) lends
# its bundle to the build steps that download (rustup, cargo); nothing of it stays in the image.
ca_args=()
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null && [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    ca=/run/frigg-build-ca.pem
    ca_args=(-v "/etc/ssl/certs/ca-certificates.crt:$ca:ro" --build-arg "SSL_CERT_FILE=$ca" --build-arg "CURL_CA_BUNDLE=$ca"
             --build-arg "CARGO_HTTP_CAINFO=$ca" --build-arg RUSTUP_USE_CURL=1)
fi
podman build --format docker --build-arg BASE="$base" --build-arg "FRIGG_GIT_COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)" \
    ${CPU_VARIANTS+--build-arg "CPU_VARIANTS=$CPU_VARIANTS"} "${ca_args[@]}" -t "$tag" -f Containerfile .
t2=$(date +%s)
# The image answers: the demo model, a chat request, through the published port.
port=18089
cid=$(podman run -d --rm -p "127.0.0.1:$port:8080" "$tag" serve --host 0.0.0.0 --port 8080 --api-key smoke-key)
trap 'podman rm -f "$cid" >/dev/null 2>&1 || true' EXIT
for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    sleep 1
done
answer=$(curl -sf "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' -H 'authorization: Bearer smoke-key' \
    -d '{"model":"demo","messages":[{"role":"user","content":"Hvad er hovedstaden i Frankrig?"}],"max_tokens":8}')
user=$(podman exec "$cid" id -u)
# the builds the image carries, and the one it starts on this CPU
variants=$(podman run --rm --entrypoint cat "$tag" /usr/local/lib/frigg/variants/manifest | grep -v '^#' | cut -d' ' -f1 | paste -sd' ' -)
version=$(podman run --rm "$tag" --version)
size=$(podman image inspect "$tag" --format '{{.Size}}')
python3 - "$tag" "$((t1 - t0))" "$((t2 - t1))" "$user" "$size" "$answer" "$runtime_note" "$(podman --version)" "$variants" "$version" <<'PY'
import json, platform, sys
tag, base_s, build_s, uid, size, answer, runtime, podman, variants, version = sys.argv[1:]
reply = json.loads(answer)["choices"][0]["message"]["content"]
out = {"command": "scripts/container-build.sh", "tag": tag, "base": "debootstrap --variant=minbase bookworm",
       "base_s": int(base_s), "build_s": int(build_s), "image_bytes": int(size), "runs_as_uid": int(uid),
       "demo_reply": reply, "runtime": runtime, "podman": podman,
       "builds_beside_baseline": variants.split(), "version_here": version,
       "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())}
json.dump(out, open("docs/bench/container-build.json", "w"), indent=2)
print(json.dumps(out, indent=2))
PY
