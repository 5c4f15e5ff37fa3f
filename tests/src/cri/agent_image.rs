//! The agent's image as the containerd backend runs it: built by `holdfast-image`'s library
//! (the code `just image` runs) from the `quota` profile's `holdfast` binary
//! ([`crate::agent::holdfast_pod_binary`]: optimised, as the pod runs under the DaemonSet's CPU
//! quota), pushed to a registry
//! on loopback (Debian's `docker-registry`), and **pulled** through CRI `PullImage` by the
//! reference the rendered DaemonSet names once kustomize's `images:` has pinned it to that
//! digest. `just image` builds the shipped image the same way from the release binary: the two
//! differ in that binary only (the `quota` profile is `release` without fat LTO; docs/images.md).
//!
//! The image is built once per `holdfast` binary (a layout cached next to it, keyed by the
//! sha256 of the binary and of `image/agent-debs.lock`), pushed and pulled once per test binary
//! (one registry and one containerd each).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use holdfast_image::agent::{self, AgentInputs};
use holdfast_image::debs::DebLock;
use holdfast_image::layout::{hex, OciLayout};
use holdfast_image::pin::Pins;
use holdfast_image::registry::{ImageRef, LocalRegistry};
use sha2::{Digest as _, Sha256};

use super::agent_pod::AgentPodSpec;
use super::runtime::Containerd;
use crate::sim::SimError;

/// The repository and tag the tests push the agent to.
pub const TEST_REPO: &str = "holdfast/agent";
pub const TEST_TAG: &str = "test";

fn setup(msg: impl std::fmt::Display) -> SimError {
    SimError::Setup(msg.to_string())
}

fn workspace() -> PathBuf {
    crate::envoy::workspace_root()
}

/// The agent image built from `binary`, in an OCI layout: (layout dir, manifest digest).
/// Reused while the binary and the pinned packages are unchanged.
pub fn build_for(binary: &Path) -> Result<(PathBuf, String), SimError> {
    // One build at a time in a process: the tests of one binary build the same image at once,
    // and their work directories are named by the pid (a second build removed the first's
    // half-written layout: "writing …/blobs/sha256/….tmp: No such file or directory"). The
    // second waits and reuses the first's.
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    let data = std::fs::read(binary).map_err(|source| SimError::Io {
        what: format!("cannot read {}", binary.display()),
        source,
    })?;
    let lock_path = workspace().join(holdfast_image::debs::LOCK_FILE);
    let lock_text = std::fs::read(&lock_path).map_err(|source| SimError::Io {
        what: format!("cannot read {}", lock_path.display()),
        source,
    })?;
    let mut key = Sha256::new();
    key.update(Sha256::digest(&data));
    key.update(Sha256::digest(&lock_text));
    let key = hex(&key.finalize())[..16].to_string();
    // target/<profile>/holdfast → target/image: shared with `just image`'s .deb cache.
    let target = binary
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| setup(format!("{} is not in a target directory", binary.display())))?;
    let images = target.join("image");
    let dir = images.join(format!("test-agent-{key}"));
    let stamp = dir.join("digest");
    if let Ok(digest) = std::fs::read_to_string(&stamp) {
        if OciLayout::open(&dir)
            .and_then(|l| l.image(TEST_TAG))
            .is_ok()
        {
            return Ok((dir, digest.trim().to_string()));
        }
    }
    let lock = DebLock::read(&lock_path).map_err(setup)?;
    let work = images.join(format!("test-agent-{key}.work-{}", std::process::id()));
    let building = images.join(format!("test-agent-{key}.tmp-{}", std::process::id()));
    let built = agent::build(
        &AgentInputs {
            binary,
            lock: &lock,
            deb_cache: &images.join("debs"),
            work: &work,
            version: env!("CARGO_PKG_VERSION"),
            epoch: 0,
        },
        &building,
        TEST_TAG,
    )
    .map_err(|e| setup(format!("building the agent image: {e}")))?;
    let _ = std::fs::remove_dir_all(&work);
    std::fs::write(building.join("digest"), &built.digest).map_err(|source| SimError::Io {
        what: "writing the image's digest".into(),
        source,
    })?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&building, &dir).map_err(|source| SimError::Io {
        what: format!("moving the image layout to {}", dir.display()),
        source,
    })?;
    // Older test images of other binaries: only the newest is kept.
    if let Ok(entries) = std::fs::read_dir(&images) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("test-agent-") && e.path() != dir && !name.contains(".tmp-") {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    Ok((dir, built.digest))
}

