//! The agent's layout holds: imports point one way between its layers, and the README's layout
//! table names what is really in the tree.
//!
//! Layers, lowest first (a module may use its own layer and the ones below it):
//! `api` (the wire types) → `config` → `pod` → `source` → `effects` (what touches the node) →
//! `report` (board, metrics, Events, status API) → `lifecycle` (the machine, its driver,
//! readiness, drain) → `agent`. `cli` (`holdfast status`) stands aside: it may use only `api`,
//! `effects::http1_client` and itself, so the CLI never links the agent's internals.

use std::path::{Path, PathBuf};

const LAYERS: [&str; 8] = [
    "api",
    "config",
    "pod",
    "source",
    "effects",
    "report",
    "lifecycle",
    "agent",
];

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("reading the source tree") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a source file that ships: comment lines and the unit-test module dropped, and
/// nothing at all of test-only files.
fn shipped_code(path: &Path) -> String {
    let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    if name == "tests" || name.ends_with("_tests") {
        return String::new();
    }
    let text = std::fs::read_to_string(path).expect("reading a source file");
    // A unit-test module ends a file here (`#[cfg(test)] mod tests;` or `{ .. }` at the end).
    let text = text.split("#[cfg(test)]\nmod ").next().unwrap_or("");
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level module a file belongs to (`effects` for `src/effects/hold/mod.rs`).
fn top_module(path: &Path) -> String {
    let rel = path.strip_prefix(src_dir()).expect("under src");
    let first = rel.components().next().expect("a component");
    first
        .as_os_str()
        .to_string_lossy()
        .trim_end_matches(".rs")
        .to_string()
}

/// The `crate::<module>` paths a piece of code uses, as (module, the rest of the path).
fn crate_paths(code: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        let path = &rest[..end];
        let module = path.split("::").next().unwrap_or("").to_string();
        out.push((module, path.to_string()));
    }
    out
}

#[test]
fn imports_point_down_the_layers() {
    let mut files = Vec::new();
    rust_files(&src_dir(), &mut files);
    let mut wrong = Vec::new();
    for file in &files {
        let from = top_module(file);
        if from == "lib" || from == "main" {
            continue;
        }
        let code = shipped_code(file);
        for (to, path) in crate_paths(&code) {
            if to == from || to.is_empty() {
                continue;
            }
            let allowed = if from == "cli" {
                to == "api" || path.starts_with("effects::http1_client")
            } else {
                let rank = |m: &str| LAYERS.iter().position(|l| *l == m);
                match (rank(&from), rank(&to)) {
                    (Some(f), Some(t)) => t < f,
                    _ => false,
                }
            };
            if !allowed {
                let rel = file.strip_prefix(src_dir()).unwrap_or(file);
                wrong.push(format!("{} uses crate::{path}", rel.display()));
            }
        }
    }
    wrong.sort();
    wrong.dedup();
    assert!(
        wrong.is_empty(),
        "imports against the layers (lowest first: {LAYERS:?}; cli: api and effects::http1_client only):\n{}",
        wrong.join("\n")
    );
}

/// The backticked paths in the README's layout table.
fn readme_layout_paths() -> Vec<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .expect("reading README.md");
    let table = readme
        .split("## Layout")
        .nth(1)
        .expect("README has a Layout section");
    let table = table.split("\n## ").next().unwrap_or("");
    let mut paths = Vec::new();
    for line in table.lines().filter(|l| l.starts_with("| `")) {
        let first_cell = line.split('|').nth(1).unwrap_or("");
        for (i, path) in first_cell.split('`').enumerate() {
            if i % 2 == 1 && !path.is_empty() {
                paths.push(path.to_string());
            }
        }
    }
    paths
}

#[test]
fn readme_layout_table_matches_the_tree() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let paths = readme_layout_paths();
    assert!(paths.len() > 8, "README layout table not found: {paths:?}");
    let missing: Vec<_> = paths.iter().filter(|p| !root.join(p).exists()).collect();
    assert!(
        missing.is_empty(),
        "README's layout table names paths that do not exist: {missing:?}"
    );

    let mut unnamed = Vec::new();
    for entry in std::fs::read_dir(src_dir()).expect("reading src") {
        let name = entry
            .expect("an entry")
            .file_name()
            .to_string_lossy()
            .to_string();
        if name == "lib.rs" || name == "main.rs" {
            continue;
        }
        let named = paths.iter().any(|p| {
            let p = p.trim_end_matches('/');
            p == format!("node-agent/src/{}", name.trim_end_matches('/'))
        });
        if !named {
            unnamed.push(name);
        }
    }
    assert!(
        unnamed.is_empty(),
        "node-agent/src entries the README's layout table does not name: {unnamed:?}"
    );
}
