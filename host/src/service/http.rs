//! The HTTP API: routes, request parsing and the mapping of scheduler errors
//! to status codes. Every refusal is JSON naming the field at fault.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::header::CONTENT_LENGTH;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use base64::Engine;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::Service;
use crate::command::FieldValue;
use crate::executor::{Executor, ExecutorError, KEPT_PER_DESTINATION};
use crate::planner::{PlanRequest, PlannerError};
use crate::scheduler::{ScheduleError, ScheduleRequest};
use crate::service::cancellations::{Answer, CancelError, Cancellations};

/// Largest message body accepted, after base64 decoding.
pub(crate) const MAX_BODY_BYTES: usize = 256 * 1024;

/// A JSON error naming what was wrong.
struct ApiError {
    status: StatusCode,
    field: Option<&'static str>,
    message: String,
}

impl ApiError {
    fn bad(field: &'static str, message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::BAD_REQUEST, field: Some(field), message: message.into() }
    }
}

/// Seconds a client should wait before retrying a 503: the broker is
/// unreachable, blocked (memory or disk alarm) or reconnecting.
const RETRY_AFTER_SECONDS: &str = "5";

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = axum::Json(json!({ "error": self.message, "field": self.field }));
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            return (self.status, [(axum::http::header::RETRY_AFTER, RETRY_AFTER_SECONDS)], body).into_response();
        }
        (self.status, body).into_response()
    }
}

fn schedule_error(err: ScheduleError) -> ApiError {
    match err {
        ScheduleError::BadRequest(message) => ApiError::bad("request", message),
        ScheduleError::UnknownStrategy(unknown) => ApiError::bad("request", unknown.to_string()),
        ScheduleError::Invalid(invalid) => ApiError::bad(invalid.field, format!("{}: {}", invalid.field, invalid.reason)),
        ScheduleError::Unplannable(message) => ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, field: None, message },
        ScheduleError::Planner(PlannerError::Refused { message, planner }) => ApiError::bad("delay", format!("planner {planner} refused: {message}")),
        ScheduleError::Planner(other) => ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, field: None, message: other.to_string() },
        ScheduleError::Broker(ExecutorError::Invalid(message)) => ApiError::bad("request", message),
        ScheduleError::Broker(ExecutorError::Unavailable(message)) => ApiError { status: StatusCode::SERVICE_UNAVAILABLE, field: None, message },
        ScheduleError::Broker(other) => ApiError { status: StatusCode::UNPROCESSABLE_ENTITY, field: Some("destination"), message: other.to_string() },
    }
}

fn authorize(service: &Service, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(token) = &service.token else { return Ok(()) };
    let given = headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    if given == Some(token.as_str()) {
        Ok(())
    } else {
        Err(ApiError { status: StatusCode::UNAUTHORIZED, field: Some("authorization"), message: "missing or wrong bearer token".into() })
    }
}

fn parse_delay(value: &Value) -> Result<u64, ApiError> {
    match value {
        Value::String(text) => hourglass_planner_sdk::parse_duration_ms(text).map_err(|e| ApiError::bad("delay", e)),
        Value::Number(n) => n.as_u64().ok_or_else(|| ApiError::bad("delay", format!("{n} is not a non-negative whole number of milliseconds"))),
        Value::Null => Err(ApiError::bad("delay", "missing: give \"10s\" or milliseconds (or deliver_at, an RFC 3339 time)")),
        other => Err(ApiError::bad("delay", format!("{other} is neither a duration string nor milliseconds"))),
    }
}

/// When the message is due: after `delay`, or at `deliver_at` (RFC 3339); exactly one.
fn parse_timing(object: &serde_json::Map<String, Value>) -> Result<(u64, Option<u64>), ApiError> {
    match (object.get("delay"), object.get("deliver_at")) {
        (Some(_), Some(_)) => Err(ApiError::bad("deliver_at", "give either delay or deliver_at, not both")),
        (None, Some(Value::String(text))) => Ok((0, Some(crate::clock::parse_rfc3339_ms(text).map_err(|e| ApiError::bad("deliver_at", e.to_string()))?))),
        (None, Some(_)) => Err(ApiError::bad("deliver_at", "must be an RFC 3339 string such as \"2026-11-23T18:00:00Z\"")),
        (delay, None) => Ok((parse_delay(delay.unwrap_or(&Value::Null))?, None)),
    }
}

