//! SQS helpers: the local server from the environment, unique queues, a
//! consumer recording arrival times, and pumps in tasks.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName};
use hourglass::broker;
use hourglass::broker::sqs::metrics::PumpCounters;
use hourglass::broker::sqs::pump::Pump;
use hourglass::broker::sqs::send::SqsExecutor;
use hourglass::clock::unix_now_ms;
use hourglass::config::Config;
use hourglass::executor::Broker;
use hourglass::scheduler::Scheduler;
use hourglass::scheduler::strategies::Strategies;
use tokio::sync::{mpsc, watch};

pub fn endpoint() -> String {
    std::env::var("AWS_ENDPOINT_URL_SQS")
        .unwrap_or_else(|_| panic!("AWS_ENDPOINT_URL_SQS is not set: run the tests with scripts/test, which starts a local SQS server (moto)"))
}

/// SQS queue names allow letters, digits, '-' and '_'.
pub fn unique_queue(stem: &str) -> String {
    format!("e2e-{stem}-{}", &uuid::Uuid::new_v4().simple().to_string()[..10])
}

pub fn sqs_config(strategy_table: &str) -> Config {
    let text = format!("[broker]\nkind = \"sqs\"\nendpoint_url = \"{}\"\n\n[strategies.main]\n{strategy_table}\n", endpoint());
    Config::parse(std::path::Path::new("e2e-sqs.toml"), text).expect("test config")
}

pub async fn sqs_scheduler(config: &Config) -> (Scheduler<Broker>, Arc<SqsExecutor>) {
    let strategies = Strategies::load(config).expect("strategies load");
    let broker = broker::connect(&config.broker).await.expect("connect to the local SQS server");
    let executor = broker.downcast::<SqsExecutor>().expect("an SQS broker");
    (Scheduler::new(config, strategies, broker), executor)
}

pub async fn create_queue(executor: &SqsExecutor, name: &str, attributes: &[(&str, &str)]) -> String {
    let mut request = executor.client().create_queue().queue_name(name);
    for (k, v) in attributes {
        request = request.attributes(QueueAttributeName::from(*k), *v);
    }
    request.send().await.unwrap_or_else(|e| panic!("create {name}: {e:?}")).queue_url().unwrap().to_string()
}

pub struct SqsReceived {
    pub body: String,
    pub attributes: std::collections::HashMap<String, MessageAttributeValue>,
    pub at_ms: u64,
}

impl SqsReceived {
    pub fn attribute(&self, name: &str) -> Option<String> {
        self.attributes.get(name).and_then(|v| v.string_value()).map(str::to_string)
    }
}

/// Polls a destination queue in its own task, recording when each message became receivable.
pub struct SqsDestination {
    pub name: String,
    received: mpsc::UnboundedReceiver<SqsReceived>,
    stop: watch::Sender<bool>,
}

impl SqsDestination {
    pub async fn create(executor: Arc<SqsExecutor>, stem: &str) -> SqsDestination {
        let name = unique_queue(stem);
        let url = create_queue(&executor, &name, &[]).await;
        let (sender, received) = mpsc::unbounded_channel();
        let (stop, stopped) = watch::channel(false);
        let client = executor.client().clone();
        tokio::spawn(async move {
            while !*stopped.borrow() {
                let Ok(output) = client
                    .receive_message()
                    .queue_url(&url)
                    .max_number_of_messages(10)
                    .wait_time_seconds(1)
                    .message_attribute_names("All")
                    .message_system_attribute_names(MessageSystemAttributeName::All)
                    .send()
                    .await
                else {
                    continue;
                };
                let at_ms = unix_now_ms();
                for message in output.messages() {
                    client.delete_message().queue_url(&url).receipt_handle(message.receipt_handle().unwrap()).send().await.ok();
                    let received = SqsReceived {
                        body: message.body().unwrap_or_default().to_string(),
                        attributes: message.message_attributes().cloned().unwrap_or_default(),
                        at_ms,
                    };
                    if sender.send(received).is_err() {
                        return;
                    }
                }
            }
        });
        SqsDestination { name, received, stop }
    }

