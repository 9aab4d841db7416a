//! A RabbitMQ node of the test's own, for faults that take the broker down:
//! its own node name, AMQP and distribution ports, data and log directories
//! and an empty plugin list, run as user `rabbitmq` (so it shares the shared
//! node's Erlang cookie and `rabbitmqctl` reaches it). The shared node on 5672
//! is never touched. Dropping it stops the node and removes its directory.
//!
//! The node is of the version under test: every RabbitMQ command goes
//! through `scripts/rabbitmq`, which runs the machine's own or, with
//! `HOURGLASS_TEST_RABBITMQ` = 4.0 or 4.3 (`scripts/test --rabbitmq`), the
//! one in that version's Debian root.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::ports::free_ports;

/// How long a node may take to open its AMQP port (it takes 4–10 s here).
const START_TIMEOUT: Duration = Duration::from_secs(90);

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{command} failed: {output}")]
    Command { command: String, output: String },
    #[error("node {node} did not open 127.0.0.1:{port} within {timeout:?}; log tail:\n{log}")]
    NotUp { node: String, port: u16, timeout: Duration, log: String },
    #[error("node {node} still accepts connections on 127.0.0.1:{port} {waited:?} after kill -9 of its VM")]
    StillUp { node: String, port: u16, waited: Duration },
}

/// How long a killed node's port may stay open (it closes within ~100 ms here).
const KILL_TIMEOUT: Duration = Duration::from_secs(30);

pub struct PrivateNode {
    /// `hg-fault-<random>@localhost`.
    pub name: String,
    pub amqp_port: u16,
    dist_port: u16,
    dir: PathBuf,
}

impl PrivateNode {
    /// Creates the node's directories and starts it; returns once its AMQP port accepts connections.
    pub fn start() -> Result<PrivateNode, NodeError> {
        let suffix = &uuid::Uuid::new_v4().simple().to_string()[..10];
        // Canonical: scripts/roots.sh mounts the machine's temporary directory at its real path in a version's root.
        let dir = std::env::temp_dir().canonicalize()?.join(format!("hg-fault-{suffix}"));
        for sub in ["mnesia", "log"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let amqp_port = free_ports(&[0, 1])?;
        let dist_port = amqp_port + 1;
        // The node's own config: the shared /etc/rabbitmq/rabbitmq.conf names port 5672.
        std::fs::write(dir.join("rabbitmq.conf"), format!("listeners.tcp.local = 127.0.0.1:{amqp_port}\nloopback_users = none\n"))?;
        std::fs::write(dir.join("enabled_plugins"), "[].\n")?;
        rabbitmq(&["chown", "-R", "rabbitmq:rabbitmq", &dir.display().to_string()], Path::new("/"))?;
        let node = PrivateNode { name: format!("hg-fault-{suffix}@localhost"), amqp_port, dist_port, dir };
        node.boot()?;
        Ok(node)
    }

    /// A node started by someone else (`scripts/cluster`) with the same
    /// directory layout, taken over so it can be killed, booted and, on drop,
    /// stopped and removed like one of our own.
    pub fn adopt(name: String, amqp_port: u16, dist_port: u16, dir: PathBuf) -> PrivateNode {
        PrivateNode { name, amqp_port, dist_port, dir }
    }

    /// `amqp://guest:guest@127.0.0.1:<port>/%2f`.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.amqp_port)
    }

