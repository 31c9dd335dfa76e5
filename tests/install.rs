//! A portable install (scripts/build-variants.sh): `bin/frigg` runs in its place the first build
//! of `lib/frigg/variants/manifest` that this CPU can run, itself when none can, and a forced
//! build the CPU cannot run is a clear error, never an illegal instruction.

mod common;

use common::*;
use std::path::Path;
use std::process::{Command, Output};

/// `PREFIX/bin/frigg` (this build) and `PREFIX/lib/frigg/variants/` with `manifest` and a
/// stand-in build `fake` that echoes how it was started.
fn install(prefix: &Path, manifest: &str) {
    let bin = prefix.join("bin");
    let variants = prefix.join("lib/frigg/variants");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&variants).unwrap();
    let frigg = bin.join("frigg");
    if !frigg.exists() && std::fs::hard_link(frigg_bin(), &frigg).is_err() {
        std::fs::copy(frigg_bin(), &frigg).unwrap();
    }
    let fake = variants.join("fake");
    std::fs::write(&fake, "#!/bin/sh\necho \"fake build: $* (FRIGG_CPU_VARIANT=$FRIGG_CPU_VARIANT)\"\n").unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(variants.join("manifest"), manifest).unwrap();
}

fn run(prefix: &Path, forced: Option<&str>) -> Output {
    let mut cmd = Command::new(prefix.join("bin/frigg"));
    cmd.arg("--version").env_remove("FRIGG_CPU_VARIANT");
    if let Some(f) = forced {
        cmd.env("FRIGG_CPU_VARIANT", f);
    }
    cmd.output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn a_portable_install_runs_the_build_this_cpu_can_run() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let prefix = dir.path();
    // every x86-64 CPU has SSE2; none has a feature of that name
    install(prefix, "# best first\nnever not-a-cpu-feature\nfake sse2,fxsr\n");
    let o = run(prefix, None);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(stdout(&o).trim(), "fake build: --version (FRIGG_CPU_VARIANT=)");

    // the override: the baseline itself, or a named build
    let o = run(prefix, Some("baseline"));
    assert!(o.status.success() && stdout(&o).starts_with("frigg ") && stdout(&o).contains("built for"), "{o:?}");
    let o = run(prefix, Some("fake"));
    assert_eq!(stdout(&o).trim(), "fake build: --version (FRIGG_CPU_VARIANT=fake)");

    // a build the CPU cannot run is refused by name, never started
    let o = run(prefix, Some("never"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("lacks not-a-cpu-feature"), "{o:?}");
    let o = run(prefix, Some("zen9"));
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("no such build"), "{o:?}");

    // no build this CPU can run: the baseline runs
    install(prefix, "never not-a-cpu-feature\n");
    let o = run(prefix, None);
    assert!(o.status.success() && stdout(&o).starts_with("frigg "), "{o:?}");

    // a build that cannot start: the baseline runs, with a warning
    install(prefix, "gone sse2\n");
    let o = run(prefix, None);
    assert!(o.status.success() && stdout(&o).starts_with("frigg "), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("could not start the build gone"), "{o:?}");

    // a broken manifest is named
    install(prefix, "fake\n");
    let o = run(prefix, None);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("manifest: line 1"), "{o:?}");
}
