//! An OCI image layout on disk (`oci-layout`, `index.json`, `blobs/sha256/<hex>`), the form
//! `just image` leaves its images in and pushes from (opencontainers/image-spec
//! `image-layout.md`), and the image manifest and config written into it (`manifest.md`,
//! `config.md`). skopeo reads the same directory as `oci:<dir>:<tag>`.
//!
//! An image's digest is its manifest's sha256: what a registry serves as `Docker-Content-Digest`,
//! what `image@sha256:…` pins, and what Istio's Wasm fetcher compares a WasmPlugin's `sha256`
//! with (istio/istio pkg/wasm/imagefetcher.go `img.Digest()`, cache.go `getOrFetch`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};

use crate::layer::Layer;
use crate::Error;

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
/// The annotation naming a manifest's tag in a layout's `index.json`.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// `sha256:<hex>` of `data`.
pub fn sha256_digest(data: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(data)))
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The hex part of a `sha256:<hex>` digest, checked.
pub fn digest_hex(digest: &str) -> Result<&str, Error> {
    match digest.strip_prefix("sha256:") {
        Some(h) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()) => Ok(h),
        _ => Err(Error::Input(format!(
            "{digest:?} is not a sha256 digest (sha256:<64 hex digits>)"
        ))),
    }
}

/// A content descriptor (image-spec `descriptor.md`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Descriptor {
    #[serde(rename = "mediaType")]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Value>,
}

impl Descriptor {
    pub fn of(media_type: &str, data: &[u8]) -> Descriptor {
        Descriptor {
            media_type: media_type.to_string(),
            digest: sha256_digest(data),
            size: data.len() as u64,
            annotations: None,
            platform: None,
        }
    }
}

/// An image manifest (image-spec `manifest.md`; Docker's v2 schema 2 has the same shape).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    #[serde(rename = "schemaVersion")]
    pub schema_version: u32,
    #[serde(rename = "mediaType", default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

/// An image index / manifest list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Index {
    #[serde(rename = "schemaVersion")]
    pub schema_version: u32,
    #[serde(rename = "mediaType", default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub manifests: Vec<Descriptor>,
}

/// An image written to a layout: what `just image` prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltImage {
    /// The manifest's digest (`sha256:<hex>`): the image's identity.
    pub digest: String,
    /// The manifest's bytes, exactly as stored (and as pushed: the digest depends on them).
    pub manifest: Vec<u8>,
    /// The tag in the layout's index.
    pub tag: String,
    /// What a pull downloads: manifest, config and compressed layers.
    pub compressed_size: u64,
    /// The layers' tars: what the image takes on a node's disk.
    pub uncompressed_size: u64,
}

/// A layer as the manifest lists it.
pub struct ManifestLayer<'a> {
    pub media_type: &'a str,
    /// The blob as stored (compressed or not, as `media_type` says).
    pub blob: &'a [u8],
    /// The uncompressed bytes' size (for [`BuiltImage::uncompressed_size`]).
    pub uncompressed_size: u64,
}

impl<'a> ManifestLayer<'a> {
    /// A gzip tar layer (`application/vnd.oci.image.layer.v1.tar+gzip`).
    pub fn gzip(layer: &'a Layer) -> ManifestLayer<'a> {
        ManifestLayer {
            media_type: OCI_LAYER_GZIP,
            blob: &layer.gzip,
            uncompressed_size: layer.tar.len() as u64,
        }
    }
}

/// An OCI image layout directory.
#[derive(Debug, Clone)]
pub struct OciLayout {
    dir: PathBuf,
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::File { what, source }
}

impl OciLayout {
    /// A new, empty layout at `dir` (whatever was there is removed).
    pub fn create(dir: &Path) -> Result<OciLayout, Error> {
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(io(format!("removing {}", dir.display())))?;
        }
        let blobs = dir.join("blobs/sha256");
        std::fs::create_dir_all(&blobs).map_err(io(format!("creating {}", blobs.display())))?;
        let layout = OciLayout {
            dir: dir.to_path_buf(),
        };
        layout.write("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        Ok(layout)
    }

