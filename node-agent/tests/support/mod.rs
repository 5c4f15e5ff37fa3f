//! Helpers shared by the agent's privileged integration tests: the root/CI gate, running a
//! tool, and a network namespace named after the test that is deleted on drop (also on panic).

// Each test binary uses only some of these.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use holdfast::effects::netns::PodNetns;

/// True when the test may run; panics under CI when it cannot.
pub fn privileged(test: &str) -> bool {
    if nix::unistd::Uid::effective().is_root() {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{test}: needs root (netns, iptables, NFQUEUE) and CI is set: refusing to skip");
    }
    eprintln!("SKIP {test}: needs root (netns, iptables, NFQUEUE)");
    false
}

/// The Envoy the real-Envoy tests run: `$HOLDFAST_ENVOY` (`just test` sets it to run them again
/// on the Envoy of the newest Istio), else `target/bin/envoy` (`just setup`).
pub fn envoy_binary() -> std::path::PathBuf {
    std::env::var_os("HOLDFAST_ENVOY")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bin/envoy"))
}

/// `x.y.z` of an Envoy binary, from `envoy --version` (`…version: <sha>/1.36.4/Clean/…`).
pub fn envoy_version_of(binary: &Path) -> Result<String> {
    let out = run(&binary.to_string_lossy(), &["--version"])?;
    out.split("version: ")
        .nth(1)
        .and_then(|v| v.split('/').nth(1))
        .map(str::to_string)
        .with_context(|| format!("no version in {out:?}"))
}

pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program} {args:?}"))?;
    ensure!(
        out.status.success(),
        "{program} {args:?}: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A network namespace named after the test, deleted on drop (also on panic).
pub struct TestNetns {
    pub name: String,
    pub ns: Arc<PodNetns>,
}

impl TestNetns {
    pub fn new(name: &str) -> Result<TestNetns> {
        // Parallel checkouts on one machine set HOLDFAST_SIM_TAG so their namespaces never collide.
        let tagged = match std::env::var("HOLDFAST_SIM_TAG") {
            Ok(tag) if !tag.is_empty() && tag.chars().all(|c| c.is_ascii_alphanumeric()) => {
                format!("{name}-{tag}")
            }
            _ => name.to_string(),
        };
        let name = tagged.as_str();
        // A leftover from an earlier crashed run would make `ip netns add` fail.
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        run("ip", &["netns", "add", name])?;
        // From here on the guard owns the netns.
        let guard = TestNetns {
            name: name.to_string(),
            ns: Arc::new(PodNetns::open_path(&Path::new("/run/netns").join(name))?),
        };
        run("ip", &["-n", name, "link", "set", "lo", "up"])?;
        Ok(guard)
    }

    /// A command run inside the netns (`ip netns exec` execs it: the child's pid is its own).
    pub fn command(&self, program: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }

    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        run("ip", &full)
    }

    pub fn iptables(&self, args: &[&str]) -> Result<String> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let out = self.ns.run_command("iptables", &args, None)?;
        ensure!(out.status.success(), "iptables {args:?}: {}", out.stderr);
        Ok(out.stdout)
    }

    /// Asserts no holdfast chain or jump is left in the netns, IPv4 and IPv6 (ip6tables is in
    /// the same Debian package as iptables; a netns where it cannot list counts as clean only
    /// if it says why).
    pub fn assert_no_hold(&self) -> Result<()> {
        let listing = self.iptables(&["-t", "filter", "-S"])?;
        ensure!(
            !listing.contains("HOLDFAST") && !listing.contains("NFQUEUE"),
            "hold rules left in {}:\n{listing}",
            self.name
        );
        let out = self.ns.run_command(
            "ip6tables",
            &["-t".into(), "filter".into(), "-S".into()],
            None,
        )?;
        if out.status.success() {
            ensure!(
                !out.stdout.contains("HOLDFAST") && !out.stdout.contains("NFQUEUE"),
                "IPv6 hold rules left in {}:\n{}",
                self.name,
                out.stdout
            );
        } else {
            eprintln!(
                "{}: ip6tables cannot list: {}",
                self.name,
                out.stderr.trim()
            );
        }
        Ok(())
    }

    /// Packets that hit the outbound NFQUEUE rule (kernel counter).
    pub fn outbound_rule_packets(&self) -> Result<u64> {
        let listing = self.iptables(&["-t", "filter", "-L", "HOLDFAST_OUT", "-v", "-x", "-n"])?;
        listing
            .lines()
            .find(|l| l.contains("NFQUEUE"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("no NFQUEUE counter in:\n{listing}"))
    }

    /// A listener bound inside the netns with a large backlog.
    pub fn listen(&self, addr: SocketAddr) -> Result<TcpListener> {
        let listener = self.ns.run(move || -> Result<TcpListener> {
            use nix::sys::socket::{
                bind, listen, setsockopt, socket, sockopt, AddressFamily, Backlog, SockFlag,
                SockType, SockaddrIn,
            };
            let fd = socket(
                AddressFamily::Inet,
                SockType::Stream,
                SockFlag::SOCK_CLOEXEC,
                None,
            )?;
            setsockopt(&fd, sockopt::ReuseAddr, &true)?;
            let SocketAddr::V4(v4) = addr else {
                bail!("IPv4 only");
            };
            bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrIn::from(v4))?;
            listen(&fd, Backlog::new(1024)?)?;
            Ok(TcpListener::from(fd))
        })??;
        Ok(listener)
    }

    /// Connects from inside the netns on a background thread; returns the outcome and when.
    pub fn connect_bg(
        &self,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<JoinHandle<(std::io::Result<TcpStream>, Instant)>> {
        let ns = self.ns.try_clone()?;
        Ok(std::thread::spawn(move || {
            match ns.run(move || TcpStream::connect_timeout(&addr, timeout)) {
                Ok(result) => (result, Instant::now()),
                Err(e) => (Err(std::io::Error::other(e.to_string())), Instant::now()),
            }
        }))
    }
}

/// The result of a background thread (a connect, a query), or an error if it panicked.
pub fn joined<T>(thread: JoinHandle<T>) -> Result<T> {
    thread
        .join()
        .map_err(|_| anyhow::anyhow!("a background thread of the test panicked"))
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}
