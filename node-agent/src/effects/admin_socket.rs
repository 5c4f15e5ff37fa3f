//! Envoy's admin API on a Unix socket inside a sidecar's mount namespace (Kuma 2.14+: the
//! socket `kuma-envoy-admin.sock` in kuma-dp's work directory `$TMPDIR/kuma-dp-<random>`,
//! `crate::mesh::kuma`), reached from the node through `/proc/<pid>/root`.
//!
//! The pod controls every name in its own filesystem, so nothing there is followed blindly:
//! - the proxy's process is **pinned** with a pidfd before its root is opened, and still alive
//!   after, so the root opened is that process's (the pid was not reused meanwhile);
//! - the parent directory is opened with `openat2(RESOLVE_IN_ROOT)`: a symlink resolves inside
//!   the container's root, never to the node's; the work directory with
//!   `RESOLVE_NO_SYMLINKS`;
//! - the socket must be a socket (`fstatat(AT_SYMLINK_NOFOLLOW)`) owned by the proxy's uid;
//! - after `connect`, the listener's credentials (`SO_PEERCRED`) must be one of the proxy's
//!   processes: a socket swapped for a symlink to another listener between the check and the
//!   connect is refused.
//!
//! `sun_path` holds 108 bytes and `/proc/<pid>/root/tmp/kuma-dp-<random>/kuma-envoy-admin.sock`
//! can be longer under another proc root, so the connect goes through the directory's fd:
//! `/proc/self/fd/<n>/<name>` (short, whatever the path it stands for).
//!
//! Permissions: the socket is mode 0600 for kuma-dp's uid (5678) and its directory 0711, so the
//! agent needs `CAP_DAC_OVERRIDE` to connect (root without it gets `EACCES`: said as such).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

/// The most entries of the parent directory looked at (the pod controls how many there are).
pub(crate) const MAX_DIR_ENTRIES: usize = 256;

/// Why the socket could not be found or reached.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the proxy's process {pid} is gone")]
    Gone { pid: i32 },
    #[error("no {name} under {parent}/{prefix}* in the proxy's filesystem (yet)")]
    NotFound {
        parent: String,
        prefix: String,
        name: String,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error(
        "permission denied connecting to the proxy's admin socket {path}: the socket is the \
         proxy's alone (mode 0600), and the agent needs CAP_DAC_OVERRIDE to reach it"
    )]
    Permission { path: String },
    #[error("the admin socket's listener is pid {peer}, not one of the proxy's processes")]
    NotTheProxy { peer: i32 },
}

impl Error {
    /// The error as an `io::Error` for the admin client's connector (its kind kept: a refused
    /// connection is `ConnectionRefused`, a socket not there yet `NotFound`).
    pub fn into_io(self) -> std::io::Error {
        let kind = match &self {
            Error::Io { source, .. } => source.kind(),
            Error::NotFound { .. } | Error::Gone { .. } => std::io::ErrorKind::NotFound,
            Error::Permission { .. } => std::io::ErrorKind::PermissionDenied,
            Error::NotTheProxy { .. } => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, self.to_string())
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// An admin socket found in one proxy's filesystem: its directory held open.
#[derive(Debug)]
pub struct AdminSocket {
    dir: OwnedFd,
    name: String,
    /// The proxy's processes (the listener must be one of them).
    proxy_pids: Vec<i32>,
    /// For messages: where it is, as the proxy sees it.
    shown: String,
}

impl AdminSocket {
    /// Finds `<parent>/<dir_prefix>*/<name>` in the filesystem of process `pid` (one of
    /// `proxy_pids`, the proxy container's own processes), owned by `uid`. With several work
    /// directories (a crashed kuma-dp leaves its own behind), the socket changed last.
    pub fn find(
        proc_root: &Path,
        pid: i32,
        proxy_pids: &[i32],
        uid: u32,
        parent: &str,
        dir_prefix: &str,
        name: &str,
    ) -> Result<AdminSocket, Error> {
        use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
        use nix::sys::stat::Mode;
        let gone = || Error::Gone { pid };
        let raw = rustix::process::Pid::from_raw(pid).ok_or_else(gone)?;
        let pidfd = rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty())
            .map_err(|_| gone())?;
        let root = nix::fcntl::open(
            &proc_root.join(pid.to_string()).join("root"),
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io(format!("opening /proc/{pid}/root"))(e.into()))?;
        if exited(&pidfd) {
            return Err(gone());
        }
        let in_root = OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        let parent_rel = parent.trim_start_matches('/');
        let parent_dir = nix::fcntl::openat2(
            &root,
            if parent_rel.is_empty() {
                "."
            } else {
                parent_rel
            },
            in_root,
        )
        .map_err(|e| io(format!("opening {parent} in the proxy's filesystem"))(e.into()))?;
        let not_found = || Error::NotFound {
            parent: parent.to_string(),
            prefix: dir_prefix.to_string(),
            name: name.to_string(),
        };
        let mut dir = nix::dir::Dir::from_fd(
            parent_dir
                .try_clone()
                .map_err(io(format!("listing {parent}")))?,
        )
        .map_err(|e| io(format!("listing {parent}"))(e.into()))?;
        let candidates: Vec<String> = dir
            .iter()
            .take(MAX_DIR_ENTRIES)
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str().ok().map(str::to_string))
            .filter(|n| n.starts_with(dir_prefix) && n.len() > dir_prefix.len())
            .collect();
        let no_links = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_SYMLINKS);
        let mut best: Option<(i64, OwnedFd, String)> = None;
        for candidate in candidates {
            let Ok(work) = nix::fcntl::openat2(&parent_dir, candidate.as_str(), no_links) else {
                continue;
            };
            let Ok(st) =
                nix::sys::stat::fstatat(&work, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
            else {
                continue;
            };
            let is_socket = (st.st_mode & libc::S_IFMT) == libc::S_IFSOCK;
            if !is_socket || st.st_uid != uid {
                continue;
            }
            if best.as_ref().is_none_or(|(t, _, _)| st.st_mtime > *t) {
                best = Some((st.st_mtime, work, candidate));
            }
        }
        let (_, dir, work) = best.ok_or_else(not_found)?;
        Ok(AdminSocket {
            dir,
            name: name.to_string(),
            proxy_pids: proxy_pids.to_vec(),
            shown: format!("{parent}/{work}/{name}"),
        })
    }

