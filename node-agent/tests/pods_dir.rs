//! The pods-directory source against a real directory: symlinks (ConfigMap-style `..data`
//! swaps, loops), non-UTF-8 names, duplicate uids, files read while being written, oversized
//! files and FIFOs, inotify-driven updates and `Synced`. Bad entries must show in
//! `SourceProblems` (what `/status` serves), not only in the log.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use holdfast::source::dir::{PodsDir, MAX_POD_FILE};
use holdfast::source::{PodEvent, SourceProblems};

struct TempDir(PathBuf);
impl TempDir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("hf-podsdir-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn pod(uid: &str, name: &str) -> String {
    serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"containers": [{"name": "app"}]}})
    .to_string()
}

fn write_atomic(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

/// `A:name` / `D:uid` / `S`.
fn describe(events: &[PodEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| match e {
            PodEvent::Applied(p) => format!("A:{}", p.metadata.name.clone().unwrap_or_default()),
            PodEvent::Deleted { uid } => format!("D:{uid}"),
            PodEvent::Synced => "S".into(),
        })
        .collect()
}

fn source(dir: &Path) -> (PodsDir, SourceProblems) {
    let problems = SourceProblems::default();
    let src = PodsDir::new(dir).unwrap().with_problems(problems.clone());
    (src, problems)
}

/// The problems as `file-name: problem` lines.
fn problem_lines(p: &SourceProblems) -> Vec<String> {
    p.snapshot()
        .into_iter()
        .map(|p| {
            let name = Path::new(&p.entry)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            format!("{name}: {}", p.problem)
        })
        .collect()
}

#[test]
fn follows_adds_updates_and_deletes_json_and_yaml() {
    let d = TempDir::new("follow");
    write_atomic(&d.0, "a.json", &pod("u-a", "a"));
    std::fs::write(d.0.join(".b.json"), pod("u-b", "b")).unwrap(); // dotfile: ignored
    std::fs::write(d.0.join("notes.txt"), "x").unwrap(); // not a pod file
    let (mut src, problems) = source(&d.0);
    assert_eq!(describe(&src.poll().unwrap()), ["A:a"]);
    assert!(src.poll().unwrap().is_empty(), "unchanged: no events");
    std::fs::write(
        d.0.join("c.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: c, uid: u-c}\nspec: {containers: [{name: x}]}\n",
    )
    .unwrap();
    assert_eq!(describe(&src.poll().unwrap()), ["A:c"]);
    std::fs::remove_file(d.0.join("a.json")).unwrap();
    assert_eq!(describe(&src.poll().unwrap()), ["D:u-a"]);
    assert!(problems.snapshot().is_empty(), "{:?}", problems.snapshot());
}

/// What inotify names: `x.json`, and a writer's `.x.json.tmp`.
fn names(list: &[&str]) -> Vec<std::ffi::OsString> {
    list.iter().map(std::ffi::OsString::from).collect()
}

/// A change reads only what inotify named: a named file is re-read, a removed one deleted, a
/// new one added; a file changed but not named is left for the next full pass (proof that
/// nothing else was looked at), and dotfiles and other names are skipped.
#[test]
fn a_named_pass_reads_only_the_named_files() {
    let d = TempDir::new("named");
    write_atomic(&d.0, "a.json", &pod("u-a", "a"));
    write_atomic(&d.0, "b.json", &pod("u-b", "b"));
    let (mut src, problems) = source(&d.0);
    assert_eq!(describe(&src.poll().unwrap()), ["A:a", "A:b"]);

    write_atomic(&d.0, "a.json", &pod("u-a", "a2"));
    write_atomic(&d.0, "b.json", &pod("u-b", "b2"));
    assert_eq!(
        describe(&src.poll_named(&names(&[".a.json.tmp", "a.json"])).unwrap()),
        ["A:a2"],
        "only the named file is read"
    );
    assert_eq!(
        describe(&src.poll().unwrap()),
        ["A:b2"],
        "the full pass finds the rest"
    );

    write_atomic(&d.0, "c.json", &pod("u-c", "c"));
    std::fs::remove_file(d.0.join("a.json")).unwrap();
    std::fs::write(d.0.join("notes.txt"), "x").unwrap();
    assert_eq!(
        describe(
            &src.poll_named(&names(&["c.json", "a.json", "notes.txt", ".c.json.tmp"]))
                .unwrap()
        ),
        ["D:u-a", "A:c"]
    );
    // A named file that cannot be read keeps its pod, and the problem is reported, then cleared.
    std::fs::write(d.0.join("c.json"), "{not json").unwrap();
    assert!(src.poll_named(&names(&["c.json"])).unwrap().is_empty());
    assert_eq!(
        problem_lines(&problems).len(),
        1,
        "{:?}",
        problem_lines(&problems)
    );
    write_atomic(&d.0, "c.json", &pod("u-c", "c3"));
    assert_eq!(
        describe(&src.poll_named(&names(&["c.json"])).unwrap()),
        ["A:c3"]
    );
    assert!(problems.snapshot().is_empty(), "{:?}", problems.snapshot());
}

/// Once a pod file is a symlink, a named pass is a full pass: the `..data` swap of a
/// ConfigMap-style mount names only `..data`.
#[test]
fn a_named_pass_is_a_full_pass_while_pod_files_are_symlinks() {
    let d = TempDir::new("named-link");
    std::fs::create_dir(d.0.join("..v1")).unwrap();
    std::fs::write(d.0.join("..v1/pod.json"), pod("u-cm", "v1")).unwrap();
    std::os::unix::fs::symlink("..v1", d.0.join("..data")).unwrap();
    let (mut src, _problems) = source(&d.0);
    assert!(src.poll().unwrap().is_empty());
    // A new symlinked pod file, named: seen, and from now on every change is a full pass.
    std::os::unix::fs::symlink("..data/pod.json", d.0.join("pod.json")).unwrap();
    assert_eq!(
        describe(&src.poll_named(&names(&["pod.json"])).unwrap()),
        ["A:v1"]
    );
    std::fs::create_dir(d.0.join("..v2")).unwrap();
    std::fs::write(d.0.join("..v2/pod.json"), pod("u-cm", "v2")).unwrap();
    std::os::unix::fs::symlink("..v2", d.0.join("..data_tmp")).unwrap();
    std::fs::rename(d.0.join("..data_tmp"), d.0.join("..data")).unwrap();
    assert_eq!(
        describe(&src.poll_named(&names(&["..data_tmp", "..data"])).unwrap()),
        ["A:v2"]
    );
}

/// ConfigMap volumes (kubelet's AtomicWriter): `pod.json -> ..data/pod.json`,
/// `..data -> ..<timestamp>`; an update writes a new timestamped dir and renames a new `..data`
/// over the old one.
#[test]
fn configmap_style_symlinks_are_followed_across_the_data_swap() {
    let d = TempDir::new("configmap");
    std::fs::create_dir(d.0.join("..2026_01_01_00_00_00.1")).unwrap();
    std::fs::write(
        d.0.join("..2026_01_01_00_00_00.1/pod.json"),
        pod("u-cm", "v1"),
    )
    .unwrap();
    std::os::unix::fs::symlink("..2026_01_01_00_00_00.1", d.0.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/pod.json", d.0.join("pod.json")).unwrap();
    let (mut src, problems) = source(&d.0);
    assert_eq!(describe(&src.poll().unwrap()), ["A:v1"]);

    std::fs::create_dir(d.0.join("..2026_01_01_00_00_01.2")).unwrap();
    std::fs::write(
        d.0.join("..2026_01_01_00_00_01.2/pod.json"),
        pod("u-cm", "v2"),
    )
    .unwrap();
    std::os::unix::fs::symlink("..2026_01_01_00_00_01.2", d.0.join("..data_tmp")).unwrap();
    std::fs::rename(d.0.join("..data_tmp"), d.0.join("..data")).unwrap();
    std::fs::remove_dir_all(d.0.join("..2026_01_01_00_00_00.1")).unwrap();
    assert_eq!(
        describe(&src.poll().unwrap()),
        ["A:v2"],
        "the swap is an update"
    );
    assert!(problems.snapshot().is_empty(), "{:?}", problems.snapshot());
}

#[test]
fn symlink_loops_and_dangling_links_are_reported() {
    let d = TempDir::new("loop");
    std::os::unix::fs::symlink("b.json", d.0.join("a.json")).unwrap();
    std::os::unix::fs::symlink("a.json", d.0.join("b.json")).unwrap();
    std::os::unix::fs::symlink("nowhere.json", d.0.join("c.json")).unwrap();
    let (mut src, problems) = source(&d.0);
    assert!(src.poll().unwrap().is_empty());
    let lines = problem_lines(&problems);
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(
        lines[0].starts_with("a.json: ignored: symlink loop"),
        "{lines:?}"
    );
    assert!(
        lines[1].starts_with("b.json: ignored: symlink loop"),
        "{lines:?}"
    );
    assert!(
        lines[2].starts_with("c.json: ignored: dangling symlink"),
        "{lines:?}"
    );
}

#[test]
fn non_utf8_file_names_are_reported() {
    let d = TempDir::new("utf8");
    let name = std::ffi::OsStr::from_bytes(b"caf\xe9.json");
    std::fs::write(d.0.join(name), pod("u-x", "x")).unwrap();
    let (mut src, problems) = source(&d.0);
    assert!(src.poll().unwrap().is_empty());
    let lines = problem_lines(&problems);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("not valid UTF-8"), "{lines:?}");
}

#[test]
fn duplicate_uid_is_reported_for_both_and_deleted_only_when_both_are_gone() {
    let d = TempDir::new("dup");
    write_atomic(&d.0, "a.json", &pod("u-dup", "first"));
    write_atomic(&d.0, "b.json", &pod("u-dup", "second"));
    let (mut src, problems) = source(&d.0);
    assert_eq!(describe(&src.poll().unwrap()), ["A:first"]);
    let lines = problem_lines(&problems);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].starts_with("a.json: duplicate uid u-dup: also in "),
        "{lines:?}"
    );
    assert!(
        lines[1].starts_with("b.json: duplicate uid u-dup: also in "),
        "{lines:?}"
    );

    std::fs::remove_file(d.0.join("a.json")).unwrap();
    assert_eq!(
        describe(&src.poll().unwrap()),
        ["A:second"],
        "b.json still has the pod: not deleted, its state is b's now"
    );
    assert!(problems.snapshot().is_empty(), "{:?}", problems.snapshot());
    std::fs::remove_file(d.0.join("b.json")).unwrap();
    assert_eq!(describe(&src.poll().unwrap()), ["D:u-dup"]);
}

