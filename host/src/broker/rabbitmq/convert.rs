//! Neutral messages to and from AMQP: [`Properties`] ↔ lapin's
//! `BasicProperties`, [`HeaderValue`] ↔ `AMQPValue`, [`FieldTable`] → AMQP
//! tables, a lapin delivery → [`Delivery`].
//!
//! Going to AMQP is fallible rather than panicking: lapin's `ShortString`
//! panics on more than 255 bytes, and a name that long must fail its own
//! request, not the task that sends it.

use lapin::BasicProperties;
use lapin::types::{AMQPValue, ByteArray, DecimalValue, FieldArray, FieldTable as AmqpTable, LongString, ShortString};

use crate::command::{FieldTable, FieldValue};
use crate::message::{Delivery, HeaderValue, Headers, Properties};

/// A name or value over AMQP's 255-byte short-string limit; `what` says which.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} is {len} bytes; AMQP allows at most 255")]
pub(crate) struct TooLongForAmqp {
    pub what: String,
    pub len: usize,
}

/// An AMQP short string, or an error naming `what` when it is over 255 bytes.
pub(crate) fn short_string(what: &str, text: &str) -> Result<ShortString, TooLongForAmqp> {
    ShortString::try_new(text).map_err(|_| TooLongForAmqp { what: what.to_string(), len: text.len() })
}

pub(crate) fn to_amqp_value(value: &HeaderValue) -> Result<AMQPValue, TooLongForAmqp> {
    Ok(match value {
        HeaderValue::Bool(v) => AMQPValue::Boolean(*v),
        HeaderValue::I8(v) => AMQPValue::ShortShortInt(*v),
        HeaderValue::U8(v) => AMQPValue::ShortShortUInt(*v),
        HeaderValue::I16(v) => AMQPValue::ShortInt(*v),
        HeaderValue::U16(v) => AMQPValue::ShortUInt(*v),
        HeaderValue::I32(v) => AMQPValue::LongInt(*v),
        HeaderValue::U32(v) => AMQPValue::LongUInt(*v),
        HeaderValue::I64(v) => AMQPValue::LongLongInt(*v),
        HeaderValue::F32(v) => AMQPValue::Float(*v),
        HeaderValue::F64(v) => AMQPValue::Double(*v),
        HeaderValue::Decimal { scale, value } => AMQPValue::DecimalValue(DecimalValue { scale: *scale, value: *value }),
        HeaderValue::ShortText(s) => AMQPValue::ShortString(short_string("a short-string header value", s)?),
        HeaderValue::Text(bytes) => AMQPValue::LongString(LongString::from(bytes.clone())),
        HeaderValue::Bytes(bytes) => AMQPValue::ByteArray(ByteArray::from(bytes.clone())),
        HeaderValue::Timestamp(t) => AMQPValue::Timestamp(*t),
        HeaderValue::Array(items) => AMQPValue::FieldArray(FieldArray::from(items.iter().map(to_amqp_value).collect::<Result<Vec<_>, _>>()?)),
        HeaderValue::Table(table) => AMQPValue::FieldTable(to_amqp_headers(table)?),
        HeaderValue::Void => AMQPValue::Void,
    })
}

pub(crate) fn from_amqp_value(value: &AMQPValue) -> HeaderValue {
    match value {
        AMQPValue::Boolean(v) => HeaderValue::Bool(*v),
        AMQPValue::ShortShortInt(v) => HeaderValue::I8(*v),
        AMQPValue::ShortShortUInt(v) => HeaderValue::U8(*v),
        AMQPValue::ShortInt(v) => HeaderValue::I16(*v),
        AMQPValue::ShortUInt(v) => HeaderValue::U16(*v),
        AMQPValue::LongInt(v) => HeaderValue::I32(*v),
        AMQPValue::LongUInt(v) => HeaderValue::U32(*v),
        AMQPValue::LongLongInt(v) => HeaderValue::I64(*v),
        AMQPValue::Float(v) => HeaderValue::F32(*v),
        AMQPValue::Double(v) => HeaderValue::F64(*v),
        AMQPValue::DecimalValue(d) => HeaderValue::Decimal { scale: d.scale, value: d.value },
        AMQPValue::ShortString(s) => HeaderValue::ShortText(s.as_str().to_string()),
        AMQPValue::LongString(s) => HeaderValue::Text(s.as_bytes().to_vec()),
        AMQPValue::ByteArray(b) => HeaderValue::Bytes(b.as_slice().to_vec()),
        AMQPValue::Timestamp(t) => HeaderValue::Timestamp(*t),
        AMQPValue::FieldArray(items) => HeaderValue::Array(items.as_slice().iter().map(from_amqp_value).collect()),
        AMQPValue::FieldTable(table) => HeaderValue::Table(from_amqp_headers(table)),
        AMQPValue::Void => HeaderValue::Void,
    }
}

pub(crate) fn to_amqp_headers(headers: &Headers) -> Result<AmqpTable, TooLongForAmqp> {
    let mut table = AmqpTable::default();
    for (name, value) in headers {
        table.insert(short_string(&format!("header name {:?}…", truncated(name)), name)?, to_amqp_value(value)?);
    }
    Ok(table)
}

