//! An OCI registry on loopback: Debian's `docker-registry` (CNCF distribution 2.8) started as a
//! child process ([`LocalRegistry`]), and the few calls of the distribution API holdfast needs
//! ([`Registry`]): push an image from a layout (blob upload, manifest put), pull a manifest and
//! its blobs (opencontainers/distribution-spec `spec.md`, "Pull" and "Push").
//!
//! Plain HTTP only, and only to loopback: this is the registry of `just image` and the tests.
//! To publish to a real registry, copy the layout with skopeo (`skopeo copy --preserve-digests
//! oci:target/image/agent:0.1.0 docker://…`; docs/install.md).

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::layout::{
    sha256_digest, OciLayout, DOCKER_MANIFEST, DOCKER_MANIFEST_LIST, OCI_INDEX, OCI_MANIFEST,
};
use crate::Error;

/// Debian's distribution registry (`apt-get install docker-registry`; `just setup`).
pub const REGISTRY_BINARY: &str = "docker-registry";

/// An image reference: `host[:port]/repository[:tag][@sha256:<hex>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    pub registry: String,
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

impl ImageRef {
    /// Parses a reference with an explicit registry host (no Docker Hub defaults).
    pub fn parse(s: &str) -> Result<ImageRef, Error> {
        let bad = |why: &str| Error::Input(format!("image reference {s:?}: {why}"));
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => {
                crate::layout::digest_hex(d)?;
                (r, Some(d.to_string()))
            }
            None => (s, None),
        };
        let (registry, path) = rest
            .split_once('/')
            .ok_or_else(|| bad("needs a registry host and a repository (host/repo[:tag])"))?;
        if registry.is_empty()
            || !(registry.contains('.') || registry.contains(':') || registry == "localhost")
        {
            return Err(bad(
                "the first part must be a registry host (with a '.' or a port)",
            ));
        }
        let (repository, tag) = match path.rsplit_once(':') {
            Some((r, t)) if !t.contains('/') => (r, Some(t.to_string())),
            _ => (path, None),
        };
        let valid = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-/".contains(c);
        if repository.is_empty() || !repository.chars().all(valid) {
            return Err(bad(
                "the repository must be lowercase letters, digits, '.', '_', '-', '/'",
            ));
        }
        if tag.as_deref().is_some_and(|t| {
            t.is_empty()
                || t.len() > 128
                || !t
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        }) {
            return Err(bad(
                "the tag must be letters, digits, '.', '_', '-' (at most 128)",
            ));
        }
        Ok(ImageRef {
            registry: registry.to_string(),
            repository: repository.to_string(),
            tag,
            digest,
        })
    }

    /// The digest if pinned, else the tag (`latest` if neither): what a manifest GET asks for.
    pub fn reference(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or("latest")
    }

    /// `registry/repository` (no tag or digest): the name kustomize's `images:` matches.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// This reference pinned to `digest` (the tag dropped, as kustomize's `digest:` does).
    pub fn at_digest(&self, digest: &str) -> ImageRef {
        ImageRef {
            tag: None,
            digest: Some(digest.to_string()),
            ..self.clone()
        }
    }
}

impl std::fmt::Display for ImageRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.name())?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// A manifest as a registry served it.
#[derive(Debug, Clone)]
pub struct FetchedManifest {
    pub bytes: Vec<u8>,
    /// The `Content-Type` it was served with.
    pub media_type: String,
    /// sha256 of `bytes` (the registry's `Docker-Content-Digest` is checked against it).
    pub digest: String,
}

/// A client for one registry on loopback, over plain HTTP.
#[derive(Debug, Clone)]
pub struct Registry {
    base: String,
    agent: ureq::Agent,
}

fn http(what: String) -> impl FnOnce(ureq::Error) -> Error {
    move |e| match e {
        ureq::Error::Status(code, resp) => {
            let body = resp.into_string().unwrap_or_default();
            Error::Registry(format!("{what}: HTTP {code}: {}", body.trim()))
        }
        other => Error::Registry(format!("{what}: {other}")),
    }
}

