//! What `just image` runs: build both images into OCI layouts, push them to a registry on
//! loopback (its storage kept under the output directory, so `holdfast-image serve` can serve
//! them again), and say how to pin the install to them.

use std::path::{Component, Path, PathBuf};

use crate::agent::{self, AgentInputs};
use crate::arch::Arch;
use crate::debs::DebLock;
use crate::filter::{self, Variant};
use crate::layout::{BuiltImage, OciLayout};
use crate::pin::Pins;
use crate::registry::{ImageRef, LocalRegistry};
use crate::Error;

/// Repositories in the local registry.
pub const AGENT_REPO: &str = "holdfast/agent";
pub const FILTER_REPO: &str = "holdfast/filter";
/// The filter's root id (the WasmPlugins' `pluginName`).
pub const ROOT_ID: &str = "holdfast";

/// Inputs of a release build.
#[derive(Debug, Clone)]
pub struct ReleaseInputs {
    /// The agent binary of each architecture, with its lock of Debian packages: (arch, binary,
    /// lock). `just image` passes amd64 and arm64.
    pub agents: Vec<(Arch, PathBuf, PathBuf)>,
    pub wasm: PathBuf,
    /// `target/image`: layouts in `agent/` and `filter/`, the registry's storage in `registry/`,
    /// the overlay in `kustomization.yaml`.
    pub out: PathBuf,
    pub deb_cache: PathBuf,
    /// The workspace's `manifests/` (the overlay's base).
    pub manifests: PathBuf,
    pub version: String,
    pub epoch: u64,
    pub registry_port: u16,
}

/// What was built and where it went.
#[derive(Debug, Clone)]
pub struct ReleaseReport {
    /// The agent's image index (its digest is what the install pins).
    pub agent: BuiltImage,
    /// Each architecture's image in it.
    pub agent_images: Vec<(Arch, BuiltImage)>,
    pub filter: BuiltImage,
    pub agent_ref: ImageRef,
    pub filter_ref: ImageRef,
    pub pins: Pins,
    pub overlay: PathBuf,
    pub out: PathBuf,
}

/// Builds the agent's image index (one image per architecture) into `out/agent`.
pub fn build_agent(inputs: &ReleaseInputs) -> Result<(BuiltImage, Vec<(Arch, BuiltImage)>), Error> {
    let locks = inputs
        .agents
        .iter()
        .map(|(arch, _, lock)| DebLock::read_for(lock, *arch))
        .collect::<Result<Vec<_>, _>>()?;
    let works: Vec<PathBuf> = inputs
        .agents
        .iter()
        .map(|(arch, _, _)| inputs.out.join(format!("work-{arch}")))
        .collect();
    let agent_inputs: Vec<AgentInputs<'_>> = inputs
        .agents
        .iter()
        .zip(&locks)
        .zip(&works)
        .map(|(((_, binary, _), lock), work)| AgentInputs {
            binary,
            lock,
            deb_cache: &inputs.deb_cache,
            work,
            version: &inputs.version,
            epoch: inputs.epoch,
        })
        .collect();
    let built = agent::build_index(&agent_inputs, &inputs.out.join("agent"), &inputs.version);
    for w in &works {
        let _ = std::fs::remove_dir_all(w);
    }
    built
}

/// Builds the filter image (compat variant) into `out/filter`.
pub fn build_filter(inputs: &ReleaseInputs) -> Result<BuiltImage, Error> {
    let module = std::fs::read(&inputs.wasm).map_err(|source| Error::File {
        what: format!(
            "reading {} (build it: `just filter`)",
            inputs.wasm.display()
        ),
        source,
    })?;
    filter::build(
        &module,
        Variant::Compat,
        &inputs.version,
        ROOT_ID,
        inputs.epoch,
        &inputs.out.join("filter"),
        &inputs.version,
    )
}

/// `to` relative to the directory `from` (both absolute or both relative to the same place).
pub fn relative(from: &Path, to: &Path) -> PathBuf {
    let f: Vec<Component> = from.components().collect();
    let t: Vec<Component> = to.components().collect();
    let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..f.len() {
        out.push("..");
    }
    for c in &t[common..] {
        out.push(c);
    }
    out
}