    pub async fn receive(&mut self, count: usize, deadline: Duration) -> Vec<SqsReceived> {
        crate::receive_within(&mut self.received, count, deadline, &self.name).await
    }

    /// Everything that arrives within `total`, however quiet it is meanwhile.
    pub async fn drain_for(&mut self, total: Duration) -> Vec<SqsReceived> {
        let end = tokio::time::Instant::now() + total;
        let mut out = Vec::new();
        while let Ok(Some(r)) = tokio::time::timeout_at(end, self.received.recv()).await {
            out.push(r);
        }
        out
    }

    /// Whatever else arrives within `quiet`.
    pub async fn drain(&mut self, quiet: Duration) -> Vec<SqsReceived> {
        let mut out = Vec::new();
        while let Ok(Some(r)) = tokio::time::timeout(quiet, self.received.recv()).await {
            out.push(r);
        }
        out
    }
}

impl Drop for SqsDestination {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// A pump for `queue` (the config's default strategy) running in a task until the returned sender says stop.
pub async fn spawn_pump(config: &Config, executor: Arc<SqsExecutor>, queue: &str) -> (watch::Sender<bool>, Arc<PumpCounters>) {
    let planner = Strategies::load_one(config, &config.default_strategy).unwrap();
    let pump = Pump::new(executor, Box::new(planner), queue, 1).await.unwrap();
    let counters = pump.counters.clone();
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(pump.run(stopped));
    (stop, counters)
}

/// A config for `serve` on the local SQS server whose one strategy has a name
/// of its own: other tests' pumped queues (tagged with their strategy's name)
/// are never found and pumped by this one.
pub fn pumps_config(strategy_table: &str, service: &str) -> (Config, String) {
    let (text, strategy) = pumps_config_text(strategy_table, service);
    (Config::parse(std::path::Path::new("e2e-sqs-pumps.toml"), text).expect("test config"), strategy)
}

/// The text of a [`pumps_config`], for a `serve` child process; and its strategy's name.
pub fn pumps_config_text(strategy_table: &str, service: &str) -> (String, String) {
    let strategy = format!("e2e-{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    // The SQS ingress's default queues have fixed names: off unless the test names its own.
    let ingress = if service.contains("[service.sqs_ingress]") { "" } else { "\n[service.sqs_ingress]\nenabled = false\n" };
    let canary = if service.contains("[service.canary]") { "" } else { "\n[service.canary]\nenabled = false\n" };
    let text = format!(
        "default_strategy = \"{strategy}\"\n\n[broker]\nkind = \"sqs\"\nendpoint_url = \"{}\"\n\n[service]\n{service}\n{ingress}{canary}\n[strategies.{strategy}]\n{strategy_table}\n",
        endpoint()
    );
    (text, strategy)
}

/// Receives up to ten messages from `queue` with all their attributes (and deletes them).
pub async fn take_messages(executor: &SqsExecutor, queue: &str) -> Vec<aws_sdk_sqs::types::Message> {
    let url = executor.url(queue).await.unwrap().unwrap_or_else(|| panic!("{queue} does not exist"));
    let output = executor
        .client()
        .receive_message()
        .queue_url(&url)
        .max_number_of_messages(10)
        .wait_time_seconds(1)
        .message_attribute_names("All")
        .send()
        .await
        .unwrap();
    for message in output.messages() {
        executor.client().delete_message().queue_url(&url).receipt_handle(message.receipt_handle().unwrap()).send().await.unwrap();
    }
    output.messages.unwrap_or_default()
}

/// A queue's attributes by name.
pub async fn queue_attributes(executor: &SqsExecutor, queue: &str) -> std::collections::HashMap<String, String> {
    let url = executor.url(queue).await.unwrap().unwrap_or_else(|| panic!("{queue} does not exist"));
    let output = executor.client().get_queue_attributes().queue_url(url).attribute_names(QueueAttributeName::All).send().await.unwrap();
    output.attributes().map(|a| a.iter().map(|(k, v)| (k.as_str().to_string(), v.clone())).collect()).unwrap_or_default()
}