    /// Where the socket is, as the proxy sees it (`/tmp/kuma-dp-123/kuma-envoy-admin.sock`).
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// Connects (non-blocking: a full backlog is an error, not a wait), then checks that the
    /// listener is one of the proxy's processes. Blocking otherwise: call off the async workers.
    pub fn connect(&self, _timeout: Duration) -> Result<std::os::unix::net::UnixStream, Error> {
        use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
        let path = format!("/proc/self/fd/{}/{}", self.dir.as_raw_fd(), self.name);
        let addr = SocketAddrUnix::new(path.as_str()).map_err(|e| io("socket path")(e.into()))?;
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )
        .map_err(|e| io("making a Unix socket")(e.into()))?;
        match rustix::net::connect(&fd, &addr) {
            Ok(()) => {}
            Err(rustix::io::Errno::ACCESS) | Err(rustix::io::Errno::PERM) => {
                return Err(Error::Permission {
                    path: self.shown.clone(),
                })
            }
            Err(e) => return Err(io(format!("connecting to {}", self.shown))(e.into())),
        }
        let peer = rustix::net::sockopt::socket_peercred(&fd)
            .map_err(|e| io("reading the listener's credentials")(e.into()))?;
        let peer_pid = peer.pid.as_raw_nonzero().get();
        if !self.proxy_pids.contains(&peer_pid) {
            return Err(Error::NotTheProxy { peer: peer_pid });
        }
        Ok(std::os::unix::net::UnixStream::from(fd))
    }
}

/// Whether the process behind a pidfd has exited (the pidfd is readable then).
fn exited(fd: &OwnedFd) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
}

/// Where a pod's Unix-socket admin is, for [`connector`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct SocketAt {
    /// The uid the socket must be owned by (the proxy's).
    pub proxy_uid: u32,
    /// `<parent>/<dir_prefix>*/<name>` in the proxy's filesystem (`crate::mesh::AdminAt`).
    pub parent: &'static str,
    pub dir_prefix: &'static str,
    pub name: &'static str,
}

