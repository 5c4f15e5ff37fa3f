//! Pid reuse with real processes (issue 25, "the right namespace, always"): pod A's process
//! exits and its pid is given to a process of pod B — in B's cgroup and B's network namespace —
//! before the agent's process index looks again. The index must never hand out B's namespace
//! (nor B's process) for A.
//!
//! Pids wrap around only after `pid_max` forks, so the reuse is made on purpose: the new process
//! is created with `clone3(CLONE_INTO_CGROUP, set_tid = [the freed pid])`, which gives a chosen
//! pid to a new process (Linux 5.5+, needs `CAP_SYS_ADMIN`; include/uapi/linux/sched.h
//! `struct clone_args`). The pod cgroups are real (`kubepods/pod<uid>/<id>` under the cgroup v2
//! mount), the namespaces real (`unshare -n`). Root only: skipped with a message otherwise,
//! failed under CI.

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use holdfast::effects::netns::NetnsId;
use holdfast::effects::procfs::pod_procs::{NetnsLookup, PodProcs};

const UID_A: &str = "a11ce000-1111-4222-8333-444455556666";
const UID_B: &str = "b0b00000-1111-4222-8333-444455556666";

fn privileged() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("pid_reuse needs root (CI must not skip it)");
    }
    eprintln!("skipping pid_reuse: needs root");
    false
}

/// The cgroup v2 mount (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a hybrid node).
fn cgroup2() -> PathBuf {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mi.lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let point = left.split_whitespace().nth(4)?;
            (right.split_whitespace().next()? == "cgroup2").then(|| PathBuf::from(point))
        })
        .expect("a cgroup v2 mount")
}

/// The test's cgroups and processes; everything is killed and removed on drop.
struct Scene {
    base: PathBuf,
    children: Vec<Child>,
    pids: Vec<i32>,
}

impl Drop for Scene {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for &pid in &self.pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        }
        // Leaves first.
        let mut dirs = Vec::new();
        walk(&self.base, &mut dirs);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for d in dirs {
            let _ = std::fs::remove_dir(d);
        }
        let _ = std::fs::remove_dir(&self.base);
    }
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.push(e.path());
                walk(&e.path(), out);
            }
        }
    }
}

