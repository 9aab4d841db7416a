//! RabbitMQ's management HTTP API: the only place bindings and arguments can
//! be read (for `verify` and `migrate`), and where broker policies are set
//! (for redelivery on queues that already exist).

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use lapin::uri::AMQPUri;
use serde_json::Value;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::future::BoxFuture;

use crate::clock::estimate::Reading;
use crate::clock::{monotonic_ms, parse_http_date_s};
use crate::service::pending::{PerMessageQueues, QueueDepth};

/// The management API to use: `$HOURGLASS_MANAGEMENT_URL`, else the configured
/// URL (`broker.management_url`), else one derived from the AMQP URL.
pub fn management_url(amqp_url: &str, configured: Option<&str>) -> Option<String> {
    crate::environment::environment_text("HOURGLASS_MANAGEMENT_URL").or_else(|| configured.map(str::to_string)).or_else(|| default_management_url(amqp_url))
}

/// The management API's base URL (`http://user:pass@host:15672`) derived from
/// an AMQP URL: one per node, comma-separated, when it lists several.
pub(crate) fn default_management_url(amqp_url: &str) -> Option<String> {
    let mut bases: Vec<String> = Vec::new();
    for node in super::nodes::each(amqp_url) {
        let Ok(uri) = node.parse::<AMQPUri>() else { continue };
        let user = &uri.authority.userinfo;
        // Written back percent-encoded: a password may hold `@`, `/`, `:` or `,`.
        let base = format!("http://{}:{}@{}:15672", encode(&user.username), encode(&user.password), uri.authority.host);
        if !bases.contains(&base) {
            bases.push(base);
        }
    }
    (!bases.is_empty()).then(|| bases.join(","))
}

pub fn vhost_of(amqp_url: &str) -> String {
    super::nodes::first(amqp_url).parse::<AMQPUri>().map(|u| u.vhost).unwrap_or_else(|_| "/".into())
}

