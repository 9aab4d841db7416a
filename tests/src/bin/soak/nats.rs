//! The NATS side of the soak: a fourth host on the NATS server under test
//! (`HOURGLASS_TEST_NATS_URL`, the machine's by default) with a `nats-hold`
//! strategy that declines each canary for at most 2 s, so canaries of 4–8 s
//! are delivered again on their held stream before they are due (the part a
//! host kill interrupts); and a consumer of their destination stream.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use async_nats::jetstream::{self, consumer, stream};
use futures_util::StreamExt;
use hourglass_e2e::chaos::ledger::Ledger;
use hourglass_e2e::nats::{nats_url, unique};

pub struct NatsSide {
    /// The NATS host's config.
    pub config: PathBuf,
    /// The subject canaries are due to, captured by `destination_stream`.
    pub destination: String,
    destination_stream: String,
    held: String,
    jetstream: jetstream::Context,
}

/// 4, 6 or 8 s: each is declined and delivered again at least once on the held stream.
pub fn delay_of(n: u64) -> u64 {
    4_000 + (n % 3) * 2_000
}

impl NatsSide {
    /// Writes the config beside `beside` and creates the destination stream.
    pub async fn prepare(beside: &Path) -> anyhow::Result<NatsSide> {
        let url = nats_url();
        let client = async_nats::connect(&url).await.with_context(|| format!("NATS at {url}: run the soak with scripts/soak, which makes sure one runs"))?;
        let jetstream = jetstream::new(client);
        let (held, held_subject) = unique("soak-hold");
        let (destination_stream, destination) = unique("soak-dest");
        let text = format!(
            "[broker]\nkind = \"nats\"\nurl = \"{url}\"\nclock_stream = \"{held}-clock\"\n\n[strategies.hold]\nplanner = \"nats-hold\"\nstream = \"{held}\"\nsubject = \"{held_subject}\"\nmax_wait = \"2s\"\n\n\
             [service.ingress]\nenabled = false\n[service.canary]\nenabled = false\n"
        );
        let config = beside.with_file_name("hourglass-nats.toml");
        std::fs::write(&config, &text)?;
        let stream = stream::Config { name: destination_stream.clone(), subjects: vec![destination.clone()], ..Default::default() };
        jetstream.create_stream(stream).await.context("create the NATS destination stream")?;
        Ok(NatsSide { config, destination, destination_stream, held, jetstream })
    }

    /// Consumes the destination until aborted, recording each arrival.
    pub fn consume(&self) -> impl FnOnce(Arc<Ledger>) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        let (jetstream, stream) = (self.jetstream.clone(), self.destination_stream.clone());
        move |ledger| Box::pin(consume(jetstream, stream, ledger))
    }

    /// Deletes the streams the soak made on the shared server (the host's held and parked streams too).
    pub async fn delete(&self) {
        for name in [self.destination_stream.clone(), self.held.clone(), format!("{}-parked", self.held), format!("{}-clock", self.held)] {
            self.jetstream.delete_stream(&name).await.ok();
        }
    }
}

async fn consume(jetstream: jetstream::Context, stream: String, ledger: Arc<Ledger>) {
    loop {
        let Ok(destination) = jetstream.get_stream(&stream).await else { continue };
        let config = consumer::pull::Config { durable_name: Some("soak".into()), ack_policy: consumer::AckPolicy::Explicit, ..Default::default() };
        let Ok(consumer) = destination.get_or_create_consumer("soak", config).await else { continue };
        let Ok(mut messages) = consumer.messages().await else { continue };
        while let Some(next) = messages.next().await {
            let Ok(message) = next else { continue };
            ledger.arrived(&String::from_utf8_lossy(&message.payload));
            message.ack().await.ok();
        }
    }
}