/// The pulled agent image: its pinned reference and the rendered DaemonSet pod that runs it.
#[derive(Debug, Clone)]
pub struct PulledAgent {
    /// `127.0.0.1:<port>/holdfast/agent@sha256:…`.
    pub reference: ImageRef,
    /// containerd's image id after the pull.
    pub image_id: String,
    /// The DaemonSet's pod as rendered from the overlay that pins `manifests/` to the image.
    pub spec: AgentPodSpec,
}

static PULLED: OnceLock<Result<PulledAgent, String>> = OnceLock::new();

/// Builds (or reuses), pushes and pulls the agent image into `rt`, once per process, and
/// renders the DaemonSet pinned to it.
pub fn pulled(rt: &'static Containerd) -> Result<PulledAgent, SimError> {
    PULLED
        .get_or_init(|| pull(rt).map_err(|e| e.to_string()))
        .clone()
        .map_err(SimError::Setup)
}

fn pull(rt: &'static Containerd) -> Result<PulledAgent, SimError> {
    let binary = crate::agent::holdfast_pod_binary().map_err(setup)?;
    let (layout_dir, digest) = build_for(&binary)?;
    let host = {
        let mut reg = rt.registry.lock().unwrap_or_else(|p| p.into_inner());
        if reg.is_none() {
            *reg = Some(
                LocalRegistry::start(&rt.dir.join("registry/storage"), 0)
                    .map_err(|e| setup(format!("starting the test registry: {e}")))?,
            );
        }
        reg.as_ref().map(LocalRegistry::host).unwrap_or_default()
    };
    rt.allow_plain_http(&host)?;
    let client = holdfast_image::registry::Registry::new(&host).map_err(setup)?;
    let layout = OciLayout::open(&layout_dir).map_err(setup)?;
    let pushed = client
        .push(&layout, TEST_TAG, TEST_REPO, TEST_TAG)
        .map_err(|e| setup(format!("pushing the agent image: {e}")))?;
    if pushed != digest {
        return Err(setup(format!(
            "the registry has the agent image as {pushed}, the layout as {digest}"
        )));
    }
    let reference = ImageRef::parse(&format!("{host}/{TEST_REPO}:{TEST_TAG}"))
        .map_err(setup)?
        .at_digest(&digest);
    let spec = render_pinned(&rt.dir.join("overlay"), &reference)?;
    // The kubelet pulls what the pod spec names.
    let image = spec.image()?.to_string();
    if image != reference.to_string() {
        return Err(setup(format!(
            "the rendered DaemonSet runs {image}, not the pinned {reference}: the image name in \
             manifests/agent/daemonset.yaml and holdfast_image::pin::AGENT_IMAGE_NAME differ"
        )));
    }
    let image_id = rt.pull(&image)?;
    Ok(PulledAgent {
        reference,
        image_id,
        spec,
    })
}

/// Writes the overlay `just image` would write for `agent` (only the agent pinned) into `dir`,
/// renders it, and returns the DaemonSet's pod.
pub fn render_pinned(dir: &Path, agent: &ImageRef) -> Result<AgentPodSpec, SimError> {
    let pins = Pins::new(Some(agent.clone()), None).map_err(setup)?;
    std::fs::create_dir_all(dir).map_err(|source| SimError::Io {
        what: format!("cannot create {}", dir.display()),
        source,
    })?;
    let dir = std::path::absolute(dir).map_err(|source| SimError::Io {
        what: "resolving the overlay directory".into(),
        source,
    })?;
    let base = holdfast_image::release::relative(&dir, &workspace().join("manifests"));
    std::fs::write(
        dir.join("kustomization.yaml"),
        pins.overlay(&base.to_string_lossy()),
    )
    .map_err(|source| SimError::Io {
        what: "writing the overlay".into(),
        source,
    })?;
    let rel = dir.strip_prefix("/").unwrap_or(&dir);
    let rendered = crate::kustomize::render(Path::new("/"), rel)
        .map_err(|e| setup(format!("rendering the overlay: {e:#}")))?;
    let ds = rendered
        .objects
        .iter()
        .find(|o| o.kind() == "DaemonSet" && o.name() == "holdfast-agent")
        .ok_or_else(|| setup("the rendered install has no DaemonSet holdfast-agent"))?;
    AgentPodSpec::from_daemonset(&ds.value)
}
