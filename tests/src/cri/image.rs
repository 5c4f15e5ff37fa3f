//! Container images without a registry: an OCI image layout (`oci-layout`, `index.json`,
//! `blobs/sha256/…`) with one uncompressed layer holding Debian's static busybox, packed as a tar
//! and imported with `ctr images import`. Host binaries that need glibc (Envoy, `sim-app`,
//! iptables) are not copied in: the containers get the host's `/usr` as a read-only bind mount
//! (see [`super::kubelet`]), so the layer only links `/lib` and `/lib64` into `/usr` as Debian's
//! merged-usr layout does.
//!
//! Layout and media types: the OCI image spec (opencontainers/image-spec `image-layout.md`,
//! `manifest.md`, `config.md`); the image name comes from the `io.containerd.image.name`
//! annotation in `index.json`, which `ctr images import` reads (containerd
//! `images/archive/importer.go`).

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::sim::netns::run_output as run;
use crate::sim::SimError;

/// Debian's `busybox-static` (`just setup` installs it).
pub const BUSYBOX: &str = "/bin/busybox";

/// The busybox applets the images link (the pause process is `sleep`).
const APPLETS: [&str; 8] = ["sh", "sleep", "cat", "ls", "echo", "id", "kill", "true"];

fn io(what: String) -> impl FnOnce(std::io::Error) -> SimError {
    move |source| SimError::Io { what, source }
}

/// Stores `data` as a blob of the layout; returns its digest (`sha256:<hex>`) and size.
fn put_blob(layout: &Path, data: &[u8]) -> Result<(String, usize), SimError> {
    let tmp = layout.join("blob.tmp");
    std::fs::write(&tmp, data).map_err(io(format!("cannot write {}", tmp.display())))?;
    put_blob_file(layout, &tmp)
}

fn put_blob_file(layout: &Path, file: &Path) -> Result<(String, usize), SimError> {
    let path = file.to_string_lossy().into_owned();
    let sum = run("sha256sum", &[&path])?;
    let hex = sum
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    if hex.len() != 64 {
        return Err(SimError::Setup(format!("sha256sum said {sum:?}")));
    }
    let size = std::fs::metadata(file)
        .map_err(io(format!("cannot stat {path}")))?
        .len() as usize;
    let dest = layout.join("blobs/sha256").join(&hex);
    std::fs::rename(file, &dest).map_err(io(format!("cannot move {path}")))?;
    Ok((format!("sha256:{hex}"), size))
}

/// Builds the busybox image `name` (e.g. `localhost/hf-base:local`) with `cmd` as its default
/// command, as an OCI layout tar under `scratch`; returns the tar's path.
pub fn build_busybox_image(scratch: &Path, name: &str, cmd: &[&str]) -> Result<PathBuf, SimError> {
    if !Path::new(BUSYBOX).exists() {
        return Err(SimError::Setup(format!(
            "{BUSYBOX} is missing: install Debian's busybox-static (`just setup`)"
        )));
    }
    let work = scratch.join("image-build");
    let _ = std::fs::remove_dir_all(&work);
    let rootfs = work.join("rootfs");
    let layout = work.join("layout");
    for d in [
        "bin", "etc", "run", "tmp", "proc", "sys", "dev", "usr", "var/run",
    ] {
        let p = rootfs.join(d);
        std::fs::create_dir_all(&p).map_err(io(format!("cannot create {}", p.display())))?;
    }
    std::fs::create_dir_all(layout.join("blobs/sha256"))
        .map_err(io(format!("cannot create {}", layout.display())))?;
    std::fs::copy(BUSYBOX, rootfs.join("bin/busybox"))
        .map_err(io(format!("cannot copy {BUSYBOX}")))?;
    let link = |target: &str, at: PathBuf| {
        std::os::unix::fs::symlink(target, &at).map_err(io(format!("cannot link {}", at.display())))
    };
    for applet in APPLETS {
        link("busybox", rootfs.join("bin").join(applet))?;
    }
    // Debian's merged /usr: /lib and /lib64 point into /usr, which containers get from the host.
    link("usr/lib", rootfs.join("lib"))?;
    link("usr/lib64", rootfs.join("lib64"))?;
    link("usr/sbin", rootfs.join("sbin"))?;
    // uid 1337 needs a world-writable /tmp (Envoy's domain sockets, if any).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(rootfs.join("tmp"), std::fs::Permissions::from_mode(0o1777))
        .map_err(io("cannot chmod /tmp of the image".into()))?;

    let layer_tar = work.join("layer.tar");
    let (rootfs_s, layer_s) = (
        rootfs.to_string_lossy().into_owned(),
        layer_tar.to_string_lossy().into_owned(),
    );
    run(
        "tar",
        &[
            "--numeric-owner",
            "--owner=0",
            "--group=0",
            "-cf",
            &layer_s,
            "-C",
            &rootfs_s,
            ".",
        ],
    )?;
    // An uncompressed layer: its diff id is its digest.
    let (layer_digest, layer_size) = put_blob_file(&layout, &layer_tar)?;
    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Cmd": cmd,
        },
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    });
    let (config_digest, config_size) = put_blob(&layout, config.to_string().as_bytes())?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config_size,
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": layer_digest,
            "size": layer_size,
        }],
    });
    let (manifest_digest, manifest_size) = put_blob(&layout, manifest.to_string().as_bytes())?;
    let tag = name.rsplit_once(':').map(|(_, t)| t).unwrap_or("latest");
    let index = json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": manifest_size,
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    });
    let write = |file: &str, text: String| {
        let p = layout.join(file);
        std::fs::write(&p, text).map_err(io(format!("cannot write {}", p.display())))
    };
    write("index.json", index.to_string())?;
    write(
        "oci-layout",
        json!({"imageLayoutVersion": "1.0.0"}).to_string(),
    )?;
    let image_tar = scratch.join(format!(
        "{}.oci.tar",
        name.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
    ));
    let (layout_s, image_s) = (
        layout.to_string_lossy().into_owned(),
        image_tar.to_string_lossy().into_owned(),
    );
    run("tar", &["-cf", &image_s, "-C", &layout_s, "."])?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(image_tar)
}
