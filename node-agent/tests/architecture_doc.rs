//! ARCHITECTURE.md stays true to the tree: every repository path it names in backticks exists,
//! and every `file.rs::item` (the "where each decision lives" table) names an item defined in
//! that file. A renamed function or a moved file fails here, not in a newcomer's reading.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where a repository path starts; a backticked token that starts otherwise (`machine/`,
/// `Input::OverBound`, `--kube`) is not a path from the root and is not checked here.
const TOP_LEVEL: [&str; 8] = [
    "node-agent/",
    "wasm-filter/",
    "tests/",
    "manifests/",
    "image/",
    "docs/",
    "scripts/",
    ".ci/",
];

/// Every backticked token of `text` (inline code spans; fenced blocks are skipped).
fn backticked(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        for (i, token) in line.split('`').enumerate() {
            if i % 2 == 1 && !token.is_empty() {
                out.push(token.to_string());
            }
        }
    }
    out
}

/// A checkable reference: a path from the root, and the item it names (`path.rs::item`).
fn reference(token: &str) -> Option<(String, Option<String>)> {
    if token.contains(char::is_whitespace) || !TOP_LEVEL.iter().any(|t| token.starts_with(t)) {
        return None;
    }
    match token.split_once(".rs::") {
        Some((path, item)) => {
            // `Type::method` names the method: that is what the file defines with `fn`.
            let item = item.rsplit("::").next().unwrap_or(item);
            Some((format!("{path}.rs"), Some(item.to_string())))
        }
        None => Some((token.to_string(), None)),
    }
}

/// Whether `code` defines `item` (a function, type, constant or trait of that name).
fn defines(code: &str, item: &str) -> bool {
    ["fn", "struct", "enum", "const", "trait", "type", "static"]
        .iter()
        .any(|kw| {
            let needle = format!("{kw} {item}");
            code.match_indices(&needle).any(|(at, _)| {
                let after = code[at + needle.len()..].chars().next();
                !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
            })
        })
}

/// The problems with `doc`'s references, against the tree at `root`.
fn problems(doc: &str, root: &Path) -> (usize, Vec<String>) {
    let mut checked = 0;
    let mut bad = Vec::new();
    for token in backticked(doc) {
        let Some((path, item)) = reference(&token) else {
            continue;
        };
        checked += 1;
        let full = root.join(&path);
        if !full.exists() {
            bad.push(format!("`{token}`: {path} does not exist"));
            continue;
        }
        if let Some(item) = item {
            let code = std::fs::read_to_string(&full).unwrap_or_default();
            if !defines(&code, &item) {
                bad.push(format!("`{token}`: {path} defines no `{item}`"));
            }
        }
    }
    (checked, bad)
}

#[test]
fn every_path_and_item_in_architecture_md_exists() {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let (checked, bad) = problems(&doc, &root());
    // The decision table alone names ~40 `file.rs::item`s: a parse that finds few is broken.
    assert!(
        checked > 60,
        "only {checked} references found in ARCHITECTURE.md"
    );
    assert!(
        bad.is_empty(),
        "ARCHITECTURE.md names what is not in the tree:\n{}",
        bad.join("\n")
    );
}

/// The checker itself: a wrong path, a wrong item and a right one, so the test above cannot
/// pass by finding nothing wrong with anything.
#[test]
fn the_checker_catches_a_missing_path_and_a_missing_item() {
    let doc = "| a | `node-agent/src/pod/app_end.rs::app_end` |\n\
               | b | `node-agent/src/pod/app_end.rs::no_such_rule` |\n\
               | c | `node-agent/src/no_such_file.rs` |\n\
               | d | `node-agent/src/lifecycle/drain/plan.rs::DrainPlan::new` |\n\
               | e | `machine/` and `Input::OverBound` are not paths from the root |\n";
    let (checked, bad) = problems(doc, &root());
    assert_eq!(checked, 4, "{bad:?}");
    assert_eq!(bad.len(), 2, "{bad:?}");
    assert!(bad[0].contains("no_such_rule"), "{bad:?}");
    assert!(bad[1].contains("no_such_file.rs does not exist"), "{bad:?}");
}