pub(crate) fn from_amqp_headers(table: &AmqpTable) -> Headers {
    table.inner().iter().map(|(k, v)| (k.as_str().to_string(), from_amqp_value(v))).collect()
}

/// Declare arguments and hourglass's own headers. Planner output is checked
/// on the way in (names ≤ 255 bytes), so this cannot fail for it.
pub(crate) fn to_amqp_table(table: &FieldTable) -> AmqpTable {
    let mut out = AmqpTable::default();
    for (key, value) in table {
        let value = match value {
            FieldValue::Text(s) => AMQPValue::LongString(LongString::from(s.as_str())),
            FieldValue::Int(i) => AMQPValue::LongLongInt(*i),
            FieldValue::Bool(b) => AMQPValue::Boolean(*b),
        };
        if let Ok(key) = ShortString::try_new(key.as_str()) {
            out.insert(key, value);
        }
    }
    out
}

/// The AMQP properties for a neutral message: persistent, no expiration.
pub(crate) fn to_amqp_properties(properties: &Properties) -> Result<BasicProperties, TooLongForAmqp> {
    let mut out = BasicProperties::default().with_delivery_mode(2).with_headers(to_amqp_headers(&properties.headers)?);
    let short = |what: &str, value: &Option<String>| value.as_deref().map(|v| short_string(what, v)).transpose();
    if let Some(v) = short("content_type", &properties.content_type)? {
        out = out.with_content_type(v);
    }
    if let Some(v) = short("content_encoding", &properties.content_encoding)? {
        out = out.with_content_encoding(v);
    }
    if let Some(v) = properties.priority {
        out = out.with_priority(v);
    }
    if let Some(v) = short("correlation_id", &properties.correlation_id)? {
        out = out.with_correlation_id(v);
    }
    if let Some(v) = short("reply_to", &properties.reply_to)? {
        out = out.with_reply_to(v);
    }
    if let Some(v) = short("message_id", &properties.message_id)? {
        out = out.with_message_id(v);
    }
    if let Some(v) = properties.timestamp {
        out = out.with_timestamp(v);
    }
    if let Some(v) = short("type", &properties.kind)? {
        out = out.with_type(v);
    }
    if let Some(v) = short("user_id", &properties.user_id)? {
        out = out.with_user_id(v);
    }
    if let Some(v) = short("app_id", &properties.app_id)? {
        out = out.with_app_id(v);
    }
    Ok(out)
}

/// A delivery's properties as hourglass carries them; `expiration`,
/// `delivery-mode` and `cluster-id` are dropped (see [`crate::message`]).
pub(crate) fn from_amqp_properties(properties: &BasicProperties) -> Properties {
    let text = |v: &Option<ShortString>| v.as_ref().map(|s| s.as_str().to_string());
    Properties {
        content_type: text(properties.content_type()),
        content_encoding: text(properties.content_encoding()),
        headers: properties.headers().as_ref().map(from_amqp_headers).unwrap_or_default(),
        priority: *properties.priority(),
        correlation_id: text(properties.correlation_id()),
        reply_to: text(properties.reply_to()),
        message_id: text(properties.message_id()),
        timestamp: *properties.timestamp(),
        kind: text(properties.kind()),
        user_id: text(properties.user_id()),
        app_id: text(properties.app_id()),
    }
}

/// A delivery from `queue` as handlers see it.
pub(crate) fn from_amqp_delivery(queue: &str, delivery: &lapin::message::Delivery) -> Delivery {
    Delivery {
        queue: queue.to_string(),
        body: delivery.data.clone(),
        properties: from_amqp_properties(&delivery.properties),
        exchange: delivery.exchange.as_str().to_string(),
        routing_key: delivery.routing_key.as_str().to_string(),
        redelivered: delivery.redelivered,
    }
}

fn truncated(name: &str) -> &str {
    let mut end = name.len().min(32);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_round_trip_with_typed_headers_and_lose_expiration() {
        let mut headers = Headers::new();
        headers.insert("score".into(), HeaderValue::F64(0.5));
        headers.insert("tags".into(), HeaderValue::Array(vec![HeaderValue::text("a"), HeaderValue::I32(2)]));
        headers.insert("raw".into(), HeaderValue::Bytes(vec![0, 255]));
        let properties = Properties {
            content_type: Some("application/json".into()),
            correlation_id: Some("c-1".into()),
            priority: Some(3),
            timestamp: Some(1_700_000_000),
            headers,
            ..Default::default()
        };
        let amqp = to_amqp_properties(&properties).unwrap().with_expiration("10".into());
        assert_eq!(*amqp.delivery_mode(), Some(2));
        assert_eq!(from_amqp_properties(&amqp), properties);
    }

    #[test]
    fn names_over_255_bytes_are_errors_not_panics() {
        let mut headers = Headers::new();
        headers.insert("h".repeat(256), HeaderValue::Bool(true));
        let err = to_amqp_properties(&Properties { headers, ..Default::default() }).unwrap_err().to_string();
        assert!(err.contains("256 bytes"), "{err}");
        let err = to_amqp_properties(&Properties { reply_to: Some("r".repeat(300)), ..Default::default() }).unwrap_err().to_string();
        assert!(err.contains("reply_to"), "{err}");
    }
}
