# Sourced by the benchmark scripts: sets MACHINE_TAG (unless given) to this CPU's model name and
# widest vector extension, e.g. intel-xeon-processor-amx, so each CPU keeps its own result files.
# A VM may show two CPUs under one model name (two AMD EPYCs, one with AVX-VNNI, one without): where a
# result file under that tag already holds another machine's flags (the flags every table's
# machine line prints), the tag gains this CPU's family and model numbers from /proc/cpuinfo,
# e.g. amd-epyc-avx512-f25m17, and keeps them on every later run here.
if [ -z "${MACHINE_TAG:-}" ]; then
    flags=" $(sed -n 's/^flags[[:space:]]*: //p' /proc/cpuinfo | head -n 1) "
    isa=avx2
    case "$flags" in *" amx_int8 "*) isa=amx ;; *" avx512f "*) isa=avx512 ;; esac
    model="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1 | tr 'A-Z' 'a-z' | sed 's/([^)]*)//g; s/[^a-z0-9]\+/-/g; s/^-//; s/-$//')"
    MACHINE_TAG="${model:-cpu}-$isa"
    # the flags frigg records (the `wanted` list of engine::host::machine: keep the two equal), in
    # /proc/cpuinfo's order
    mine="$(for f in $flags; do case " avx2 avx512f avx512_bf16 avx512_vnni avx_vnni amx_int8 amx_bf16 f16c fma asimd sve " in *" $f "*) printf '%s ' "$f" ;; esac; done)"
    for recorded in docs/bench/vs-"$MACHINE_TAG"-*.json; do
        [ -f "$recorded" ] || continue
        theirs="$(python3 -c 'import json, sys; print(" ".join(json.load(open(sys.argv[1]))[0]["machine"]["cpu_flags"]) + " ")' "$recorded")"
        if [ "$theirs" != "$mine" ]; then
            family="$(sed -n 's/^cpu family[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
            number="$(sed -n 's/^model[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
            MACHINE_TAG="$MACHINE_TAG-f${family}m${number}"
        fi
        break
    done
fi