impl Registry {
    /// A client for `host:port`, which must be a loopback address or `localhost`.
    pub fn new(host: &str) -> Result<Registry, Error> {
        let name = host.rsplit_once(':').map_or(host, |(h, _)| h);
        let loopback = name == "localhost"
            || name
                .trim_matches(|c| c == '[' || c == ']')
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if !loopback {
            return Err(Error::Input(format!(
                "{host}: this client speaks plain HTTP and only to a registry on loopback; \
                 publish to {host} with skopeo (docs/install.md)"
            )));
        }
        Ok(Registry {
            base: format!("http://{host}"),
            agent: ureq::AgentBuilder::new()
                .timeout(Duration::from_secs(60))
                .redirects(0)
                .build(),
        })
    }

    /// Whether the registry answers the API's base endpoint.
    pub fn ping(&self) -> bool {
        self.agent
            .get(&format!("{}/v2/", self.base))
            .timeout(Duration::from_secs(1))
            .call()
            .is_ok()
    }

    fn blob_exists(&self, repo: &str, digest: &str) -> bool {
        self.agent
            .head(&format!("{}/v2/{repo}/blobs/{digest}", self.base))
            .call()
            .is_ok()
    }

    /// Uploads one blob (monolithic upload: POST for a session, PUT with the digest).
    pub fn put_blob(&self, repo: &str, data: &[u8]) -> Result<String, Error> {
        let digest = sha256_digest(data);
        if self.blob_exists(repo, &digest) {
            return Ok(digest);
        }
        let start = self
            .agent
            .post(&format!("{}/v2/{repo}/blobs/uploads/", self.base))
            .call()
            .map_err(http(format!("starting the upload of {digest} to {repo}")))?;
        let location = start.header("Location").ok_or_else(|| {
            Error::Registry(format!("upload of {digest}: the registry gave no Location"))
        })?;
        let mut url = if location.starts_with('/') {
            format!("{}{location}", self.base)
        } else {
            location.to_string()
        };
        url.push(if url.contains('?') { '&' } else { '?' });
        url.push_str(&format!("digest={digest}"));
        self.agent
            .put(&url)
            .set("Content-Type", "application/octet-stream")
            .send_bytes(data)
            .map_err(http(format!("uploading {digest} to {repo}")))?;
        Ok(digest)
    }

    /// Pushes the image tagged `layout_tag` in `layout` as `repo:tag`; returns the manifest
    /// digest the registry reports (checked against the layout's). An image index is pushed
    /// with every image it names: each image's blobs, its manifest by digest, then the index
    /// under the tag (the registry refuses an index naming manifests it does not have).
    pub fn push(
        &self,
        layout: &OciLayout,
        layout_tag: &str,
        repo: &str,
        tag: &str,
    ) -> Result<String, Error> {
        if let Ok((desc, index_bytes, index)) = layout.image_index(layout_tag) {
            for m in &index.manifests {
                let bytes = layout.blob(&m.digest)?;
                let manifest: crate::layout::Manifest = serde_json::from_slice(&bytes)
                    .map_err(|e| Error::Input(format!("manifest {}: {e}", m.digest)))?;
                self.put_image(layout, repo, &m.digest, &m.media_type, &bytes, &manifest)?;
            }
            self.put_manifest(repo, tag, &desc.media_type, &index_bytes, &desc.digest)?;
            return Ok(desc.digest);
        }
        let (desc, manifest_bytes, manifest) = layout.image(layout_tag)?;
        self.put_image(
            layout,
            repo,
            tag,
            &desc.media_type,
            &manifest_bytes,
            &manifest,
        )?;
        Ok(desc.digest)
    }

    /// Uploads an image's blobs and puts its manifest as `repo:reference`.
    fn put_image(
        &self,
        layout: &OciLayout,
        repo: &str,
        reference: &str,
        media_type: &str,
        manifest_bytes: &[u8],
        manifest: &crate::layout::Manifest,
    ) -> Result<(), Error> {
        for blob in std::iter::once(&manifest.config).chain(&manifest.layers) {
            self.put_blob(repo, &layout.blob(&blob.digest)?)?;
        }
        self.put_manifest(
            repo,
            reference,
            media_type,
            manifest_bytes,
            &sha256_digest(manifest_bytes),
        )
    }