/// Checks and converts the JSON body of `POST /v1/messages`.
fn parse_message(bytes: &[u8]) -> Result<ScheduleRequest, ApiError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| ApiError::bad("request", format!("not JSON: {e}")))?;
    parse_message_value(&value)
}

/// Checks and converts one message as JSON: a `POST /v1/messages` body, or an item of a batch.
fn parse_message_value(value: &Value) -> Result<ScheduleRequest, ApiError> {
    let object = value.as_object().ok_or_else(|| ApiError::bad("request", "expected a JSON object"))?;
    const FIELDS: [&str; 9] = ["destination", "exchange", "routing_key", "delay", "deliver_at", "body", "encoding", "headers", "strategy"];
    if let Some(unknown) = object.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(ApiError::bad("request", format!("unknown field {unknown:?}; known: {}", FIELDS.join(", "))));
    }
    // A queue, or an exchange with the routing key its bindings route by: exactly one of the two.
    let (destination, exchange) = match (object.get("destination"), object.get("exchange")) {
        (Some(_), Some(_)) => return Err(ApiError::bad("exchange", "give \"destination\" (a queue) or \"exchange\", not both")),
        (Some(Value::String(d)), None) if !d.is_empty() => (d.clone(), None),
        (Some(_), None) => return Err(ApiError::bad("destination", "must be a non-empty string")),
        (None, Some(Value::String(e))) if !e.is_empty() => (String::new(), Some(e.clone())),
        (None, Some(_)) => return Err(ApiError::bad("exchange", "must be a non-empty string")),
        (None, None) => return Err(ApiError::bad("destination", "missing (or give \"exchange\" and \"routing_key\")")),
    };
    let routing_key = match object.get("routing_key") {
        None | Some(Value::Null) => None,
        Some(_) if exchange.is_none() => return Err(ApiError::bad("routing_key", "only with \"exchange\": a queue destination is reached by its name")),
        Some(Value::String(key)) => Some(key.clone()),
        Some(_) => return Err(ApiError::bad("routing_key", "must be a string")),
    };
    let (delay_ms, deliver_at_ms) = parse_timing(object)?;
    let text = match object.get("body") {
        Some(Value::String(b)) => b.as_str(),
        None => "",
        Some(_) => return Err(ApiError::bad("body", "must be a string (text, or base64 with \"encoding\": \"base64\")")),
    };
    let body = match object.get("encoding").and_then(Value::as_str) {
        None | Some("text") => text.as_bytes().to_vec(),
        Some("base64") => base64::engine::general_purpose::STANDARD.decode(text).map_err(|e| ApiError::bad("body", format!("not valid base64: {e}")))?,
        Some(other) => return Err(ApiError::bad("encoding", format!("{other:?} is not \"text\" or \"base64\""))),
    };
    if body.len() > MAX_BODY_BYTES {
        return Err(ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            field: Some("body"),
            message: format!("{} bytes; at most {MAX_BODY_BYTES}", body.len()),
        });
    }
    let mut headers = BTreeMap::new();
    match object.get("headers") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (k, v) in map {
                let v = v.as_str().ok_or_else(|| ApiError::bad("headers", format!("header {k:?} must be a string")))?;
                headers.insert(k.clone(), FieldValue::Text(v.to_string()));
            }
        }
        Some(_) => return Err(ApiError::bad("headers", "must be an object of strings")),
    }
    let strategy = match object.get("strategy") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(ApiError::bad("strategy", "must be a string")),
    };
    Ok(ScheduleRequest { destination, exchange, routing_key, delay_ms, deliver_at_ms, body, headers, strategy, ..Default::default() })
}

/// A request body the API refuses with `400`/`413`, as its JSON answer names it.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {message}")]
pub struct RequestError {
    pub field: &'static str,
    pub message: String,
}

impl From<ApiError> for RequestError {
    fn from(err: ApiError) -> Self {
        RequestError { field: err.field.unwrap_or("request"), message: err.message }
    }
}

/// The body of `POST /v1/messages`, read exactly as the handler reads it (the
/// docs' request examples are checked with it).
pub fn schedule_request(bytes: &[u8]) -> Result<ScheduleRequest, RequestError> {
    Ok(parse_message(bytes)?)
}

