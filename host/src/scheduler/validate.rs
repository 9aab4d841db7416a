//! What every schedule request must satisfy before anything reaches a broker.
//!
//! HTTP, the AMQP ingress, redelivery and the CLI all schedule through
//! [`super::Scheduler::schedule`], so this one check serves them all. A
//! refusal names the field, so HTTP answers 400 with it and the ingress puts
//! the message on its invalid queue with the reason. The limits come from
//! AMQP and RabbitMQ: a short string (names, routing keys, header names,
//! string properties) over 255 bytes or a header frame over `frame_max`
//! closes the whole connection, and `CC`/`BCC` headers copy a message to
//! other queues — so none of them may reach the wire from a client.

use std::collections::HashSet;

use crate::command::{AMQP_MAX_NAME, FieldTable, FieldValue};
use crate::headers::{is_reserved, is_routing_header};
use crate::message::{HeaderValue, Headers, Properties};

use super::ScheduleRequest;

/// All headers and properties of one message, encoded. RabbitMQ's default
/// `frame_max` is 131,072 bytes and every property must fit in one frame;
/// half of it leaves room for hourglass's own headers and the planner's.
pub(crate) const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Why a request is refused, and which field of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    pub field: &'static str,
    pub reason: String,
}

fn invalid(field: &'static str, reason: impl Into<String>) -> Invalid {
    Invalid { field, reason: reason.into() }
}

/// Headers set by the broker when it dead-letters a message. A client never
/// sets them; a kept `x-death` can make RabbitMQ 3.x drop the message as a
/// dead-letter cycle.
pub(crate) fn is_death_record(name: &str) -> bool {
    name == "x-death" || name.starts_with("x-first-death-") || name.starts_with("x-last-death-")
}

/// Checks `request` and removes what a delivered message may carry but must
/// not pass on (the broker's death records). `reserved` holds the names of
/// hourglass's own queues and exchanges, which are never destinations.
pub fn check(request: &mut ScheduleRequest, reserved: &HashSet<String>) -> Result<(), Invalid> {
    match &request.exchange {
        Some(exchange) => {
            if !request.destination.is_empty() {
                return Err(invalid("exchange", "give a destination queue or an exchange, not both"));
            }
            check_exchange(exchange, reserved)?;
            // Empty is a routing key too (fanout and headers exchanges ignore it).
            if let Some(key) = &request.routing_key
                && key.len() > AMQP_MAX_NAME
            {
                return Err(invalid("routing_key", format!("is {} bytes; at most {AMQP_MAX_NAME}", key.len())));
            }
        }
        None => {
            check_destination(&request.destination, reserved)?;
            if let Some(key) = &request.routing_key {
                check_name("routing_key", key)?;
            }
        }
    }
    check_client_headers(&request.headers)?;
    request.properties.headers.retain(|name, _| !is_death_record(name));
    // Redelivery (as_is) carries hourglass's attempt header in the properties; nobody else may.
    check_message_headers(&request.properties.headers, request.as_is)?;
    check_properties(&request.properties)?;
    let size = encoded_size(&request.properties) + request.headers.iter().map(|(k, v)| 1 + k.len() + field_size(v)).sum::<usize>();
    if size > MAX_HEADER_BYTES {
        return Err(invalid("headers", format!("headers and properties take {size} bytes; at most {MAX_HEADER_BYTES}")));
    }
    Ok(())
}

/// A destination is a valid AMQP name and none of hourglass's own objects.
pub fn check_destination(destination: &str, reserved: &HashSet<String>) -> Result<(), Invalid> {
    check_name("destination", destination)?;
    if reserved.contains(destination) {
        return Err(invalid("destination", format!("{destination:?} is one of hourglass's own queues or exchanges, not a destination")));
    }
    Ok(())
}

/// An exchange destination is a valid AMQP name, none of hourglass's own
/// objects and not the default exchange (a queue destination says that).
pub(crate) fn check_exchange(exchange: &str, reserved: &HashSet<String>) -> Result<(), Invalid> {
    check_name("exchange", exchange)?;
    if exchange.starts_with("amq.default") {
        return Err(invalid("exchange", "the default exchange routes by queue name: give the queue as the destination instead"));
    }
    if reserved.contains(exchange) {
        return Err(invalid("exchange", format!("{exchange:?} is one of hourglass's own queues or exchanges, not a destination")));
    }
    Ok(())
}