/// Builds, pushes and pins.
pub fn run(inputs: &ReleaseInputs) -> Result<ReleaseReport, Error> {
    let (agent, agent_images) = build_agent(inputs)?;
    let filter = build_filter(inputs)?;
    let registry = LocalRegistry::start(&inputs.out.join("registry"), inputs.registry_port)?;
    let client = registry.client()?;
    let host = registry.host();
    let mut refs = Vec::new();
    for (dir, built, repo) in [
        ("agent", &agent, AGENT_REPO),
        ("filter", &filter, FILTER_REPO),
    ] {
        let layout = OciLayout::open(&inputs.out.join(dir))?;
        let digest = client.push(&layout, &built.tag, repo, &inputs.version)?;
        refs.push(
            ImageRef::parse(&format!("{host}/{repo}:{}", inputs.version))?.at_digest(&digest),
        );
    }
    drop(registry);
    let pins = Pins::new(Some(refs[0].clone()), Some(refs[1].clone()))?;
    let out_abs = absolute(&inputs.out)?;
    let base = relative(&out_abs, &absolute(&inputs.manifests)?);
    let overlay = inputs.out.join("kustomization.yaml");
    std::fs::write(&overlay, pins.overlay(&base.to_string_lossy())).map_err(|source| {
        Error::File {
            what: format!("writing {}", overlay.display()),
            source,
        }
    })?;
    Ok(ReleaseReport {
        agent_ref: ImageRef::parse(&format!("{host}/{AGENT_REPO}:{}", inputs.version))?,
        filter_ref: ImageRef::parse(&format!("{host}/{FILTER_REPO}:{}", inputs.version))?,
        agent,
        agent_images,
        filter,
        pins,
        overlay,
        out: inputs.out.clone(),
    })
}

fn absolute(p: &Path) -> Result<PathBuf, Error> {
    std::path::absolute(p).map_err(|source| Error::File {
        what: format!("resolving {}", p.display()),
        source,
    })
}

/// Bytes as `12.3 MB (12345678 bytes)`.
pub fn size(bytes: u64) -> String {
    format!("{:.1} MB ({bytes} bytes)", bytes as f64 / 1e6)
}

/// The report `just image` prints.
pub fn describe(r: &ReleaseReport) -> String {
    let mut s = String::new();
    // The agent: an index; a node downloads and unpacks its own platform's image only.
    s.push_str(&format!(
        "agent  {}\n       digest      {} (image index)\n       layout      oci:{}:{}\n",
        r.agent_ref,
        r.agent.digest,
        r.out.join("agent").display(),
        r.agent.tag,
    ));
    for (arch, b) in &r.agent_images {
        s.push_str(&format!(
            "       linux/{arch:5} {}\n                   download {}, unpacked {}\n",
            b.digest,
            size(b.compressed_size),
            size(b.uncompressed_size)
        ));
    }
    s.push_str(&format!(
        "filter {}\n       digest      {}\n       download    {}\n       unpacked    {}\n       layout      oci:{}:{}\n",
        r.filter_ref,
        r.filter.digest,
        size(r.filter.compressed_size),
        size(r.filter.uncompressed_size),
        r.out.join("filter").display(),
        r.filter.tag,
    ));
    s.push_str(&format!(
        "\nPushed to the registry on loopback; its storage stays in {} (serve it again: \
         `holdfast-image serve`).\n\nPin the install to these digests, in manifests/:\n",
        r.out.join("registry").display()
    ));
    for e in r.pins.kustomize_edits() {
        s.push_str(&format!("  {e}\n"));
    }
    s.push_str(&format!(
        "or apply the overlay with the same edits: kubectl apply -k {}\n\
         (A cluster pulls from your registry, not this loopback one: copy the layouts there with \
         `skopeo copy --all --preserve-digests oci:<layout>:<tag> docker://<registry>/<repo>:<tag>` \
         (`--all`: the agent's index with every platform's image), \
         which keeps the digests, and use your registry's name in the edits.)\n",
        r.overlay.parent().unwrap_or(Path::new(".")).display()
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths() {
        assert_eq!(
            relative(Path::new("/w/target/image"), Path::new("/w/manifests")),
            PathBuf::from("../../manifests")
        );
        assert_eq!(
            relative(Path::new("/w"), Path::new("/w/m")),
            PathBuf::from("m")
        );
    }
}