fn container_dir(scene: &Scene, uid: &str, cid: char) -> PathBuf {
    let d = scene
        .base
        .join(format!("kubepods/pod{uid}/{}", cid.to_string().repeat(64)));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn move_into(dir: &Path, pid: u32) {
    std::fs::write(dir.join("cgroup.procs"), pid.to_string()).unwrap();
}

/// `struct clone_args` (include/uapi/linux/sched.h), up to `cgroup` (CLONE_ARGS_SIZE_VER2).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// A new process with pid `pid`, started in the cgroup `dir`, running `argv` (exec'd at once).
fn spawn_with_pid(pid: i32, dir: &Path, argv: &[&str]) -> std::io::Result<i32> {
    let cgroup = std::fs::File::open(dir)?;
    let c_argv: Vec<CString> = argv.iter().map(|a| CString::new(*a).unwrap()).collect();
    let mut ptrs: Vec<*const libc::c_char> = c_argv.iter().map(|c| c.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let tids = [pid as libc::pid_t];
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        set_tid: tids.as_ptr() as u64,
        set_tid_size: 1,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: clone3 without CLONE_VM is a fork: the child has its own copy of memory and only
    // calls execv (async-signal-safe) with pointers prepared before the call, then _exit.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    match ret {
        -1 => Err(std::io::Error::last_os_error()),
        0 => unsafe {
            libc::execv(ptrs[0], ptrs.as_ptr());
            libc::_exit(127)
        },
        child => Ok(child as i32),
    }
}

fn netns_of(pid: i32) -> NetnsId {
    NetnsId::of_path(Path::new(&format!("/proc/{pid}/ns/net"))).unwrap()
}

fn unshare() -> PathBuf {
    ["/usr/bin/unshare", "/bin/unshare"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("unshare (util-linux)")
}

/// Waits until `pid` runs `comm` (unshare or nsenter has exec'd it) and, with `own_netns`, is in
/// a network namespace other than this test's (unshare -n made it): the signals that the
/// process is set up, instead of a sleep that a loaded machine outlasts.
fn exec_done(pid: i32, comm: &str, own_netns: bool) {
    let ours = std::fs::read_link("/proc/self/ns/net").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let ns = std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
        if name.trim_end() == comm && (!own_netns || ns.is_some_and(|n| n != ours)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "pid {pid} did not exec {comm} within 10 s (comm {name:?})"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_pid_given_to_another_pod_never_leads_to_its_namespace() {
    if !privileged() {
        return;
    }
    let mut scene = Scene {
        base: cgroup2().join(format!("hf-pidreuse-{}", std::process::id())),
        children: Vec::new(),
        pids: Vec::new(),
    };
    let (a1_dir, a2_dir) = (
        container_dir(&scene, UID_A, 'a'),
        container_dir(&scene, UID_A, 'b'),
    );
    let b_dir = container_dir(&scene, UID_B, 'c');

    // Pod A: two processes in one new netns.
    let a1 = Command::new(unshare())
        .args(["-n", "sleep", "600"])
        .spawn()
        .unwrap();
    let a1_pid = a1.id() as i32;
    move_into(&a1_dir, a1.id());
    scene.children.push(a1);
    exec_done(a1_pid, "sleep", true);
    let a2 = Command::new("nsenter")
        .arg(format!("--net=/proc/{a1_pid}/ns/net"))
        .args(["sleep", "600"])
        .spawn()
        .unwrap();
    let a2_pid = a2.id() as i32;
    move_into(&a2_dir, a2.id());
    scene.children.push(a2);
    exec_done(a2_pid, "sleep", true);
    let ns_a = netns_of(a1_pid);
    assert_eq!(netns_of(a2_pid), ns_a);
    assert!(a1_pid < a2_pid, "pids in order (no wrap during the test)");

    let procs = PodProcs::new("/proc".into());
    match procs.find_netns_blocking(UID_A) {
        NetnsLookup::Found { pid, netns } => assert_eq!((pid, netns.id()), (a1_pid, ns_a)),
        other => panic!("pod A's netns through pid {a1_pid}, got {other:?}"),
    }

    // A's first process exits; its pid goes to a process of pod B, in B's own new netns.
    let mut first = scene.children.remove(0);
    first.kill().unwrap();
    first.wait().unwrap();
    let unshare = unshare();
    let b_pid = spawn_with_pid(
        a1_pid,
        &b_dir,
        &[unshare.to_str().unwrap(), "-n", "sleep", "600"],
    )
    .expect("clone3 with set_tid (Linux 5.5+, CAP_SYS_ADMIN)");
    scene.pids.push(b_pid);
    assert_eq!(b_pid, a1_pid, "pod B's process has pod A's old pid");
    exec_done(b_pid, "sleep", true);
    let ns_b = netns_of(b_pid);
    assert_ne!(ns_b, ns_a);

    // The index looks again: the pid is listed both times, so only its identity tells.
    std::thread::sleep(Duration::from_millis(20));
    match procs.find_netns_blocking(UID_A) {
        NetnsLookup::Found { pid, netns } => {
            assert_ne!(
                netns.id(),
                ns_b,
                "pod A was given pod B's network namespace"
            );
            assert_eq!((pid, netns.id()), (a2_pid, ns_a));
        }
        other => panic!("pod A's netns through pid {a2_pid}, got {other:?}"),
    }
    let a: Vec<i32> = procs.of_pod_blocking(UID_A).iter().map(|p| p.pid).collect();
    assert_eq!(a, vec![a2_pid], "pod A's processes");
    let b: Vec<i32> = procs.of_pod_blocking(UID_B).iter().map(|p| p.pid).collect();
    assert_eq!(b, vec![b_pid], "the reused pid is pod B's");
}