pub fn encode(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// How far past the second its `Date` header names the broker's clock can
/// read when the answer leaves: the header is whole seconds, and Cowboy (the
/// management API's HTTP server) renews it once a second from a timer, not on
/// the second. Measured on RabbitMQ 3.10: the header lagged the clock by 0.83
/// to 1.83 s. Only the upper end of a reading rests on this; the lower end
/// (what keeps due times from being early) holds whatever the lag.
pub(crate) const DATE_STALENESS_MS: u64 = 2_000;

/// The management API of one or more nodes (`management_url` may list
/// several, comma-separated): each request goes to the node that answered
/// last, and on to the next when a node cannot be reached.
pub struct Management {
    agent: ureq::Agent,
    endpoints: Vec<Endpoint>,
    /// The endpoint that answered last, tried first.
    last_good: AtomicUsize,
    vhost: String,
}

struct Endpoint {
    /// `scheme://host:port`, credentials removed.
    base: String,
    authorization: String,
    /// The user name alone, for commands printed to the user (never the password).
    user: String,
}

type Answer = Result<ureq::http::Response<ureq::Body>, ureq::Error>;

/// What went wrong asking the management API. URLs are the endpoints' own,
/// without credentials.
#[derive(Debug, thiserror::Error)]
pub enum ManagementError {
    #[error("no management URL")]
    NoUrl,
    #[error("management URL needs http:// or https://")]
    NoScheme,
    #[error("management URL credentials are not UTF-8 once decoded")]
    CredentialsNotUtf8(#[source] std::str::Utf8Error),
    /// No endpoint answered at all: each one's URL and why.
    #[error("{}", .0.iter().map(|(url, err)| format!("{url}: {err}")).collect::<Vec<_>>().join("; "))]
    Unreachable(Vec<(String, ureq::Error)>),
    #[error("{url}: HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("{url}: {source}")]
    Body { url: String, source: ureq::Error },
    #[error("{url}: the answer has no Date header")]
    NoDate { url: String },
    #[error("{url}: Date {date:?} is not an HTTP date")]
    BadDate { url: String, date: String },
}

impl Management {
    pub fn new(management_url: &str, vhost: String) -> Result<Self, ManagementError> {
        let endpoints = super::nodes::each(management_url).map(endpoint).collect::<Result<Vec<_>, _>>()?;
        if endpoints.is_empty() {
            return Err(ManagementError::NoUrl);
        }
        let agent = ureq::Agent::config_builder().timeout_global(Some(std::time::Duration::from_secs(10))).http_status_as_error(false).build().into();
        Ok(Management { agent, endpoints, last_good: AtomicUsize::new(0), vhost })
    }

    /// Sends `request` (given the full URL and the authorization header) to
    /// each endpoint in turn until one answers with any HTTP status.
    fn send(&self, path: &str, request: impl Fn(&str, &str) -> Answer) -> Result<(String, ureq::http::Response<ureq::Body>), ManagementError> {
        let start = self.last_good.load(Ordering::Relaxed);
        let mut failures = Vec::new();
        for offset in 0..self.endpoints.len() {
            let index = (start + offset) % self.endpoints.len();
            let endpoint = &self.endpoints[index];
            let url = format!("{}/api/{path}", endpoint.base);
            match request(&url, &endpoint.authorization) {
                Ok(response) => {
                    self.last_good.store(index, Ordering::Relaxed);
                    return Ok((url, response));
                }
                Err(err) => failures.push((url, err)),
            }
        }
        Err(ManagementError::Unreachable(failures))
    }

    /// `Ok(None)` for 404.
    pub fn get(&self, path: &str) -> Result<Option<Value>, ManagementError> {
        let (url, response) = self.send(path, |url, authorization| self.agent.get(url).header("Authorization", authorization).call())?;
        json_or_none(&url, response)
    }

    /// A reading of the broker's clock: the `Date` header of an answer to
    /// `GET /api/whoami` (any status will do, a refusal carries it too),
    /// timed on the monotonic clock.
    pub(crate) fn clock_reading(&self) -> Result<Reading, ManagementError> {
        let sent = std::cell::Cell::new(0);
        let (url, response) = self.send("whoami", |url, authorization| {
            // Each endpoint tried is timed afresh: the one that answers is the one timed.
            sent.set(monotonic_ms());
            self.agent.get(url).header("Authorization", authorization).call()
        })?;
        let received = monotonic_ms();
        let date = response.headers().get("date").and_then(|v| v.to_str().ok()).ok_or_else(|| ManagementError::NoDate { url: url.clone() })?;
        let date_s = parse_http_date_s(date).ok_or_else(|| ManagementError::BadDate { url, date: date.to_string() })?;
        Ok(Reading::http_date(date_s, DATE_STALENESS_MS, sent.get(), received))
    }

    /// `GET path` from every endpoint, not only the first that answers, each
    /// answer beside its endpoint's base URL: for what a node reports of
    /// itself alone (the delayed-message plugin's count of its own messages).
    pub(crate) fn get_each(&self, path: &str) -> Vec<(String, Result<Option<Value>, ManagementError>)> {
        self.endpoints
            .iter()
            .map(|endpoint| {
                let url = format!("{}/api/{path}", endpoint.base);
                let answer = match self.agent.get(&url).header("Authorization", &endpoint.authorization).call() {
                    Ok(response) => json_or_none(&url, response),
                    Err(err) => Err(ManagementError::Unreachable(vec![(url, err)])),
                };
                (endpoint.base.clone(), answer)
            })
            .collect()
    }

    /// Each endpoint's base URL (no credentials) and user name, in the order given.
    pub fn endpoints(&self) -> Vec<(String, String)> {
        self.endpoints.iter().map(|e| (e.base.clone(), e.user.clone())).collect()
    }

    /// The vhost every per-vhost request is about.
    pub fn vhost(&self) -> &str {
        &self.vhost
    }

    pub fn object(&self, kind: &str, name: &str) -> Result<Option<Value>, ManagementError> {
        self.get(&format!("{kind}/{}/{}", encode(&self.vhost), encode(name)))
    }

    /// The vhost's queues that dead-letter into one of `exchanges`, with their
    /// messages and TTL: the queues a strategy declares per message (hold
    /// queues), which its static topology cannot list.
    pub(crate) fn queues_dead_lettering_to(&self, exchanges: &[String]) -> Result<Vec<(String, u64, Option<u64>)>, ManagementError> {
        let listed = self.get(&format!("queues/{}?columns=name,messages,arguments", encode(&self.vhost)))?.unwrap_or_default();
        let mut found: Vec<(String, u64, Option<u64>)> = listed
            .as_array()
            .into_iter()
            .flatten()
            .filter(|q| q["arguments"]["x-dead-letter-exchange"].as_str().is_some_and(|dlx| exchanges.iter().any(|e| e == dlx)))
            .filter_map(|q| Some((q["name"].as_str()?.to_string(), q["messages"].as_u64().unwrap_or(0), q["arguments"]["x-message-ttl"].as_u64())))
            .collect();
        found.sort();
        Ok(found)
    }

    pub fn bindings(&self, source: &str, target_kind: char, target: &str) -> Result<Vec<Value>, ManagementError> {
        let path = format!("bindings/{}/e/{}/{target_kind}/{}", encode(&self.vhost), encode(source), encode(target));
        Ok(self.get(&path)?.and_then(|v| v.as_array().cloned()).unwrap_or_default())
    }

    fn policy_path(&self, name: &str) -> String {
        format!("policies/{}/{}", encode(&self.vhost), encode(name))
    }

    /// Creates or replaces the policy `name` (`PUT /api/policies/{vhost}/{name}`).
    pub(crate) fn put_policy(&self, name: &str, policy: &Value) -> Result<(), ManagementError> {
        let (url, response) =
            self.send(&self.policy_path(name), |url, authorization| self.agent.put(url).header("Authorization", authorization).send_json(policy))?;
        succeeded(&url, response)
    }
}

/// One management URL, its credentials (default guest) turned into a Basic authorization.
fn endpoint(url: &str) -> Result<Endpoint, ManagementError> {
    let (scheme, rest) = url.split_once("://").ok_or(ManagementError::NoScheme)?;
    let (credentials, host) = rest.rsplit_once('@').unwrap_or(("guest:guest", rest));
    // URL credentials are percent-encoded; Basic authentication wants them as they are.
    let credentials = percent_encoding::percent_decode_str(credentials).decode_utf8().map_err(ManagementError::CredentialsNotUtf8)?;
    let user = credentials.split_once(':').map_or(&*credentials, |(user, _)| user).to_string();
    Ok(Endpoint { base: format!("{scheme}://{}", host.trim_end_matches('/')), authorization: format!("Basic {}", BASE64.encode(credentials.as_bytes())), user })
}

/// A 200's JSON, or `None` for 404.
fn json_or_none(url: &str, mut response: ureq::http::Response<ureq::Body>) -> Result<Option<Value>, ManagementError> {
    match response.status().as_u16() {
        404 => Ok(None),
        200 => response.body_mut().read_json::<Value>().map(Some).map_err(|source| ManagementError::Body { url: url.to_string(), source }),
        status => Err(ManagementError::Status { url: url.to_string(), status }),
    }
}

fn succeeded(url: &str, response: ureq::http::Response<ureq::Body>) -> Result<(), ManagementError> {
    match response.status().as_u16() {
        200..=299 => Ok(()),
        status => Err(ManagementError::Status { url: url.to_string(), status }),
    }
}

/// The management API of a RabbitMQ broker (`broker.management_url`, else
/// the AMQP host on port 15672).
pub fn management_for(settings: &crate::config::broker::RabbitMqSettings) -> Option<std::sync::Arc<Management>> {
    management_api(&settings.url, settings.management_url.as_deref())
}

/// The management API of the RabbitMQ at `amqp` (`management_url`, else the
/// AMQP host on port 15672).
pub fn management_api(amqp: &str, management_url: Option<&str>) -> Option<std::sync::Arc<Management>> {
    let base = self::management_url(amqp, management_url)?;
    Management::new(&base, vhost_of(amqp)).ok().map(std::sync::Arc::new)
}

/// Hold queues made per message are the queues that dead-letter into a strategy's exchanges.
impl PerMessageQueues for std::sync::Arc<Management> {
    fn dead_lettering_to(&self, strategy: &str, exchanges: Vec<String>) -> BoxFuture<'_, Vec<QueueDepth>> {
        let (api, strategy) = (self.clone(), strategy.to_string());
        Box::pin(async move {
            match tokio::task::spawn_blocking(move || api.queues_dead_lettering_to(&exchanges)).await {
                Ok(Ok(found)) => found.into_iter().map(|(queue, messages, ttl_ms)| QueueDepth { queue, messages: Some(messages), ttl_ms }).collect(),
                Ok(Err(err)) => {
                    tracing::debug!(%strategy, error = %err, "listing per-message queues through the management API failed");
                    Vec::new()
                }
                Err(err) => {
                    tracing::debug!(%strategy, error = %err, "listing per-message queues failed");
                    Vec::new()
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_management_url_follows_the_amqp_url() {
        assert_eq!(default_management_url("amqp://guest:guest@127.0.0.1:5672/%2f").as_deref(), Some("http://guest:guest@127.0.0.1:15672"));
        assert_eq!(vhost_of("amqp://guest:guest@127.0.0.1:5672/%2f"), "/");
        assert_eq!(encode("/"), "%2F");
    }

    #[test]
    fn a_cluster_url_gives_each_node_s_management_api_once() {
        let urls = "amqp://u:p@a:5672/%2f,amqp://u:p@b:5672/%2f,amqp://u:p@a:5673/%2f";
        assert_eq!(default_management_url(urls).as_deref(), Some("http://u:p@a:15672,http://u:p@b:15672"));
        assert_eq!(vhost_of("amqp://u:p@a:5672/orders,amqp://u:p@b:5672/orders"), "orders");
    }

    #[test]
    fn credentials_with_url_characters_reach_the_api_as_they_are() {
        // The AMQP URL's password is `p,w@x/y` (percent-encoded where it must be).
        let management = default_management_url("amqp://u:p,w%40x%2Fy@a:5672/%2f").unwrap();
        assert_eq!(management, "http://u:p%2Cw%40x%2Fy@a:15672");
        let endpoint = endpoint(&management).unwrap();
        assert_eq!(endpoint.base, "http://a:15672", "no credentials in what errors quote");
        assert_eq!(endpoint.authorization, format!("Basic {}", BASE64.encode("u:p,w@x/y")));
        assert_eq!(endpoint.user, "u");
    }

    #[test]
    fn a_node_that_cannot_be_reached_is_skipped_and_the_one_that_answered_is_asked_first() {
        use std::io::{Read, Write};
        use std::net::TcpListener;
        // A port nothing listens on any more, then a server answering `{}` twice.
        let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let open = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            for stream in listener.incoming().take(2) {
                let mut stream = stream.unwrap();
                let _ = stream.read(&mut [0u8; 4096]);
                stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}").unwrap();
            }
        });
        let api = Management::new(&format!("http://guest:guest@127.0.0.1:{closed},http://guest:guest@127.0.0.1:{open}"), "/".into()).unwrap();
        assert_eq!(api.get("overview").unwrap(), Some(serde_json::json!({})));
        assert_eq!(api.last_good.load(Ordering::Relaxed), 1);
        assert_eq!(api.get("overview").unwrap(), Some(serde_json::json!({})));
        server.join().unwrap();
        let none = Management::new(&format!("http://127.0.0.1:{closed}"), "/".into()).unwrap();
        let err = none.get("overview").unwrap_err().to_string();
        assert!(err.contains(&format!("127.0.0.1:{closed}/api/overview")), "{err}");
    }
}
