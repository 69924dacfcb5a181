//! `docs/architecture.md` stays true: every crate of the workspace has a row in its crates
//! table, listed below every nextok crate it depends on (normal, dev or build), and a section
//! that names each of its top-level modules (`src/<name>.rs` or `src/<name>/`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The workspace's member directories (`crates/core`, ...), from the root `Cargo.toml`.
fn members() -> Vec<String> {
    let toml = read(&root().join("Cargo.toml"));
    let line = toml
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("a members line in the workspace Cargo.toml");
    line.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// A crate's package name and the nextok crates it depends on in any dependency table.
fn manifest(dir: &str) -> (String, Vec<String>) {
    let toml = read(&root().join(dir).join("Cargo.toml"));
    let mut section = String::new();
    let mut name = None;
    let mut deps = Vec::new();
    for line in toml.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_string();
        } else if section == "[package]" && line.starts_with("name") {
            name = line.split('"').nth(1).map(str::to_string);
        } else if section.ends_with("dependencies]") && line.starts_with("nextok-") {
            let dep = line.split([' ', '=', '.']).next().unwrap_or_default();
            deps.push(dep.to_string());
        }
    }
    (name.expect("a package name"), deps)
}

/// The top-level modules of a crate: `src/*.rs` but the crate roots, and `src/*/`.
fn modules(dir: &str) -> Vec<String> {
    let src = root().join(dir).join("src");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&src).unwrap_or_else(|e| panic!("{}: {e}", src.display())) {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if e.path().is_dir() {
            out.push(format!("{name}/"));
        } else if name.ends_with(".rs") && name != "lib.rs" && name != "main.rs" {
            out.push(name);
        }
    }
    out.sort();
    out
}

#[test]
fn every_crate_and_module_is_on_the_architecture_page() {
    let doc = read(&root().join("docs/architecture.md"));
    // the crates table: row order
    let rows: Vec<&str> = doc
        .lines()
        .skip_while(|l| !l.starts_with("| crate |"))
        .skip(2)
        .take_while(|l| l.starts_with("| `"))
        .collect();
    let position: HashMap<String, usize> = rows
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.split('`').nth(1).map(|n| (n.to_string(), i)))
        .collect();
    let members = members();
    assert!(members.len() >= 10, "{members:?}");
    let mut missing = Vec::new();
    for dir in &members {
        let (name, deps) = manifest(dir);
        let Some(&at) = position.get(&name) else {
            missing.push(format!("`{name}` has no row in the crates table"));
            continue;
        };
        if !rows[at].contains(&format!("`{dir}`")) {
            missing.push(format!("`{name}`'s row does not name `{dir}`"));
        }
        for d in deps {
            match position.get(&d) {
                Some(&p) if p < at => {}
                _ => missing.push(format!(
                    "`{name}` depends on `{d}`, which is not listed above it"
                )),
            }
        }
        // its section: from its heading to the next heading
        let heading = format!("### `{name}` (`{dir}`");
        let Some(start) = doc.find(&heading) else {
            missing.push(format!("no section `{heading}`"));
            continue;
        };
        let body = &doc[start + heading.len()..];
        let end = body.find("\n#").unwrap_or(body.len());
        let section = &body[..end];
        for m in modules(dir) {
            if !section.contains(&format!("`{m}`")) {
                missing.push(format!(
                    "`{name}`: module `{m}` is not named in its section"
                ));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/architecture.md is out of date:\n{}",
        missing.join("\n")
    );
}