fn check_name(field: &'static str, name: &str) -> Result<(), Invalid> {
    if name.is_empty() {
        return Err(invalid(field, "is empty"));
    }
    if name.len() > AMQP_MAX_NAME {
        return Err(invalid(field, format!("is {} bytes; at most {AMQP_MAX_NAME}", name.len())));
    }
    Ok(())
}

/// Headers a client gives explicitly (HTTP, CLI): every reserved name is refused.
fn check_client_headers(headers: &FieldTable) -> Result<(), Invalid> {
    for name in headers.keys() {
        check_header_name(name)?;
        if is_reserved(name) {
            return Err(invalid("headers", format!("header {name:?} is reserved: hourglass-* headers are set by hourglass")));
        }
        if is_death_record(name) {
            return Err(invalid("headers", format!("header {name:?} is the broker's dead-letter record; clients may not set it")));
        }
    }
    Ok(())
}

/// Headers that came with a message (AMQP ingress, redelivery).
fn check_message_headers(headers: &Headers, internal: bool) -> Result<(), Invalid> {
    for name in headers.keys() {
        check_header_name(name)?;
        if is_reserved(name) && !internal {
            return Err(invalid("headers", format!("header {name:?} is reserved: hourglass-* headers are set by hourglass")));
        }
    }
    Ok(())
}

fn check_header_name(name: &str) -> Result<(), Invalid> {
    if name.is_empty() || name.len() > AMQP_MAX_NAME {
        let shown: String = name.chars().take(40).collect();
        return Err(invalid("headers", format!("header name {shown:?}… is {} bytes; names take 1 to {AMQP_MAX_NAME}", name.len())));
    }
    if is_routing_header(name) {
        return Err(invalid("headers", format!("header {name:?} would copy the message to other queues; it is not allowed")));
    }
    Ok(())
}

fn check_properties(properties: &Properties) -> Result<(), Invalid> {
    let short = [
        ("content_type", &properties.content_type),
        ("content_encoding", &properties.content_encoding),
        ("correlation_id", &properties.correlation_id),
        ("reply_to", &properties.reply_to),
        ("message_id", &properties.message_id),
        ("type", &properties.kind),
        ("user_id", &properties.user_id),
        ("app_id", &properties.app_id),
    ];
    for (field, value) in short {
        if let Some(value) = value
            && value.len() > AMQP_MAX_NAME
        {
            return Err(invalid("properties", format!("{field} is {} bytes; at most {AMQP_MAX_NAME}", value.len())));
        }
    }
    check_values(&properties.headers)
}

/// Nested tables and short strings inside header values follow the same limits.
fn check_values(headers: &Headers) -> Result<(), Invalid> {
    fn value(v: &HeaderValue) -> Result<(), Invalid> {
        match v {
            HeaderValue::ShortText(s) if s.len() > AMQP_MAX_NAME => {
                Err(invalid("headers", format!("a short-string header value is {} bytes; at most {AMQP_MAX_NAME}", s.len())))
            }
            HeaderValue::Array(items) => items.iter().try_for_each(value),
            HeaderValue::Table(table) => {
                table.keys().try_for_each(|k| {
                    if k.len() > AMQP_MAX_NAME {
                        Err(invalid("headers", format!("a nested header name is {} bytes; at most {AMQP_MAX_NAME}", k.len())))
                    } else {
                        Ok(())
                    }
                })?;
                table.values().try_for_each(value)
            }
            _ => Ok(()),
        }
    }
    headers.values().try_for_each(value)
}

/// The bytes these properties take in an AMQP content header (close enough to budget by).
fn encoded_size(properties: &Properties) -> usize {
    let strings = [
        &properties.content_type,
        &properties.content_encoding,
        &properties.correlation_id,
        &properties.reply_to,
        &properties.message_id,
        &properties.kind,
        &properties.user_id,
        &properties.app_id,
    ];
    14 + strings.iter().map(|s| s.as_ref().map_or(0, |s| 1 + s.len())).sum::<usize>() + table_size(&properties.headers)
}

fn table_size(headers: &Headers) -> usize {
    4 + headers.iter().map(|(k, v)| 1 + k.len() + value_size(v)).sum::<usize>()
}