/// The messages of a `POST /v1/messages:batch` body, each read as
/// [`schedule_request`] reads one; the batch itself refused when it is not one.
pub fn batch_request(bytes: &[u8]) -> Result<Vec<Result<ScheduleRequest, RequestError>>, RequestError> {
    Ok(parse_batch(bytes)?.iter().map(|item| Ok(parse_message_value(item)?)).collect())
}

/// The new due time (Unix ms) a `PATCH /v1/messages/{id}` body asks for, read
/// exactly as the handler reads it; `now` and `retention_ms` as in [`parse_new_due_time`].
pub fn reschedule_request(bytes: &[u8], now: u64, retention_ms: u64) -> Result<u64, RequestError> {
    Ok(parse_new_due_time(bytes, now, retention_ms)?)
}

/// Largest `POST /v1/messages` request read; base64 makes a 256 KiB body
/// about 350 KiB of JSON.
const MAX_REQUEST_BYTES: usize = 2 * MAX_BODY_BYTES;

/// How much of a request over [`MAX_REQUEST_BYTES`] is read and thrown away
/// before answering 413. Most clients read the answer only once they have sent
/// the whole request, and a server that closes with unread data resets the
/// connection: without this they would see a reset, not the 413. Beyond it the
/// connection is closed after the 413, and the client may miss it.
const DRAIN_LIMIT_BYTES: usize = 16 * 1024 * 1024;

/// Reads the request body, at most `limit` bytes ([`MAX_REQUEST_BYTES`] for
/// one message, [`MAX_BATCH_REQUEST_BYTES`] for a batch). A stalled body is
/// cut by the connection's idle timeout.
async fn receive(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let announced = headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<usize>().ok());
    let what = if limit == MAX_BATCH_REQUEST_BYTES { "a batch of messages" } else { "a message" };
    let too_large = |received: usize| ApiError {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        field: Some("body"),
        message: format!(
            "body: the request is over {limit} bytes ({what}, each body at most {MAX_BODY_BYTES} bytes, as text or base64){}",
            if received > 0 { format!("; {received} bytes received") } else { String::new() }
        ),
    };
    if announced.is_some_and(|length| length > DRAIN_LIMIT_BYTES) {
        return Err(too_large(0));
    }
    // Reserved up front only up to one message's size: a batch grows as it arrives, not as it is announced.
    let mut kept = Vec::with_capacity(announced.unwrap_or(0).min(limit).min(MAX_REQUEST_BYTES));
    let mut received = 0;
    let mut frames = body.into_data_stream();
    while let Some(frame) = frames.next().await {
        let frame = frame.map_err(|e| ApiError::bad("request", format!("reading the request failed: {e}")))?;
        received += frame.len();
        if received <= limit {
            kept.extend_from_slice(&frame);
        } else if received > DRAIN_LIMIT_BYTES {
            break;
        }
    }
    if received > limit { Err(too_large(received)) } else { Ok(kept.into()) }
}

/// An authorized request's body, read (at most `limit` bytes) and parsed; a
/// refusal is the answer, counted by the field it names (a wrong token is not).
async fn read_request<T>(service: &Service, headers: &HeaderMap, body: Body, limit: usize, parse: fn(&[u8]) -> Result<T, ApiError>) -> Result<T, Response> {
    authorize(service, headers).map_err(IntoResponse::into_response)?;
    receive(headers, body, limit).await.and_then(|bytes| parse(&bytes)).map_err(|err| {
        service.metrics.rejected(err.field.unwrap_or("request"));
        err.into_response()
    })
}

async fn post_message(State(service): State<Arc<Service>>, headers: HeaderMap, body: Body) -> Response {
    let request = match read_request(&service, &headers, body, MAX_REQUEST_BYTES, parse_message).await {
        Ok(request) => request,
        Err(refused) => return refused,
    };
    match schedule_one(&service, request).await {
        Ok(scheduled) => (StatusCode::ACCEPTED, axum::Json(scheduled)).into_response(),
        Err(err) => err.into_response(),
    }
}

