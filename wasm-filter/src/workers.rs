//! `<stat_prefix>.workers_ready`: how many Envoy worker threads have the filter configured.
//!
//! # Where the VMs are (Envoy 1.40, proxy-wasm-cpp-host)
//! Each thread has its own copy of the module (one VM per thread and VM key; all copies write the
//! same Envoy stats by name, but share no memory). For every plugin configuration Envoy makes:
//! - a **canary** on the main thread: `WasmHandleBase::canary` (proxy-wasm-cpp-host
//!   `src/wasm.cc`) clones the base VM, runs `on_configure`, then `kill()`s the handle. `kill()`
//!   only drops the pointer: the canary's root context never gets `on_done`, and its VM (with any
//!   timer it set) is destroyed before the main thread returns to its event loop;
//! - one **thread-local** VM with a configured root context on *every* thread that runs an
//!   event loop: Envoy's `ThreadLocal::SlotImpl::set` posts the initializer to each worker and
//!   then runs it on the main thread too (`source/common/thread_local/thread_local_impl.cc`,
//!   "Handle main thread."), so the main thread keeps a configured root context for as long as
//!   the plugin lives, although it never gets a connection.
//!
//! Counting `on_configure` calls therefore over-counts by the canary (forever) and the main
//! thread. So a VM counts itself only on the **first tick** after a root context is configured
//! (the canary never ticks: it is gone before the loop runs), and the process-wide count `n` of
//! such VMs is kept in proxy-wasm shared data (one value per stat prefix, updated with
//! compare-and-swap). The gauge is `n - 1`: the main thread's VM is always one of the `n` once it
//! ticked. The VM that moves `n` from 0 to 1 leaves the gauge alone, every later one adds 1, and
//! the same in reverse when a VM's last root context of that prefix ends (`on_done`).
//!
//! Until the main thread's VM has ticked the gauge reads one less than the ready workers: it can
//! lag, never lead. It is exact once every VM ticked (about a millisecond after configuration).
//!
//! This module is the plain bookkeeping; `glue` makes the hostcalls.

use std::collections::BTreeMap;

/// How one root context of this VM stands.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Root {
    prefix: String,
    /// Its first tick came: this root context is not a canary's.
    confirmed: bool,
}

/// This VM's root contexts, and whether the VM counts as ready for each stat prefix.
#[derive(Debug, Default)]
pub struct VmReadiness {
    roots: BTreeMap<u32, Root>,
}

impl VmReadiness {
    /// An empty VM.
    pub fn new() -> VmReadiness {
        VmReadiness::default()
    }

    fn confirmed_under(&self, prefix: &str) -> usize {
        self.roots
            .values()
            .filter(|r| r.confirmed && r.prefix == prefix)
            .count()
    }

    /// Root context `root` accepted a configuration with `prefix`. Returns the prefix this VM
    /// stops being ready for, if a re-configuration moved its last confirmed root elsewhere.
    pub fn configured(&mut self, root: u32, prefix: &str) -> Option<String> {
        if let Some(r) = self.roots.get(&root) {
            if r.prefix == prefix {
                return None;
            }
        }
        let left = self.gone(root);
        self.roots.insert(
            root,
            Root {
                prefix: prefix.to_string(),
                confirmed: false,
            },
        );
        left
    }

    /// Whether `root` is configured and still waits for its first tick.
    pub fn awaiting_tick(&self, root: u32) -> bool {
        self.roots.get(&root).is_some_and(|r| !r.confirmed)
    }

    /// First tick of `root`. Returns the prefix this VM becomes ready for now (its first
    /// confirmed root context of that prefix), else `None`.
    pub fn ticked(&mut self, root: u32) -> Option<String> {
        let prefix = {
            let r = self.roots.get_mut(&root)?;
            if r.confirmed {
                return None;
            }
            r.confirmed = true;
            r.prefix.clone()
        };
        (self.confirmed_under(&prefix) == 1).then_some(prefix)
    }

    /// Root context `root` ended (`on_done`). Returns the prefix this VM stops being ready for
    /// (it was the last confirmed root context of it), else `None`.
    pub fn gone(&mut self, root: u32) -> Option<String> {
        let r = self.roots.remove(&root)?;
        (r.confirmed && self.confirmed_under(&r.prefix) == 0).then_some(r.prefix)
    }

