//! Pinning the install to the images just built: the kustomize edits `just image` prints, and
//! the same edits as an overlay kustomization (`target/image/kustomization.yaml`), which the
//! tests render to run exactly what an operator would apply.
//!
//! - The agent: kustomize's `images:` transformer rewrites the DaemonSet's
//!   `ghcr.io/holdfast-mesh/holdfast:<version>` to `<registry>/<repo>@sha256:…`
//!   (`kustomize edit set image NAME=NEW@DIGEST`; with a digest, the tag is dropped).
//! - The filter: a WasmPlugin's `url` is not an image field kustomize knows, so a JSON patch
//!   replaces it with `oci://<registry>/<repo>@sha256:<manifest digest>`
//!   (`kustomize edit add patch --kind WasmPlugin`). With the digest in the URL, pilot-agent
//!   pulls by digest and checks it (istio/istio pkg/wasm/cache.go `getEntry`: "If there is no
//!   checksum and the digest is suffixed in URL, use the digest"); the manifest's digest is what
//!   it compares with (`getOrFetch`, `img.Digest()` in imagefetcher.go).

use crate::registry::ImageRef;

/// The agent image's name in `manifests/agent/daemonset.yaml` (a placeholder until pinned).
pub const AGENT_IMAGE_NAME: &str = "ghcr.io/holdfast-mesh/holdfast";
/// The filter image's name in `manifests/wasmplugin.yaml`.
pub const FILTER_IMAGE_NAME: &str = "ghcr.io/holdfast-mesh/holdfast-filter";

/// The images an install is pinned to (either may be left as shipped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pins {
    /// The agent, by digest.
    pub agent: Option<ImageRef>,
    /// The filter, by digest.
    pub filter: Option<ImageRef>,
}

impl Pins {
    /// Pins to the given references, which must carry a digest.
    pub fn new(agent: Option<ImageRef>, filter: Option<ImageRef>) -> Result<Pins, crate::Error> {
        for r in agent.iter().chain(&filter) {
            if r.digest.is_none() {
                return Err(crate::Error::Input(format!(
                    "{r}: a pin needs the image's digest (name@sha256:…)"
                )));
            }
        }
        Ok(Pins { agent, filter })
    }

    /// The WasmPlugins' `url`.
    pub fn filter_url(&self) -> Option<String> {
        self.filter.as_ref().map(|f| format!("oci://{f}"))
    }

    fn wasmplugin_patch(&self) -> Option<String> {
        let url = self.filter_url()?;
        Some(
            serde_json::json!([{ "op": "replace", "path": "/spec/url", "value": url }]).to_string(),
        )
    }

    /// The `kustomize edit` commands that pin `manifests/` (run in `manifests/`).
    pub fn kustomize_edits(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(a) = &self.agent {
            let digest = a.digest.as_deref().unwrap_or_default();
            out.push(format!(
                "kustomize edit set image {AGENT_IMAGE_NAME}={}@{digest}",
                a.name()
            ));
        }
        if let Some(p) = self.wasmplugin_patch() {
            out.push(format!(
                "kustomize edit add patch --kind WasmPlugin --patch '{p}'"
            ));
        }
        out
    }

    /// The same edits as an overlay of `base` (a path relative to the overlay's directory).
    pub fn overlay(&self, base: &str) -> String {
        let mut s = format!(
            "# Written by `just image`: {base} pinned to the images just built (the same edits as\n\
             # the `kustomize edit` commands it prints). `kubectl apply -k` this directory.\n\
             apiVersion: kustomize.config.k8s.io/v1beta1\n\
             kind: Kustomization\n\
             resources:\n\
             - {base}\n"
        );
        if let Some(a) = &self.agent {
            let digest = a.digest.as_deref().unwrap_or_default();
            s.push_str(&format!(
                "images:\n- name: {AGENT_IMAGE_NAME}\n  newName: {}\n  digest: {digest}\n",
                a.name()
            ));
        }
        if let Some(p) = self.wasmplugin_patch() {
            s.push_str(&format!(
                "patches:\n- target:\n    kind: WasmPlugin\n  patch: '{p}'\n"
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_name_the_digests() {
        let d = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        let pins = Pins::new(
            Some(ImageRef::parse(&format!("127.0.0.1:5000/holdfast/agent@{}", d('a'))).unwrap()),
            Some(ImageRef::parse(&format!("127.0.0.1:5000/holdfast/filter@{}", d('b'))).unwrap()),
        )
        .unwrap();
        let edits = pins.kustomize_edits();
        assert_eq!(
            edits[0],
            format!("kustomize edit set image ghcr.io/holdfast-mesh/holdfast=127.0.0.1:5000/holdfast/agent@{}", d('a'))
        );
        assert!(edits[1].contains(&format!("oci://127.0.0.1:5000/holdfast/filter@{}", d('b'))));
        let overlay = pins.overlay("../../manifests");
        assert!(overlay.contains("- ../../manifests\n"), "{overlay}");
        assert!(Pins::new(Some(ImageRef::parse("127.0.0.1:5000/a:1").unwrap()), None).is_err());
        let agent_only = Pins::new(pins.agent.clone(), None).unwrap();
        assert_eq!(agent_only.kustomize_edits().len(), 1);
        assert!(!agent_only.overlay("m").contains("patches"));
    }
}