#[test]
fn a_file_read_while_being_written_keeps_the_last_good_state_and_is_reported() {
    let d = TempDir::new("partial");
    write_atomic(&d.0, "a.json", &pod("u-a", "a"));
    let (mut src, problems) = source(&d.0);
    assert_eq!(describe(&src.poll().unwrap()), ["A:a"]);
    // A writer that truncates and writes in place, caught halfway.
    let full = pod("u-a", "a2");
    std::fs::write(d.0.join("a.json"), &full[..full.len() / 2]).unwrap();
    assert!(src.poll().unwrap().is_empty(), "no event from half a file");
    let lines = problem_lines(&problems);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("does not parse"), "{lines:?}");
    assert!(lines[0].contains("keeps its last good state"), "{lines:?}");
    std::fs::write(d.0.join("a.json"), &full).unwrap();
    assert_eq!(describe(&src.poll().unwrap()), ["A:a2"]);
    assert!(problems.snapshot().is_empty());
}

#[test]
fn oversized_files_and_fifos_are_refused_without_hanging() {
    let d = TempDir::new("big");
    // Valid JSON, just too big: a padded annotation.
    let pad = "x".repeat(MAX_POD_FILE as usize);
    let big = serde_json::json!({"metadata": {"name": "big", "uid": "u-big",
        "annotations": {"pad": pad}}})
    .to_string();
    std::fs::write(d.0.join("big.json"), big).unwrap();
    nix::unistd::mkfifo(&d.0.join("fifo.json"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let (mut src, problems) = source(&d.0);
    let t = Instant::now();
    assert!(src.poll().unwrap().is_empty());
    assert!(t.elapsed() < Duration::from_secs(2));
    let lines = problem_lines(&problems);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].starts_with("big.json: larger than"), "{lines:?}");
    assert!(
        lines[1].starts_with("fifo.json: ignored: not a regular file"),
        "{lines:?}"
    );
}

