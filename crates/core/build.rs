//! Enables the AVX-512 copies of the numeric kernels when the compiler can build them
//! (`#[target_feature(enable = "avx512f")]` is stable from Rust 1.89; the crate supports older
//! compilers, which get the baseline and AVX2 copies only). Results never depend on it.

use std::process::Command;

fn main() {
    println!("cargo:rustc-check-cfg=cfg(nextok_avx512)");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=RUSTC");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let minor = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| {
            // "rustc 1.89.0 (...)"
            let ver = v.split_whitespace().nth(1)?.to_string();
            let mut parts = ver.split('.');
            let major: u32 = parts.next()?.parse().ok()?;
            let minor: u32 = parts.next()?.parse().ok()?;
            (major == 1).then_some(minor)
        });
    if minor.is_some_and(|m| m >= 89) {
        println!("cargo:rustc-cfg=nextok_avx512");
    }
}
