//! The ingress: any client of the broker hands hourglass a message to delay by
//! publishing it to one queue (or subject), with the destination and the
//! delay (or the due time, `hourglass-deliver-at`) in headers.
//!
//! Each message is planned and forwarded through the scheduler, and acked only
//! after the broker confirmed the forward. A message that cannot be scheduled
//! (missing or bad headers, a field over a limit, unknown destination or
//! strategy, a delay the planner refuses) goes to the invalid-messages queue
//! with the reason, naming the header or field, in `hourglass-invalid-reason`;
//! it is acked only once that publish is confirmed. While the broker is
//! unavailable, a message is requeued, never acked; a planner out of time (a
//! starved CPU is no fault of the message) requeues it once, and sets it aside
//! when it runs out of time on the redelivery too. A lost connection leaves
//! every unacked message to the broker, which delivers it again. Prefetch
//! bounds the messages in flight. The broker's consumer carries out each
//! [`Outcome`] and sets aside a message this handler keeps panicking on.
//!
//! A message may be due to an exchange instead of a queue
//! (`hourglass-exchange`, `hourglass-routing-key`). The queue is also the
//! intake of the delayed exchanges (`[exchanges."<name>"]`): each is a fanout
//! exchange bound to it, and a message that came through one is read the
//! delayed-message plugin's way ([`parse_delayed`]): its `x-delay` in
//! milliseconds, delivered when due through the exchange's `deliver_to`
//! with its own routing key.
//!
//! The same handler runs under the SQS consumer for the SQS ingress queue and
//! under the NATS consumer for the ingress subject ([`Ingress::with_plain_headers`]):
//! there the producer's text attributes or headers stay plain on the way to
//! the destination.

use std::sync::Arc;

use crate::clock::{TimeError, parse_rfc3339_ms};
use crate::command::{Command, FieldValue};
use crate::config::{DelayedExchangeConfig, IngressConfig};
use crate::executor::{Broker, ExecutorError};
use crate::headers::{
    DELIVER_AT_HEADER, DESTINATION_HEADER, EXCHANGE_HEADER, INVALID_REASON_HEADER, REQUESTED_DELAY_HEADER, ROUTING_KEY_HEADER, STRATEGY_HEADER, is_reserved,
};
use crate::message::{Delivery, Handler, HeaderValue, Outcome, Properties, Settled};
use crate::planner::PlannerError;
use crate::scheduler::{OWN_QUEUE_HINT, ScheduleError, ScheduleRequest, Scheduler};

/// The ingress queue's handler; a broker's consumer runs it.
pub struct Ingress {
    config: IngressConfig,
    scheduler: Arc<Scheduler<Broker>>,
    /// Text and whole-number headers travel as plain headers (SQS attributes), not typed properties.
    plain_headers: bool,
}

impl Ingress {
    pub fn new(config: IngressConfig, scheduler: Arc<Scheduler<Broker>>) -> Arc<Ingress> {
        Arc::new(Ingress { config, scheduler, plain_headers: false })
    }

    /// The handler of an ingress whose messages carry text headers (SQS
    /// attributes, NATS headers) rather than typed AMQP ones; no delayed exchanges.
    pub fn with_plain_headers(config: IngressConfig, scheduler: Arc<Scheduler<Broker>>) -> Arc<Ingress> {
        Arc::new(Ingress { config, scheduler, plain_headers: true })
    }

    fn set_aside(&self, reason: &str) -> Outcome {
        set_aside(&self.config.invalid_queue, reason)
    }
}

fn set_aside(invalid_queue: &str, reason: &str) -> Outcome {
    Outcome::move_to(invalid_queue, INVALID_REASON_HEADER, reason)
}