    /// Whether `id` is one of this VM's configured root contexts.
    pub fn is_root(&self, id: u32) -> bool {
        self.roots.contains_key(&id)
    }
}

/// A VM joins the `n` ready VMs of a prefix: the new `n` and the change to the gauge.
pub fn join(n: u32) -> (u32, i64) {
    (n.saturating_add(1), if n >= 1 { 1 } else { 0 })
}

/// A VM leaves the `n` ready VMs of a prefix: the new `n` and the change to the gauge.
pub fn leave(n: u32) -> (u32, i64) {
    match n {
        0 | 1 => (0, 0),
        _ => (n - 1, -1),
    }
}

/// The shared-data key holding `n` for a stat prefix (versioned: a future encoding gets a new key).
pub fn shared_key(prefix: &str) -> String {
    format!("holdfast.v1.ready_vms.{prefix}")
}

/// `n` as stored in shared data.
pub fn encode(n: u32) -> [u8; 4] {
    n.to_le_bytes()
}

/// `n` from shared data; `None` for anything that is not 4 bytes.
pub fn decode(raw: &[u8]) -> Option<u32> {
    <[u8; 4]>::try_from(raw).ok().map(u32::from_le_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vm_is_ready_from_the_first_tick_until_its_last_root_ends() {
        let mut vm = VmReadiness::new();
        assert_eq!(vm.configured(1, "holdfast"), None);
        assert!(vm.awaiting_tick(1));
        assert_eq!(vm.configured(2, "holdfast"), None);
        assert_eq!(
            vm.ticked(1),
            Some("holdfast".into()),
            "first confirmed root"
        );
        assert_eq!(vm.ticked(1), None, "a second tick changes nothing");
        assert_eq!(vm.ticked(2), None, "already ready for the prefix");
        assert!(!vm.awaiting_tick(2));
        assert_eq!(vm.gone(1), None, "root 2 still holds the VM ready");
        assert_eq!(vm.gone(2), Some("holdfast".into()));
        assert_eq!(vm.gone(2), None, "on_done twice");
        assert_eq!(vm.ticked(9), None, "unknown root");
    }

    #[test]
    fn a_canary_that_never_ticks_never_counts() {
        let mut vm = VmReadiness::new();
        vm.configured(1, "holdfast");
        // Killed without on_done: nothing is ever reported for it.
        assert!(vm.is_root(1));
        assert_eq!(vm.gone(1), None, "never confirmed: nothing to take back");
    }

    #[test]
    fn prefixes_are_counted_apart() {
        let mut vm = VmReadiness::new();
        vm.configured(1, "a");
        vm.configured(2, "b");
        assert_eq!(vm.ticked(1), Some("a".into()));
        assert_eq!(vm.ticked(2), Some("b".into()));
        // Reconfigured to another prefix: leaves "a", waits for a tick under "c".
        assert_eq!(vm.configured(1, "c"), Some("a".into()));
        assert!(vm.awaiting_tick(1));
        assert_eq!(vm.configured(2, "b"), None, "same prefix: unchanged");
        assert!(!vm.awaiting_tick(2));
    }

    /// The gauge is always max(n - 1, 0), whatever order VMs join and leave in.
    #[test]
    fn gauge_is_ready_vms_minus_the_main_thread() {
        let mut n = 0u32;
        let mut gauge = 0i64;
        for step in [1, 1, 1, -1, 1, -1, -1, -1, -1, 1, 1] {
            let (new, delta) = if step > 0 { join(n) } else { leave(n) };
            n = new;
            gauge += delta;
            assert_eq!(gauge, i64::from(n.saturating_sub(1)), "n = {n}");
        }
    }

    #[test]
    fn shared_value_round_trip_and_garbage() {
        assert_eq!(decode(&encode(7)), Some(7));
        assert_eq!(decode(&[]), None);
        assert_eq!(decode(&[1, 2, 3]), None);
        assert_eq!(decode(&[0; 8]), None);
        assert_eq!(shared_key("hf"), "holdfast.v1.ready_vms.hf");
    }
}