fn value_size(value: &HeaderValue) -> usize {
    1 + match value {
        HeaderValue::Bool(_) | HeaderValue::I8(_) | HeaderValue::U8(_) | HeaderValue::Void => 1,
        HeaderValue::I16(_) | HeaderValue::U16(_) => 2,
        HeaderValue::I32(_) | HeaderValue::U32(_) | HeaderValue::F32(_) => 4,
        HeaderValue::Decimal { .. } => 5,
        HeaderValue::I64(_) | HeaderValue::F64(_) | HeaderValue::Timestamp(_) => 8,
        HeaderValue::ShortText(s) => 1 + s.len(),
        HeaderValue::Text(b) | HeaderValue::Bytes(b) => 4 + b.len(),
        HeaderValue::Array(items) => 4 + items.iter().map(value_size).sum::<usize>(),
        HeaderValue::Table(table) => table_size(table),
    }
}

fn field_size(value: &FieldValue) -> usize {
    match value {
        FieldValue::Text(s) => 5 + s.len(),
        FieldValue::Int(_) => 9,
        FieldValue::Bool(_) => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(destination: &str) -> ScheduleRequest {
        ScheduleRequest { destination: destination.into(), delay_ms: 1000, ..Default::default() }
    }

    fn refused(mut request: ScheduleRequest) -> Invalid {
        check(&mut request, &HashSet::from(["hourglass.ingress".to_string()])).unwrap_err()
    }

    #[test]
    fn a_plain_request_passes() {
        let mut ok = request("orders");
        ok.headers.insert("tenant".into(), FieldValue::Text("acme".into()));
        ok.properties.content_type = Some("application/json".into());
        assert_eq!(check(&mut ok, &HashSet::new()), Ok(()));
    }

    #[test]
    fn names_over_255_bytes_are_refused_by_field() {
        assert_eq!(refused(request(&"d".repeat(256))).field, "destination");
        assert_eq!(refused(request("")).field, "destination");
        let mut long_header = request("d");
        long_header.headers.insert("h".repeat(256), FieldValue::Bool(true));
        assert_eq!(refused(long_header).field, "headers");
        let mut long_property = request("d");
        long_property.properties.reply_to = Some("r".repeat(256));
        assert!(refused(long_property).reason.contains("reply_to"));
        let mut long_key = request("d");
        long_key.routing_key = Some("k".repeat(300));
        assert_eq!(refused(long_key).field, "routing_key");
    }

    #[test]
    fn routing_copies_death_records_and_hourglass_headers_are_refused_from_clients() {
        for name in ["CC", "bcc", "x-death", "x-first-death-queue", "hourglass-due-at"] {
            let mut r = request("d");
            r.headers.insert(name.into(), FieldValue::Text("x".into()));
            let err = refused(r);
            assert_eq!(err.field, "headers", "{name}");
            assert!(err.reason.contains(name), "{err:?}");
        }
    }

    #[test]
    fn death_records_on_a_delivered_message_are_stripped_and_the_rest_kept() {
        let mut r = request("d");
        r.properties.headers.insert("x-death".into(), HeaderValue::Array(vec![]));
        r.properties.headers.insert("x-last-death-reason".into(), HeaderValue::text("expired"));
        r.properties.headers.insert("tenant".into(), HeaderValue::text("acme"));
        check(&mut r, &HashSet::new()).unwrap();
        assert_eq!(r.properties.headers.keys().collect::<Vec<_>>(), vec!["tenant"]);
    }

    #[test]
    fn only_redelivery_may_carry_hourglass_headers_in_the_properties() {
        let mut r = request("d");
        r.properties.headers.insert("hourglass-attempt".into(), HeaderValue::I32(2));
        assert_eq!(refused(r.clone()).field, "headers");
        r.as_is = true;
        assert_eq!(check(&mut r, &HashSet::new()), Ok(()));
    }

    #[test]
    fn a_header_block_too_big_for_a_frame_is_refused() {
        let mut r = request("d");
        for i in 0..40 {
            r.properties.headers.insert(format!("h{i}"), HeaderValue::Text(vec![b'x'; 3300]));
        }
        let err = refused(r);
        assert!(err.field == "headers" && err.reason.contains("bytes"), "{err:?}");
    }

    #[test]
    fn hourglass_objects_are_not_destinations() {
        let err = refused(request("hourglass.ingress"));
        assert!(err.field == "destination" && err.reason.contains("hourglass's own"), "{err:?}");
    }
}
