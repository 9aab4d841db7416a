//! A case's service: a config on a given broker URL with a `binary-levels`
//! strategy `main` left at its defaults (the "default config"), an ingress
//! queue, a delayed exchange (`<prefix>.delayed`, delivering through
//! `<prefix>.orders`) and a canary destination, all with random names.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::unique;

use crate::chaos::canary::{self, Route};

/// The ingress consumer's prefetch: how many deliveries a killed host can leave unacknowledged.
pub const INGRESS_PREFETCH: u16 = 16;

pub struct Setup {
    pub amqp_url: String,
    pub config: PathBuf,
    pub ingress: String,
    pub invalid: String,
    pub destination: String,
    /// The strategy's prefix: its parking queue is `<prefix>.parked`.
    pub prefix: String,
    /// The delayed exchange producers publish to with `x-delay`, and its `deliver_to`.
    pub delayed: String,
    pub orders: String,
}

impl Setup {
    /// Writes the config (with `more` TOML appended) and declares the destination.
    pub async fn new(stem: &str, amqp_url: &str, more: &str) -> anyhow::Result<Setup> {
        let dir = crate::chaos::scratch(stem);
        let prefix = unique(stem);
        let ingress = unique(&format!("{stem}-in"));
        let invalid = format!("{ingress}.invalid");
        let destination = unique(&format!("{stem}-dest"));
        let text = format!(
            "default_strategy = \"main\"\n\n[broker]\nkind = \"rabbitmq\"\nurl = \"{amqp_url}\"\n\n\
             [service.ingress]\nqueue = \"{ingress}\"\ninvalid_queue = \"{invalid}\"\nprefetch = {INGRESS_PREFETCH}\n\n\
             [service.canary]\nenabled = false\n\n\
             [strategies.main]\nplanner = \"binary-levels\"\nprefix = \"{prefix}\"\n\n\
             [service.cancel]\nrelease_prefix = \"{prefix}.release\"\n\n\
             [exchanges.\"{prefix}.delayed\"]\ntype = \"topic\"\ndeliver_to = \"{prefix}.orders\"\n\n{more}\n"
        );
        let config = dir.join("hourglass.toml");
        std::fs::write(&config, text)?;
        canary::declare_destination(amqp_url, &destination).await?;
        let (delayed, orders) = (format!("{prefix}.delayed"), format!("{prefix}.orders"));
        Ok(Setup { amqp_url: amqp_url.into(), config, ingress, invalid, destination, prefix, delayed, orders })
    }

    /// Strategy `main`'s release queue: where its messages due to an exchange wait for the host.
    pub fn release_queue(&self) -> String {
        format!("{}.release.main", self.prefix)
    }

    /// Canaries through HTTP at `base`, through the ingress and through the delayed exchange.
    pub fn route(&self, base: &Arc<Mutex<String>>) -> Route {
        Route {
            amqp_url: self.amqp_url.clone(),
            http: Some(base.clone()),
            ingress: Some(self.ingress.clone()),
            delayed: Some((self.delayed.clone(), self.orders.clone())),
            destination: self.destination.clone(),
        }
    }
}
