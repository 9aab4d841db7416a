//! What the fault suite (`scripts/faults`) and the soak (`scripts/soak`)
//! share: canary traffic and its ledger, `hourglass serve` as a child process
//! that can be killed, and a case's config on a broker.
//!
//! * [`canary`]: valid messages from other clients, sent all through a fault,
//!   and the consumer that records their arrivals.
//! * [`ledger`]: every canary's due time, acknowledgement and arrivals.
//! * [`host`]: `hourglass serve` as a child process.
//! * [`setup`]: a config with the default strategy, an ingress queue and a
//!   delayed exchange, all with random names.

pub mod canary;
pub mod host;
pub mod ledger;
pub mod setup;

use std::path::PathBuf;

/// A scratch directory for one run's config.
pub fn scratch(stem: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(crate::unique(stem));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}
