//! A message as NATS headers: hourglass's own and the caller's headers by
//! name, each value as text; the neutral properties under the names a NATS
//! consumer would look for (`Content-Type`, `Correlation-Id`, …); and
//! `Nats-Msg-Id` set to hourglass's id, so the stream drops a publish repeated
//! within its duplicate window (a hand-over retried after a lost acknowledgement).
//!
//! NATS headers are text: a value that is not (a nested table, an array,
//! bytes that are not UTF-8, a line break) is refused, never trimmed.

use std::str::FromStr;

use async_nats::{HeaderMap, HeaderName, HeaderValue};

use crate::command::FieldValue;
use crate::executor::{Envelope, ExecutorError};
use crate::message::{HeaderValue as Typed, Properties};

/// JetStream's de-duplication header.
pub(crate) const MSG_ID: &str = "Nats-Msg-Id";

/// Every header the message carries on NATS.
pub(crate) fn headers(envelope: &Envelope) -> Result<HeaderMap, ExecutorError> {
    let mut map = HeaderMap::new();
    for (name, value) in &envelope.headers {
        let text = match value {
            FieldValue::Text(text) => text.clone(),
            FieldValue::Int(i) => i.to_string(),
            FieldValue::Bool(b) => b.to_string(),
        };
        put(&mut map, name, text)?;
    }
    properties(&mut map, &envelope.properties)?;
    put(&mut map, MSG_ID, envelope.id.clone())?;
    Ok(map)
}

/// The headers that carry the neutral properties, and hourglass's id; a consumer reads them back as properties.
pub(crate) const PROPERTY_HEADERS: [&str; 11] =
    ["Content-Type", "Content-Encoding", "Correlation-Id", "Reply-To", "Message-Id", "Type", "User-Id", "App-Id", "Priority", "Timestamp", MSG_ID];

/// The text properties by header name.
fn text_property<'a>(properties: &'a mut Properties, name: &str) -> Option<&'a mut Option<String>> {
    Some(match name {
        "Content-Type" => &mut properties.content_type,
        "Content-Encoding" => &mut properties.content_encoding,
        "Correlation-Id" => &mut properties.correlation_id,
        "Reply-To" => &mut properties.reply_to,
        "Message-Id" => &mut properties.message_id,
        "Type" => &mut properties.kind,
        "User-Id" => &mut properties.user_id,
        "App-Id" => &mut properties.app_id,
        _ => return None,
    })
}

fn properties(map: &mut HeaderMap, properties: &Properties) -> Result<(), ExecutorError> {
    let mut copy = properties.clone();
    for name in PROPERTY_HEADERS {
        if let Some(Some(value)) = text_property(&mut copy, name).map(|v| v.take()) {
            put(map, name, value)?;
        }
    }
    if let Some(priority) = properties.priority {
        put(map, "Priority", priority.to_string())?;
    }
    if let Some(timestamp) = properties.timestamp {
        put(map, "Timestamp", timestamp.to_string())?;
    }
    for (name, value) in &properties.headers {
        put_typed(map, name, value)?;
    }
    Ok(())
}

/// Sets the property header `name` carries; false for any other header.
/// Headers the server reads (`Nats-…`) are taken as properties too: they are not carried on.
pub(crate) fn set_property(properties: &mut Properties, name: &str, value: &str) -> bool {
    if let Some(slot) = text_property(properties, name) {
        *slot = Some(value.to_string());
        return true;
    }
    match name {
        "Priority" => properties.priority = value.parse().ok(),
        "Timestamp" => properties.timestamp = value.parse().ok(),
        other => return other.starts_with("Nats-"),
    }
    true
}

/// A typed header, as text.
pub(crate) fn put_typed(map: &mut HeaderMap, name: &str, value: &Typed) -> Result<(), ExecutorError> {
    put(map, name, typed_text(name, value)?)
}

