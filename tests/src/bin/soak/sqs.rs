//! The SQS side of the soak: a third host on the local SQS server (moto)
//! with a `sqs-cycles` strategy of 3 s cycles, so canaries of 4–8 s go
//! round a cycling queue through the host's pumps (the part a host kill
//! interrupts) before their last leg; and a consumer of their destination.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use hourglass::broker;
use hourglass::broker::sqs::send::SqsExecutor;
use hourglass::config::Config;
use hourglass_e2e::chaos::ledger::Ledger;
use hourglass_e2e::sqs::{pumps_config_text, unique_queue};

pub struct SqsSide {
    /// The SQS host's config.
    pub config: PathBuf,
    pub destination: String,
    executor: Arc<SqsExecutor>,
}

/// 4, 6 or 8 s: longer than a cycle, so each goes round the cycling queue at least once.
pub fn delay_of(n: u64) -> u64 {
    4_000 + (n % 3) * 2_000
}

impl SqsSide {
    /// Writes the config beside `beside` and creates the destination queue.
    pub async fn prepare(beside: &Path) -> anyhow::Result<SqsSide> {
        std::env::var("AWS_ENDPOINT_URL_SQS")
            .context("AWS_ENDPOINT_URL_SQS is not set: run the soak with scripts/soak, which starts a local SQS server (moto)")?;
        let (text, _) = pumps_config_text("planner = \"sqs-cycles\"\ncycle = \"3s\"", "");
        let config = beside.with_file_name("hourglass-sqs.toml");
        std::fs::write(&config, &text)?;
        let parsed = Config::parse(&config, text)?;
        let Some(executor) = broker::connect(&parsed.broker).await?.downcast::<SqsExecutor>() else { anyhow::bail!("not an SQS broker") };
        let destination = unique_queue("soak-dest");
        executor.client().create_queue().queue_name(&destination).send().await.context("create the SQS destination")?;
        Ok(SqsSide { config, destination, executor })
    }

    /// Receives from the destination until aborted, recording each arrival.
    pub fn consume(&self) -> impl FnOnce(Arc<Ledger>) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        let (executor, queue) = (self.executor.clone(), self.destination.clone());
        move |ledger| Box::pin(consume(executor, queue, ledger))
    }
}

async fn consume(executor: Arc<SqsExecutor>, queue: String, ledger: Arc<Ledger>) {
    loop {
        let Ok(Some(url)) = executor.url(&queue).await else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        let received = executor.client().receive_message().queue_url(&url).max_number_of_messages(10).wait_time_seconds(1).send().await;
        let Ok(received) = received else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        for message in received.messages() {
            ledger.arrived(message.body().unwrap_or_default());
            if let Some(handle) = message.receipt_handle() {
                executor.client().delete_message().queue_url(&url).receipt_handle(handle).send().await.ok();
            }
        }
    }
}
