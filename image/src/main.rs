//! `holdfast-image`: builds holdfast's OCI images without a container daemon (see the library's
//! docs). `just image` runs `holdfast-image release`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use holdfast_image::arch::Arch;
use holdfast_image::{agent, debs, filter, layout, registry, release};

#[derive(Parser)]
#[command(
    name = "holdfast-image",
    about = "Build holdfast's OCI images reproducibly, without a container daemon",
    long_about = "Build holdfast's OCI images reproducibly, without a container daemon.\n\n\
        The same inputs (binary, filter module, pinned Debian packages, SOURCE_DATE_EPOCH) give \
        the same bytes, hence the same digest. Images are written as OCI image layouts, which \
        skopeo copies anywhere (`skopeo copy --preserve-digests oci:DIR:TAG docker://...`)."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum FilterVariant {
    /// One gzip layer holding plugin.wasm (what holdfast ships).
    Compat,
    /// Two layers: the raw module (application/vnd.module.wasm.content.layer.v1+wasm) and its
    /// runtime config.
    Oci,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build both images, push them to a registry on loopback and print digests, sizes and the
    /// kustomize edits that pin the install to them (`just image`).
    Release {
        /// The amd64 agent binary (`cargo build --release -p holdfast`).
        #[arg(long, default_value = "target/release/holdfast")]
        agent_binary: PathBuf,
        /// The arm64 agent binary (`cargo build --release -p holdfast --target
        /// aarch64-unknown-linux-gnu`).
        #[arg(
            long,
            default_value = "target/aarch64-unknown-linux-gnu/release/holdfast"
        )]
        agent_binary_arm64: PathBuf,
        /// The filter module (`just filter`).
        #[arg(long, default_value = "target/holdfast_filter.wasm")]
        wasm: PathBuf,
        /// Output directory: layouts, registry storage, overlay.
        #[arg(long, default_value = "target/image")]
        out: PathBuf,
        /// The amd64 image's Debian packages.
        #[arg(long, default_value = debs::LOCK_FILE)]
        lock: PathBuf,
        /// The arm64 image's Debian packages.
        #[arg(long, default_value = "image/agent-debs-arm64.lock")]
        lock_arm64: PathBuf,
        /// Where the .deb files are kept.
        #[arg(long, default_value = "target/image/debs")]
        deb_cache: PathBuf,
        #[arg(long, default_value = "manifests")]
        manifests: PathBuf,
        /// The images' tag and version label.
        #[arg(long, default_value = env!("CARGO_PKG_VERSION"))]
        version: String,
        /// Port of the loopback registry (0: any free port).
        #[arg(long, default_value_t = 5000)]
        registry_port: u16,
    },
    /// Build the agent image of one architecture into an OCI layout.
    Agent {
        #[arg(long)]
        binary: PathBuf,
        /// The binary's architecture: amd64 or arm64.
        #[arg(long, default_value = "amd64")]
        arch: String,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value = env!("CARGO_PKG_VERSION"))]
        tag: String,
        /// The architecture's lock (default: image/agent-debs.lock for amd64,
        /// image/agent-debs-arm64.lock for arm64).
        #[arg(long)]
        lock: Option<PathBuf>,
        #[arg(long, default_value = "target/image/debs")]
        deb_cache: PathBuf,
    },
    /// Build the filter image into an OCI layout.
    Filter {
        #[arg(long)]
        wasm: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value = env!("CARGO_PKG_VERSION"))]
        tag: String,
        #[arg(long, value_enum, default_value_t = FilterVariant::Compat)]
        variant: FilterVariant,
    },
    /// Push an image from a layout to a registry on loopback (others: skopeo).
    Push {
        #[arg(long)]
        layout: PathBuf,
        /// The tag in the layout.
        #[arg(long, default_value = env!("CARGO_PKG_VERSION"))]
        tag: String,
        /// Destination, e.g. 127.0.0.1:5000/holdfast/agent:0.1.0.
        #[arg(long)]
        to: String,
    },
    /// Serve a registry storage directory on loopback until interrupted.
    Serve {
        #[arg(long, default_value = "target/image/registry")]
        storage: PathBuf,
        #[arg(long, default_value_t = 5000)]
        port: u16,
    },
    /// Rewrite the Debian package pins (image/agent-debs.lock, image/agent-debs-arm64.lock) from
    /// the archive's current versions.
    Lock {
        #[arg(long, default_value = debs::LOCK_FILE)]
        lock: PathBuf,
        #[arg(long, default_value = "image/agent-debs-arm64.lock")]
        lock_arm64: PathBuf,
        #[arg(long, default_value = "target/image/debs")]
        deb_cache: PathBuf,
    },
}