/// A typed header's value as NATS carries it: text.
fn typed_text(name: &str, value: &Typed) -> Result<String, ExecutorError> {
    let refused = |what: &str| ExecutorError::Invalid(format!("header {name:?}: {what} has no text form, and NATS headers are text"));
    Ok(match value {
        Typed::Bool(b) => b.to_string(),
        Typed::I8(i) => i.to_string(),
        Typed::U8(i) => i.to_string(),
        Typed::I16(i) => i.to_string(),
        Typed::U16(i) => i.to_string(),
        Typed::I32(i) => i.to_string(),
        Typed::U32(i) => i.to_string(),
        Typed::I64(i) => i.to_string(),
        Typed::F32(f) => f.to_string(),
        Typed::F64(f) => f.to_string(),
        Typed::Decimal { scale, value } => {
            let digits = format!("{value:0>width$}", width = usize::from(*scale) + 1);
            let (whole, fraction) = digits.split_at(digits.len() - usize::from(*scale));
            if fraction.is_empty() { whole.to_string() } else { format!("{whole}.{fraction}") }
        }
        Typed::ShortText(text) => text.clone(),
        Typed::Text(bytes) | Typed::Bytes(bytes) => String::from_utf8(bytes.clone()).map_err(|_| refused("bytes that are not UTF-8"))?,
        Typed::Timestamp(seconds) => seconds.to_string(),
        Typed::Array(_) => return Err(refused("an array")),
        Typed::Table(_) => return Err(refused("a table")),
        Typed::Void => String::new(),
    })
}

fn put(map: &mut HeaderMap, name: &str, value: String) -> Result<(), ExecutorError> {
    let header = HeaderName::from_str(name).map_err(|_| ExecutorError::Invalid(format!("header name {name:?}: NATS takes printable ASCII without ':'")))?;
    let value = HeaderValue::from_str(&value).map_err(|_| ExecutorError::Invalid(format!("header {name:?}: a NATS header value cannot hold a line break")))?;
    map.insert(header, value);
    Ok(())
}

/// A header's text, if the message has it.
pub(crate) fn text<'a>(map: &'a HeaderMap, name: &str) -> Option<&'a str> {
    map.get(name).map(HeaderValue::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::FieldTable;

    fn envelope(headers: FieldTable, properties: Properties) -> Envelope {
        Envelope { id: "id-1".into(), body: b"x".to_vec(), headers, properties, stamp_message_id: true }
    }

    #[test]
    fn headers_and_properties_travel_as_text_and_the_id_deduplicates() {
        let mut properties = Properties { content_type: Some("application/json".into()), priority: Some(3), ..Default::default() };
        properties.headers.insert("attempt".into(), Typed::I32(2));
        properties.headers.insert("price".into(), Typed::Decimal { scale: 2, value: 5 });
        let headers: FieldTable = [("hourglass-due-at".to_string(), FieldValue::Int(1_700_000_000_000))].into();
        let map = super::headers(&envelope(headers, properties)).unwrap();
        assert_eq!(text(&map, "hourglass-due-at"), Some("1700000000000"));
        assert_eq!(text(&map, "Content-Type"), Some("application/json"));
        assert_eq!(text(&map, "Priority"), Some("3"));
        assert_eq!(text(&map, "attempt"), Some("2"));
        assert_eq!(text(&map, "price"), Some("0.05"));
        assert_eq!(text(&map, MSG_ID), Some("id-1"));
    }

    #[test]
    fn what_is_not_text_is_refused_naming_the_header() {
        let mut properties = Properties::default();
        properties.headers.insert("nested".into(), Typed::Table(Default::default()));
        let err = super::headers(&envelope(FieldTable::new(), properties)).unwrap_err();
        assert!(matches!(&err, ExecutorError::Invalid(why) if why.contains("\"nested\"")), "{err}");
        let mut properties = Properties::default();
        properties.headers.insert("two lines".into(), Typed::ShortText("a".into()));
        assert!(super::headers(&envelope(FieldTable::new(), properties)).is_err(), "a space in a header name");
    }
}