/// `run` sends the first scan, then `Synced` once, then follows changes through inotify well
/// before the safety rescan (an hour here).
#[tokio::test]
async fn run_sends_synced_once_and_follows_changes_without_polling() {
    let d = TempDir::new("run");
    write_atomic(&d.0, "a.json", &pod("u-a", "a"));
    let (src, _) = source(&d.0);
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let task = tokio::spawn(src.run(Duration::from_secs(3600), tx));
    async fn next(rx: &mut tokio::sync::mpsc::Receiver<PodEvent>) -> PodEvent {
        tokio::time::timeout(Duration::from_secs(2), rx.recv())
            .await
            .expect("an event within 2 s")
            .expect("the source runs")
    }
    let first = [next(&mut rx).await, next(&mut rx).await];
    assert_eq!(describe(&first), ["A:a", "S"]);
    write_atomic(&d.0, "b.json", &pod("u-b", "b"));
    assert_eq!(describe(&[next(&mut rx).await]), ["A:b"]);
    std::fs::remove_file(d.0.join("a.json")).unwrap();
    assert_eq!(describe(&[next(&mut rx).await]), ["D:u-a"]);
    // Rewritten in place (same inode), quickly: inotify names the file, so it is re-read.
    std::fs::write(d.0.join("b.json"), pod("u-b", "b2")).unwrap();
    assert_eq!(describe(&[next(&mut rx).await]), ["A:b2"]);
    task.abort();
}