fn print_built(what: &str, b: &layout::BuiltImage, out: &std::path::Path) {
    println!(
        "{what}: {} (tag {}), download {}, unpacked {}, layout {}",
        b.digest,
        b.tag,
        release::size(b.compressed_size),
        release::size(b.uncompressed_size),
        out.display()
    );
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let epoch = holdfast_image::source_date_epoch()?;
    match cli.command {
        Cmd::Release {
            agent_binary,
            agent_binary_arm64,
            wasm,
            out,
            lock,
            lock_arm64,
            deb_cache,
            manifests,
            version,
            registry_port,
        } => {
            let report = release::run(&release::ReleaseInputs {
                agents: vec![
                    (Arch::Amd64, agent_binary, lock),
                    (Arch::Arm64, agent_binary_arm64, lock_arm64),
                ],
                wasm,
                out,
                deb_cache,
                manifests,
                version,
                epoch,
                registry_port,
            })?;
            print!("{}", release::describe(&report));
        }
        Cmd::Agent {
            binary,
            arch,
            out,
            tag,
            lock,
            deb_cache,
        } => {
            let arch = Arch::parse(&arch)?;
            let lock = lock.unwrap_or_else(|| PathBuf::from(arch.lock_file()));
            let lock = debs::DebLock::read_for(&lock, arch)?;
            let work = out.with_extension("work");
            let built = agent::build(
                &agent::AgentInputs {
                    binary: &binary,
                    lock: &lock,
                    deb_cache: &deb_cache,
                    work: &work,
                    version: env!("CARGO_PKG_VERSION"),
                    epoch,
                },
                &out,
                &tag,
            )?;
            let _ = std::fs::remove_dir_all(&work);
            print_built("agent", &built, &out);
        }
        Cmd::Filter {
            wasm,
            out,
            tag,
            variant,
        } => {
            let module =
                std::fs::read(&wasm).with_context(|| format!("reading {}", wasm.display()))?;
            let variant = match variant {
                FilterVariant::Compat => filter::Variant::Compat,
                FilterVariant::Oci => filter::Variant::OciArtifact,
            };
            let built = filter::build(
                &module,
                variant,
                env!("CARGO_PKG_VERSION"),
                release::ROOT_ID,
                epoch,
                &out,
                &tag,
            )?;
            print_built("filter", &built, &out);
        }
        Cmd::Push { layout, tag, to } => {
            let dest = registry::ImageRef::parse(&to)?;
            let client = registry::Registry::new(&dest.registry)?;
            let l = layout::OciLayout::open(&layout)?;
            let digest = client.push(
                &l,
                &tag,
                &dest.repository,
                dest.tag.as_deref().unwrap_or(&tag),
            )?;
            println!("{}", dest.at_digest(&digest));
        }
        Cmd::Serve { storage, port } => {
            let reg = registry::LocalRegistry::start(&storage, port)?;
            println!(
                "serving {} on {} (pid {}); Ctrl-C stops it",
                storage.display(),
                reg.host(),
                reg.pid()
            );
            loop {
                std::thread::park();
            }
        }
        Cmd::Lock {
            lock,
            lock_arm64,
            deb_cache,
        } => {
            for (arch, lock) in [(Arch::Amd64, lock), (Arch::Arm64, lock_arm64)] {
                let current = debs::lock_current(&deb_cache, arch)?;
                std::fs::write(&lock, current.render())
                    .with_context(|| format!("writing {}", lock.display()))?;
                for d in &current.debs {
                    println!("{}", d.apt_spec());
                }
                println!("wrote {}", lock.display());
            }
        }
    }
    Ok(())
}