/// What becomes of a message the scheduler could not take. `redelivered`:
/// the broker delivered this message before; `delay_header`: the header its
/// producer set the delay in (`hourglass-delay`, or `x-delay` through a
/// delayed exchange), named in the reason when the delay is what is wrong.
fn refused(err: ScheduleError, invalid_queue: &str, redelivered: bool, delay_header: &str) -> Outcome {
    match err {
        // Not the message's fault: it waits on its queue until the broker can answer.
        ScheduleError::Broker(ExecutorError::Unavailable(why)) => {
            tracing::warn!(%why, "broker unavailable; holding the ingress message to try again");
            Outcome::Retry
        }
        // Once may be a starved CPU; again on a redelivery is a planner that
        // loops on this message, which would otherwise come back forever.
        ScheduleError::Planner(err) if err.is_timeout() && !redelivered => {
            tracing::warn!(error = %err, "the planner ran out of time; requeueing the ingress message once");
            Outcome::Requeue
        }
        ScheduleError::Planner(err) if err.is_timeout() => {
            set_aside(invalid_queue, &format!("{err}, again after a requeue; publish it again to retry, or raise the planner's budget"))
        }
        ScheduleError::Invalid(invalid) if invalid.field == "delay" => set_aside(invalid_queue, &format!("{delay_header}: {}", invalid.reason)),
        ScheduleError::Invalid(invalid) => set_aside(invalid_queue, &format!("{}: {}", wire_name(invalid.field), invalid.reason)),
        // A planner refuses a message for its delay (too long, say).
        ScheduleError::Planner(err @ PlannerError::Refused { .. }) => set_aside(invalid_queue, &format!("{delay_header}: {err}")),
        other => set_aside(invalid_queue, &other.to_string()),
    }
}

/// The name a field of a schedule request has on an ingress message.
fn wire_name(field: &str) -> &str {
    match field {
        "destination" => DESTINATION_HEADER,
        "exchange" => EXCHANGE_HEADER,
        "routing_key" => ROUTING_KEY_HEADER,
        "delay" => REQUESTED_DELAY_HEADER,
        "strategy" => STRATEGY_HEADER,
        other => other,
    }
}

impl Handler for Ingress {
    type Note = ();

    fn queue(&self) -> &str {
        &self.config.queue
    }

    fn prefetch(&self) -> u16 {
        self.config.prefetch
    }

    /// The ingress and invalid-messages queues, and the delayed exchanges
    /// that feed the ingress, as the broker makes them.
    fn declarations(&self) -> Vec<Command> {
        let config = self.scheduler.config();
        config.broker.ingress_declarations(&self.config.queue, &self.config.invalid_queue, config.service.queue_type, &config.exchanges)
    }

    fn declaration_hint(&self) -> Option<String> {
        Some(OWN_QUEUE_HINT.into())
    }

    async fn handle(&self, delivery: &Delivery) -> (Outcome, ()) {
        self.scheduler.metrics().ingress_started();
        let config = self.scheduler.config();
        let delayed = (!self.plain_headers && !delivery.exchange.is_empty()).then(|| config.exchanges.get(&delivery.exchange)).flatten();
        let parsed = match delayed {
            Some(exchange) => parse_delayed(delivery, exchange),
            None => parse(delivery),
        };
        let mut request = match parsed {
            Ok(request) => request,
            Err(invalid) => return (self.set_aside(&invalid.to_string()), ()),
        };
        if self.plain_headers {
            let typed = std::mem::take(&mut request.properties.headers);
            for (name, value) in typed {
                match (value.as_text(), &value) {
                    (Some(text), _) => _ = request.headers.insert(name, FieldValue::Text(text)),
                    (None, HeaderValue::I64(number)) => _ = request.headers.insert(name, FieldValue::Int(*number)),
                    _ => _ = request.properties.headers.insert(name, value),
                }
            }
        }
        let destination = request.target().to_string();
        let strategy = request.strategy.clone().unwrap_or_else(|| self.scheduler.strategy_for(&destination));
        let metrics = self.scheduler.metrics();
        match self.scheduler.schedule(request).await {
            Ok(scheduled) => {
                metrics.scheduled(&scheduled.strategy, &destination);
                (Outcome::Ack, ())
            }
            Err(err) => {
                metrics.failed(&strategy, &destination);
                let delay_header = if delayed.is_some() { X_DELAY_HEADER } else { REQUESTED_DELAY_HEADER };
                (refused(err, &self.config.invalid_queue, delivery.redelivered, delay_header), ())
            }
        }
    }

