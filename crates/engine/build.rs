//! Names the build: `NEXTOK_VERSION` is the package version with the git commit it was built
//! from as build metadata (`0.1.0+g84e8bd9c1d2e`), or the bare version outside a git checkout.
//! A trace header records it, and a replay that cannot run names the version that can.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    let commit = git(&["rev-parse", "--short=12", "HEAD"]);
    // rebuild when HEAD moves: HEAD itself (a checkout) and the branch refs (a commit)
    // (only paths that exist: cargo reruns a script whose watched path is missing every time)
    let watch = |p: String| {
        if std::path::Path::new(&p).exists() {
            println!("cargo:rerun-if-changed={p}");
        }
    };
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        watch(format!("{dir}/HEAD"));
    }
    if let Some(dir) = git(&["rev-parse", "--git-common-dir"]) {
        watch(format!("{dir}/refs/heads"));
        watch(format!("{dir}/packed-refs"));
    }
    let full = match commit {
        Some(c) => format!("{version}+g{c}"),
        None => version,
    };
    println!("cargo:rustc-env=NEXTOK_VERSION={full}");
}