/// Idle CPU of the source with 0, 20 and 110 pod files over 10 s each: the old way (a rescan
/// every 20 ms, what the agent did: a listing plus a stat per file) and inotify with a 10 s safety rescan. Prints; run with
/// `cargo test -p holdfast --test pods_dir idle_cpu -- --ignored --nocapture`.
#[test]
#[ignore = "timing figure for docs/benchmarks.md: prints, asserts nothing about speed"]
fn idle_cpu() {
    /// CPU time of this process (user + system), at getrusage's microsecond resolution.
    fn cpu_time() -> Duration {
        let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).unwrap();
        let tv = |t: nix::sys::time::TimeVal| {
            Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
        };
        tv(u.user_time()) + tv(u.system_time())
    }
    let window = Duration::from_secs(10);
    for rescan in [Duration::from_millis(20), Duration::from_secs(10)] {
        for n in [0, 20, 110] {
            let d = TempDir::new(&format!("idle-{n}-{}", rescan.as_millis()));
            for i in 0..n {
                write_atomic(&d.0, &format!("p{i}.json"), &pod(&format!("u{i}"), "p"));
            }
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let ms_per_s = rt.block_on(async {
                let (tx, mut rx) = tokio::sync::mpsc::channel(256);
                let task = tokio::spawn(PodsDir::new(&d.0).unwrap().run(rescan, tx));
                while let Some(ev) = rx.recv().await {
                    if matches!(ev, PodEvent::Synced) {
                        break;
                    }
                }
                let before = cpu_time();
                tokio::time::sleep(window).await;
                let used = (cpu_time() - before).as_secs_f64();
                task.abort();
                used * 1000.0 / window.as_secs_f64()
            });
            println!(
                "pods-dir source, rescan every {rescan:?}, {n:>3} files: {ms_per_s:.3} ms CPU per s"
            );
        }
    }
}