/// Schedules one checked message, counting it: what `POST /v1/messages` and
/// each item of a batch answer (`id`, `due_at`, `strategy`), or the refusal
/// naming the field the client sent.
async fn schedule_one(service: &Service, request: ScheduleRequest) -> Result<Value, ApiError> {
    let destination = request.target().to_string();
    let to_exchange = request.exchange.is_some();
    let scheduler = &service.scheduler;
    if let Some(strategy) = &request.strategy
        && !scheduler.strategy_names().contains(strategy)
    {
        service.metrics.rejected("strategy");
        return Err(ApiError::bad("strategy", format!("unknown strategy {strategy:?}")));
    }
    let strategy = request.strategy.clone().unwrap_or_else(|| scheduler.strategy_for(&destination));
    let timed_by_deliver_at = request.deliver_at_ms.is_some();
    let started = Instant::now();
    let result = scheduler.schedule(request).await;
    service.metrics.observe_schedule(started.elapsed());
    match result {
        Ok(scheduled) => {
            service.metrics.scheduled(&scheduled.strategy, &destination);
            Ok(json!({ "id": scheduled.id, "due_at": scheduled.due_at_ms, "strategy": scheduled.strategy }))
        }
        Err(err) => {
            service.metrics.failed(&strategy, &destination);
            let mut err = schedule_error(err);
            if timed_by_deliver_at && err.field == Some("delay") {
                // The delay was worked out from deliver_at: name what the client sent.
                err.field = Some("deliver_at");
            }
            if to_exchange && err.field == Some("destination") {
                err.field = Some("exchange");
            }
            Err(err)
        }
    }
}

/// Most messages one `POST /v1/messages:batch` carries.
pub const MAX_BATCH: usize = 1_000;

/// Largest batch request read: a thousand messages of about 8 KiB of JSON
/// each (one with a body near [`MAX_BODY_BYTES`] leaves room for fewer).
const MAX_BATCH_REQUEST_BYTES: usize = 8 * 1024 * 1024;

/// A batch's messages scheduled at once: their publishes and the broker's
/// confirms overlap, so a batch costs a few round trips, not one per message.
const BATCH_IN_FLIGHT: usize = 128;

/// Batches a host reads and schedules at once; more answer 503 with
/// `Retry-After`. A batch holds up to [`MAX_BATCH_REQUEST_BYTES`] and its
/// parsed messages, so this bounds what batches take of the host's memory.
const MAX_BATCHES_AT_ONCE: usize = 4;

/// The service's slots for batches in progress.
pub(crate) struct BatchSlots(tokio::sync::Semaphore);

impl Default for BatchSlots {
    fn default() -> Self {
        BatchSlots(tokio::sync::Semaphore::new(MAX_BATCHES_AT_ONCE))
    }
}

