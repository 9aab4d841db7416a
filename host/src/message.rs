//! The broker-neutral message: the properties a producer set (content type,
//! correlation id, its own typed headers, …), carried through a delay on any
//! broker. `broker::rabbitmq` converts them to and from AMQP; `broker::sqs`
//! to and from message attributes.
//!
//! [`Handler`], [`Delivery`], [`Outcome`] and [`Settled`] are the consumer's
//! side: what a handler (the ingress, redelivery) receives and what it asks for,
//! whichever broker's consumer carries it out.
//!
//! Two AMQP properties are deliberately absent: `expiration` (a per-message
//! TTL would cut a delay short in the first delay queue, so it is never
//! forwarded) and `delivery-mode` (hourglass always publishes persistent).

use std::collections::BTreeMap;

use crate::command::Command;

/// Header name → value, in name order.
pub type Headers = BTreeMap<String, HeaderValue>;

/// A header value of any AMQP field type, so a producer's headers arrive with
/// the type they were sent with.
#[derive(Clone, Debug, PartialEq)]
pub enum HeaderValue {
    Bool(bool),
    I8(i8),
    U8(u8),
    I16(i16),
    U16(u16),
    I32(i32),
    U32(u32),
    I64(i64),
    F32(f32),
    F64(f64),
    Decimal {
        scale: u8,
        value: u32,
    },
    /// An AMQP short string (at most 255 bytes).
    ShortText(String),
    /// An AMQP long string: bytes, usually UTF-8 text.
    Text(Vec<u8>),
    Bytes(Vec<u8>),
    /// Seconds since the Unix epoch.
    Timestamp(u64),
    Array(Vec<HeaderValue>),
    Table(Headers),
    Void,
}

impl HeaderValue {
    pub fn text(text: &str) -> HeaderValue {
        HeaderValue::Text(text.as_bytes().to_vec())
    }

    /// The value as text, if it is a string of either kind.
    pub(crate) fn as_text(&self) -> Option<String> {
        match self {
            HeaderValue::ShortText(s) => Some(s.clone()),
            HeaderValue::Text(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
            _ => None,
        }
    }

    /// The value as a whole number, if it is an integer of any width.
    pub(crate) fn as_whole_number(&self) -> Option<i128> {
        Some(match *self {
            HeaderValue::I8(v) => v as i128,
            HeaderValue::U8(v) => v as i128,
            HeaderValue::I16(v) => v as i128,
            HeaderValue::U16(v) => v as i128,
            HeaderValue::I32(v) => v as i128,
            HeaderValue::U32(v) => v as i128,
            HeaderValue::I64(v) => v as i128,
            _ => return None,
        })
    }
}

impl From<&crate::command::FieldValue> for HeaderValue {
    fn from(value: &crate::command::FieldValue) -> HeaderValue {
        use crate::command::FieldValue;
        match value {
            FieldValue::Text(s) => HeaderValue::text(s),
            FieldValue::Int(i) => HeaderValue::I64(*i),
            FieldValue::Bool(b) => HeaderValue::Bool(*b),
        }
    }
}

/// What a producer set on a message besides its body.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Properties {
    pub content_type: Option<String>,
    pub content_encoding: Option<String>,
    pub headers: Headers,
    pub priority: Option<u8>,
    pub correlation_id: Option<String>,
    pub reply_to: Option<String>,
    pub message_id: Option<String>,
    /// Seconds since the Unix epoch.
    pub timestamp: Option<u64>,
    /// AMQP's `type` property.
    pub kind: Option<String>,
    pub user_id: Option<String>,
    pub app_id: Option<String>,
}

/// A message a consumer took off a queue, as its handler sees it: no broker
/// types, so handlers live outside `broker::rabbitmq`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Delivery {
    /// The queue it was consumed from.
    pub queue: String,
    pub body: Vec<u8>,
    pub properties: Properties,
    /// The exchange it was published to (empty: the default exchange).
    pub exchange: String,
    pub routing_key: String,
    /// The broker delivered it before without an acknowledgement (a requeue, a lost consumer).
    pub redelivered: bool,
}

/// What a handler wants done with a delivery; the consumer carries it out.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Done with it (its forward was confirmed): acknowledge it.
    Ack,
    /// Not now, and maybe not here (the planner ran out of time): back on its queue after a short pause.
    Requeue,
    /// Not now, through no fault of the message (the broker cannot take the
    /// publish it needs): a RabbitMQ consumer keeps it in hand and asks the
    /// handler again after a pause, longer each time, until the answer
    /// changes; only when the consumer stops or loses its channel does it go
    /// back to its queue. RabbitMQ 4's quorum queues drop a message returned
    /// more than 20 times, so waiting out an outage must not return it. An
    /// SQS consumer makes it visible again later, as for `Requeue`.
    Retry,
    /// Set it aside: publish it as it came plus `headers` to `queue`, wait for
    /// the broker's confirm, then acknowledge it; if that publish fails it is
    /// requeued instead, never dropped. `reason` is for the log.
    MoveTo { queue: String, headers: Headers, reason: String },
}

impl Outcome {
    /// A move to `queue` with one header giving the reason.
    pub fn move_to(queue: &str, reason_header: &str, reason: &str) -> Outcome {
        Outcome::MoveTo { queue: queue.to_string(), headers: [(reason_header.to_string(), HeaderValue::text(reason))].into(), reason: reason.to_string() }
    }
}

/// How a consumer carried out an [`Outcome`].
#[derive(Clone, Debug, PartialEq)]
pub enum Settled {
    /// Acknowledged (after a move, once the move was confirmed).
    Acked,
    /// Done, but the acknowledgement could not be sent: the broker delivers it again.
    AckLost,
    /// Back on its queue.
    Requeued,
    /// The move failed (the reason); the message was requeued.
    MoveFailed(String),
}

impl Settled {
    /// A metric label for an outcome labelled `done`: `done`, `done_unacked` or `requeued`.
    pub fn label(&self, done: &'static str) -> String {
        match self {
            Settled::Acked => done.to_string(),
            Settled::AckLost => format!("{done}_unacked"),
            Settled::Requeued | Settled::MoveFailed(_) => "requeued".to_string(),
        }
    }
}

/// What a consumer (the AMQP one, or the SQS one) does with its queue.
pub trait Handler: Send + Sync + 'static {
    /// What `handle` tells `settled` about a delivery (for counts and metrics).
    type Note: Send;

    /// The queue consumed.
    fn queue(&self) -> &str;
    fn prefetch(&self) -> u16;
    /// The queues (and exchanges, bindings) the handler needs; declared on every connect.
    fn declarations(&self) -> Vec<Command>;
    /// A hint added to a refused declaration (which setting would avoid it).
    fn declaration_hint(&self) -> Option<String> {
        None
    }
    /// Decides what happens to one delivery.
    fn handle(&self, delivery: &Delivery) -> impl Future<Output = (Outcome, Self::Note)> + Send;
    /// Where a message goes that made `handle` panic `MAX_PANICS` times.
    fn poisoned(&self, delivery: &Delivery, reason: &str) -> Outcome;
    /// How the outcome was carried out: once per delivery, `note` is `None` when `handle` panicked.
    fn settled(&self, note: Option<Self::Note>, outcome: &Outcome, settled: &Settled);
}
