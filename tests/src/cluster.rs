//! A three-node RabbitMQ cluster of the test's own, started with
//! `scripts/cluster` (so the script people use is the one the fault suite
//! runs) on a random name, free ports and a scratch directory. Each node is a
//! [`PrivateNode`] the test can `kill -9` and boot again; dropping the cluster
//! stops every node and removes its data.

use std::path::PathBuf;
use std::process::Command;

use crate::ports::free_ports;
use crate::private_node::{NodeError, PrivateNode};
use crate::repo_root;

pub struct Cluster {
    pub nodes: Vec<PrivateNode>,
    dir: PathBuf,
}

impl Cluster {
    /// Starts three nodes (no management plugin) and joins them; returns once all three are in.
    pub fn start() -> Result<Cluster, NodeError> {
        let suffix = &uuid::Uuid::new_v4().simple().to_string()[..10];
        let name = format!("hg-cluster-{suffix}");
        // Canonical, as PrivateNode's: a version's Debian root sees the temporary directory at its real path.
        let dir = std::env::temp_dir().canonicalize()?.join(&name);
        // Each node's AMQP port and its distribution port (AMQP + 20,000, as scripts/cluster sets it).
        let port = free_ports(&[0, 1, 2, 20_000, 20_001, 20_002])?;
        let output = Command::new(repo_root().join("scripts/cluster"))
            .arg("start")
            .env("HOURGLASS_CLUSTER_DIR", &dir)
            .env("HOURGLASS_CLUSTER_PORT", port.to_string())
            .env("HOURGLASS_CLUSTER_NAME", &name)
            .env("HOURGLASS_CLUSTER_MANAGEMENT", "0")
            .output()?;
        let nodes = (1..=3u16)
            .map(|i| PrivateNode::adopt(format!("{name}-{i}@localhost"), port + i - 1, port + i - 1 + 20_000, dir.join(format!("node-{i}"))))
            .collect();
        // Built before checking, so a half-started cluster is still stopped on drop.
        let cluster = Cluster { nodes, dir };
        if !output.status.success() {
            let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
            return Err(NodeError::Command { command: "scripts/cluster start".into(), output: text });
        }
        Ok(cluster)
    }

    /// Every node's URL, comma-separated: hourglass's `broker.url` for a cluster.
    pub fn urls(&self) -> String {
        self.nodes.iter().map(PrivateNode::url).collect::<Vec<_>>().join(",")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Each node stops itself on drop; then the shared directory goes.
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
