//! Which tracked pod holds which network namespace (issue 25): a lookup that finds a
//! namespace another tracked pod holds is refused. Moved out of `lifecycle/driver.rs` (issue 40
//! item 4), unchanged.

use std::collections::HashMap;
use std::sync::Arc;

use crate::pod::PodKey;

/// Which tracked pod uses which network namespace: two pods never share one (hostNetwork pods
/// are not tracked), so a lookup that finds a namespace another tracked pod holds went through
/// a stale or reused pid, and is refused (issue 25: pod A's drain must never reach pod B's
/// Envoy). A [`NetnsClaim`] gives its namespace back on drop.
#[derive(Debug, Clone, Default)]
pub(crate) struct NetnsOwners(
    Arc<std::sync::Mutex<HashMap<crate::effects::netns::NetnsId, PodKey>>>,
);

/// One pod's hold on a namespace in [`NetnsOwners`].
#[derive(Debug)]
pub(crate) struct NetnsClaim {
    owners: NetnsOwners,
    id: crate::effects::netns::NetnsId,
    uid: String,
}

impl NetnsOwners {
    /// Claims `id` for `pod`; `Err(owner)` when another tracked pod holds it.
    pub(crate) fn claim(
        &self,
        id: crate::effects::netns::NetnsId,
        pod: &PodKey,
    ) -> Result<NetnsClaim, PodKey> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&id) {
            Some(owner) if owner.uid != pod.uid => Err(owner.clone()),
            _ => {
                map.insert(id, pod.clone());
                Ok(NetnsClaim {
                    owners: self.clone(),
                    id,
                    uid: pod.uid.clone(),
                })
            }
        }
    }
}

impl Drop for NetnsClaim {
    fn drop(&mut self) {
        let mut map = self.owners.0.lock().unwrap_or_else(|e| e.into_inner());
        if map.get(&self.id).is_some_and(|k| k.uid == self.uid) {
            map.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_netns_belongs_to_one_pod_at_a_time() {
        let owners = NetnsOwners::default();
        let key = |uid: &str| PodKey {
            uid: uid.into(),
            namespace: "ns".into(),
            name: uid.into(),
        };
        let ns = crate::effects::netns::NetnsId { dev: 4, ino: 42 };
        let a = owners.claim(ns, &key("a")).expect("free");
        // Pod b's lookup went through a pid that is a's process now: refused, naming a.
        assert_eq!(owners.claim(ns, &key("b")).unwrap_err().uid, "a");
        let other = crate::effects::netns::NetnsId { dev: 4, ino: 43 };
        let _b = owners.claim(other, &key("b")).expect("b's own namespace");
        drop(a);
        assert!(
            owners.claim(ns, &key("c")).is_ok(),
            "free again once a is gone"
        );
    }
}
