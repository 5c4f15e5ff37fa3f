//! holdfast's images, built without a container daemon and reproducibly: the same inputs give
//! the same bytes, so the same digest (`just image`; docs/images.md).
//!
//! # Layout
//!
//! - [`layer`]: one layer's tar and gzip, deterministic (sorted entries, fixed mtimes, owners
//!   and modes).
//! - [`layout`]: the OCI image layout on disk, image manifest and config, unpacking for tests.
//! - [`arch`]: the architectures of the agent image (amd64, arm64) and what differs between them.
//! - [`debs`]: the pinned Debian packages (`image/agent-debs.lock`, `image/agent-debs-arm64.lock`)
//!   the agent's run time comes from.
//! - [`agent`]: the agent image (the `holdfast` binary, iptables-nft and exactly the shared
//!   libraries they link), one per architecture under an OCI image index.
//! - [`filter`]: the filter image, in the Wasm image formats Istio's pilot-agent fetches.
//! - [`registry`]: a registry on loopback (Debian's `docker-registry`) and the push/pull calls
//!   of the distribution API.
//! - [`pin`]: the kustomize edits that pin `manifests/` to the images' digests.
//! - [`release`]: what `just image` runs.
//!
//! The binary (`holdfast-image`) only parses arguments and calls these.

pub mod agent;
pub mod arch;
pub mod debs;
pub mod filter;
pub mod layer;
pub mod layout;
pub mod pin;
pub mod registry;
pub mod release;

/// Errors of this crate; messages name the input and, where there is one, the fix.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Input(String),
    #[error("{what}: {source}")]
    File {
        what: String,
        source: std::io::Error,
    },
    #[error("writing a layer: {0}")]
    Io(std::io::Error),
    #[error("`{what}` failed ({status}): {stderr}")]
    Command {
        what: String,
        status: String,
        stderr: String,
    },
    #[error("registry: {0}")]
    Registry(String),
}

/// The build epoch: `SOURCE_DATE_EPOCH` if set (reproducible-builds.org's convention), else 0.
/// Every file's mtime and the image config's `created` come from it.
pub fn source_date_epoch() -> Result<u64, Error> {
    source_date_epoch_from(std::env::var("SOURCE_DATE_EPOCH").ok().as_deref())
}

/// [`source_date_epoch`] from the variable's value.
pub fn source_date_epoch_from(value: Option<&str>) -> Result<u64, Error> {
    match value {
        None | Some("") => Ok(0),
        Some(v) => v.trim().parse().map_err(|_| {
            Error::Input(format!(
                "SOURCE_DATE_EPOCH={v:?}: expected seconds since 1970 (e.g. `git log -1 --format=%ct`)"
            ))
        }),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn epoch_from_the_environment_value() {
        assert_eq!(super::source_date_epoch_from(None).unwrap(), 0);
        assert_eq!(
            super::source_date_epoch_from(Some("1700000000")).unwrap(),
            1_700_000_000
        );
        let err = super::source_date_epoch_from(Some("yesterday"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("SOURCE_DATE_EPOCH"), "{err}");
    }
}
