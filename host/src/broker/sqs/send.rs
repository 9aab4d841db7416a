//! The SQS executor: queue setup checked against what the strategy needs,
//! sends with SQS's limits checked up front (then batched, see
//! [`super::batcher`]), and a count of every request.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{BatchResultErrorEntry, Message, MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName, SendMessageBatchRequestEntry};
use tokio::sync::Mutex;

use super::batcher::{Batcher, SQS_MAX_MESSAGE_BYTES, SendBatch, fits_in_batch};
use super::dead_letters::{dead_letter_queue, redrives_to_own_dead_letters};
use super::metrics::RequestCounts;
use crate::command::{BrokerFamily, Command, FieldValue, SQS_MAX_MESSAGE_ATTRIBUTES, SqsCommand};
use crate::executor::{Envelope, Executor, ExecutorError};
use crate::headers::ID_HEADER;

/// Queue attributes `ensure_queue` sets when they differ instead of refusing the queue.
const SETTABLE_ATTRIBUTES: [&str; 2] = ["DeduplicationScope", "FifoThroughputLimit"];
/// Room a message sent to a pumped queue keeps below SQS's size limit: its
/// planner's state grows on later visits (`sqs-cycles` adds the first send's
/// time and a longer cycle count, about 35 bytes), and a message accepted
/// right at the limit would otherwise be parked on its first visit.
pub const PUMPED_HEADROOM_BYTES: usize = 64;

/// Room a first send keeps free below SQS's limits for what later steps add:
/// a pumped queue's state grows, and a cancellable strategy's message (it
/// carries its id) is claimed in the fates queue with one attribute more.
#[derive(Clone, Copy, Debug, Default)]
struct Room {
    pumped: bool,
    cancellable: bool,
}

impl Room {
    fn bytes(self) -> usize {
        (if self.pumped { PUMPED_HEADROOM_BYTES } else { 0 }) + if self.cancellable { super::fates::CLAIM_BYTES } else { 0 }
    }

    fn attributes(self) -> usize {
        usize::from(self.cancellable)
    }

    /// What the room is kept for, after the limit in a refusal.
    fn reason(self, queue: &str) -> String {
        let bytes = self.bytes();
        match (self.pumped, self.cancellable) {
            (false, false) => String::new(),
            (true, false) => format!(", less {bytes} for the state it gathers while it cycles through {queue}"),
            (false, true) => format!(", less {bytes} for its claim when due"),
            (true, true) => format!(", less {bytes} for the state it gathers while it cycles through {queue} and for its claim when due"),
        }
    }
}

