//! The agent's layout holds: imports point one way between its layers, and ARCHITECTURE.md's
//! layout table names what is really in the tree.
//!
//! Layers, lowest first (a module may use its own layer and the ones below it):
//! `api` (the wire types) → `backoff` (the one growing pause) → `config` → `mesh` (the mesh profiles) → `pod` → `source` → `effects` (what touches the node) →
//! `report` (board, metrics, Events, status API) → `lifecycle` (the machine, its driver,
//! readiness, drain) → `agent`. `cli` (`holdfast status`) stands aside: it may use only `api`,
//! `effects::http1_client` and itself, so the CLI never links the agent's internals.

use std::path::{Path, PathBuf};

const LAYERS: [&str; 10] = [
    "api",
    "backoff",
    "config",
    "mesh",
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

/// The module path of a source file: `src/effects/hold/mod.rs` → `[effects, hold]`,
/// `src/effects/hold/rules.rs` → `[effects, hold, rules]`, `src/pod.rs` → `[pod]`.
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| {
            c.as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string()
        })
        .collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    parts
}

/// Splits a `{a, b::{c, d}, e}` group's inside at its top-level commas.
fn group_items(inside: &str) -> Vec<&str> {
    let (mut depth, mut start, mut out) = (0usize, 0usize, Vec::new());
    for (i, c) in inside.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(inside[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(inside[start..].trim());
    out.into_iter().filter(|s| !s.is_empty()).collect()
}

/// The path right after `at` in `code` (identifiers and `::`), and, when it ends in `::{`, the
/// items of that group.
fn path_at(code: &str) -> (String, Vec<String>) {
    let end = code
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(code.len());
    let path = code[..end].trim_end_matches("::").to_string();
    let mut items = Vec::new();
    if code[end..].starts_with('{') {
        let mut depth = 0usize;
        for (i, c) in code[end..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        items = group_items(&code[end + 1..end + i])
                            .into_iter()
                            .map(str::to_string)
                            .collect();
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    (path, items)
}

/// Every crate module path a piece of code of module `here` names, as full paths from the crate
/// root (`lifecycle::driver`): `crate::…` paths, `crate::{a, b::c}` groups, and `super::…` paths
/// resolved against `here` (`super::super::agent` from `effects::hold` is `agent`).
fn crate_paths_from(code: &str, here: &[String]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut push = |full: Vec<String>| {
        if let Some(first) = full.first().filter(|f| !f.is_empty()) {
            out.push((first.clone(), full.join("::")));
        }
    };
    let joined = |base: &[String], path: &str| -> Vec<String> {
        let mut full = base.to_vec();
        full.extend(
            path.split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string),
        );
        full
    };
    for (at, _) in code.match_indices("crate::") {
        // Not `holdfast_crate::` or the like.
        if code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let (path, items) = path_at(&code[at + "crate::".len()..]);
        if items.is_empty() {
            push(joined(&[], &path));
        }
        for item in items {
            push(joined(&joined(&[], &path), &item));
        }
    }
    for (at, _) in code.match_indices("super::") {
        // Only the first `super::` of a chain; `super::super::` is counted from there.
        if code[..at].ends_with("super::")
            || code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let mut rest = &code[at..];
        let mut base: Vec<String> = here.to_vec();
        base.extend(inline_modules_around(code, at));
        while let Some(r) = rest.strip_prefix("super::") {
            base.pop();
            rest = r;
        }
        let (path, items) = path_at(rest);
        if items.is_empty() {
            push(joined(&base, &path));
        }
        for item in items {
            push(joined(&joined(&base, &path), &item));
        }
    }
    out
}

/// The inline modules (`mod name { … }`) whose body holds byte `at` of `code`, outermost first.
fn inline_modules_around(code: &str, at: usize) -> Vec<String> {
    let mut out = Vec::new();
    for (start, _) in code.match_indices("mod ") {
        if code[..start].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &code[start + 4..];
        let name_len = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let after = rest[name_len..].trim_start();
        if name_len == 0 || !after.starts_with('{') {
            continue;
        }
        let open = start + 4 + name_len + (rest[name_len..].len() - after.len());
        let mut depth = 0usize;
        let mut close = code.len();
        for (i, c) in code[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = open + i;
                        break;
                    }
                }
                _ => {}
            }
        }
        if open < at && at < close {
            out.push(rest[..name_len].to_string());
        }
    }
    out
}

/// The layer rule for one use: may a module of top module `from` use `path` (top module `to`)?
fn allowed(from: &str, to: &str, path: &str) -> bool {
    if to == from {
        return true;
    }
    if from == "cli" {
        return to == "api" || path.starts_with("effects::http1_client");
    }
    let rank = |m: &str| LAYERS.iter().position(|l| *l == m);
    match (rank(from), rank(to)) {
        (Some(f), Some(t)) => t < f,
        _ => false,
    }
}

