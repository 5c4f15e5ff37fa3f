//! Mesh names stay in `node-agent/src/mesh/` (each mesh's facts and texts) and `api/` (the wire
//! names of `Mesh`): everywhere else the agent reads the pod's `MeshProfile` (issue 37, "The
//! shape that keeps these true"). This test reads every product file of `node-agent/src` —
//! comments and unit-test modules left out, since citations of a mesh's source belong in
//! comments — and counts the words `istio`, `kuma` and `consul` (any case) in the code.
//! The count is zero everywhere: a file that names a mesh in code fails the test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Whether `rel` is a product file this test reads: not `mesh/`, not `api/`, not a test file.
fn is_product(rel: &str) -> bool {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    !(rel.starts_with("mesh/")
        || rel.starts_with("api/")
        || name == "tests.rs"
        || name.ends_with("_tests.rs")
        || rel.contains("/tests/"))
}

/// The code of a file: up to its unit-test module, each line without its `//` comment.
fn code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod "))
        {
            break;
        }
        let code = match line.find("//") {
            // `://` is a URL in a string, not a comment.
            Some(i) if !line[..i].ends_with(':') => &line[..i],
            _ => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

fn mesh_words(code: &str) -> usize {
    let lower = code.to_ascii_lowercase();
    ["istio", "kuma", "consul"]
        .iter()
        .map(|w| lower.matches(w).count())
        .sum()
}

#[test]
fn mesh_names_stay_in_mesh_and_api() {
    let root = src();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    assert!(
        files.len() > 50,
        "read {} files under {}",
        files.len(),
        root.display()
    );
    let mut found: BTreeMap<String, usize> = BTreeMap::new();
    for f in files {
        let rel = f
            .strip_prefix(&root)
            .expect("under src")
            .to_string_lossy()
            .replace('\\', "/");
        if !is_product(&rel) {
            continue;
        }
        let text = std::fs::read_to_string(&f).expect("read");
        let n = mesh_words(&code(&text));
        if n > 0 {
            found.insert(rel, n);
        }
    }
    let wrong: Vec<String> = found
        .iter()
        .map(|(file, n)| {
            format!(
                "{file}: names a mesh {n} time(s) in code; a mesh's facts and texts go in \
                 node-agent/src/mesh/ (read them from the pod's MeshProfile), the CLI's beside \
                 api::Mesh"
            )
        })
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_reader_sees_code_not_comments_or_unit_tests() {
    let text = "// istio in a comment\nlet x = \"kuma\"; // consul\nlet u = \"https://x\";\n#[cfg(test)]\nmod tests {\n    istio\n}\n";
    assert_eq!(mesh_words(&code(text)), 1);
    assert!(is_product("lifecycle/driver.rs"));
    assert!(!is_product("mesh/kuma.rs"));
    assert!(!is_product("api/status.rs"));
    assert!(!is_product("lifecycle/machine_tests.rs"));
    assert!(!is_product("pod/tests.rs"));
}
