# Sourced by the benchmark scripts: sets MACHINE_TAG (unless given) to this CPU's model name and
# widest vector extension, e.g. intel-xeon-processor-amx, so each CPU keeps its own result files.
if [ -z "${MACHINE_TAG:-}" ]; then
    flags=" $(sed -n 's/^flags[[:space:]]*: //p' /proc/cpuinfo | head -n 1) "
    isa=avx2
    case "$flags" in *" amx_int8 "*) isa=amx ;; *" avx512f "*) isa=avx512 ;; esac
    model="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1 | tr 'A-Z' 'a-z' | sed 's/([^)]*)//g; s/[^a-z0-9]\+/-/g; s/^-//; s/-$//')"
    MACHINE_TAG="${model:-cpu}-$isa"
fi