/// `POST /v1/messages:batch`: `{"messages": [...]}`, each item a `POST
/// /v1/messages` body. Answers 200 with one result per item, in order: `202`
/// and what a single schedule answers, or the item's own refusal (`400`
/// naming the field, `422`, `503`, …). A bad item harms only itself; a body
/// that is not a batch is refused whole.
async fn post_batch(State(service): State<Arc<Service>>, headers: HeaderMap, body: Body) -> Response {
    if let Err(err) = authorize(&service, &headers) {
        return err.into_response();
    }
    let Ok(_slot) = service.batches.0.try_acquire() else {
        let message = format!("{MAX_BATCHES_AT_ONCE} batches are being scheduled on this host; send this one again shortly");
        return ApiError { status: StatusCode::SERVICE_UNAVAILABLE, field: None, message }.into_response();
    };
    let items = match read_request(&service, &headers, body, MAX_BATCH_REQUEST_BYTES, parse_batch).await {
        Ok(items) => items,
        Err(refused) => return refused,
    };
    let service = &service;
    // Once the broker could not take a message, the items not yet tried are answered 503 at
    // once: a stalled broker costs the batch one confirm timeout, not one per wave of messages.
    let broker_down = std::sync::atomic::AtomicBool::new(false);
    let broker_down = &broker_down;
    let results: Vec<Result<Value, ApiError>> = futures_util::stream::iter(items)
        .map(|item| async move {
            let request = parse_message_value(&item).inspect_err(|err| service.metrics.rejected(err.field.unwrap_or("request")))?;
            if broker_down.load(std::sync::atomic::Ordering::Relaxed) {
                let message = "not tried: the broker could not take an earlier message of this batch".to_string();
                return Err(ApiError { status: StatusCode::SERVICE_UNAVAILABLE, field: None, message });
            }
            let scheduled = schedule_one(service, request).await;
            if scheduled.as_ref().is_err_and(|err| err.status == StatusCode::SERVICE_UNAVAILABLE) {
                broker_down.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            scheduled
        })
        .buffered(BATCH_IN_FLIGHT)
        .collect()
        .await;
    let retry = results.iter().any(|result| result.as_ref().is_err_and(|err| err.status == StatusCode::SERVICE_UNAVAILABLE));
    let scheduled = results.iter().filter(|result| result.is_ok()).count();
    let results: Vec<Value> = results
        .into_iter()
        .map(|result| match result {
            Ok(mut scheduled) => {
                scheduled["status"] = json!(StatusCode::ACCEPTED.as_u16());
                scheduled
            }
            Err(err) => json!({ "status": err.status.as_u16(), "error": err.message, "field": err.field }),
        })
        .collect();
    let failed = results.len() - scheduled;
    let answer = axum::Json(json!({ "scheduled": scheduled, "failed": failed, "results": results }));
    if retry {
        // As a 503 would: the messages answered 503 may be sent again then.
        return ([(axum::http::header::RETRY_AFTER, RETRY_AFTER_SECONDS)], answer).into_response();
    }
    answer.into_response()
}

/// The items of a batch body: 1 to [`MAX_BATCH`] of them.
fn parse_batch(bytes: &[u8]) -> Result<Vec<Value>, ApiError> {
    let mut value: Value = serde_json::from_slice(bytes).map_err(|e| ApiError::bad("request", format!("not JSON: {e}")))?;
    let Some(object) = value.as_object_mut() else { return Err(ApiError::bad("request", "expected a JSON object with \"messages\"")) };
    if let Some(unknown) = object.keys().find(|k| *k != "messages") {
        return Err(ApiError::bad("request", format!("unknown field {unknown:?}; known: messages")));
    }
    match object.remove("messages") {
        Some(Value::Array(items)) if (1..=MAX_BATCH).contains(&items.len()) => Ok(items),
        Some(Value::Array(items)) => Err(ApiError::bad("messages", format!("{} messages; a batch carries 1 to {MAX_BATCH}", items.len()))),
        Some(_) => Err(ApiError::bad("messages", "must be an array of messages, each as POST /v1/messages takes it")),
        None => Err(ApiError::bad("messages", "missing: give {\"messages\": [...]}, each as POST /v1/messages takes it")),
    }
}

/// What decides cancels and reschedules on this service, or why it has nothing.
fn cancellations(service: &Service) -> Result<&dyn Cancellations, ApiError> {
    service.cancellations().ok_or_else(|| ApiError {
        status: StatusCode::CONFLICT,
        field: Some("id"),
        message: "no strategy has cancellable = true: messages cannot be cancelled or rescheduled".into(),
    })
}

fn check_id(id: &str) -> Result<(), ApiError> {
    if id.is_empty() || id.len() > 255 {
        return Err(ApiError::bad("id", format!("must be 1 to 255 bytes, got {}", id.len())));
    }
    Ok(())
}

/// The HTTP answer to a cancel or reschedule, and the metric label.
fn cancellation_answer(id: &str, answered: Result<Answer, CancelError>, due_at_ms: Option<u64>) -> (&'static str, Response) {
    let conflict = |message: String| ApiError { status: StatusCode::CONFLICT, field: Some("id"), message }.into_response();
    match answered {
        Ok(Answer::Cancelled) => ("cancelled", axum::Json(json!({ "id": id, "status": "cancelled" })).into_response()),
        Ok(Answer::Rescheduled) => ("rescheduled", axum::Json(json!({ "id": id, "status": "rescheduled", "due_at": due_at_ms })).into_response()),
        Ok(Answer::AlreadyCancelled) if due_at_ms.is_none() => {
            ("already_cancelled", axum::Json(json!({ "id": id, "status": "cancelled", "already": true })).into_response())
        }
        Ok(Answer::AlreadyCancelled) => ("already_cancelled", conflict(format!("message {id} was cancelled; it cannot be rescheduled"))),
        Ok(Answer::AlreadyReleased) => ("already_released", conflict(format!("message {id} was already delivered to its destination"))),
        Ok(other) => {
            ("failed", ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, field: None, message: format!("unexpected answer {other:?}") }.into_response())
        }
        Err(err) => {
            let label = if matches!(err, CancelError::Unanswered(_)) { "unanswered" } else { "failed" };
            (label, ApiError { status: StatusCode::SERVICE_UNAVAILABLE, field: None, message: err.to_string() }.into_response())
        }
    }
}