/// The connector of a pod's Unix-socket admin ([`crate::effects::envoy_admin::AdminClient::unix`]):
/// it keeps the socket found last, and finds it anew among the proxy container's current
/// processes (`proxy_id`: the container's id now; `procs`: the pod `uid`'s processes) whenever
/// that one stops answering. A permission problem stays one: said as it is, not searched again.
///
/// Before a socket was ever found, no proxy process (or socket) is "not yet" (`NotFound`: the
/// proxy is starting). Once one was found, the proxy container without a process is Envoy gone
/// — the kubelet stopped the sidecar, or it crashed — and the error is `ConnectionRefused`, as a
/// TCP admin's closed port says it, so the drain sees the proxy gone instead of retrying "not
/// yet" to its deadline (seen on the real cluster: a Kuma 2.14 native sidecar stopped by the
/// kubelet after its app, the drain asking its socket 52 times, then quitting at the deadline).
pub(crate) fn connector(
    procs: crate::effects::procfs::pod_procs::PodProcs,
    uid: String,
    at: SocketAt,
    proxy_id: impl Fn() -> Option<String> + Send + Sync + 'static,
) -> crate::effects::envoy_admin::UnixConnector {
    let found: std::sync::Mutex<Option<AdminSocket>> = Default::default();
    let ever_found = std::sync::atomic::AtomicBool::new(false);
    std::sync::Arc::new(
        move |timeout: Duration| -> std::io::Result<std::os::unix::net::UnixStream> {
            let mut slot = found.lock().unwrap_or_else(|p| p.into_inner());
            let gone_or_not_yet =
                |what: &str| absent(ever_found.load(std::sync::atomic::Ordering::Relaxed), what);
            if let Some(socket) = slot.as_ref() {
                match socket.connect(timeout) {
                    Ok(stream) => return Ok(stream),
                    Err(e @ Error::Permission { .. }) => return Err(e.into_io()),
                    Err(_) => *slot = None,
                }
            }
            let proxy_id =
                proxy_id().ok_or_else(|| gone_or_not_yet("the proxy container has no id"))?;
            let container: Vec<i32> = procs
                .of_pod_blocking(&uid)
                .iter()
                .filter(|p| p.container_id.as_deref() == Some(proxy_id.as_str()))
                .map(|p| p.pid)
                .collect();
            let proc_root = procs.proc_root();
            let proxy = crate::effects::procfs::proxy_procs::proxy_pids_of(&proc_root, &container);
            // Through Envoy's own root first (the mesh's agent's child made the socket, in the
            // mount namespace it runs in), then the main process's.
            let mut last = gone_or_not_yet("no process of the proxy container");
            let mut found_socket = None;
            for &pid in proxy.iter().rev() {
                match AdminSocket::find(
                    &proc_root,
                    pid,
                    &proxy,
                    at.proxy_uid,
                    at.parent,
                    at.dir_prefix,
                    at.name,
                ) {
                    Ok(s) => {
                        found_socket = Some(s);
                        break;
                    }
                    Err(e) => last = e.into_io(),
                }
            }
            let socket = found_socket.ok_or(last)?;
            let stream = socket.connect(timeout).map_err(Error::into_io)?;
            *slot = Some(socket);
            ever_found.store(true, std::sync::atomic::Ordering::Relaxed);
            Ok(stream)
        },
    )
}