/// Each hole the scanner once had, closed: a deliberately wrong import of each shape is caught,
/// and the right ones pass.
#[test]
fn the_scanner_catches_every_import_shape() {
    let here = |m: &str| m.split("::").map(str::to_string).collect::<Vec<_>>();
    let wrong = |code: &str, module: &str| -> Vec<String> {
        let here = here(module);
        crate_paths_from(code, &here)
            .into_iter()
            .filter(|(to, path)| !allowed(&here[0], to, path))
            .map(|(_, p)| p)
            .collect()
    };
    // Plain paths.
    assert_eq!(
        wrong("use crate::lifecycle::driver;", "report::board"),
        ["lifecycle::driver"]
    );
    assert!(wrong("use crate::effects::netns::PodNetns;", "lifecycle::driver").is_empty());
    // A group: each item is judged.
    assert_eq!(
        wrong(
            "use crate::{api::Phase, lifecycle::Input};",
            "report::metrics"
        ),
        ["lifecycle::Input"]
    );
    assert_eq!(
        wrong(
            "use crate::{\n    agent,\n    pod::{PodKey, PodView},\n};",
            "effects::hold"
        ),
        ["agent"]
    );
    // `super::` from a top-level module's own file reaches the crate root.
    assert_eq!(wrong("use super::agent::run;", "report"), ["agent::run"]);
    // `super::super::` out of a nested module.
    assert_eq!(
        wrong("use super::super::lifecycle::machine;", "effects::hold"),
        ["lifecycle::machine"]
    );
    // `super::` that stays inside the module is fine; so is `self::`.
    assert!(wrong("use super::rules::RuleSpec;", "effects::hold::nfqueue").is_empty());
    assert!(wrong("use super::*;", "lifecycle::machine::holding").is_empty());
    // `super::` inside an inline module reaches the module around it, not the crate root.
    assert!(wrong(
        "mod serde_helpers {\n    fn f() { super::format_duration(); }\n}",
        "config"
    )
    .is_empty());
    assert_eq!(
        wrong("mod inner {\n    use super::super::agent;\n}", "report"),
        ["agent"]
    );
    // The CLI may use api and the HTTP client only.
    assert_eq!(
        wrong(
            "use crate::{api::PodStatus, effects::netns};",
            "cli::status"
        ),
        ["effects::netns"]
    );
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
        let rel = file.strip_prefix(src_dir()).unwrap_or(file);
        let code = shipped_code(file);
        for (to, path) in crate_paths_from(&code, &module_path(rel)) {
            if !allowed(&from, &to, &path) {
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

/// Modules that use each other in a circle (`report::metrics` → `report::process_metrics` →
/// `report::server` → `report::metrics`) make a layer one lump: no file of it can be read,
/// tested or replaced alone. A parent and its child modules may use each other (`use super::*`
/// in a child is how Rust splits a module); any other circle fails.
#[test]
fn no_module_circles() {
    let mut files = Vec::new();
    rust_files(&src_dir(), &mut files);
    let mods: Vec<(Vec<String>, String)> = files
        .iter()
        .filter_map(|f| {
            let rel = f.strip_prefix(src_dir()).ok()?;
            let m = module_path(rel);
            (m.first().is_some_and(|t| t != "lib" && t != "main")).then(|| (m, shipped_code(f)))
        })
        .collect();
    let known: std::collections::BTreeSet<Vec<String>> =
        mods.iter().map(|(m, _)| m.clone()).collect();
    let related = |a: &[String], b: &[String]| a.starts_with(b) || b.starts_with(a);
    let mut edges: std::collections::BTreeMap<
        Vec<String>,
        std::collections::BTreeSet<Vec<String>>,
    > = Default::default();
    for (m, code) in &mods {
        for (_, path) in crate_paths_from(code, m) {
            let parts: Vec<String> = path.split("::").map(str::to_string).collect();
            let Some(target) = (1..=parts.len())
                .rev()
                .map(|n| parts[..n].to_vec())
                .find(|p| known.contains(p))
            else {
                continue;
            };
            if !related(m, &target) {
                edges.entry(m.clone()).or_default().insert(target);
            }
        }
    }
    // Depth-first search for a back edge.
    fn visit(
        n: &Vec<String>,
        edges: &std::collections::BTreeMap<Vec<String>, std::collections::BTreeSet<Vec<String>>>,
        stack: &mut Vec<Vec<String>>,
        done: &mut std::collections::BTreeSet<Vec<String>>,
        found: &mut Vec<String>,
    ) {
        if let Some(i) = stack.iter().position(|s| s == n) {
            let mut circle: Vec<String> = stack[i..].iter().map(|m| m.join("::")).collect();
            circle.push(n.join("::"));
            found.push(circle.join(" → "));
            return;
        }
        if !done.insert(n.clone()) {
            return;
        }
        stack.push(n.clone());
        for next in edges.get(n).into_iter().flatten() {
            visit(next, edges, stack, done, found);
        }
        stack.pop();
    }
    let mut found = Vec::new();
    let mut done = Default::default();
    for n in edges.keys() {
        visit(n, &edges, &mut Vec::new(), &mut done, &mut found);
    }
    assert!(
        found.is_empty(),
        "modules in a circle:\n{}",
        found.join("\n")
    );
}

/// The backticked paths in the first column of ARCHITECTURE.md's layout table.
fn layout_table_paths() -> Vec<String> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../ARCHITECTURE.md"))
            .expect("reading ARCHITECTURE.md");
    let table = doc
        .split("\n## Layout\n")
        .nth(1)
        .expect("ARCHITECTURE.md has a `## Layout` section");
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
fn layout_table_matches_the_tree() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let paths = layout_table_paths();
    assert!(
        paths.len() > 8,
        "ARCHITECTURE.md's layout table not found: {paths:?}"
    );
    let missing: Vec<_> = paths.iter().filter(|p| !root.join(p).exists()).collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's layout table names paths that do not exist: {missing:?}"
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
        "node-agent/src entries ARCHITECTURE.md's layout table does not name: {unnamed:?}"
    );
}