/// `DELETE /v1/messages/{id}`: the message is never delivered (200), or it already was (409).
async fn delete_message(State(service): State<Arc<Service>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    if let Err(err) = authorize(&service, &headers).and_then(|()| check_id(&id)) {
        return err.into_response();
    }
    let log = match cancellations(&service) {
        Ok(log) => log,
        Err(err) => return err.into_response(),
    };
    let (label, response) = cancellation_answer(&id, log.cancel(&id).await, None);
    service.metrics.cancellation(label);
    response
}

/// `PATCH /v1/messages/{id}` with `{"delay": …}` or `{"deliver_at": …}`: a new due time.
async fn patch_message(State(service): State<Arc<Service>>, headers: HeaderMap, Path(id): Path<String>, body: Body) -> Response {
    if let Err(err) = authorize(&service, &headers).and_then(|()| check_id(&id)) {
        return err.into_response();
    }
    let log = match cancellations(&service) {
        Ok(log) => log,
        Err(err) => return err.into_response(),
    };
    let due_at_ms = match receive(&headers, body, MAX_REQUEST_BYTES)
        .await
        .and_then(|bytes| parse_new_due_time(&bytes, service.scheduler.clock().latest_ms(), log.retention_ms()))
    {
        Ok(due) => due,
        Err(err) => return err.into_response(),
    };
    let (label, response) = cancellation_answer(&id, log.reschedule(&id, due_at_ms).await, Some(due_at_ms));
    service.metrics.cancellation(label);
    response
}

/// The new due time (Unix ms) of a `PATCH`: `delay` from `now` or `deliver_at`, within the log's retention.
/// `now` is the latest the broker's clock can read now (the host's before any
/// reading): the claim that meets this due time compares it with the earliest
/// it can read then, so the message cannot go before `delay` has passed.
fn parse_new_due_time(bytes: &[u8], now: u64, retention_ms: u64) -> Result<u64, ApiError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| ApiError::bad("request", format!("not JSON: {e}")))?;
    let object = value.as_object().ok_or_else(|| ApiError::bad("request", "expected a JSON object with delay or deliver_at"))?;
    if let Some(unknown) = object.keys().find(|k| !["delay", "deliver_at"].contains(&k.as_str())) {
        return Err(ApiError::bad("request", format!("unknown field {unknown:?}; known: delay, deliver_at")));
    }
    let (delay_ms, deliver_at_ms) = parse_timing(object)?;
    let due = deliver_at_ms.unwrap_or(now.saturating_add(delay_ms));
    if due.saturating_sub(now) > retention_ms {
        let field = if deliver_at_ms.is_some() { "deliver_at" } else { "delay" };
        return Err(ApiError::bad(field, format!("more than service.cancel.retention ({retention_ms} ms) from now; the cancellation log would forget it")));
    }
    Ok(due)
}

async fn get_plan(State(service): State<Arc<Service>>, headers: HeaderMap, Query(query): Query<BTreeMap<String, String>>) -> Response {
    if let Err(err) = authorize(&service, &headers) {
        return err.into_response();
    }
    let Some(destination) = query.get("destination").filter(|d| !d.is_empty()) else {
        return ApiError::bad("destination", "missing").into_response();
    };
    let delay_ms = match parse_delay(&query.get("delay").map_or(Value::Null, |d| Value::String(d.clone()))) {
        Ok(ms) => ms,
        Err(err) => return err.into_response(),
    };
    let scheduler = &service.scheduler;
    let strategy = query.get("strategy").cloned().unwrap_or_else(|| scheduler.strategy_for(destination));
    let request = PlanRequest { destination: destination.clone(), delay_ms, message_id: "plan-preview".into(), routing_key: None };
    match scheduler.plan_only(&strategy, &request) {
        Ok(plan) => axum::Json(json!({ "strategy": strategy, "delivers_after_ms": plan.delivers_after_ms, "commands": plan.commands })).into_response(),
        Err(err) => schedule_error(err).into_response(),
    }
}

