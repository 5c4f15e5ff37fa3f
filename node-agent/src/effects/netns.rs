//! Entering a pod's network namespace.
//!
//! Owns the one way the agent acts inside a pod's netns: a dedicated, short-lived OS thread that
//! `setns(CLONE_NEWNET)`s into it, does its work (create a socket, run `iptables`, read
//! `/proc/thread-self/net/...`) and ends. No thread ever returns to a pool or to the tokio runtime
//! while inside a foreign namespace, so the rest of the agent always runs in the host's netns.
//! Sockets keep the namespace they were created in, so a socket made here can be handed to tokio
//! (`tokio::net::TcpStream::from_std`) and used from any thread.
//!
//! A namespace is identified by the `(st_dev, st_ino)` of its nsfs file: two processes are in the
//! same netns exactly when `/proc/<pid>/ns/net` of both stat to the same pair.

#![forbid(unsafe_code)]

use std::fs::File;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sched::{setns, CloneFlags};

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open network namespace {path}: {source} (is the process gone, or is the agent missing hostPID / CAP_SYS_ADMIN?)")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot spawn a thread to enter network namespace {0:?}: {1}")]
    Spawn(NetnsId, std::io::Error),
    #[error("setns into network namespace {0:?} failed: {1} (the agent needs CAP_SYS_ADMIN)")]
    Setns(NetnsId, nix::Error),
    #[error("the work run inside network namespace {0:?} panicked")]
    Panicked(NetnsId),
    #[error("connect to {addr} inside network namespace {netns:?} failed: {source}")]
    Connect {
        netns: NetnsId,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot run `{program}` inside network namespace {netns:?}: {source} (is it installed in the agent's image?)")]
    Command {
        netns: NetnsId,
        program: String,
        source: std::io::Error,
    },
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Identity of a network namespace: device and inode of its nsfs file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct NetnsId {
    pub dev: u64,
    pub ino: u64,
}

impl NetnsId {
    /// Stats a netns file (`/proc/<pid>/ns/net`, `/run/netns/<name>`), following the link.
    pub fn of_path(path: &Path) -> std::io::Result<NetnsId> {
        let metadata = std::fs::metadata(path)?;
        Ok(NetnsId {
            dev: metadata.dev(),
            ino: metadata.ino(),
        })
    }

    /// The netns of the calling thread (`/proc/thread-self/ns/net`).
    pub fn current_thread() -> std::io::Result<NetnsId> {
        NetnsId::of_path(Path::new("/proc/thread-self/ns/net"))
    }
}

/// Output of a command run inside a network namespace.
#[derive(Debug, Clone)]
pub struct CommandOutput {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// An open handle on a pod's network namespace. Holding the file keeps the namespace alive (and
/// its identity stable) even if the pod's processes exit.
#[derive(Debug)]
pub struct PodNetns {
    file: File,
    id: NetnsId,
}

impl PodNetns {
    /// Opens the netns of a process, `/proc/<pid>/ns/net`.
    pub fn open_pid(pid: i32) -> Result<PodNetns> {
        PodNetns::open_path(&Path::new("/proc").join(pid.to_string()).join("ns/net"))
    }

    /// Opens a netns file such as `/proc/<pid>/ns/net` or `/run/netns/<name>`.
    pub fn open_path(path: &Path) -> Result<PodNetns> {
        let open_error = |source| Error::Open {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(open_error)?;
        let metadata = file.metadata().map_err(open_error)?;
        Ok(PodNetns {
            file,
            id: NetnsId {
                dev: metadata.dev(),
                ino: metadata.ino(),
            },
        })
    }

    /// The namespace's identity.
    pub fn id(&self) -> NetnsId {
        self.id
    }

    /// Another handle on the same namespace (a duplicated file descriptor).
    pub fn try_clone(&self) -> Result<PodNetns> {
        let file = self.file.try_clone().map_err(|source| Error::Open {
            path: PathBuf::from(format!("<netns {:?}>", self.id)),
            source,
        })?;
        Ok(PodNetns { file, id: self.id })
    }

    /// Runs `f` on a new OS thread that has entered this netns, and returns its value. The thread
    /// ends afterwards, so nothing lingers in the pod's namespace. Blocks the caller until `f`
    /// returns: call it from `tokio::task::spawn_blocking` in async code when `f` may be slow.
    pub fn run<F, T>(&self, f: F) -> Result<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let id = self.id;
        let file = self.file.try_clone().map_err(|e| Error::Spawn(id, e))?;
        let handle = std::thread::Builder::new()
            .name("holdfast-netns".to_string())
            .spawn(move || -> Result<T> {
                // setns(CLONE_NEWNET) changes only this thread's namespace; the thread is ours
                // and ends right after `f`, so no other code ever runs in the pod's netns.
                setns(&file, CloneFlags::CLONE_NEWNET).map_err(|e| Error::Setns(id, e))?;
                Ok(f())
            })
            .map_err(|e| Error::Spawn(id, e))?;
        handle.join().map_err(|_| Error::Panicked(id))?
    }

    /// Connects a TCP socket created inside this netns (e.g. to Envoy's admin on 127.0.0.1:15000).
    /// The stream is blocking; for tokio call `set_nonblocking(true)` and
    /// `tokio::net::TcpStream::from_std`.
    pub fn connect_tcp(&self, addr: SocketAddr, timeout: Duration) -> Result<TcpStream> {
        let netns = self.id;
        self.run(move || TcpStream::connect_timeout(&addr, timeout))?
            .map_err(|source| Error::Connect {
                netns,
                addr,
                source,
            })
    }

    /// Runs a program inside this netns (forked from a thread in the netns, so the child inherits
    /// it), with arguments as a vector (never through a shell), optional stdin, and waits for it.
    pub fn run_command(
        &self,
        program: &str,
        args: &[String],
        stdin: Option<Vec<u8>>,
    ) -> Result<CommandOutput> {
        let netns = self.id;
        let program_owned = program.to_string();
        let args = args.to_vec();
        let output = self.run(move || -> std::io::Result<std::process::Output> {
            let mut command = Command::new(&program_owned);
            command
                .args(&args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .stdin(if stdin.is_some() {
                    Stdio::piped()
                } else {
                    Stdio::null()
                });
            let mut child = command.spawn()?;
            if let Some(input) = stdin {
                if let Some(mut pipe) = child.stdin.take() {
                    pipe.write_all(&input)?;
                }
            }
            child.wait_with_output()
        })?;
        let output = output.map_err(|source| Error::Command {
            netns,
            program: program.to_string(),
            source,
        })?;
        Ok(CommandOutput {
            status: output.status,
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_netns_identity_is_stable() {
        let a = NetnsId::of_path(Path::new("/proc/self/ns/net")).expect("stat own netns");
        let ns = PodNetns::open_path(Path::new("/proc/self/ns/net")).expect("open own netns");
        assert_eq!(ns.id(), a);
        // Entering our own namespace is allowed for root only; either way the thread ends.
        if nix::unistd::Uid::effective().is_root() {
            let inside = ns.run(NetnsId::current_thread).expect("run").expect("stat");
            assert_eq!(inside, a);
        }
    }

    #[test]
    fn open_missing_names_the_path() {
        let err = PodNetns::open_path(Path::new("/nonexistent/ns/net")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/ns/net"), "{err}");
    }
}