    /// An existing layout.
    pub fn open(dir: &Path) -> Result<OciLayout, Error> {
        if !dir.join("oci-layout").is_file() {
            return Err(Error::Input(format!(
                "{} is not an OCI image layout (no oci-layout file): build it with `just image`",
                dir.display()
            )));
        }
        Ok(OciLayout {
            dir: dir.to_path_buf(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn write(&self, name: &str, data: &[u8]) -> Result<(), Error> {
        let path = self.dir.join(name);
        std::fs::write(&path, data).map_err(io(format!("writing {}", path.display())))
    }

    /// Stores a blob; returns its digest.
    pub fn put_blob(&self, data: &[u8]) -> Result<String, Error> {
        let digest = sha256_digest(data);
        let path = self.blob_path(&digest)?;
        if !path.is_file() {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, data).map_err(io(format!("writing {}", tmp.display())))?;
            std::fs::rename(&tmp, &path).map_err(io(format!("renaming {}", tmp.display())))?;
        }
        Ok(digest)
    }

    fn blob_path(&self, digest: &str) -> Result<PathBuf, Error> {
        Ok(self.dir.join("blobs/sha256").join(digest_hex(digest)?))
    }

    /// A blob's bytes, checked against its digest.
    pub fn blob(&self, digest: &str) -> Result<Vec<u8>, Error> {
        let path = self.blob_path(digest)?;
        let data = std::fs::read(&path).map_err(io(format!("reading {}", path.display())))?;
        let actual = sha256_digest(&data);
        if actual != digest {
            return Err(Error::Input(format!(
                "{}: content is {actual}, not {digest} (the layout is damaged: rebuild it)",
                path.display()
            )));
        }
        Ok(data)
    }

    /// The layout's `index.json`.
    pub fn index(&self) -> Result<Index, Error> {
        let path = self.dir.join("index.json");
        let text = std::fs::read(&path).map_err(io(format!("reading {}", path.display())))?;
        serde_json::from_slice(&text)
            .map_err(|e| Error::Input(format!("{}: not an OCI index: {e}", path.display())))
    }

    /// The manifest tagged `tag` in the index: (descriptor, manifest bytes, parsed manifest).
    /// An image index tagged `tag` is refused: take one of its images with [`Self::image_for`].
    pub fn image(&self, tag: &str) -> Result<(Descriptor, Vec<u8>, Manifest), Error> {
        let desc = self.tagged(tag)?;
        if desc.media_type == OCI_INDEX {
            return Err(Error::Input(format!(
                "{}: {tag:?} is an image index: name the platform",
                self.dir.display()
            )));
        }
        let bytes = self.blob(&desc.digest)?;
        let manifest: Manifest = serde_json::from_slice(&bytes)
            .map_err(|e| Error::Input(format!("manifest {}: {e}", desc.digest)))?;
        Ok((desc, bytes, manifest))
    }

    /// Writes an image (config, layers, manifest) and tags it `tag` in `index.json` (the only
    /// image of the layout). The manifest is `manifest_media_type` (OCI or Docker v2).
    pub fn write_image(
        &self,
        tag: &str,
        config_media_type: &str,
        config: &[u8],
        layers: &[ManifestLayer<'_>],
    ) -> Result<BuiltImage, Error> {
        let mut built = self.write_manifest(config_media_type, config, layers)?;
        let mut desc = Descriptor::of(OCI_MANIFEST, &built.manifest);
        desc.annotations = Some([(REF_NAME.to_string(), tag.to_string())].into());
        self.write_top(desc)?;
        built.tag = tag.to_string();
        Ok(built)
    }

    /// Writes an image's config, layers and manifest as blobs, untagged (an index names it).
    pub fn write_manifest(
        &self,
        config_media_type: &str,
        config: &[u8],
        layers: &[ManifestLayer<'_>],
    ) -> Result<BuiltImage, Error> {
        let config_desc = Descriptor::of(config_media_type, config);
        self.put_blob(config)?;
        let mut compressed = config.len() as u64;
        let mut uncompressed = 0;
        let mut descs = Vec::new();
        for l in layers {
            self.put_blob(l.blob)?;
            compressed += l.blob.len() as u64;
            uncompressed += l.uncompressed_size;
            descs.push(Descriptor::of(l.media_type, l.blob));
        }
        let manifest = Manifest {
            schema_version: 2,
            media_type: Some(OCI_MANIFEST.to_string()),
            config: config_desc,
            layers: descs,
        };
        let bytes = serde_json::to_vec(&manifest).map_err(|e| Error::Input(e.to_string()))?;
        let digest = self.put_blob(&bytes)?;
        compressed += bytes.len() as u64;
        Ok(BuiltImage {
            digest,
            manifest: bytes,
            tag: String::new(),
            compressed_size: compressed,
            uncompressed_size: uncompressed,
        })
    }

    /// Writes an OCI image index of `images` (each written by [`Self::write_manifest`], with
    /// its platform: `{"architecture": "arm64", "os": "linux"}`) and tags it `tag` in
    /// `index.json`. The result's `manifest` is the index's bytes, its sizes the sums of the
    /// images'.
    pub fn write_index(
        &self,
        tag: &str,
        images: &[(Value, &BuiltImage)],
    ) -> Result<BuiltImage, Error> {
        let mut manifests = Vec::new();
        let (mut compressed, mut uncompressed) = (0, 0);
        for (platform, b) in images {
            let mut d = Descriptor::of(OCI_MANIFEST, &b.manifest);
            d.platform = Some(platform.clone());
            manifests.push(d);
            compressed += b.compressed_size;
            uncompressed += b.uncompressed_size;
        }
        let index = Index {
            schema_version: 2,
            media_type: Some(OCI_INDEX.to_string()),
            manifests,
        };
        let bytes = serde_json::to_vec(&index).map_err(|e| Error::Input(e.to_string()))?;
        let digest = self.put_blob(&bytes)?;
        let mut desc = Descriptor::of(OCI_INDEX, &bytes);
        desc.annotations = Some([(REF_NAME.to_string(), tag.to_string())].into());
        self.write_top(desc)?;
        Ok(BuiltImage {
            digest,
            compressed_size: compressed + bytes.len() as u64,
            manifest: bytes,
            tag: tag.to_string(),
            uncompressed_size: uncompressed,
        })
    }

    /// `index.json` naming `desc` alone.
    fn write_top(&self, desc: Descriptor) -> Result<(), Error> {
        let index = Index {
            schema_version: 2,
            media_type: Some(OCI_INDEX.to_string()),
            manifests: vec![desc],
        };
        let index_bytes = serde_json::to_vec(&index).map_err(|e| Error::Input(e.to_string()))?;
        self.write("index.json", &index_bytes)
    }

    /// The tagged image index `tag` (a layout [`Self::write_index`] wrote): (descriptor, its
    /// bytes, parsed).
    pub fn image_index(&self, tag: &str) -> Result<(Descriptor, Vec<u8>, Index), Error> {
        let desc = self.tagged(tag)?;
        if desc.media_type != OCI_INDEX {
            return Err(Error::Input(format!(
                "{}: {tag:?} is a {}, not an image index",
                self.dir.display(),
                desc.media_type
            )));
        }
        let bytes = self.blob(&desc.digest)?;
        let index: Index = serde_json::from_slice(&bytes)
            .map_err(|e| Error::Input(format!("index {}: {e}", desc.digest)))?;
        Ok((desc, bytes, index))
    }

    /// The manifest for `os`/`architecture` in the image tagged `tag`: the tagged manifest
    /// itself if its config says that platform, or the index's entry for it, as a runtime picks
    /// it (containerd's platform matcher: the descriptor's `platform`).
    pub fn image_for(
        &self,
        tag: &str,
        architecture: &str,
    ) -> Result<(Descriptor, Vec<u8>, Manifest), Error> {
        let desc = self.tagged(tag)?;
        if desc.media_type != OCI_INDEX {
            return self.image(tag);
        }
        let (_, _, index) = self.image_index(tag)?;
        let found = index
            .manifests
            .iter()
            .find(|d| {
                d.platform
                    .as_ref()
                    .is_some_and(|p| p["os"] == "linux" && p["architecture"] == architecture)
            })
            .cloned()
            .ok_or_else(|| {
                Error::Input(format!(
                    "{}: the index {tag:?} has no linux/{architecture} image",
                    self.dir.display()
                ))
            })?;
        let bytes = self.blob(&found.digest)?;
        let manifest: Manifest = serde_json::from_slice(&bytes)
            .map_err(|e| Error::Input(format!("manifest {}: {e}", found.digest)))?;
        Ok((found, bytes, manifest))
    }

    fn tagged(&self, tag: &str) -> Result<Descriptor, Error> {
        self.index()?
            .manifests
            .iter()
            .find(|d| {
                d.annotations
                    .as_ref()
                    .and_then(|a| a.get(REF_NAME))
                    .is_some_and(|t| t == tag)
            })
            .cloned()
            .ok_or_else(|| {
                Error::Input(format!(
                    "{}: no image tagged {tag:?} in index.json",
                    self.dir.display()
                ))
            })
    }
}

/// Unpacks the image tagged `tag` into `dest` the way a runtime does (layers in order, gzip or
/// plain tar), for tests that run the image's files. Whiteouts are not needed: the images built
/// here never delete a lower layer's file.
pub fn unpack(layout: &OciLayout, tag: &str, dest: &Path) -> Result<(), Error> {
    let (_, _, manifest) = layout.image(tag)?;
    unpack_manifest(layout, &manifest, dest)
}

/// Unpacks the `linux/<architecture>` image of the image (or index) tagged `tag`.
pub fn unpack_for(
    layout: &OciLayout,
    tag: &str,
    architecture: &str,
    dest: &Path,
) -> Result<(), Error> {
    let (_, _, manifest) = layout.image_for(tag, architecture)?;
    unpack_manifest(layout, &manifest, dest)
}

fn unpack_manifest(layout: &OciLayout, manifest: &Manifest, dest: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(dest).map_err(io(format!("creating {}", dest.display())))?;
    for l in &manifest.layers {
        let blob = layout.blob(&l.digest)?;
        let tar: Box<dyn std::io::Read> = match l.media_type.as_str() {
            OCI_LAYER_GZIP | DOCKER_LAYER_GZIP => Box::new(flate2::read::GzDecoder::new(&blob[..])),
            "application/vnd.oci.image.layer.v1.tar" => Box::new(&blob[..]),
            other => {
                return Err(Error::Input(format!(
                    "layer {} is {other}, not a filesystem layer",
                    l.digest
                )))
            }
        };
        let mut archive = tar::Archive::new(tar);
        archive.set_preserve_permissions(true);
        archive.set_overwrite(true);
        archive.unpack(dest).map_err(io(format!(
            "unpacking layer {} into {}",
            l.digest,
            dest.display()
        )))?;
    }
    Ok(())
}

/// The build time as the image config's `created` (RFC 3339, UTC) from a Unix epoch.
pub fn rfc3339(epoch: u64) -> String {
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let days = (epoch / 86_400) as i64;
    let secs = epoch % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// An image config (image-spec `config.md`) for a Linux image of `layers`.
pub fn image_config(
    architecture: &str,
    epoch: u64,
    container: Value,
    layers: &[&Layer],
) -> Result<Vec<u8>, Error> {
    let diff_ids: Vec<String> = layers.iter().map(|l| sha256_digest(&l.tar)).collect();
    let config = json!({
        "architecture": architecture,
        "os": "linux",
        "created": rfc3339(epoch),
        "config": container,
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
    });
    serde_json::to_vec(&config).map_err(|e| Error::Input(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_of_known_epochs() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn digests_are_checked() {
        assert!(digest_hex("sha256:abc").is_err());
        assert!(digest_hex(&format!("sha512:{}", "a".repeat(64))).is_err());
        assert_eq!(
            sha256_digest(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn an_index_names_each_platform_s_image() {
        let dir = std::env::temp_dir().join(format!("hf-index-test-{}", std::process::id()));
        let layout = OciLayout::create(&dir).unwrap();
        let mut built = Vec::new();
        for arch in ["amd64", "arm64"] {
            let mut b = crate::layer::LayerBuilder::new();
            b.file("arch", arch.as_bytes().to_vec(), 0o644).unwrap();
            let layer = b.build(0).unwrap();
            let config = image_config(arch, 0, json!({}), &[&layer]).unwrap();
            let img = layout
                .write_manifest(OCI_CONFIG, &config, &[ManifestLayer::gzip(&layer)])
                .unwrap();
            built.push((json!({"architecture": arch, "os": "linux"}), img));
        }
        let refs: Vec<(Value, &BuiltImage)> = built.iter().map(|(p, b)| (p.clone(), b)).collect();
        let index = layout.write_index("t", &refs).unwrap();
        let (desc, bytes, parsed) = layout.image_index("t").unwrap();
        assert_eq!(desc.digest, index.digest);
        assert_eq!(sha256_digest(&bytes), index.digest);
        assert_eq!(parsed.manifests.len(), 2);
        for (i, arch) in ["amd64", "arm64"].into_iter().enumerate() {
            let (d, _, m) = layout.image_for("t", arch).unwrap();
            assert_eq!(d.digest, built[i].1.digest, "{arch}");
            let config: Value =
                serde_json::from_slice(&layout.blob(&m.config.digest).unwrap()).unwrap();
            assert_eq!(config["architecture"], arch);
        }
        assert!(layout.image_for("t", "riscv64").is_err());
        assert!(layout.image("t").is_err(), "an index is not one image");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_layout_round_trips_and_detects_damage() {
        let dir = std::env::temp_dir().join(format!("hf-layout-test-{}", std::process::id()));
        let layout = OciLayout::create(&dir).unwrap();
        let mut b = crate::layer::LayerBuilder::new();
        b.file("x", b"hello".to_vec(), 0o644).unwrap();
        let layer = b.build(0).unwrap();
        let config = image_config("amd64", 0, json!({}), &[&layer]).unwrap();
        let built = layout
            .write_image("t", OCI_CONFIG, &config, &[ManifestLayer::gzip(&layer)])
            .unwrap();
        let (desc, bytes, m) = OciLayout::open(&dir).unwrap().image("t").unwrap();
        assert_eq!(desc.digest, built.digest);
        assert_eq!(sha256_digest(&bytes), built.digest);
        assert_eq!(m.layers[0].digest, sha256_digest(&layer.gzip));
        assert!(layout.image("other").is_err());
        // Damage a blob: reading it says so.
        let path = dir
            .join("blobs/sha256")
            .join(digest_hex(&m.layers[0].digest).unwrap());
        std::fs::write(&path, b"x").unwrap();
        let err = layout.blob(&m.layers[0].digest).unwrap_err().to_string();
        assert!(err.contains("damaged"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