async fn get_topology(State(service): State<Arc<Service>>, headers: HeaderMap, Query(query): Query<BTreeMap<String, String>>) -> Response {
    if let Err(err) = authorize(&service, &headers) {
        return err.into_response();
    }
    let strategy = query.get("strategy").cloned().unwrap_or_else(|| service.scheduler.default_strategy());
    let commands = match service.scheduler.topology_of(&strategy) {
        Ok(commands) => commands,
        Err(err) => return schedule_error(err).into_response(),
    };
    match query.get("format").map(String::as_str).unwrap_or("json") {
        "json" => axum::Json(json!({ "strategy": strategy, "commands": commands })).into_response(),
        "mermaid" => crate::render::mermaid(&commands).into_response(),
        "dot" => crate::render::dot(&commands).into_response(),
        other => ApiError::bad("format", format!("{other:?} is not json, mermaid or dot")).into_response(),
    }
}

async fn get_redelivery(State(service): State<Arc<Service>>, headers: HeaderMap) -> Response {
    if let Err(err) = authorize(&service, &headers) {
        return err.into_response();
    }
    let redelivery = service.redelivery();
    let input = redelivery.as_ref().map(|r| r.input.clone());
    let queues = redelivery.map(|r| r.queues).unwrap_or_default();
    axum::Json(json!({ "input": input, "queues": queues })).into_response()
}

/// The memory broker's newest deliveries to a destination: what a first-time
/// user reads to see a delay happen. Other brokers keep none (consume the queue).
async fn get_delivered(State(service): State<Arc<Service>>, headers: HeaderMap, Query(query): Query<BTreeMap<String, String>>) -> Response {
    if let Err(err) = authorize(&service, &headers) {
        return err.into_response();
    }
    let Some(destination) = query.get("destination").filter(|d| !d.is_empty()) else {
        return ApiError::bad("destination", "missing").into_response();
    };
    let Some(delivered) = service.scheduler.executor().delivered(destination) else {
        let message = "only the embedded memory broker keeps delivered messages; on a real broker, consume the destination";
        return ApiError { status: StatusCode::NOT_FOUND, field: None, message: message.into() }.into_response();
    };
    let messages: Vec<Value> = delivered
        .into_iter()
        .map(|delivered| {
            let (body, encoding) = match String::from_utf8(delivered.body.clone()) {
                Ok(text) => (text, "text"),
                Err(_) => (base64::engine::general_purpose::STANDARD.encode(&delivered.body), "base64"),
            };
            json!({
                "id": delivered.id,
                "arrived_at": delivered.arrived_at_ms,
                "due_at": delivered.due_at_ms,
                "late_ms": delivered.late_ms(),
                "body": body,
                "encoding": encoding,
            })
        })
        .collect();
    axum::Json(json!({ "destination": destination, "kept_at_most": KEPT_PER_DESTINATION, "messages": messages })).into_response()
}

/// Every strategy's queue depths, from the last reading (every 5 s), never
/// read per request: `?strategy=` narrows it to one.
async fn get_delays(State(service): State<Arc<Service>>, headers: HeaderMap, Query(query): Query<BTreeMap<String, String>>) -> Response {
    if let Err(err) = authorize(&service, &headers) {
        return err.into_response();
    }
    let mut strategies = service.pending();
    if let Some(wanted) = query.get("strategy") {
        if !service.scheduler.strategy_names().contains(wanted) {
            return ApiError::bad("strategy", format!("unknown strategy {wanted:?}")).into_response();
        }
        strategies.retain(|s| &s.strategy == wanted);
    }
    axum::Json(json!({ "strategies": strategies })).into_response()
}

