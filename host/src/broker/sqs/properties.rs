//! A message's neutral [`Properties`] as SQS message attributes, and back.
//!
//! SQS allows ten attributes per message and hourglass, the planner and the
//! producer's own headers already use some, so the properties take at most two:
//!
//! * `content-type` (String): the content type on its own, where any SQS
//!   consumer looks for it.
//! * `hourglass-properties` (`String.json`): every other property that is set,
//!   as one JSON object with the AMQP names (`content-encoding`,
//!   `correlation-id`, `reply-to`, `message-id`, `type`, `user-id`, `app-id`,
//!   `priority`, `timestamp`) and `headers`, the producer's typed headers. Each
//!   header value is an object naming its type, so an `i32` stays an `i32`:
//!   `{"i32": 5}`, `{"text": "a"}`, `{"bytes": "<base64>"}`, `{"table": {…}}`.
//!
//! Neither is sent when it would be empty. The pump carries both unchanged
//! from cycle to cycle, so the message at the destination has them as they
//! were sent; [`from_attributes`] turns them back into [`Properties`].

use std::collections::HashMap;

use aws_sdk_sqs::types::MessageAttributeValue;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Map, Value, json};

use crate::executor::ExecutorError;
use crate::message::{HeaderValue, Headers, Properties};

/// The content type, as its own attribute.
pub const CONTENT_TYPE_ATTRIBUTE: &str = "content-type";
/// Every other property, as one JSON attribute.
pub(crate) const PROPERTIES_ATTRIBUTE: &str = "hourglass-properties";
const PROPERTIES_DATA_TYPE: &str = "String.json";

/// Whether an attribute carries properties (the pump keeps those apart from the planner's view).
pub(crate) fn is_property_attribute(name: &str) -> bool {
    name == CONTENT_TYPE_ATTRIBUTE || name == PROPERTIES_ATTRIBUTE
}

/// The attributes that carry `properties`: none, one or two.
pub(crate) fn to_attributes(properties: &Properties) -> Result<HashMap<String, MessageAttributeValue>, ExecutorError> {
    let mut attributes = HashMap::new();
    if let Some(content_type) = &properties.content_type {
        attributes.insert(CONTENT_TYPE_ATTRIBUTE.to_string(), attribute("String", content_type.clone())?);
    }
    let mut rest = Map::new();
    let text = [
        ("content-encoding", &properties.content_encoding),
        ("correlation-id", &properties.correlation_id),
        ("reply-to", &properties.reply_to),
        ("message-id", &properties.message_id),
        ("type", &properties.kind),
        ("user-id", &properties.user_id),
        ("app-id", &properties.app_id),
    ];
    for (name, value) in text {
        if let Some(value) = value {
            rest.insert(name.into(), Value::from(value.as_str()));
        }
    }
    if let Some(priority) = properties.priority {
        rest.insert("priority".into(), Value::from(priority));
    }
    if let Some(timestamp) = properties.timestamp {
        rest.insert("timestamp".into(), Value::from(timestamp));
    }
    if !properties.headers.is_empty() {
        rest.insert("headers".into(), headers_to_json(&properties.headers));
    }
    if !rest.is_empty() {
        attributes.insert(PROPERTIES_ATTRIBUTE.to_string(), attribute(PROPERTIES_DATA_TYPE, Value::Object(rest).to_string())?);
    }
    Ok(attributes)
}

