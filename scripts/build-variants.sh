#!/usr/bin/env bash
# Builds a portable frigg: the baseline for any x86-64-v3 CPU (AVX2, FMA, F16C) as PREFIX/bin/frigg,
# and beside it each build deploy/cpu-variants lists (AVX-512, VNNI, BF16, AMX) as
# PREFIX/lib/frigg/variants/NAME, with PREFIX/lib/frigg/variants/manifest naming the CPU
# features each one needs. At start the baseline runs the first listed build this CPU can run
# (src/cli/variant.rs), so ggml and the extension use every instruction the machine has, as a
# build for that one CPU (target-cpu=native) would. The Containerfile runs this.
#   scripts/build-variants.sh PREFIX [NAME...]     # default: every build in deploy/cpu-variants;
#                                                  # "none": the baseline alone
# Env: BASELINE (default x86-64-v3), TARGET_ROOT (default target-variants: one cargo target dir
# per build, so a rebuild of one does not rebuild the others).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
prefix="${1:?usage: scripts/build-variants.sh PREFIX [NAME...]}"
shift
# names as separate arguments or in one (the Containerfile passes its build argument whole)
read -r -a wanted <<< "$*"
baseline="${BASELINE:-x86-64-v3}"
target_root="${TARGET_ROOT:-target-variants}"
variants_dir="$prefix/lib/frigg/variants"
# An explicit --target keeps RUSTFLAGS off build scripts and proc macros, which run here: a
# build for a CPU this one is not would otherwise stop on an illegal instruction while building.
host="$(rustc -vV | sed -n 's/^host: //p')"

# The target features rustc enables for these flags, one per line.
rustc_features() {
    rustc --print cfg "$@" 2>/dev/null | sed -n 's/^target_feature="\(.*\)"$/\1/p'
}

build() { # NAME TARGET-CPU FEATURES(comma list or -)
    local name="$1" cpu="$2" feats="$3" rust_flags cflags=() f
    rust_flags="-C target-cpu=$cpu"
    if [ "$feats" != "-" ]; then
        IFS=, read -r -a list <<< "$feats"
        for f in "${list[@]}"; do
            cflags+=("-m$f")
            # rustc takes only the features it has stably (it warns on the others, e.g. AMX);
            # ggml and the extension get every one through gcc's -m flags
            if rustc_features -C "target-feature=+$f" | grep -qx -- "$f"; then
                rust_flags+=" -C target-feature=+$f"
            fi
        done
    fi
    echo "building $name: RUSTFLAGS=\"$rust_flags\" CFLAGS=\"${cflags[*]}\"" >&2
    FRIGG_VARIANT="$name" RUSTFLAGS="$rust_flags" CFLAGS="${cflags[*]}" CXXFLAGS="${cflags[*]}" \
        cargo build --release --locked --target "$host" --target-dir "$target_root/$name" >&2
}

build "$baseline" "$baseline" -
install -D -s -m 0755 "$target_root/$baseline/$host/release/frigg" "$prefix/bin/frigg"

mkdir -p "$variants_dir"
manifest="$(mktemp)"
echo "# NAME FEATURES: the CPU features each build needs (scripts/build-variants.sh), best first" > "$manifest"
while read -r name cpu feats; do
    case "$name" in ''|'#'*) continue ;; esac
    if ((${#wanted[@]})) && ! printf '%s\n' "${wanted[@]}" | grep -qx -- "$name"; then
        continue
    fi
    build "$name" "$cpu" "$feats"
    install -D -s -m 0755 "$target_root/$name/$host/release/frigg" "$variants_dir/$name"
    # what the CPU must have: every feature rustc enables for the level, and the listed ones
    needs="$( { rustc_features -C "target-cpu=$cpu"; [ "$feats" = "-" ] || tr , '\n' <<< "$feats"; } | sort -u | paste -sd, -)"
    echo "$name $needs" >> "$manifest"
done < deploy/cpu-variants
install -m 0644 "$manifest" "$variants_dir/manifest"
rm -f "$manifest"
echo "installed $prefix/bin/frigg ($baseline) and $(grep -vc '^#' "$variants_dir/manifest") variants in $variants_dir" >&2
