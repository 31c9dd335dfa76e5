//! A portable install's choice of build (scripts/build-variants.sh, the container image): the
//! baseline `frigg` (x86-64-v3) runs in its place the first build listed in
//! `../lib/frigg/variants/manifest` (beside its own directory) whose every CPU feature this CPU
//! has, so ggml and the extension use AVX-512, VNNI, BF16 and AMX where the machine has them.
//! The choice is by CPU features only, never by CPU model; `FRIGG_CPU_VARIANT=NAME` (or
//! `baseline`) overrides it. Without a manifest (any other build) nothing happens.

use std::path::{Path, PathBuf};

/// One build of a portable install: its file name in the variants directory and the CPU
/// features (rustc's names) its code may use.
#[derive(Debug, Clone, PartialEq)]
pub struct Variant {
    pub name: String,
    pub needs: Vec<String>,
}

/// The manifest: `NAME FEATURE,FEATURE,…` per line, best build first; `#` starts a comment.
pub fn parse_manifest(text: &str) -> Result<Vec<Variant>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let (Some(name), Some(needs), None) = (words.next(), words.next(), words.next()) else {
            return Err(format!("line {}: expected `NAME FEATURE,FEATURE,…`, got `{line}`", i + 1));
        };
        if name == "baseline" || name.contains('/') {
            return Err(format!("line {}: `{name}` cannot name a build", i + 1));
        }
        out.push(Variant { name: name.to_string(), needs: needs.split(',').filter(|f| !f.is_empty()).map(str::to_string).collect() });
    }
    Ok(out)
}

/// Which build runs: `None` for this one (the baseline), else the first variant whose every
/// feature `has` reports present (unknown features count as absent). `forced` is
/// `FRIGG_CPU_VARIANT`: `baseline`, or a variant this CPU must be able to run.
pub fn choose<'a>(variants: &'a [Variant], forced: Option<&str>, has: impl Fn(&str) -> Option<bool>) -> Result<Option<&'a Variant>, String> {
    let missing = |v: &Variant| -> Vec<String> { v.needs.iter().filter(|f| has(f) != Some(true)).cloned().collect() };
    match forced {
        Some("baseline") => Ok(None),
        Some(name) => {
            let Some(v) = variants.iter().find(|v| v.name == name) else {
                let names: Vec<&str> = variants.iter().map(|v| v.name.as_str()).chain(["baseline"]).collect();
                return Err(format!("FRIGG_CPU_VARIANT={name}: this install has no such build (it has {})", names.join(", ")));
            };
            let lacks = missing(v);
            if lacks.is_empty() {
                Ok(Some(v))
            } else {
                Err(format!("FRIGG_CPU_VARIANT={name}: this CPU lacks {} that build needs; it would stop on an illegal instruction", lacks.join(", ")))
            }
        }
        None => Ok(variants.iter().find(|v| missing(v).is_empty())),
    }
}

/// Whether this CPU (and the OS, for the register state) has a feature, by rustc's name; `None`
/// for a name this function does not know.
pub fn cpu_has(feature: &str) -> Option<bool> {
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! detect {
            ($($name:tt),* $(,)?) => {
                match feature {
                    $($name => Some(std::is_x86_feature_detected!($name)),)*
                    // std's detection of AMX is not stable yet
                    "amx-bf16" | "amx-tile" | "amx-int8" => Some(frigg::ggml::os::cpu_has_amx(feature)),
                    _ => None,
                }
            };
        }
        detect!(
            "sse", "sse2", "sse3", "ssse3", "sse4.1", "sse4.2", "sse4a", "popcnt", "cmpxchg16b", "fxsr", "xsave", "xsaveopt", "xsavec",
            "xsaves", "avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "lzcnt", "movbe", "adx", "aes", "pclmulqdq", "sha", "rdrand",
            "rdseed", "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512ifma", "avx512vbmi", "avx512vbmi2",
            "avx512vnni", "avx512bitalg", "avx512vpopcntdq", "avx512bf16", "avx512fp16", "avxvnni", "gfni", "vaes", "vpclmulqdq",
        )
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = feature;
        None
    }
}

/// The manifest of the install this executable belongs to, if it is a portable install's
/// baseline: `EXE_DIR/../lib/frigg/variants/manifest`.
fn manifest_path() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let path = exe.parent()?.parent()?.join("lib/frigg/variants/manifest");
    path.is_file().then_some(path)
}

/// First thing at start: in a portable install, replace this process with the build chosen for
/// this CPU (arguments and environment unchanged). `Ok` when this build goes on running; `Err`
/// for a manifest or override that cannot be honoured.
pub fn run_chosen_build() -> Result<(), String> {
    let forced = std::env::var("FRIGG_CPU_VARIANT").ok().filter(|v| !v.is_empty());
    let Some(manifest) = manifest_path() else {
        if let Some(f) = forced.as_deref().filter(|f| *f != "baseline" && *f != env!("FRIGG_BUILT_FOR")) {
            tracing::warn!("FRIGG_CPU_VARIANT={f} has no effect: this frigg (built for {}) is not a portable install", env!("FRIGG_BUILT_FOR"));
        }
        return Ok(());
    };
    let text = std::fs::read_to_string(&manifest).map_err(|e| format!("{}: {e}", manifest.display()))?;
    let variants = parse_manifest(&text).map_err(|e| format!("{}: {e}", manifest.display()))?;
    match choose(&variants, forced.as_deref(), cpu_has)? {
        Some(chosen) => exec(&manifest.with_file_name(&chosen.name), &chosen.name),
        None if forced.is_some() => tracing::info!("running the baseline build ({}): FRIGG_CPU_VARIANT=baseline", env!("FRIGG_BUILT_FOR")),
        None => tracing::info!("running the baseline build ({}): no build in {} needs only features this CPU has", env!("FRIGG_BUILT_FOR"), manifest.display()),
    }
    Ok(())
}