    fn poisoned(&self, _delivery: &Delivery, reason: &str) -> Outcome {
        self.set_aside(reason)
    }

    fn settled(&self, _note: Option<()>, outcome: &Outcome, settled: &Settled) {
        let metrics = self.scheduler.metrics();
        let label = match outcome {
            // Not acked: the broker delivers it again; forwarded twice, never lost.
            Outcome::Ack => settled.label("forwarded"),
            Outcome::MoveTo { .. } => settled.label("invalid"),
            Outcome::Requeue | Outcome::Retry => settled.label("requeued"),
        };
        metrics.ingress(&label);
        metrics.ingress_finished();
    }
}

/// Why an ingress message asks for no schedule request hourglass can make: it
/// is set aside with this as its reason.
#[derive(Debug, thiserror::Error)]
pub enum InvalidRequest {
    #[error("header {0}: must be a non-empty string")]
    EmptyOrNotText(&'static str),
    #[error("header {0}: must be a string")]
    NotText(&'static str),
    #[error("missing header {DESTINATION_HEADER} (a queue) or {EXCHANGE_HEADER} (an exchange)")]
    NoDestination,
    #[error("headers {DESTINATION_HEADER} and {EXCHANGE_HEADER}: give one, not both")]
    TwoDestinations,
    #[error("header {ROUTING_KEY_HEADER}: only with {EXCHANGE_HEADER}; a queue is reached by its name")]
    RoutingKeyWithoutExchange,
    #[error("missing header {REQUESTED_DELAY_HEADER} (\"10s\" or milliseconds) or {DELIVER_AT_HEADER} (an RFC 3339 time)")]
    NoDelay,
    #[error("headers {REQUESTED_DELAY_HEADER} and {DELIVER_AT_HEADER}: give one, not both")]
    TwoDelays,
    /// The SDK's reason the duration does not parse.
    #[error("header {REQUESTED_DELAY_HEADER}: {0}")]
    Duration(String),
    #[error("header {REQUESTED_DELAY_HEADER}: {0:?} is neither a duration string nor whole milliseconds")]
    DelayNotDuration(HeaderValue),
    #[error("header {DELIVER_AT_HEADER}: {0}")]
    DeliverAt(#[source] TimeError),
    #[error("header {DELIVER_AT_HEADER}: {0:?} is neither an RFC 3339 time nor whole Unix milliseconds")]
    DeliverAtNotTime(HeaderValue),
    #[error("header {header}: {number} is not a whole number of milliseconds from 0 up")]
    NotWholeMs { header: &'static str, number: i128 },
    #[error(
        "header {0:?} is reserved: only {DESTINATION_HEADER}, {EXCHANGE_HEADER}, {ROUTING_KEY_HEADER}, {REQUESTED_DELAY_HEADER}, {DELIVER_AT_HEADER} and {STRATEGY_HEADER} may be set by a producer"
    )]
    Reserved(String),
    #[error("header {X_DELAY_HEADER}: {0:?} is not a whole number of milliseconds")]
    XDelayText(String),
    #[error("header {X_DELAY_HEADER}: {0:?} is not a whole number of milliseconds")]
    XDelayValue(HeaderValue),
    #[error("header {X_DELAY_HEADER}: {0} ms is too large")]
    XDelayTooLarge(i128),
}

/// The schedule request an ingress message asks for, or why it is invalid.
/// The control headers are removed; every other header and property is kept
/// as it came, with its AMQP type.
fn parse(delivery: &Delivery) -> Result<ScheduleRequest, InvalidRequest> {
    parse_parts(delivery.properties.clone(), &delivery.body)
}

fn parse_parts(mut properties: Properties, body: &[u8]) -> Result<ScheduleRequest, InvalidRequest> {
    let headers = &mut properties.headers;
    let text = |header: &'static str, value: HeaderValue| value.as_text().filter(|d| !d.is_empty()).ok_or(InvalidRequest::EmptyOrNotText(header));
    // A queue, or an exchange with the routing key its bindings route by: exactly one of the two.
    let (destination, exchange) = match (headers.remove(DESTINATION_HEADER), headers.remove(EXCHANGE_HEADER)) {
        (None, None) => return Err(InvalidRequest::NoDestination),
        (Some(_), Some(_)) => return Err(InvalidRequest::TwoDestinations),
        (Some(value), None) => (text(DESTINATION_HEADER, value)?, None),
        (None, Some(value)) => (String::new(), Some(text(EXCHANGE_HEADER, value)?)),
    };
    let routing_key = match headers.remove(ROUTING_KEY_HEADER) {
        None => None,
        Some(_) if exchange.is_none() => return Err(InvalidRequest::RoutingKeyWithoutExchange),
        Some(value) => Some(value.as_text().ok_or(InvalidRequest::NotText(ROUTING_KEY_HEADER))?),
    };
    let (delay_ms, deliver_at_ms) = match (headers.remove(REQUESTED_DELAY_HEADER), headers.remove(DELIVER_AT_HEADER)) {
        (None, None) => return Err(InvalidRequest::NoDelay),
        (Some(_), Some(_)) => return Err(InvalidRequest::TwoDelays),
        (Some(value), None) => (
            match (value.as_text(), value.as_whole_number()) {
                (Some(text), _) => hourglass_planner_sdk::parse_duration_ms(&text).map_err(InvalidRequest::Duration)?,
                (None, Some(ms)) => whole_ms(REQUESTED_DELAY_HEADER, ms)?,
                (None, None) => return Err(InvalidRequest::DelayNotDuration(value)),
            },
            None,
        ),
        (None, Some(value)) => (
            0,
            Some(match (value.as_text(), value.as_whole_number()) {
                (Some(text), _) => parse_rfc3339_ms(&text).map_err(InvalidRequest::DeliverAt)?,
                (None, Some(ms)) => whole_ms(DELIVER_AT_HEADER, ms)?,
                (None, None) => return Err(InvalidRequest::DeliverAtNotTime(value)),
            }),
        ),
    };
    let strategy = match headers.remove(STRATEGY_HEADER) {
        None => None,
        Some(value) => Some(value.as_text().ok_or(InvalidRequest::NotText(STRATEGY_HEADER))?),
    };
    if let Some(reserved) = headers.keys().find(|k| is_reserved(k)) {
        return Err(InvalidRequest::Reserved(reserved.clone()));
    }
    Ok(ScheduleRequest {
        destination,
        exchange,
        routing_key,
        delay_ms,
        deliver_at_ms,
        body: body.to_vec(),
        headers: Default::default(),
        properties,
        strategy,
        ..Default::default()
    })
}

/// The delayed-message plugin's header: the delay in milliseconds.
pub(crate) const X_DELAY_HEADER: &str = "x-delay";

/// A message published to a delayed exchange, read as the plugin reads it:
/// `x-delay` (an integer, or a string of one) milliseconds, none, zero or
/// negative meaning at once; due through `deliver_to` with the routing key it
/// was published with, every header and property kept. A delay that is not a
/// whole number is refused (the plugin would deliver it at once), naming the header.
pub fn parse_delayed(delivery: &Delivery, exchange: &DelayedExchangeConfig) -> Result<ScheduleRequest, InvalidRequest> {
    let properties = delivery.properties.clone();
    let delay_ms = match properties.headers.get(X_DELAY_HEADER) {
        None => 0,
        Some(value) => {
            let number = match (value.as_whole_number(), value.as_text()) {
                (Some(number), _) => number,
                (None, Some(text)) => text.trim().parse::<i128>().map_err(|_| InvalidRequest::XDelayText(text))?,
                (None, None) => return Err(InvalidRequest::XDelayValue(value.clone())),
            };
            u64::try_from(number.max(0)).map_err(|_| InvalidRequest::XDelayTooLarge(number))?
        }
    };
    Ok(ScheduleRequest {
        exchange: Some(exchange.deliver_to.clone()),
        routing_key: Some(delivery.routing_key.clone()),
        delay_ms,
        body: delivery.body.clone(),
        properties,
        strategy: exchange.strategy.clone(),
        ..Default::default()
    })
}

/// A header's whole number as milliseconds: a delay, or a Unix time.
fn whole_ms(header: &'static str, number: i128) -> Result<u64, InvalidRequest> {
    u64::try_from(number).map_err(|_| InvalidRequest::NotWholeMs { header, number })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::HeaderValue;

    fn properties(headers: &[(&str, HeaderValue)]) -> Properties {
        let headers = headers.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        Properties { headers, content_type: Some("application/json".into()), ..Default::default() }
    }

    #[test]
    fn control_headers_become_the_request_and_the_rest_is_kept_with_its_type() {
        let props = properties(&[
            (DESTINATION_HEADER, HeaderValue::text("orders")),
            (REQUESTED_DELAY_HEADER, HeaderValue::text("1m 30s")),
            ("tenant", HeaderValue::text("acme")),
            ("score", HeaderValue::F64(0.5)),
        ]);
        let request = parse_parts(props, b"body").unwrap();
        assert_eq!((request.destination.as_str(), request.delay_ms, request.strategy), ("orders", 90_000, None));
        let kept = &request.properties.headers;
        assert_eq!(kept.len(), 2);
        assert_eq!(kept.get("score"), Some(&HeaderValue::F64(0.5)));
        assert_eq!(request.properties.content_type.as_deref(), Some("application/json"));
        assert_eq!(request.body, b"body");
    }

    #[test]
    fn an_unavailable_broker_requeues_a_planner_out_of_time_requeues_once_and_anything_else_sets_aside() {
        let timeout = || PlannerError::Timeout { planner: "p".into(), function: "plan", budget: std::time::Duration::from_millis(100) };
        assert_eq!(
            refused(ScheduleError::Planner(timeout()), "bad", false, REQUESTED_DELAY_HEADER),
            Outcome::Requeue,
            "a starved CPU is not the message's fault"
        );
        let Outcome::MoveTo { headers, .. } = refused(ScheduleError::Planner(timeout()), "bad", true, REQUESTED_DELAY_HEADER) else {
            panic!("a planner out of time on a redelivered message sets it aside, or a looping planner requeues it forever")
        };
        let reason = headers[INVALID_REASON_HEADER].as_text().unwrap();
        assert!(reason.contains("p") && reason.contains("again after a requeue"), "{reason}");
        for redelivered in [false, true] {
            assert_eq!(refused(ScheduleError::Broker(ExecutorError::Unavailable("down".into())), "bad", redelivered, REQUESTED_DELAY_HEADER), Outcome::Retry);
        }
        let trap = PlannerError::Trapped { planner: "p".into(), function: "plan", reason: "unreachable".into() };
        let Outcome::MoveTo { queue, headers, .. } = refused(ScheduleError::Planner(trap), "bad", false, REQUESTED_DELAY_HEADER) else {
            panic!("a trap is not retried")
        };
        assert_eq!(queue, "bad");
        assert!(headers[INVALID_REASON_HEADER].as_text().unwrap().contains("unreachable"));
        let refusal = || PlannerError::Refused { planner: "p".into(), message: "too long".into() };
        for header in [REQUESTED_DELAY_HEADER, X_DELAY_HEADER] {
            let Outcome::MoveTo { headers, .. } = refused(ScheduleError::Planner(refusal()), "bad", false, header) else { panic!("a refusal sets aside") };
            let reason = headers[INVALID_REASON_HEADER].as_text().unwrap();
            assert!(reason.starts_with(&format!("{header}: ")) && reason.contains("too long"), "names the header the producer set: {reason}");
        }
    }

    #[test]
    fn a_refused_field_is_named_as_the_producer_set_it() {
        let invalid = crate::scheduler::validate::Invalid { field: "destination", reason: "is 300 bytes; at most 255".into() };
        let Outcome::MoveTo { headers, .. } = refused(ScheduleError::Invalid(invalid), "bad", false, REQUESTED_DELAY_HEADER) else { panic!("set aside") };
        assert_eq!(headers[INVALID_REASON_HEADER].as_text().unwrap(), "hourglass-destination: is 300 bytes; at most 255");
        let delay = || crate::scheduler::validate::Invalid { field: "delay", reason: "is above the maximum".into() };
        let Outcome::MoveTo { headers, .. } = refused(ScheduleError::Invalid(delay()), "bad", false, X_DELAY_HEADER) else { panic!("set aside") };
        assert_eq!(headers[INVALID_REASON_HEADER].as_text().unwrap(), "x-delay: is above the maximum", "through a delayed exchange the delay is x-delay");
    }

    #[test]
    fn whole_milliseconds_and_a_strategy_are_accepted() {
        let props = properties(&[
            (DESTINATION_HEADER, HeaderValue::text("d")),
            (REQUESTED_DELAY_HEADER, HeaderValue::I32(2500)),
            (STRATEGY_HEADER, HeaderValue::text("precise")),
        ]);
        let request = parse_parts(props, b"").unwrap();
        assert_eq!((request.delay_ms, request.strategy.as_deref()), (2500, Some("precise")));
    }

    #[test]
    fn a_due_time_is_read_as_rfc_3339_or_unix_milliseconds() {
        let text = properties(&[(DESTINATION_HEADER, HeaderValue::text("d")), (DELIVER_AT_HEADER, HeaderValue::text("2026-11-23T19:00:00.5+01:00"))]);
        let request = parse_parts(text, b"").unwrap();
        assert_eq!((request.deliver_at_ms, request.delay_ms), (Some(1_795_456_800_500), 0));
        let number = properties(&[(DESTINATION_HEADER, HeaderValue::text("d")), (DELIVER_AT_HEADER, HeaderValue::I64(1_795_456_800_500))]);
        assert_eq!(parse_parts(number, b"").unwrap().deliver_at_ms, Some(1_795_456_800_500));
    }

    #[test]
    fn each_bad_message_is_refused_with_a_reason_naming_the_header() {
        let cases: Vec<(Vec<(&str, HeaderValue)>, &str)> = vec![
            (vec![(REQUESTED_DELAY_HEADER, HeaderValue::text("1s"))], "missing header hourglass-destination"),
            (vec![(DESTINATION_HEADER, HeaderValue::text("d"))], "missing header hourglass-delay"),
            (
                vec![(DESTINATION_HEADER, HeaderValue::text("")), (REQUESTED_DELAY_HEADER, HeaderValue::text("1s"))],
                "hourglass-destination: must be a non-empty",
            ),
            (vec![(DESTINATION_HEADER, HeaderValue::text("d")), (REQUESTED_DELAY_HEADER, HeaderValue::text("soon"))], "hourglass-delay:"),
            (vec![(DESTINATION_HEADER, HeaderValue::text("d")), (REQUESTED_DELAY_HEADER, HeaderValue::I32(-5))], "-5 is not a whole number"),
            (
                vec![(DESTINATION_HEADER, HeaderValue::text("d")), (DELIVER_AT_HEADER, HeaderValue::text("at noon"))],
                "hourglass-deliver-at: \"at noon\" is not an RFC 3339",
            ),
            (vec![(DESTINATION_HEADER, HeaderValue::text("d")), (DELIVER_AT_HEADER, HeaderValue::I64(-1))], "hourglass-deliver-at: -1 is not"),
            (
                vec![
                    (DESTINATION_HEADER, HeaderValue::text("d")),
                    (REQUESTED_DELAY_HEADER, HeaderValue::text("1s")),
                    (DELIVER_AT_HEADER, HeaderValue::text("2026-11-23T18:00:00Z")),
                ],
                "give one, not both",
            ),
            (vec![(DESTINATION_HEADER, HeaderValue::text("d")), (REQUESTED_DELAY_HEADER, HeaderValue::Bool(true))], "neither a duration"),
            (
                vec![
                    (DESTINATION_HEADER, HeaderValue::text("d")),
                    (REQUESTED_DELAY_HEADER, HeaderValue::text("1s")),
                    ("hourglass-due-at", HeaderValue::text("x")),
                ],
                "is reserved",
            ),
        ];
        for (headers, want) in cases {
            let err = parse_parts(properties(&headers), b"").unwrap_err().to_string();
            assert!(err.contains(want), "{err:?} should mention {want:?}");
        }
    }
}
