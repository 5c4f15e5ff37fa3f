//! A real Prometheus for the tests: Debian's `prometheus` 2.42 (`just setup` installs it, with
//! `promtool`), started on a free loopback port with a configuration the test writes, its data
//! in a temporary directory; killed by pid and its directory removed on drop. Read through its
//! HTTP API (`/api/v1/query`, `/api/v1/targets`, `/api/v1/alerts`,
//! prometheus/web/api/v1/api.go), as Grafana and an operator would.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// `prometheus` and `promtool`: on PATH (Debian's package puts them in /usr/bin).
pub fn binary(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// Gate for tests that need `name` (`prometheus`, `promtool`): its path; otherwise prints why
/// the test is skipped and returns `None` — except under CI (`CI` set), where it panics: CI
/// must not skip them silently (`just setup` installs Debian's `prometheus`).
pub fn required(test: &str, name: &str) -> Option<PathBuf> {
    if let Some(p) = binary(name) {
        return Some(p);
    }
    let why = format!(
        "{test}: needs `{name}` (Debian's prometheus package: `just setup`, or apt-get install prometheus)"
    );
    if std::env::var_os("CI").is_some() {
        panic!("{why}, and CI is set");
    }
    eprintln!("SKIPPED {why}");
    None
}

/// A running Prometheus.
pub struct Prometheus {
    child: Option<Child>,
    addr: SocketAddr,
    dir: PathBuf,
}

impl Prometheus {
    /// Starts Prometheus with `config` (a YAML or JSON document) in a fresh directory named
    /// after `test`, and waits until it is ready (`/-/ready`).
    pub fn start(test: &str, config: &str) -> Result<Prometheus> {
        let bin = binary("prometheus").context("no prometheus on PATH (`just setup`)")?;
        let dir = std::env::temp_dir().join(format!("hf-prom-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data")).context("Prometheus' directory")?;
        std::fs::write(dir.join("prometheus.yml"), config).context("writing its config")?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let log = std::fs::File::create(dir.join("prometheus.log"))?;
        let child = Command::new(bin)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=info")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting prometheus")?;
        let mut p = Prometheus {
            child: Some(child),
            addr,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if p.get("/-/ready").is_ok() {
                return Ok(p);
            }
            if let Some(status) = p.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                bail!("prometheus exited with {status}; log:\n{}", p.log_tail());
            }
            if Instant::now() > deadline {
                bail!("prometheus not ready in 20 s; log:\n{}", p.log_tail());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// GET `path_and_query`; the body of a 200 answer.
    pub fn get(&self, path_and_query: &str) -> Result<String> {
        let mut s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        // HTTP/1.0: Go's server then answers without chunking and closes.
        write!(
            s,
            "GET {path_and_query} HTTP/1.0\r\nHost: prometheus\r\n\r\n"
        )?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)?;
        let raw = String::from_utf8_lossy(&raw);
        let (head, body) = raw.split_once("\r\n\r\n").context("no HTTP header end")?;
        let status = head.lines().next().unwrap_or("");
        if !status.contains(" 200 ") {
            bail!("GET {path_and_query}: {status}: {body}");
        }
        Ok(body.to_string())
    }

    /// `/api/v1/...` as JSON; its `data`, or an error with Prometheus' own message.
    pub fn api(&self, path_and_query: &str) -> Result<Value> {
        let body = self.get(path_and_query)?;
        let v: Value = serde_json::from_str(&body)
            .with_context(|| format!("{path_and_query}: not JSON: {body}"))?;
        if v.get("status").and_then(Value::as_str) != Some("success") {
            bail!("{path_and_query}: {v}");
        }
        Ok(v.get("data").cloned().unwrap_or(Value::Null))
    }

    /// An instant query now: the result vector as (labels, value) pairs.
    pub fn query(&self, promql: &str) -> Result<Vec<(serde_json::Map<String, Value>, f64)>> {
        let data = self
            .api(&format!("/api/v1/query?query={}", encode(promql)))
            .with_context(|| format!("query {promql}"))?;
        let rows = match data.get("resultType").and_then(Value::as_str) {
            Some("vector") => data["result"].as_array().cloned().unwrap_or_default(),
            Some("scalar") => vec![serde_json::json!({"metric": {}, "value": data["result"]})],
            other => bail!("query {promql}: result type {other:?}"),
        };
        rows.into_iter()
            .map(|r| {
                let labels = r["metric"].as_object().cloned().unwrap_or_default();
                let v = r["value"][1]
                    .as_str()
                    .context("a sample without a value")?
                    .parse::<f64>()
                    .context("a sample's value")?;
                Ok((labels, v))
            })
            .collect()
    }

    /// Polls `f` every 100 ms until it returns `Ok(Some(_))`, or fails after `timeout` with its
    /// last error and Prometheus' log.
    pub fn wait<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut(&Prometheus) -> Result<Option<T>>,
    ) -> Result<T> {
        let deadline = Instant::now() + timeout;
        let mut last;
        loop {
            match f(self) {
                Ok(Some(v)) => return Ok(v),
                Ok(None) => last = "not yet".into(),
                Err(e) => last = format!("{e:#}"),
            }
            if Instant::now() > deadline {
                bail!(
                    "{what}: not within {timeout:?} (last: {last}); prometheus log:\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Percent-encodes a query parameter (RFC 3986 unreserved characters kept).
pub fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(
            super::encode(r#"up{job="x"} == 0"#),
            "up%7Bjob%3D%22x%22%7D%20%3D%3D%200"
        );
    }
}