    /// PUTs a manifest or index; the registry must store it under `digest` (unchanged bytes).
    fn put_manifest(
        &self,
        repo: &str,
        reference: &str,
        media_type: &str,
        bytes: &[u8],
        digest: &str,
    ) -> Result<(), Error> {
        let resp = self
            .agent
            .put(&format!("{}/v2/{repo}/manifests/{reference}", self.base))
            .set("Content-Type", media_type)
            .send_bytes(bytes)
            .map_err(http(format!("putting the manifest {repo}:{reference}")))?;
        let served = resp.header("Docker-Content-Digest").map(str::to_string);
        if let Some(d) = served.as_deref() {
            if d != digest {
                return Err(Error::Registry(format!(
                    "the registry stored {repo}:{reference} as {d}, not {digest}: it rewrote the manifest"
                )));
            }
        }
        Ok(())
    }

    /// GETs a manifest (or index) by tag or digest, accepting the OCI and Docker v2 types (as
    /// go-containerregistry's `remote.Get` does). A manifest asked for by digest must hash to it.
    pub fn manifest(&self, repo: &str, reference: &str) -> Result<FetchedManifest, Error> {
        let accept = [
            OCI_MANIFEST,
            OCI_INDEX,
            DOCKER_MANIFEST,
            DOCKER_MANIFEST_LIST,
        ]
        .join(", ");
        let resp = self
            .agent
            .get(&format!("{}/v2/{repo}/manifests/{reference}", self.base))
            .set("Accept", &accept)
            .call()
            .map_err(http(format!("getting the manifest {repo}:{reference}")))?;
        let media_type = resp.header("Content-Type").unwrap_or_default().to_string();
        let served = resp.header("Docker-Content-Digest").map(str::to_string);
        let mut bytes = Vec::new();
        resp.into_reader()
            .take(4 << 20)
            .read_to_end(&mut bytes)
            .map_err(|e| {
                Error::Registry(format!("reading the manifest {repo}:{reference}: {e}"))
            })?;
        let digest = sha256_digest(&bytes);
        if reference.starts_with("sha256:") && reference != digest {
            return Err(Error::Registry(format!(
                "{repo}@{reference}: the registry served a manifest whose digest is {digest}"
            )));
        }
        if served.as_deref().is_some_and(|d| d != digest) {
            return Err(Error::Registry(format!(
                "{repo}:{reference}: Docker-Content-Digest {} does not match the body's {digest}",
                served.unwrap_or_default()
            )));
        }
        Ok(FetchedManifest {
            bytes,
            media_type,
            digest,
        })
    }

    /// GETs a blob, checked against its digest.
    pub fn blob(&self, repo: &str, digest: &str, limit: u64) -> Result<Vec<u8>, Error> {
        crate::layout::digest_hex(digest)?;
        let resp = self
            .agent
            .get(&format!("{}/v2/{repo}/blobs/{digest}", self.base))
            .call()
            .map_err(http(format!("getting the blob {repo}@{digest}")))?;
        let mut data = Vec::new();
        resp.into_reader()
            .take(limit)
            .read_to_end(&mut data)
            .map_err(|e| Error::Registry(format!("reading the blob {repo}@{digest}: {e}")))?;
        let actual = sha256_digest(&data);
        if actual != digest {
            return Err(Error::Registry(format!(
                "blob {repo}@{digest}: the content's digest is {actual} (truncated at {limit} bytes?)"
            )));
        }
        Ok(data)
    }
}

/// `docker-registry serve` on 127.0.0.1, storing in a directory; killed (by its pid) on drop.
#[derive(Debug)]
pub struct LocalRegistry {
    child: Child,
    addr: SocketAddr,
    config: PathBuf,
}

