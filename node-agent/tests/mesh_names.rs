//! Mesh names stay in `node-agent/src/mesh/` (each mesh's facts and texts) and `api/` (the wire
//! names of `Mesh`): everywhere else the agent reads the pod's `MeshProfile` (issue 37, "The
//! shape that keeps these true"). This test reads every product file of `node-agent/src` —
//! comments and unit-test modules left out, since citations of a mesh's source belong in
//! comments — and counts the words `istio`, `kuma` and `consul` (any case) in the code.
//!
//! Not yet zero: [`DEBT`] lists the files that still name a mesh in code when this test came
//! in, each with its count and why it is there. The test fails when a file not listed names a
//! mesh, when a listed file names meshes more often than listed, and when a listed file names
//! them less often (then lower its count, or drop its line: the debt only goes down).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Files outside `mesh/` and `api/` that still name a mesh in code, with the count, and why.
/// Paying one off: move the fact or text into the mesh's file in `node-agent/src/mesh/` and
/// read it from the pod's profile.
const DEBT: &[(&str, usize, &str)] = &[
    (
        "cli/check.rs",
        10,
        "holdfast check's per-mesh fixes (filter install, Envoy 1.34 release): the CLI may not \
         link mesh/ (tests/layout.rs); to move beside api::Mesh",
    ),
    (
        "config.rs",
        1,
        "ProxyConfig's default container `istio-proxy` (the --proxy-* flags are Istio's)",
    ),
    (
        "lifecycle/drain/in_flight.rs",
        1,
        "Istio's own listeners as the default of from_stats (tests' shorthand)",
    ),
    (
        "lifecycle/drain/admin.rs",
        1,
        "AdminClient as a ProxyAdmin (tests) samples with Istio's own listeners",
    ),
    (
        "main.rs",
        1,
        "the --proxy-container flag's default `istio-proxy`",
    ),
];

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
    let debt: BTreeMap<&str, usize> = DEBT.iter().map(|(f, n, _)| (*f, *n)).collect();
    let mut wrong = Vec::new();
    for (file, n) in &found {
        match debt.get(file.as_str()) {
            None => wrong.push(format!(
                "{file}: names a mesh {n} time(s) in code; a mesh's facts and texts go in \
                 node-agent/src/mesh/ (read them from the pod's MeshProfile)"
            )),
            Some(max) if n > max => wrong.push(format!(
                "{file}: names a mesh {n} time(s), more than its {max} of known debt"
            )),
            Some(max) if n < max => wrong.push(format!(
                "{file}: names a mesh {n} time(s) now, fewer than its {max}: lower its DEBT count"
            )),
            _ => {}
        }
    }
    for (file, _) in debt.iter().filter(|(f, _)| !found.contains_key(**f)) {
        wrong.push(format!(
            "{file}: names no mesh any more: drop its DEBT line"
        ));
    }
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
