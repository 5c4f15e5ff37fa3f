//! The inotify watch behind the pods-directory source ([`super::dir`]): which names changed,
//! an overflow (`IN_Q_OVERFLOW`: the kernel dropped events, re-read everything), or a lost watch
//! (the directory itself was removed or replaced). See inotify(7).

use std::ffi::OsString;
use std::path::Path;

/// What the directory watch saw.
pub(super) enum Changed {
    /// These names changed.
    Names(Vec<OsString>),
    /// Nothing specific (a timer): rescan.
    Rescan,
    /// The kernel dropped events (`IN_Q_OVERFLOW`): re-read everything.
    Overflow,
    /// The watch is gone (`IN_IGNORED`: the directory was removed or its filesystem unmounted).
    Lost,
}

/// An inotify watch on the pods directory, read through tokio.
pub(super) struct DirWatch {
    fd: tokio::io::unix::AsyncFd<OwnedInotify>,
}

/// nix's `Inotify` is `AsFd`; tokio's `AsyncFd` wants `AsRawFd`.
struct OwnedInotify(nix::sys::inotify::Inotify);

impl std::os::fd::AsRawFd for OwnedInotify {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsFd;
        self.0.as_fd().as_raw_fd()
    }
}

impl DirWatch {
    /// `None` (logged) when inotify is unavailable; the caller then rescans on a timer.
    pub(super) fn new(dir: &Path) -> Option<Self> {
        use nix::sys::inotify::{AddWatchFlags as F, InitFlags, Inotify};
        let watch = || -> std::result::Result<Self, String> {
            let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
                .map_err(|e| format!("inotify_init: {e} (fs.inotify.max_user_instances?)"))?;
            // Every way a name can appear, change or go; the `..data` rename of a ConfigMap-style
            // swap is an IN_MOVED_TO here.
            let mask = F::IN_CREATE
                | F::IN_DELETE
                | F::IN_MODIFY
                | F::IN_CLOSE_WRITE
                | F::IN_MOVED_FROM
                | F::IN_MOVED_TO
                | F::IN_ATTRIB
                | F::IN_DELETE_SELF
                | F::IN_MOVE_SELF;
            ino.add_watch(dir, mask)
                .map_err(|e| format!("inotify_add_watch: {e} (fs.inotify.max_user_watches?)"))?;
            // SAFETY: `OwnedInotify` owns the inotify fd; it stays open and the same until the
            // AsyncFd (its only owner) is dropped.
            let fd = unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(
                    OwnedInotify(ino),
                    tokio::io::Interest::READABLE,
                )
            }
            .map_err(|e| e.to_string())?;
            Ok(Self { fd })
        };
        match watch() {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the pods directory; rescanning every second instead");
                None
            }
        }
    }

    pub(super) async fn changed(&mut self) -> Changed {
        use nix::sys::inotify::AddWatchFlags as F;
        loop {
            let Ok(mut guard) = self.fd.readable().await else {
                return Changed::Lost;
            };
            match guard.get_inner().0.read_events() {
                Ok(events) => {
                    let mut names = Vec::new();
                    for ev in events {
                        if ev.mask.contains(F::IN_Q_OVERFLOW) {
                            return Changed::Overflow;
                        }
                        if ev
                            .mask
                            .intersects(F::IN_IGNORED | F::IN_DELETE_SELF | F::IN_MOVE_SELF)
                        {
                            return Changed::Lost;
                        }
                        if let Some(name) = ev.name {
                            names.push(name);
                        }
                    }
                    return Changed::Names(names);
                }
                Err(nix::errno::Errno::EAGAIN) => guard.clear_ready(),
                Err(_) => return Changed::Lost,
            }
        }
    }
}