/// The error of a socket or proxy process not found: "not yet" (`NotFound`) before a socket was
/// ever found, Envoy gone (`ConnectionRefused`, as a closed TCP port says it) after.
fn absent(ever_found: bool, what: &str) -> std::io::Error {
    if ever_found {
        std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            format!("{what}: the proxy's Envoy answered before and is gone"),
        )
    } else {
        std::io::Error::new(std::io::ErrorKind::NotFound, format!("{what} yet"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn a_proxy_gone_after_it_answered_is_refused_not_not_yet() {
        let before = absent(false, "no process of the proxy container");
        assert_eq!(before.kind(), std::io::ErrorKind::NotFound);
        assert_eq!(before.to_string(), "no process of the proxy container yet");
        let after = absent(true, "no process of the proxy container");
        assert_eq!(after.kind(), std::io::ErrorKind::ConnectionRefused);
    }

    /// A directory standing for a container's `/tmp`, reached through this process's own
    /// `/proc/<pid>/root` (the node's `/`).
    struct Tmp(std::path::PathBuf);
    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    fn tmp(test: &str) -> Tmp {
        let p = std::env::temp_dir().join(format!("hf-admin-socket-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Tmp(p)
    }
    fn me() -> (i32, u32) {
        (
            std::process::id() as i32,
            rustix::process::getuid().as_raw(),
        )
    }
    fn find(t: &Tmp, pids: &[i32], uid: u32) -> Result<AdminSocket, Error> {
        let (pid, _) = me();
        AdminSocket::find(
            Path::new("/proc"),
            pid,
            pids,
            uid,
            t.0.to_str().unwrap(),
            "kuma-dp-",
            "kuma-envoy-admin.sock",
        )
    }

    #[test]
    fn finds_the_socket_and_connects_to_the_proxys_listener() {
        let t = tmp("ok");
        let (pid, uid) = me();
        let work = t.0.join("kuma-dp-1234");
        std::fs::create_dir(&work).unwrap();
        let listener = UnixListener::bind(work.join("kuma-envoy-admin.sock")).unwrap();
        let s = find(&t, &[pid], uid).unwrap();
        assert!(
            s.shown().ends_with("/kuma-dp-1234/kuma-envoy-admin.sock"),
            "{}",
            s.shown()
        );
        let _stream = s.connect(Duration::from_secs(1)).unwrap();
        assert!(listener.accept().is_ok());
    }

    #[test]
    fn a_path_longer_than_sun_path_is_reached_through_the_directorys_fd() {
        let t = tmp("long");
        let (pid, uid) = me();
        let mut deep = t.0.clone();
        for i in 0..4 {
            deep = deep.join(format!("{i}-{}", "d".repeat(40)));
        }
        std::fs::create_dir_all(deep.join("kuma-dp-x")).unwrap();
        let sock = deep.join("kuma-dp-x").join("kuma-envoy-admin.sock");
        assert!(
            sock.as_os_str().len() > 108,
            "the test needs a path past sun_path"
        );
        // Bound through a short relative path, since bind has the same limit.
        let cwd = std::env::current_dir().unwrap();
        let listener = {
            let _ = cwd;
            let fd = nix::fcntl::open(
                &deep.join("kuma-dp-x"),
                nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY,
                nix::sys::stat::Mode::empty(),
            )
            .unwrap();
            UnixListener::bind(format!(
                "/proc/self/fd/{}/kuma-envoy-admin.sock",
                fd.as_raw_fd()
            ))
            .unwrap()
        };
        let s = AdminSocket::find(
            Path::new("/proc"),
            pid,
            &[pid],
            uid,
            deep.to_str().unwrap(),
            "kuma-dp-",
            "kuma-envoy-admin.sock",
        )
        .unwrap();
        let _stream = s.connect(Duration::from_secs(1)).unwrap();
        assert!(listener.accept().is_ok());
    }

    #[test]
    fn a_symlinked_work_directory_is_not_followed() {
        let t = tmp("symlink");
        let (pid, uid) = me();
        // The real socket elsewhere (standing for a node's socket), linked from the pod's /tmp.
        let elsewhere = tmp("symlink-target");
        let _listener = UnixListener::bind(elsewhere.0.join("kuma-envoy-admin.sock")).unwrap();
        std::os::unix::fs::symlink(&elsewhere.0, t.0.join("kuma-dp-evil")).unwrap();
        assert!(matches!(find(&t, &[pid], uid), Err(Error::NotFound { .. })));
    }

    #[test]
    fn a_symlink_named_like_the_socket_is_not_a_socket() {
        let t = tmp("symsock");
        let (pid, uid) = me();
        let elsewhere = tmp("symsock-target");
        let target = elsewhere.0.join("node.sock");
        let _listener = UnixListener::bind(&target).unwrap();
        std::fs::create_dir(t.0.join("kuma-dp-1")).unwrap();
        std::os::unix::fs::symlink(&target, t.0.join("kuma-dp-1/kuma-envoy-admin.sock")).unwrap();
        assert!(matches!(find(&t, &[pid], uid), Err(Error::NotFound { .. })));
    }

    #[test]
    fn a_socket_of_another_uid_is_not_the_proxys() {
        let t = tmp("uid");
        let (pid, uid) = me();
        std::fs::create_dir(t.0.join("kuma-dp-1")).unwrap();
        let _listener = UnixListener::bind(t.0.join("kuma-dp-1/kuma-envoy-admin.sock")).unwrap();
        assert!(matches!(
            find(&t, &[pid], uid.wrapping_add(1)),
            Err(Error::NotFound { .. })
        ));
    }

    #[test]
    fn a_listener_that_is_not_the_proxys_process_is_refused() {
        let t = tmp("peer");
        let (_, uid) = me();
        std::fs::create_dir(t.0.join("kuma-dp-1")).unwrap();
        let _listener = UnixListener::bind(t.0.join("kuma-dp-1/kuma-envoy-admin.sock")).unwrap();
        // The proxy's processes are others (pid 1 stands for them): this listener is not theirs.
        let s = find(&t, &[1], uid).unwrap();
        assert!(matches!(
            s.connect(Duration::from_secs(1)),
            Err(Error::NotTheProxy { .. })
        ));
    }

    #[test]
    fn the_newest_of_several_work_directories_wins() {
        let t = tmp("newest");
        let (pid, uid) = me();
        std::fs::create_dir(t.0.join("kuma-dp-old")).unwrap();
        let old = UnixListener::bind(t.0.join("kuma-dp-old/kuma-envoy-admin.sock")).unwrap();
        drop(old); // a crashed kuma-dp's socket: nothing listens
        std::thread::sleep(Duration::from_millis(1100));
        std::fs::create_dir(t.0.join("kuma-dp-new")).unwrap();
        let _new = UnixListener::bind(t.0.join("kuma-dp-new/kuma-envoy-admin.sock")).unwrap();
        let s = find(&t, &[pid], uid).unwrap();
        assert!(s.shown().contains("kuma-dp-new"), "{}", s.shown());
    }

    #[test]
    fn a_gone_process_is_gone() {
        let t = tmp("gone");
        let (_, uid) = me();
        let r = AdminSocket::find(
            Path::new("/proc"),
            i32::MAX - 1,
            &[],
            uid,
            t.0.to_str().unwrap(),
            "kuma-dp-",
            "kuma-envoy-admin.sock",
        );
        assert!(matches!(r, Err(Error::Gone { .. })), "{r:?}");
    }
}
