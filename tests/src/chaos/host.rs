//! `hourglass serve` as a child process the suite can `kill -9` and start
//! again. Unlike the tests' `ServeProcess` it runs under a descriptor limit of
//! 1,024 (the usual default of a service or container, where idle-connection
//! exhaustion shows) and finds the binary next to the suite's own.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};

pub struct Host {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    log: Arc<Mutex<Vec<String>>>,
}

/// `target/<profile>/hourglass`, beside this binary (scripts/faults builds both).
pub fn binary() -> PathBuf {
    if let Ok(path) = std::env::var("HOURGLASS_BINARY") {
        return path.into();
    }
    let exe = std::env::current_exe().expect("own path");
    exe.parent().unwrap().join("hourglass")
}

impl Host {
    /// Starts `hourglass --config CONFIG serve` on a free port; returns once it listens.
    pub fn start(config: &Path) -> anyhow::Result<Host> {
        let mut child = Command::new("prlimit")
            .arg("--nofile=1024:1024")
            .arg("--")
            .arg(binary())
            .arg("--config")
            .arg(config)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "info,lapin=off")
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("spawn {}", binary().display()))?;
        let (log, address_rx) = crate::process::follow_stderr(&mut child);
        match address_rx.recv_timeout(Duration::from_secs(60)) {
            Ok(address) => Ok(Host { child, base: format!("http://{address}"), log }),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                bail!("hourglass serve did not start listening:\n{}", log.lock().unwrap().join("\n"))
            }
        }
    }

    /// SIGKILL: no shutdown, nothing flushed, unacked ingress messages go back to the broker.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The last `n` lines the host logged.
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log.lock().unwrap();
        log[log.len().saturating_sub(n)..].join("\n")
    }

    /// Whether any line the host logged contains `needle`.
    pub fn logged(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|line| line.contains(needle))
    }

    /// The host's `/metrics` lines that start with `prefix` (none if it does not answer).
    pub async fn metric_lines(&self, prefix: &str) -> Vec<String> {
        let url = format!("{}/metrics", self.base);
        let text = tokio::task::spawn_blocking(move || ureq::get(&url).call().ok()?.body_mut().read_to_string().ok()).await.ok().flatten().unwrap_or_default();
        text.lines().filter(|line| line.starts_with(prefix)).map(str::to_string).collect()
    }

    pub fn port(&self) -> u16 {
        self.base.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or(0)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.kill9();
    }
}
