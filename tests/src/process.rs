//! `hourglass serve` as a child process, for what only a real process shows:
//! signals (SIGHUP reloads, SIGTERM stops) and the exit status.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use crate::serve::Http;

pub struct ServeProcess {
    child: Child,
    pub http: Http,
    /// Every stderr line so far.
    log: Arc<Mutex<Vec<String>>>,
}

impl ServeProcess {
    /// Starts `hourglass --config CONFIG serve` on a free port and waits until it listens.
    pub fn start(config: &Path) -> ServeProcess {
        Self::start_on(config, &crate::amqp_url())
    }

    /// The same, with `HOURGLASS_AMQP_URL` set to `amqp_url` (a private vhost, say).
    /// On the test broker, `HOURGLASS_MANAGEMENT_URL` names its management
    /// API, as a user who points an example at a broker of their own would.
    pub fn start_on(config: &Path, amqp_url: &str) -> ServeProcess {
        let mut command = Command::new(crate::hourglass_binary());
        command
            .arg("--config")
            .arg(config)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "info,lapin=off")
            // Configs with `url_env = "HOURGLASS_AMQP_URL"` (the examples) reach the test broker.
            .env("HOURGLASS_AMQP_URL", amqp_url);
        if crate::same_broker(amqp_url, &crate::amqp_url()) {
            command.env("HOURGLASS_MANAGEMENT_URL", crate::management_url());
        }
        Self::spawn(command)
    }

    /// `hourglass --config CONFIG serve` on a free port with `env` set, as a
    /// user overrides a config's settings (`HOURGLASS_NATS_URL`, say).
    pub fn start_with_env(config: &Path, env: &[(&str, &str)]) -> ServeProcess {
        let mut command = Command::new(crate::hourglass_binary());
        command.arg("--config").arg(config).args(["serve", "--listen", "127.0.0.1:0"]).env("RUST_LOG", "info").envs(env.iter().copied());
        Self::spawn(command)
    }

    fn spawn(mut command: Command) -> ServeProcess {
        let mut child = command.stderr(Stdio::piped()).stdout(Stdio::null()).spawn().expect("spawn hourglass serve");
        let (log, address_rx) = follow_stderr(&mut child);
        let Ok(address) = address_rx.recv_timeout(Duration::from_secs(60)) else {
            let _ = child.kill();
            panic!("hourglass serve did not start listening: {:#?}", log.lock().unwrap());
        };
        ServeProcess { child, http: Http::new(&format!("http://{address}")), log }
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill").args([&format!("-{name}"), &self.child.id().to_string()]).status().unwrap();
        assert!(status.success(), "kill -{name} failed");
    }

    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Waits for the process to exit, failing after `deadline`.
    pub fn wait(&mut self, deadline: Duration) -> ExitStatus {
        let end = Instant::now() + deadline;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > end {
                let _ = self.child.kill();
                panic!("hourglass serve did not exit within {deadline:?}: {:#?}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Keeps every stderr line of a `hourglass serve` child, and sends the
/// address it serves on as soon as it says so.
pub fn follow_stderr(child: &mut Child) -> (Arc<Mutex<Vec<String>>>, mpsc::Receiver<String>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let (address_tx, address_rx) = mpsc::channel();
    let stderr = child.stderr.take().expect("stderr piped");
    let lines = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("serving on http://").nth(1) {
                let _ = address_tx.send(rest.split_whitespace().next().unwrap_or_default().to_string());
            }
            lines.lock().unwrap().push(line);
        }
    });
    (log, address_rx)
}