/// Why an `hourglass-properties` attribute cannot be read: hourglass did not write it.
#[derive(Debug, thiserror::Error)]
pub enum MalformedProperties {
    #[error("attribute {PROPERTIES_ATTRIBUTE}: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("attribute {PROPERTIES_ATTRIBUTE}: not a JSON object")]
    NotAnObject,
    #[error("attribute {PROPERTIES_ATTRIBUTE}: {0} is not text")]
    NotText(String),
    #[error("attribute {PROPERTIES_ATTRIBUTE}: priority is not 0-255")]
    Priority,
    #[error("attribute {PROPERTIES_ATTRIBUTE}: timestamp is not whole seconds")]
    Timestamp,
    #[error("attribute {PROPERTIES_ATTRIBUTE}: headers: {0}")]
    Headers(#[source] MalformedHeader),
    #[error("attribute {PROPERTIES_ATTRIBUTE}: unknown property {0:?}")]
    UnknownProperty(String),
}

/// Why a header in `hourglass-properties` is not one of its typed values.
#[derive(Debug, thiserror::Error)]
pub enum MalformedHeader {
    #[error("not an object")]
    NotAnObject,
    /// Named by the path down to it: `outer: inner: …`.
    #[error("{name}: {source}")]
    In { name: String, source: Box<MalformedHeader> },
    #[error("not a typed value")]
    NotTyped,
    #[error("a typed value has exactly one key")]
    NotOneKey,
    /// `expected`: "an integer", "a whole number" or "text".
    #[error("{kind} value {value} is not {expected}")]
    WrongValue { kind: String, value: Value, expected: &'static str },
    #[error("{kind} value {value}: {source}")]
    OutOfRange { kind: String, value: Value, source: std::num::TryFromIntError },
    #[error("{kind}: {source}")]
    NotBase64 { kind: String, source: base64::DecodeError },
    #[error("bool value is not a boolean")]
    NotBoolean,
    #[error("array value is not an array")]
    NotArray,
    #[error("decimal {0} needs scale and value")]
    Decimal(Value),
    #[error("unknown type {0:?}")]
    UnknownType(String),
}

/// The properties a message's attributes carry. A malformed `hourglass-properties`
/// (not written by hourglass) is an error naming it.
pub fn from_attributes(attributes: &HashMap<String, MessageAttributeValue>) -> Result<Properties, MalformedProperties> {
    let mut properties =
        Properties { content_type: attributes.get(CONTENT_TYPE_ATTRIBUTE).and_then(|v| v.string_value()).map(str::to_string), ..Default::default() };
    let Some(json) = attributes.get(PROPERTIES_ATTRIBUTE).and_then(|v| v.string_value()) else {
        return Ok(properties);
    };
    let Value::Object(rest) = serde_json::from_str(json).map_err(MalformedProperties::NotJson)? else {
        return Err(MalformedProperties::NotAnObject);
    };
    for (name, value) in rest {
        let text = || value.as_str().map(str::to_string).ok_or_else(|| MalformedProperties::NotText(name.clone()));
        match name.as_str() {
            "content-encoding" => properties.content_encoding = Some(text()?),
            "correlation-id" => properties.correlation_id = Some(text()?),
            "reply-to" => properties.reply_to = Some(text()?),
            "message-id" => properties.message_id = Some(text()?),
            "type" => properties.kind = Some(text()?),
            "user-id" => properties.user_id = Some(text()?),
            "app-id" => properties.app_id = Some(text()?),
            "priority" => properties.priority = Some(value.as_u64().and_then(|p| u8::try_from(p).ok()).ok_or(MalformedProperties::Priority)?),
            "timestamp" => properties.timestamp = Some(value.as_u64().ok_or(MalformedProperties::Timestamp)?),
            "headers" => properties.headers = headers_from_json(&value).map_err(MalformedProperties::Headers)?,
            _ => return Err(MalformedProperties::UnknownProperty(name)),
        }
    }
    Ok(properties)
}

fn attribute(data_type: &str, value: String) -> Result<MessageAttributeValue, ExecutorError> {
    MessageAttributeValue::builder().data_type(data_type).string_value(value).build().map_err(|e| ExecutorError::Invalid(format!("message attribute: {e}")))
}

fn headers_to_json(headers: &Headers) -> Value {
    Value::Object(headers.iter().map(|(k, v)| (k.clone(), value_to_json(v))).collect())
}

fn value_to_json(value: &HeaderValue) -> Value {
    match value {
        HeaderValue::Bool(b) => json!({ "bool": b }),
        HeaderValue::I8(v) => json!({ "i8": v }),
        HeaderValue::U8(v) => json!({ "u8": v }),
        HeaderValue::I16(v) => json!({ "i16": v }),
        HeaderValue::U16(v) => json!({ "u16": v }),
        HeaderValue::I32(v) => json!({ "i32": v }),
        HeaderValue::U32(v) => json!({ "u32": v }),
        HeaderValue::I64(v) => json!({ "i64": v }),
        // Bit patterns, so NaN and infinities (which JSON lacks) survive too.
        HeaderValue::F32(v) => json!({ "f32-bits": v.to_bits() }),
        HeaderValue::F64(v) => json!({ "f64-bits": v.to_bits() }),
        HeaderValue::Decimal { scale, value } => json!({ "decimal": { "scale": scale, "value": value } }),
        HeaderValue::ShortText(s) => json!({ "short-text": s }),
        HeaderValue::Text(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => json!({ "text": text }),
            Err(_) => json!({ "text-bytes": BASE64.encode(bytes) }),
        },
        HeaderValue::Bytes(bytes) => json!({ "bytes": BASE64.encode(bytes) }),
        HeaderValue::Timestamp(t) => json!({ "timestamp": t }),
        HeaderValue::Array(items) => json!({ "array": items.iter().map(value_to_json).collect::<Vec<_>>() }),
        HeaderValue::Table(table) => json!({ "table": headers_to_json(table) }),
        HeaderValue::Void => json!({ "void": null }),
    }
}

fn headers_from_json(value: &Value) -> Result<Headers, MalformedHeader> {
    let Value::Object(map) = value else { return Err(MalformedHeader::NotAnObject) };
    map.iter().map(|(k, v)| Ok((k.clone(), value_from_json(v).map_err(|e| MalformedHeader::In { name: k.clone(), source: Box::new(e) })?))).collect()
}

fn value_from_json(value: &Value) -> Result<HeaderValue, MalformedHeader> {
    let Value::Object(map) = value else { return Err(MalformedHeader::NotTyped) };
    let mut entries = map.iter();
    let (Some((kind, v)), None) = (entries.next(), entries.next()) else {
        return Err(MalformedHeader::NotOneKey);
    };
    let wrong = |expected| MalformedHeader::WrongValue { kind: kind.clone(), value: v.clone(), expected };
    let int = || v.as_i64().ok_or_else(|| wrong("an integer"));
    let unsigned = || v.as_u64().ok_or_else(|| wrong("a whole number"));
    let text = || v.as_str().ok_or_else(|| wrong("text"));
    let fits = |source| MalformedHeader::OutOfRange { kind: kind.clone(), value: v.clone(), source };
    let base64 = |s: &str| BASE64.decode(s).map_err(|source| MalformedHeader::NotBase64 { kind: kind.clone(), source });
    Ok(match kind.as_str() {
        "bool" => HeaderValue::Bool(v.as_bool().ok_or(MalformedHeader::NotBoolean)?),
        "i8" => HeaderValue::I8(int()?.try_into().map_err(fits)?),
        "u8" => HeaderValue::U8(unsigned()?.try_into().map_err(fits)?),
        "i16" => HeaderValue::I16(int()?.try_into().map_err(fits)?),
        "u16" => HeaderValue::U16(unsigned()?.try_into().map_err(fits)?),
        "i32" => HeaderValue::I32(int()?.try_into().map_err(fits)?),
        "u32" => HeaderValue::U32(unsigned()?.try_into().map_err(fits)?),
        "i64" => HeaderValue::I64(int()?),
        "f32-bits" => HeaderValue::F32(f32::from_bits(unsigned()?.try_into().map_err(fits)?)),
        "f64-bits" => HeaderValue::F64(f64::from_bits(unsigned()?)),
        "decimal" => {
            let scale = v.get("scale").and_then(Value::as_u64).and_then(|s| u8::try_from(s).ok());
            let value = v.get("value").and_then(Value::as_u64).and_then(|s| u32::try_from(s).ok());
            let (Some(scale), Some(value)) = (scale, value) else { return Err(MalformedHeader::Decimal(v.clone())) };
            HeaderValue::Decimal { scale, value }
        }
        "short-text" => HeaderValue::ShortText(text()?.to_string()),
        "text" => HeaderValue::Text(text()?.as_bytes().to_vec()),
        "text-bytes" => HeaderValue::Text(base64(text()?)?),
        "bytes" => HeaderValue::Bytes(base64(text()?)?),
        "timestamp" => HeaderValue::Timestamp(unsigned()?),
        "array" => HeaderValue::Array(v.as_array().ok_or(MalformedHeader::NotArray)?.iter().map(value_from_json).collect::<Result<_, _>>()?),
        "table" => HeaderValue::Table(headers_from_json(v)?),
        "void" => HeaderValue::Void,
        other => return Err(MalformedHeader::UnknownType(other.to_string())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_kind() -> Headers {
        let nested: Headers = [("inner".to_string(), HeaderValue::I16(-3))].into();
        [
            ("bool", HeaderValue::Bool(true)),
            ("i8", HeaderValue::I8(-8)),
            ("u8", HeaderValue::U8(8)),
            ("i16", HeaderValue::I16(-16)),
            ("u16", HeaderValue::U16(16)),
            ("i32", HeaderValue::I32(-32)),
            ("u32", HeaderValue::U32(32)),
            ("i64", HeaderValue::I64(i64::MIN)),
            ("f32", HeaderValue::F32(1.5)),
            ("f64", HeaderValue::F64(f64::INFINITY)),
            ("decimal", HeaderValue::Decimal { scale: 2, value: 12345 }),
            ("short", HeaderValue::ShortText("short".into())),
            ("text", HeaderValue::text("long text")),
            ("not-utf8", HeaderValue::Text(vec![0xff, 0xfe])),
            ("bytes", HeaderValue::Bytes(vec![0, 1, 2])),
            ("timestamp", HeaderValue::Timestamp(1_700_000_000)),
            ("array", HeaderValue::Array(vec![HeaderValue::I32(1), HeaderValue::text("two")])),
            ("table", HeaderValue::Table(nested)),
            ("void", HeaderValue::Void),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    #[test]
    fn every_property_and_header_type_survives_the_round_trip() {
        let properties = Properties {
            content_type: Some("application/json".into()),
            content_encoding: Some("gzip".into()),
            headers: every_kind(),
            priority: Some(7),
            correlation_id: Some("corr".into()),
            reply_to: Some("replies".into()),
            message_id: Some("m-1".into()),
            timestamp: Some(1_700_000_000),
            kind: Some("order.created".into()),
            user_id: Some("guest".into()),
            app_id: Some("shop".into()),
        };
        let attributes = to_attributes(&properties).unwrap();
        assert_eq!(attributes.len(), 2, "two attributes whatever is set: {:?}", attributes.keys());
        assert_eq!(attributes[CONTENT_TYPE_ATTRIBUTE].string_value(), Some("application/json"));
        assert_eq!(from_attributes(&attributes).unwrap(), properties);
    }

    #[test]
    fn nothing_set_takes_no_attribute_and_content_type_alone_takes_one() {
        assert!(to_attributes(&Properties::default()).unwrap().is_empty());
        let only_type = Properties { content_type: Some("text/plain".into()), ..Default::default() };
        let attributes = to_attributes(&only_type).unwrap();
        assert_eq!(attributes.keys().collect::<Vec<_>>(), [CONTENT_TYPE_ATTRIBUTE]);
        assert_eq!(from_attributes(&attributes).unwrap(), only_type);
    }

    #[test]
    fn a_malformed_properties_attribute_is_named() {
        let attributes: HashMap<String, MessageAttributeValue> =
            [(PROPERTIES_ATTRIBUTE.to_string(), attribute("String", "{\"priority\": 900}".into()).unwrap())].into();
        let err = from_attributes(&attributes).unwrap_err().to_string();
        assert!(err.contains("hourglass-properties") && err.contains("priority"), "{err}");
    }
}