pub fn count(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

pub struct SqsExecutor {
    client: Client,
    urls: Mutex<HashMap<String, String>>,
    pub requests: Arc<RequestCounts>,
    batch_requests: BatchRequests,
    /// First sends, coalesced per target queue.
    batcher: Batcher<BatchRequests>,
    /// Per pumped queue, messages per SQS message its pumps received lately
    /// (bundles hold many): what scales SQS's counts into messages.
    carried: std::sync::Mutex<HashMap<String, f64>>,
    /// Queues set up as pumped here: first sends to them keep [`PUMPED_HEADROOM_BYTES`].
    pumped: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// `SendMessageBatch` through the SDK, counted: the pump's onward sends and the batcher's first sends.
#[derive(Clone)]
struct BatchRequests {
    client: Client,
    requests: Arc<RequestCounts>,
}

impl SendBatch for BatchRequests {
    async fn send_batch(&self, queue: &str, url: &str, entries: Vec<SendMessageBatchRequestEntry>) -> Result<Vec<BatchResultErrorEntry>, ExecutorError> {
        count(&self.requests.send_message_batch);
        match self.client.send_message_batch().queue_url(url).set_entries(Some(entries)).send().await {
            Ok(output) => Ok(output.failed),
            Err(err) if err.as_service_error().is_some_and(|e| e.is_queue_does_not_exist()) => Err(queue_does_not_exist(queue)),
            Err(err) => Err(unavailable(format!("SendMessageBatch to {queue}"), err)),
        }
    }
}

fn queue_does_not_exist(queue: &str) -> ExecutorError {
    ExecutorError::Refused(format!("SQS queue {queue:?} does not exist; create it before sending to it"))
}

pub(super) fn unavailable(what: impl std::fmt::Display, err: impl std::error::Error) -> ExecutorError {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        text.push_str(&format!(": {inner}"));
        source = inner.source();
    }
    ExecutorError::Unavailable(format!("SQS {what}: {text}"))
}

/// The attributes a message's properties travel in (see [`super::properties`]).
pub(crate) type PropertyAttributes = HashMap<String, MessageAttributeValue>;

/// Message attributes for a send: the message's properties, the envelope's
/// headers, then the command's, checked against SQS's limit of ten.
pub fn message_attributes(
    properties: &PropertyAttributes,
    envelope_headers: &BTreeMap<String, FieldValue>,
    extra: &BTreeMap<String, String>,
) -> Result<HashMap<String, MessageAttributeValue>, ExecutorError> {
    if let Some(name) = envelope_headers.keys().chain(extra.keys()).find(|name| properties.contains_key(*name)) {
        return Err(ExecutorError::Invalid(format!("header {name:?} would overwrite the message property carried in that attribute")));
    }
    let mut attributes = properties.clone();
    for (name, value) in envelope_headers {
        let (data_type, text) = match value {
            FieldValue::Int(i) => ("Number", i.to_string()),
            FieldValue::Text(s) => ("String", s.clone()),
            FieldValue::Bool(b) => ("String", b.to_string()),
        };
        attributes.insert(name.clone(), attribute(data_type, text)?);
    }
    for (name, value) in extra {
        attributes.insert(name.clone(), attribute("String", value.clone())?);
    }
    if attributes.len() > SQS_MAX_MESSAGE_ATTRIBUTES {
        return Err(ExecutorError::Refused(format!(
            "the message would carry {} attributes; SQS allows {SQS_MAX_MESSAGE_ATTRIBUTES} ({})",
            attributes.len(),
            attributes.keys().cloned().collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(attributes)
}

fn attribute(data_type: &str, value: String) -> Result<MessageAttributeValue, ExecutorError> {
    MessageAttributeValue::builder().data_type(data_type).string_value(value).build().map_err(|e| ExecutorError::Refused(format!("message attribute: {e}")))
}

/// Body plus attributes, as SQS counts them against its size limit.
pub(crate) fn message_size(body: &str, attributes: &HashMap<String, MessageAttributeValue>) -> usize {
    let value = |v: &MessageAttributeValue| v.string_value().map_or(0, str::len) + v.binary_value().map_or(0, |b| b.as_ref().len());
    body.len() + attributes.iter().map(|(k, v)| k.len() + v.data_type().len() + value(v)).sum::<usize>()
}

/// The parts of an SQS send command.
struct SendParts<'c> {
    queue: &'c String,
    delay_seconds: &'c u32,
    group_id: &'c Option<String>,
    dedup_id: &'c Option<String>,
}

/// An SQS send's parts, its message attributes and its size, checked against
/// SQS's limits less the room it keeps for later steps.
fn checked_send<'c>(
    command: &'c Command,
    body: &str,
    base: &BTreeMap<String, FieldValue>,
    properties: &PropertyAttributes,
    room: Room,
) -> Result<(SendParts<'c>, HashMap<String, MessageAttributeValue>, usize), ExecutorError> {
    let Command::Sqs(SqsCommand::Send { queue, delay_seconds, attributes, group_id, dedup_id }) = command else {
        return Err(ExecutorError::other_family(command, BrokerFamily::Sqs));
    };
    let message_attributes = message_attributes(properties, base, attributes)?;
    if room.attributes() > 0 && message_attributes.len() + room.attributes() > SQS_MAX_MESSAGE_ATTRIBUTES {
        return Err(ExecutorError::Refused(format!(
            "the message would carry {} attributes; SQS allows {SQS_MAX_MESSAGE_ATTRIBUTES}, and a cancellable strategy's message keeps {} free for its claim ({})",
            message_attributes.len(),
            room.attributes(),
            message_attributes.keys().cloned().collect::<Vec<_>>().join(", ")
        )));
    }
    let size = message_size(body, &message_attributes);
    if size + room.bytes() > SQS_MAX_MESSAGE_BYTES {
        return Err(ExecutorError::Refused(format!(
            "the message is {size} bytes with its attributes; SQS allows {SQS_MAX_MESSAGE_BYTES}{}",
            room.reason(queue)
        )));
    }
    Ok((SendParts { queue, delay_seconds, group_id, dedup_id }, message_attributes, size))
}

/// A checked batch entry for one send, with its target queue and its size.
fn checked_entry<'c>(
    id: &str,
    command: &'c Command,
    body: &str,
    base: &BTreeMap<String, FieldValue>,
    properties: &PropertyAttributes,
    room: Room,
) -> Result<(&'c str, SendMessageBatchRequestEntry, usize), ExecutorError> {
    let (send, message_attributes, size) = checked_send(command, body, base, properties, room)?;
    let SendParts { queue, delay_seconds, group_id, dedup_id } = send;
    let mut entry = SendMessageBatchRequestEntry::builder()
        .id(id)
        .message_body(body)
        .set_message_attributes(Some(message_attributes))
        .set_message_group_id(group_id.clone())
        .set_message_deduplication_id(dedup_id.clone());
    // A FIFO queue's delay is the queue's own; SQS refuses a per-message one.
    if !queue.ends_with(".fifo") {
        entry = entry.delay_seconds(*delay_seconds as i32);
    }
    let entry = entry.build().map_err(|e| ExecutorError::Refused(format!("batch entry: {e}")))?;
    Ok((queue, entry, size))
}

impl SqsExecutor {
    /// Region, endpoint and credentials come from the standard AWS chain
    /// (environment, profile, instance role); `region` and `endpoint_url` override it.
    /// `send_batch_window`: how long a first send waits for others to the same queue to share its request.
    pub async fn connect(region: Option<&str>, endpoint_url: Option<&str>, send_batch_window: Duration) -> Result<Self, ExecutorError> {
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
        if let Some(region) = region {
            loader = loader.region(aws_config::Region::new(region.to_string()));
        }
        if let Some(endpoint) = endpoint_url {
            loader = loader.endpoint_url(endpoint);
        }
        let config = loader.load().await;
        if config.region().is_none() {
            return Err(ExecutorError::Unavailable("SQS: no region: set broker.region or AWS_REGION".into()));
        }
        let client = Client::new(&config);
        let requests = Arc::<RequestCounts>::default();
        let batch_requests = BatchRequests { client: client.clone(), requests: requests.clone() };
        let batcher = Batcher::new(batch_requests.clone(), send_batch_window);
        Ok(SqsExecutor { client, urls: Mutex::new(HashMap::new()), requests, batch_requests, batcher, carried: Default::default(), pumped: Default::default() })
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// A pump on `queue` received `messages` in `sqs_messages` SQS messages.
    pub(super) fn note_carried(&self, queue: &str, sqs_messages: usize, messages: usize) {
        if sqs_messages == 0 {
            return;
        }
        let ratio = messages as f64 / sqs_messages as f64;
        let mut carried = self.carried.lock().unwrap_or_else(|p| p.into_inner());
        // Smoothed over the last receives: first sends (alone) and bundles share a queue.
        let smoothed = carried.entry(queue.to_string()).or_insert(ratio);
        *smoothed = 0.8 * *smoothed + 0.2 * ratio;
    }

    fn is_pumped(&self, queue: &str) -> bool {
        self.pumped.lock().unwrap_or_else(|p| p.into_inner()).contains(queue)
    }

    /// Messages per SQS message on `queue` lately (1 where no pump of this host received any).
    pub(super) fn carried_per_message(&self, queue: &str) -> f64 {
        self.carried.lock().unwrap_or_else(|p| p.into_inner()).get(queue).copied().unwrap_or(1.0)
    }

    /// A queue's URL, looked up once.
    pub async fn url(&self, queue: &str) -> Result<Option<String>, ExecutorError> {
        if let Some(url) = self.urls.lock().await.get(queue) {
            return Ok(Some(url.clone()));
        }
        count(&self.requests.get_queue_url);
        match self.client.get_queue_url().queue_name(queue).send().await {
            Ok(output) => {
                let url = output.queue_url().unwrap_or_default().to_string();
                self.urls.lock().await.insert(queue.to_string(), url.clone());
                Ok(Some(url))
            }
            Err(err) if err.as_service_error().is_some_and(|e| e.is_queue_does_not_exist()) => Ok(None),
            Err(err) => Err(unavailable(format!("GetQueueUrl {queue}"), err)),
        }
    }

    async fn existing_url(&self, queue: &str) -> Result<String, ExecutorError> {
        self.url(queue).await?.ok_or_else(|| queue_does_not_exist(queue))
    }

    /// Creates the queue if missing, then refuses to go on unless its
    /// attributes are what the strategy needs.
    pub async fn ensure_queue(&self, name: &str, wanted: &BTreeMap<String, String>) -> Result<String, ExecutorError> {
        let url = match self.url(name).await? {
            Some(url) => url,
            None => {
                count(&self.requests.create_queue);
                let attributes: HashMap<QueueAttributeName, String> = wanted.iter().map(|(k, v)| (QueueAttributeName::from(k.as_str()), v.clone())).collect();
                let created = self
                    .client
                    .create_queue()
                    .queue_name(name)
                    .set_attributes(Some(attributes))
                    .send()
                    .await
                    .map_err(|e| unavailable(format!("CreateQueue {name}"), e))?;
                let url = created.queue_url().unwrap_or_default().to_string();
                self.urls.lock().await.insert(name.to_string(), url.clone());
                url
            }
        };
        count(&self.requests.get_queue_attributes);
        let found = self
            .client
            .get_queue_attributes()
            .queue_url(&url)
            .attribute_names(QueueAttributeName::All)
            .send()
            .await
            .map_err(|e| unavailable(format!("GetQueueAttributes {name}"), e))?;
        let found: HashMap<String, String> =
            found.attributes().map(|a| a.iter().map(|(k, v)| (k.as_str().to_string(), v.clone())).collect()).unwrap_or_default();
        // Attributes that only raise a FIFO queue's throughput are set where they
        // differ (queues made by an earlier version), never refused.
        let settable: Vec<(&String, &String)> =
            wanted.iter().filter(|(key, value)| SETTABLE_ATTRIBUTES.contains(&key.as_str()) && found.get(*key) != Some(*value)).collect();
        if !settable.is_empty() {
            count(&self.requests.set_queue_attributes);
            let mut request = self.client.set_queue_attributes().queue_url(&url);
            for (key, value) in &settable {
                request = request.attributes(QueueAttributeName::from(key.as_str()), value.as_str());
            }
            request.send().await.map_err(|e| unavailable(format!("SetQueueAttributes {name}"), e))?;
        }
        let mut wrong = Vec::new();
        for (key, value) in wanted.iter().filter(|(key, _)| !SETTABLE_ATTRIBUTES.contains(&key.as_str())) {
            let actual = found.get(key).map(String::as_str);
            let fine = match key.as_str() {
                // Longer retention than required is fine.
                "MessageRetentionPeriod" => actual.and_then(|a| a.parse::<u64>().ok()) >= value.parse::<u64>().ok(),
                _ => actual == Some(value.as_str()),
            };
            if !fine {
                wrong.push(format!("{key} is {}, hourglass needs {value}", actual.unwrap_or("unset")));
            }
        }
        if let Some(policy) = found.get("RedrivePolicy")
            && !redrives_to_own_dead_letters(name, policy)
        {
            wrong.push(format!("RedrivePolicy sends to another queue than {}: only the pump may park messages", dead_letter_queue(name)));
        }
        if !wrong.is_empty() {
            return Err(ExecutorError::Refused(format!("SQS queue {name:?} cannot be used: {}", wrong.join("; "))));
        }
        Ok(url)
    }

    /// A batch entry for one send, checked against SQS's limits; returns it with its size.
    pub(crate) fn batch_entry(
        &self,
        id: &str,
        command: &Command,
        body: &str,
        base: &BTreeMap<String, FieldValue>,
        properties: &PropertyAttributes,
    ) -> Result<(SendMessageBatchRequestEntry, usize), ExecutorError> {
        checked_entry(id, command, body, base, properties, Room::default()).map(|(_, entry, size)| (entry, size))
    }

    /// One receive of up to ten messages from `queue` at `url`, with every
    /// message and system attribute, long-polling `wait_seconds`.
    pub(crate) async fn receive_ten(&self, queue: &str, url: &str, wait_seconds: i32) -> Result<Vec<Message>, ExecutorError> {
        count(&self.requests.receive_message);
        let output = self
            .client
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .wait_time_seconds(wait_seconds)
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send()
            .await
            .map_err(|e| unavailable(format!("ReceiveMessage on {queue}"), e))?;
        Ok(output.messages.unwrap_or_default())
    }

    /// Sends entries to one queue in batches of at most 10 and 256 KiB.
    /// Returns the entries that did not go, by id, each with why: `Refused`
    /// when SQS blames the entry or the queue does not exist (or no longer
    /// does: the entries not yet sent then), `Unavailable` when it may pass.
    pub(crate) async fn send_batches(&self, queue: &str, entries: Vec<(SendMessageBatchRequestEntry, usize)>) -> Vec<(String, ExecutorError)> {
        let ids = |entries: &[(SendMessageBatchRequestEntry, usize)]| entries.iter().map(|(e, _)| e.id().to_string()).collect::<Vec<_>>();
        let url = match self.existing_url(queue).await {
            Ok(url) => url,
            Err(err) => return ids(&entries).into_iter().map(|id| (id, err.clone())).collect(),
        };
        let mut failed = Vec::new();
        let mut batch: Vec<SendMessageBatchRequestEntry> = Vec::new();
        let mut batch_bytes = 0;
        let mut entries = entries.into_iter().peekable();
        while let Some((entry, size)) = entries.next() {
            batch_bytes += size;
            batch.push(entry);
            if entries.peek().is_some_and(|(_, next)| fits_in_batch(batch.len(), batch_bytes, *next)) {
                continue;
            }
            let sent = std::mem::take(&mut batch);
            let sent_ids: Vec<String> = sent.iter().map(|e| e.id().to_string()).collect();
            match self.batch_requests.send_batch(queue, &url, sent).await {
                Ok(refused) => failed.extend(refused.iter().map(|f| (f.id().to_string(), super::batcher::entry_failure(queue, f)))),
                // The queue is gone (deleted since its URL was looked up): nothing more can go there.
                Err(err @ ExecutorError::Refused(_)) => {
                    self.urls.lock().await.remove(queue);
                    let rest: Vec<(SendMessageBatchRequestEntry, usize)> = entries.collect();
                    failed.extend(sent_ids.into_iter().chain(ids(&rest)).map(|id| (id, err.clone())));
                    return failed;
                }
                Err(err) => {
                    tracing::warn!(queue, error = %err, "SendMessageBatch failed");
                    failed.extend(sent_ids.into_iter().map(|id| (id, err.clone())));
                }
            }
            batch_bytes = 0;
        }
        failed
    }
}

impl Executor for SqsExecutor {
    fn describe(&self) -> String {
        "SQS".into()
    }

    async fn apply(&self, commands: &[Command]) -> Result<(), ExecutorError> {
        for command in commands {
            let Command::Sqs(command) = command else { return Err(ExecutorError::other_family(command, BrokerFamily::Sqs)) };
            match command {
                SqsCommand::EnsureQueue { name, attributes, pumped } => {
                    self.ensure_queue(name, attributes).await?;
                    if *pumped {
                        self.pumped.lock().unwrap_or_else(|p| p.into_inner()).insert(name.clone());
                    }
                }
                SqsCommand::Send { .. } => return Err(ExecutorError::Refused("a send needs a message".into())),
            }
        }
        Ok(())
    }

    async fn check_destination(&self, destination: &str) -> Result<(), ExecutorError> {
        self.existing_url(destination).await.map(|_| ())
    }

    async fn queue_depth(&self, queue: &str) -> Option<u64> {
        SqsExecutor::queue_depth(self, queue).await
    }

    async fn mark_pumped(&self, queue: &str, strategy: &str) -> Result<(), ExecutorError> {
        self.tag_pumped(queue, strategy).await
    }

    async fn send(&self, commands: &[Command], envelope: &Envelope) -> Result<(), ExecutorError> {
        let body = std::str::from_utf8(&envelope.body).map_err(|_| ExecutorError::Refused("SQS message bodies are text; this body is not UTF-8".into()))?;
        let properties = super::properties::to_attributes(&envelope.properties)?;
        // Every send checked and its queue found before any is queued: an invalid message never joins a batch.
        let mut sends = Vec::with_capacity(commands.len());
        let cancellable = envelope.headers.contains_key(ID_HEADER);
        for command in commands {
            // A declaration among the sends is carried out, as the other brokers do.
            if !command.sends_the_message() {
                self.apply(std::slice::from_ref(command)).await?;
                continue;
            }
            let pumped = matches!(command, Command::Sqs(SqsCommand::Send { queue, .. }) if self.is_pumped(queue));
            // The batcher gives the entry an id unique within its request.
            let (queue, entry, size) = checked_entry("unassigned", command, body, &envelope.headers, &properties, Room { pumped, cancellable })?;
            let url = self.existing_url(queue).await?;
            sends.push((queue, url, entry, size));
        }
        for (queue, url, entry, size) in sends {
            self.batcher.send(queue, &url, entry, size).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_than_ten_attributes_are_refused_before_sending() {
        let headers: BTreeMap<String, FieldValue> = (0..9).map(|i| (format!("h{i}"), FieldValue::Int(i))).collect();
        let extra: BTreeMap<String, String> = [("a".to_string(), "1".to_string()), ("b".to_string(), "2".to_string())].into();
        let none = PropertyAttributes::new();
        let err = message_attributes(&none, &headers, &extra).unwrap_err().to_string();
        assert!(err.contains("11 attributes; SQS allows 10"), "{err}");
        assert!(message_attributes(&none, &headers, &BTreeMap::new()).is_ok());
        // The properties count too.
        let typed = crate::message::Properties { content_type: Some("text/plain".into()), ..Default::default() };
        let properties = super::super::properties::to_attributes(&typed).unwrap();
        let err = message_attributes(&properties, &headers, &[("a".to_string(), "1".to_string())].into()).unwrap_err().to_string();
        assert!(err.contains("11 attributes; SQS allows 10") && err.contains("content-type"), "{err}");
    }

    #[test]
    fn binary_attribute_values_count_toward_the_size_limit() {
        let blob = MessageAttributeValue::builder().data_type("Binary").binary_value(aws_sdk_sqs::primitives::Blob::new(vec![0u8; 1_000])).build().unwrap();
        let attributes: HashMap<String, MessageAttributeValue> = [("b".to_string(), blob)].into();
        assert_eq!(message_size("body", &attributes), 4 + 1 + "Binary".len() + 1_000);
    }

    #[test]
    fn a_header_cannot_overwrite_a_property() {
        let typed = crate::message::Properties { content_type: Some("text/plain".into()), ..Default::default() };
        let properties = super::super::properties::to_attributes(&typed).unwrap();
        let headers: BTreeMap<String, FieldValue> = [("content-type".to_string(), FieldValue::Text("x".into()))].into();
        let err = message_attributes(&properties, &headers, &BTreeMap::new()).unwrap_err().to_string();
        assert!(err.contains("\"content-type\""), "{err}");
    }
}