/// Replaces this process with the build at `path`; returns (with a warning) only if it cannot.
#[cfg(unix)]
fn exec(path: &Path, name: &str) {
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| "frigg".into());
    tracing::info!("running the build for this CPU: {name} ({})", path.display());
    let err = std::process::Command::new(path).arg0(arg0).args(args).exec();
    // exec returns only on failure: the baseline still runs on this CPU
    tracing::warn!("could not start the build {name} ({}): {err}; running the baseline ({})", path.display(), env!("FRIGG_BUILT_FOR"));
}

#[cfg(not(unix))]
fn exec(_path: &Path, _name: &str) {}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(name: &str, needs: &[&str]) -> Variant {
        Variant { name: name.into(), needs: needs.iter().map(|s| s.to_string()).collect() }
    }

    #[test]
    fn the_first_build_whose_features_the_cpu_all_has_is_chosen() {
        let builds = [v("amx", &["avx512f", "amx-int8"]), v("v4", &["avx512f"]), v("odd", &["sse2"])];
        let has = |present: &'static [&'static str]| move |f: &str| Some(present.contains(&f));
        assert_eq!(choose(&builds, None, has(&["avx512f", "amx-int8", "sse2"])).unwrap(), Some(&builds[0]));
        assert_eq!(choose(&builds, None, has(&["avx512f", "sse2"])).unwrap(), Some(&builds[1]));
        assert_eq!(choose(&builds, None, has(&["sse2"])).unwrap(), Some(&builds[2]));
        assert_eq!(choose(&builds, None, has(&[])).unwrap(), None);
        // a feature this frigg cannot detect counts as absent
        assert_eq!(choose(&builds[..2], None, |f| (f != "amx-int8").then_some(true)).unwrap(), Some(&builds[1]));
    }

    #[test]
    fn an_override_names_a_build_the_cpu_can_run_or_fails_clearly() {
        let builds = [v("amx", &["avx512f", "amx-int8"]), v("v4", &["avx512f"])];
        let has = |f: &str| Some(f == "avx512f");
        assert_eq!(choose(&builds, Some("baseline"), has).unwrap(), None);
        assert_eq!(choose(&builds, Some("v4"), has).unwrap(), Some(&builds[1]));
        let lacks = choose(&builds, Some("amx"), has).unwrap_err();
        assert!(lacks.contains("lacks amx-int8"), "{lacks}");
        let unknown = choose(&builds, Some("zen9"), has).unwrap_err();
        assert!(unknown.contains("no such build") && unknown.contains("amx, v4, baseline"), "{unknown}");
    }

    #[test]
    fn the_manifest_parses_and_bad_lines_are_named() {
        let m = parse_manifest("# comment\n\nv4 avx512f,avx512bw\namx avx512f,amx-tile # best\n").unwrap();
        assert_eq!(m, vec![v("v4", &["avx512f", "avx512bw"]), v("amx", &["avx512f", "amx-tile"])]);
        assert!(parse_manifest("v4\n").unwrap_err().starts_with("line 1:"));
        assert!(parse_manifest("ok sse2\nv4 a b\n").unwrap_err().starts_with("line 2:"));
        assert!(parse_manifest("../frigg sse2\n").is_err());
        assert!(parse_manifest("baseline sse2\n").is_err());
    }

    /// Every feature a build in deploy/cpu-variants needs (its level's, as rustc lists them,
    /// and its own) is one `cpu_has` can detect: else that build would never be chosen.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn every_feature_the_listed_builds_need_can_be_detected() {
        let list = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/cpu-variants")).unwrap();
        let mut builds = 0;
        for line in list.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
            let [name, cpu, feats] = line.split_whitespace().collect::<Vec<_>>()[..] else { panic!("bad line {line}") };
            let out = std::process::Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
                .args(["--print", "cfg", "-C", &format!("target-cpu={cpu}")])
                .output()
                .expect("rustc runs");
            assert!(out.status.success(), "rustc --print cfg for {cpu}");
            let level = String::from_utf8(out.stdout).unwrap();
            let level: Vec<&str> = level.lines().filter_map(|l| l.strip_prefix("target_feature=\"")?.strip_suffix('"')).collect();
            assert!(level.contains(&"avx2"), "{name}: {cpu} is no level above the baseline");
            for f in level.iter().copied().chain(feats.split(',').filter(|f| *f != "-")) {
                assert!(cpu_has(f).is_some(), "{name} needs {f}, which cpu_has cannot detect");
            }
            builds += 1;
        }
        assert!(builds >= 1);
    }
}