/// The status page. With a token set, a browser is asked for it as the
/// password of HTTP Basic (any user name); the API's bearer token works too.
async fn status_page(State(service): State<Arc<Service>>, headers: HeaderMap) -> Response {
    if let Some(token) = &service.token {
        let basic = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Basic "))
            .and_then(|encoded| base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok())
            .and_then(|decoded| String::from_utf8(decoded).ok())
            .and_then(|pair| pair.split_once(':').map(|(_, password)| password == token));
        if basic != Some(true) && authorize(&service, &headers).is_err() {
            let challenge = [(axum::http::header::WWW_AUTHENTICATE, "Basic realm=\"hourglass\", charset=\"UTF-8\"")];
            return (StatusCode::UNAUTHORIZED, challenge, "the status page needs the token: any user name, the token as password").into_response();
        }
    }
    ([(axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8")], super::status::page(&service).await).into_response()
}

async fn healthz() -> &'static str {
    "ok"
}

/// `200` only when the broker answers and every task that should run runs;
/// otherwise `503` naming what is down.
async fn readyz(State(service): State<Arc<Service>>) -> Response {
    let readiness = service.readiness().await;
    let status = if readiness.ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, axum::Json(readiness)).into_response()
}

async fn post_reload(State(service): State<Arc<Service>>, headers: HeaderMap) -> Response {
    if let Err(err) = authorize(&service, &headers) {
        return err.into_response();
    }
    match service.reload().await {
        Ok(reloaded) => axum::Json(reloaded).into_response(),
        // The broker away is no fault of the config: ask again later.
        Err(err) if err.broker_unavailable() => ApiError { status: StatusCode::SERVICE_UNAVAILABLE, field: None, message: err.to_string() }.into_response(),
        Err(err) => ApiError { status: StatusCode::UNPROCESSABLE_ENTITY, field: Some("config"), message: err.to_string() }.into_response(),
    }
}

/// Behind the token when one is set: label values name destinations and queues.
async fn get_metrics(State(service): State<Arc<Service>>, headers: HeaderMap) -> Response {
    if let Err(err) = authorize(&service, &headers) {
        return err.into_response();
    }
    ([("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], service.metrics.encode()).into_response()
}

pub fn router(service: Arc<Service>) -> Router {
    Router::new()
        .route("/", get(status_page))
        .route("/v1/messages", post(post_message))
        .route("/v1/messages:batch", post(post_batch))
        .route("/v1/messages/{id}", delete(delete_message).patch(patch_message))
        .route("/v1/plan", get(get_plan))
        .route("/v1/topology", get(get_topology))
        .route("/v1/reload", post(post_reload))
        .route("/v1/redelivery", get(get_redelivery))
        .route("/v1/delivered", get(get_delivered))
        .route("/v1/delays", get(get_delays))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(get_metrics))
        // `post_message` reads its body itself, with its own limit.
        .layer(axum::extract::DefaultBodyLimit::max(MAX_REQUEST_BYTES))
        .with_state(service)
}

/// Serves until `shutdown` resolves; then stops accepting, stops the ingress
/// and the pumps, and waits (at most the shutdown timeout) for requests,
/// confirms and acks in flight. Connections are limited as
/// [`connections`](super::connections) describes.
pub async fn run(listener: TcpListener, service: Arc<Service>, shutdown: impl Future<Output = ()> + Send + 'static) -> std::io::Result<()> {
    let address = listener.local_addr()?;
    if service.token.is_none() && !address.ip().is_loopback() {
        tracing::warn!(%address, "listening beyond loopback with no token: anyone who can reach this address can schedule messages, reload and read metrics; set service.token or HOURGLASS_TOKEN");
    }
    let (signalled, mut signal) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = signalled.send(true);
    });
    let server = tokio::spawn(super::connections::serve(listener, router(service.clone()), service.limits, signal.clone()));
    tokio::pin!(server);
    // With no connection open the listener ends as soon as the signal comes,
    // so both branches can be ready at once: whichever wins, the background
    // tasks are stopped below (returning here once left consumers running).
    let ended = tokio::select! {
        finished = &mut server => Some(finished),
        _ = signal.wait_for(|s| *s) => None,
    };
    if ended.is_some() && !*signal.borrow() {
        tracing::error!("the HTTP listener stopped on its own; stopping the service");
    }
    tracing::info!(timeout = ?service.shutdown_timeout, "shutting down: finishing work in flight");
    let drained = async {
        let served = async {
            match ended {
                Some(finished) => finished,
                None => (&mut server).await,
            }
        };
        let (served, ()) = tokio::join!(served, service.stop_background());
        served.map_err(std::io::Error::other)?
    };
    match tokio::time::timeout(service.shutdown_timeout, drained).await {
        Ok(result) => result,
        Err(_) => {
            // Unacked ingress messages go back to their queue; clients without a 202 retry.
            tracing::warn!(timeout = ?service.shutdown_timeout, "shutdown timeout: leaving work unfinished");
            Ok(())
        }
    }
}
