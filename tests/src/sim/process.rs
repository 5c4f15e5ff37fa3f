//! Starting processes inside a pod (its network namespace and a container cgroup), and watching
//! them exit. The only `unsafe` of the simulated node lives here.
//!
//! `ip netns exec` would remount /sys and hide the cgroup tree from the process, so instead the
//! child enters the namespace and the cgroup itself between fork and exec (`pre_exec`), using a
//! netns fd and a `cgroup.procs` fd both opened before the fork.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::mpsc::Sender;

use nix::sched::CloneFlags;
use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::SimError;

/// Forks a child that exits at once, and reaps it; returns its pid (the fork flood of
/// [`super::attacks`]: pids wrap around within seconds).
pub fn fork_and_exit() -> std::io::Result<i32> {
    // SAFETY: the child calls only `_exit` (async-signal-safe) and touches no memory; the
    // parent reaps it before returning.
    match unsafe { nix::unistd::fork() }.map_err(std::io::Error::from)? {
        nix::unistd::ForkResult::Child => unsafe { libc::_exit(0) },
        nix::unistd::ForkResult::Parent { child } => {
            let _ = waitpid(child, None);
            Ok(child.as_raw())
        }
    }
}

/// Forks a child that sleeps until the calling *thread* exits (`PR_SET_PDEATHSIG`: SIGKILL
/// when the thread that forked it ends, so the caller keeps that thread alive for as long as
/// the children should live); returns its pid. The many-processes attack of
/// [`super::attacks`]: an app with thousands of processes that go when the app goes, as a
/// container's processes go with its pid namespace's init.
pub fn fork_sleeper() -> std::io::Result<i32> {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the child only makes raw system calls (prctl, getppid, pause, _exit: all
    // async-signal-safe), allocates nothing and touches no lock; the parent reaps nothing here
    // (the children outlive this call by design and die with the forking thread).
    match unsafe { nix::unistd::fork() }.map_err(std::io::Error::from)? {
        nix::unistd::ForkResult::Child => unsafe {
            libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            );
            // The parent may have gone between fork and prctl.
            if libc::getppid() != parent {
                libc::_exit(0);
            }
            loop {
                libc::pause();
            }
        },
        nix::unistd::ForkResult::Parent { child } => Ok(child.as_raw()),
    }
}

/// Spawns `cmd` inside the network namespace `netns` (an open `/run/netns/<name>`) and, if given,
/// the cgroup whose `cgroup.procs` is `cgroup_procs`, as the leader of a new process group.
pub fn spawn_in(
    cmd: &mut Command,
    netns: &File,
    cgroup_procs: Option<&Path>,
) -> Result<Child, SimError> {
    let netns = netns.try_clone().map_err(|source| SimError::Io {
        what: "cannot duplicate netns fd".into(),
        source,
    })?;
    let procs = match cgroup_procs {
        Some(p) => Some(
            OpenOptions::new()
                .write(true)
                .open(p)
                .map_err(|source| SimError::Io {
                    what: format!("cannot open {}", p.display()),
                    source,
                })?,
        ),
        None => None,
    };
    let what = format!("{cmd:?}");
    // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe
    // work is allowed. It makes two raw syscalls on fds opened before the fork: setns(2) and
    // write(2) of the static bytes "0" (cgroup v2: "0" moves the writing process). It allocates
    // nothing on success, takes no locks, and returns an io::Error built from errno on failure.
    unsafe {
        cmd.pre_exec(move || {
            nix::sched::setns(&netns, CloneFlags::CLONE_NEWNET)?;
            if let Some(mut f) = procs.as_ref() {
                f.write_all(b"0")?;
            }
            Ok(())
        });
    }
    cmd.process_group(0).spawn().map_err(|source| SimError::Io {
        what: format!("cannot start {what} in the pod"),
        source,
    })
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    /// The exit code, or 128 + signal for a killed process (as container runtimes report it).
    pub code: i32,
    /// The signal that killed it, if any.
    pub signal: Option<i32>,
}

/// Waits (in a new thread) until `pid` has exited WITHOUT reaping it, then sends `event`.
///
/// The receiver reaps with [`reap`]. Until then the PID stays a zombie and cannot be reused, so
/// the owner may signal it safely any time before it has reaped it.
pub fn notify_exit<E: Send + 'static>(pid: u32, tx: Sender<E>, event: E) {
    let spawned = std::thread::Builder::new()
        .name(format!("wait-{pid}"))
        .spawn(move || loop {
            match waitid(
                Id::Pid(Pid::from_raw(pid as i32)),
                WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT,
            ) {
                Err(nix::errno::Errno::EINTR) => continue,
                // Exited (or not our child any more): report either way.
                _ => {
                    let _ = tx.send(event);
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        eprintln!("sim: cannot start exit watcher for pid {pid}: {e}");
    }
}

/// Reaps an exited child and decodes its status.
pub fn reap(pid: u32) -> Exit {
    loop {
        match waitpid(Pid::from_raw(pid as i32), None) {
            Ok(WaitStatus::Exited(_, code)) => return Exit { code, signal: None },
            Ok(WaitStatus::Signaled(_, sig, _)) => {
                return Exit {
                    code: 128 + sig as i32,
                    signal: Some(sig as i32),
                }
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => {
                return Exit {
                    code: -1,
                    signal: None,
                }
            }
        }
    }
}

/// Sends `sig` to `pid`; errors (already exited) are ignored on purpose.
pub fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), sig);
}

/// Whether `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Registers `f` to run when the process exits normally (`exit(3)`, also after the test harness
/// caught a panic): how state held in statics — never dropped — is torn down (the containerd
/// backend's shared runtime). Returns false if libc could not register it.
pub fn at_exit(f: extern "C" fn()) -> bool {
    // SAFETY: atexit(3) only stores the function pointer; `f` is a plain `extern "C" fn()`
    // with no arguments, valid for the whole process lifetime.
    unsafe { libc::atexit(f) == 0 }
}

/// The direct children of `pid` (procfs `stat`, field 4 is the parent's pid).
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|s| {
                    // After the `(comm)` field, which may hold spaces.
                    let rest = s.get(s.rfind(')')? + 2..)?;
                    rest.split(' ').nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}