    /// Starts the node again on the same data (after [`kill9`](Self::kill9) or [`stop`](Self::stop)).
    pub fn boot(&self) -> Result<(), NodeError> {
        let dir = self.dir.display().to_string();
        let env = [
            format!("RABBITMQ_NODENAME={}", self.name),
            format!("RABBITMQ_NODE_PORT={}", self.amqp_port),
            format!("RABBITMQ_DIST_PORT={}", self.dist_port),
            format!("RABBITMQ_MNESIA_BASE={dir}/mnesia"),
            format!("RABBITMQ_LOG_BASE={dir}/log"),
            format!("RABBITMQ_ENABLED_PLUGINS_FILE={dir}/enabled_plugins"),
            format!("RABBITMQ_CONFIG_FILE={dir}/rabbitmq.conf"),
            "HOME=/var/lib/rabbitmq".to_string(),
        ];
        let mut args = vec!["runuser", "-u", "rabbitmq", "--", "env"];
        args.extend(env.iter().map(String::as_str));
        args.extend(["rabbitmq-server", "-detached"]);
        rabbitmq(&args, &self.dir)?;
        let end = Instant::now() + START_TIMEOUT;
        while std::net::TcpStream::connect(("127.0.0.1", self.amqp_port)).is_err() {
            if Instant::now() > end {
                return Err(NodeError::NotUp { node: self.name.clone(), port: self.amqp_port, timeout: START_TIMEOUT, log: self.log_tail() });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    }

    /// The operating-system pid of the node's Erlang VM.
    pub fn pid(&self) -> Result<u32, NodeError> {
        let text = self.ctl(&["eval", "os:getpid()."])?;
        text.trim().trim_matches('"').parse().map_err(|_| NodeError::Command { command: "os:getpid()".into(), output: text })
    }

    /// `kill -9` of the Erlang VM: no flush, no goodbye to clients.
    pub fn kill9(&self) -> Result<(), NodeError> {
        let pid = self.pid()?;
        run("kill", &["-9", &pid.to_string()])?;
        // Wait until the port is closed so a following boot starts a new VM.
        let end = Instant::now() + KILL_TIMEOUT;
        while std::net::TcpStream::connect(("127.0.0.1", self.amqp_port)).is_ok() {
            if Instant::now() > end {
                return Err(NodeError::StillUp { node: self.name.clone(), port: self.amqp_port, waited: KILL_TIMEOUT });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// A clean stop of the whole node (`rabbitmqctl stop`).
    pub fn stop(&self) -> Result<(), NodeError> {
        self.ctl(&["stop"]).map(drop)
    }

    /// Runs `rabbitmqctl -n <node> ARGS` as user rabbitmq; its stdout.
    pub fn ctl(&self, args: &[&str]) -> Result<String, NodeError> {
        let mut all = vec!["runuser", "-u", "rabbitmq", "--", "env", "HOME=/var/lib/rabbitmq", "rabbitmqctl", "-q", "-n", self.name.as_str()];
        all.extend(args);
        let output = rabbitmq(&all, Path::new("/"))?;
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// The node's log file (removed with the node).
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("log").join(format!("{}.log", self.name))
    }

    /// The last 20 lines of the node's log.
    pub fn log_tail(&self) -> String {
        // Lossy: a log line may carry bytes that are not UTF-8, which must not hide the rest.
        let text = String::from_utf8_lossy(&std::fs::read(self.log_path()).unwrap_or_default()).into_owned();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for PrivateNode {
    fn drop(&mut self) {
        if self.stop().is_err()
            && let Ok(pid) = self.pid()
        {
            let _ = run("kill", &["-9", &pid.to_string()]);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn run(program: &str, args: &[&str]) -> Result<Output, NodeError> {
    run_in(program, args, Path::new("/"))
}

/// A command from the RabbitMQ under test (`scripts/rabbitmq`), run in `dir`.
fn rabbitmq(args: &[&str], dir: &Path) -> Result<Output, NodeError> {
    // The crate is `tests/`, or `host/` for the benches that include this file: the repository is above either.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("a crate inside the repository").join("scripts/rabbitmq");
    run_in(&script.display().to_string(), args, dir)
}

fn run_in(program: &str, args: &[&str], dir: &Path) -> Result<Output, NodeError> {
    let output = Command::new(program).args(args).current_dir(dir).output()?;
    if output.status.success() {
        Ok(output)
    } else {
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        Err(NodeError::Command { command: format!("{program} {}", args.join(" ")), output: text })
    }
}

#[cfg(test)]
mod tests {
    // Imported inside the test: host/benches/pending.rs includes this file, and its harness compiles no tests.
    /// `kill9` kills the node's VM, then waits for the node's AMQP port to
    /// close: a port still open after [`KILL_TIMEOUT`] is `StillUp`, neither a
    /// success nor a wait without end. The node is a real one and its VM is
    /// killed; the port `kill9` watches is one this test holds open instead
    /// of the node's (the same node adopted under it), answering every connection.
    #[test]
    fn kill9_fails_still_up_when_the_port_stays_open_after_the_kill() {
        use std::net::{TcpListener, TcpStream};

        use super::*;

        let node = PrivateNode::start().expect("a private RabbitMQ node starts");
        let held = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let held_port = held.local_addr().unwrap().port();
        // Accepted and closed at once, so the backlog never fills and every connect succeeds.
        std::thread::spawn(move || held.incoming().for_each(drop));
        let watched = PrivateNode::adopt(node.name.clone(), held_port, node.dist_port, node.dir.clone());

        let started = Instant::now();
        let result = watched.kill9();
        let took = started.elapsed();
        // One node, one directory: `node` stops and removes it when dropped.
        std::mem::forget(watched);

        let err = result.expect_err("kill9 must fail while the port stays open");
        eprintln!("kill9 after {took:?}: {err}");
        assert!(
            matches!(&err, NodeError::StillUp { node: name, port, waited } if *name == node.name && *port == held_port && *waited == KILL_TIMEOUT),
            "{err:?}"
        );
        assert!(took >= KILL_TIMEOUT && took < KILL_TIMEOUT + Duration::from_secs(10), "gave up after {took:?}");
        assert!(TcpStream::connect(("127.0.0.1", node.amqp_port)).is_err(), "the node's own port is closed: its VM was killed");
    }
}