impl LocalRegistry {
    /// Starts a registry storing under `storage`, on `port` (0: a free one). Its log goes to
    /// `storage/../registry.log`.
    pub fn start(storage: &Path, port: u16) -> Result<LocalRegistry, Error> {
        let mut last = None;
        for _ in 0..3 {
            match LocalRegistry::try_start(storage, port) {
                Ok(r) => return Ok(r),
                // A free port taken by someone else between the check and the start: try
                // another (a fixed port is the caller's choice, so do not retry it).
                Err(e) if port == 0 => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("three attempts"))
    }

    fn try_start(storage: &Path, port: u16) -> Result<LocalRegistry, Error> {
        let port = if port == 0 {
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .and_then(|l| l.local_addr())
                .map_err(|source| Error::File {
                    what: "finding a free port for the registry".into(),
                    source,
                })?
                .port()
        } else {
            port
        };
        std::fs::create_dir_all(storage).map_err(|source| Error::File {
            what: format!("creating {}", storage.display()),
            source,
        })?;
        let parent = storage.parent().unwrap_or(storage);
        let config = parent.join(format!("registry-{port}.yml"));
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        // distribution's configuration reference (docs/configuration.md): filesystem storage,
        // HTTP on loopback only, no auth, logs at warn.
        let text = format!(
            "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
            storage.display()
        );
        std::fs::write(&config, text).map_err(|source| Error::File {
            what: format!("writing {}", config.display()),
            source,
        })?;
        let log_path = parent.join("registry.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|source| Error::File {
                what: format!("opening {}", log_path.display()),
                source,
            })?;
        let child = Command::new(REGISTRY_BINARY)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|source| Error::File {
                what: "duplicating the registry log".into(),
                source,
            })?)
            .stderr(log)
            .spawn()
            .map_err(|source| Error::File {
                what: format!(
                    "starting {REGISTRY_BINARY} (Debian's docker-registry: `just setup` installs it)"
                ),
                source,
            })?;
        let mut reg = LocalRegistry {
            child,
            addr,
            config,
        };
        let client = reg.client()?;
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if client.ping() {
                return Ok(reg);
            }
            if let Ok(Some(status)) = reg.child.try_wait() {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(10).collect();
                return Err(Error::Registry(format!(
                    "{REGISTRY_BINARY} exited ({status}) before answering on {addr}; its log ({}):\n{}",
                    log_path.display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(Error::Registry(format!(
            "{REGISTRY_BINARY} did not answer on {addr} within 15 s (log: {})",
            log_path.display()
        )))
    }

    /// `127.0.0.1:<port>`: the registry part of image references.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    pub fn client(&self) -> Result<Registry, Error> {
        Registry::new(&self.host())
    }

    /// The registry process's id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for LocalRegistry {
    fn drop(&mut self) {
        // Our own child, not reaped yet: its pid cannot have been reused.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.config);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse() {
        let r = ImageRef::parse("127.0.0.1:5000/holdfast/agent:0.1.0").unwrap();
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "holdfast/agent");
        assert_eq!(r.tag.as_deref(), Some("0.1.0"));
        assert_eq!(r.reference(), "0.1.0");
        let d = format!("sha256:{}", "a".repeat(64));
        let pinned = r.at_digest(&d);
        assert_eq!(
            pinned.to_string(),
            format!("127.0.0.1:5000/holdfast/agent@{d}")
        );
        assert_eq!(ImageRef::parse(&pinned.to_string()).unwrap(), pinned);
        let g = ImageRef::parse("ghcr.io/holdfast-mesh/holdfast-filter:0.1.0").unwrap();
        assert_eq!(g.name(), "ghcr.io/holdfast-mesh/holdfast-filter");
        for bad in [
            "holdfast:0.1.0",
            "ghcr.io/Holdfast/x",
            "ghcr.io/x@sha256:abc",
            "ghcr.io/x:bad tag",
            "/x",
        ] {
            assert!(ImageRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_loopback_registries() {
        assert!(Registry::new("127.0.0.1:5000").is_ok());
        assert!(Registry::new("localhost:5000").is_ok());
        assert!(Registry::new("[::1]:5000").is_ok());
        let err = Registry::new("ghcr.io").unwrap_err().to_string();
        assert!(err.contains("skopeo"), "{err}");
    }
}
