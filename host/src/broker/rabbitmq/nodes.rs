//! Several nodes of one RabbitMQ cluster behind one URL setting.
//!
//! `broker.url` (or `HOURGLASS_AMQP_URL`) may name several nodes separated by
//! commas: `amqp://u:p@rabbit-1/%2f,amqp://u:p@rabbit-2/%2f`. Every
//! connection hourglass opens tries them in turn, each starting one node
//! further on than the last, so a host's connections spread over the
//! cluster and a connection lost with its node opens again on another. A host
//! name that resolves to several addresses needs no list: each address is
//! tried in the resolver's order.
//!
//! A node that failed is tried last for a while ([`SUSPECT_FOR`]): one that
//! drops packets rather than refusing them would otherwise cost a whole
//! connect timeout on every connection that happens to start there.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lapin::{Connection, ConnectionProperties};

/// Where the next connection starts trying; process-wide, so connections spread.
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// How long a node that failed is tried after the others.
pub const SUSPECT_FOR: Duration = Duration::from_secs(30);

/// Nodes that failed lately (redacted URL, when), process-wide.
static SUSPECTS: Mutex<Vec<(String, Instant)>> = Mutex::new(Vec::new());

/// Whether `node` failed within [`SUSPECT_FOR`]; forgets older failures.
fn suspect(node: &str) -> bool {
    let mut suspects = SUSPECTS.lock().unwrap_or_else(|p| p.into_inner());
    suspects.retain(|(_, since)| since.elapsed() < SUSPECT_FOR);
    suspects.iter().any(|(url, _)| url == node)
}

fn mark(node: &str, failed: bool) {
    let mut suspects = SUSPECTS.lock().unwrap_or_else(|p| p.into_inner());
    suspects.retain(|(url, _)| url != node);
    if failed {
        suspects.push((node.to_string(), Instant::now()));
    }
}

/// The node URLs in a setting, in order (blanks between commas skipped). A
/// comma separates nodes only where a URL with a scheme follows: a password
/// may hold a raw comma (`amqp://u:p,w@host`), and it stays in its URL.
pub fn each(urls: &str) -> impl Iterator<Item = &str> {
    let starts_url = |rest: &str| {
        let rest = rest.trim_start();
        rest.split_once("://").is_some_and(|(scheme, _)| {
            scheme.starts_with(|c: char| c.is_ascii_alphabetic()) && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        })
    };
    let mut cuts = vec![0];
    cuts.extend(urls.match_indices(',').map(|(at, _)| at + 1).filter(|at| starts_url(&urls[*at..]) || urls[*at..].trim().is_empty()));
    cuts.push(urls.len() + 1);
    cuts.windows(2).map(move |pair| urls[pair[0]..pair[1] - 1].trim()).filter(|url| !url.is_empty()).collect::<Vec<_>>().into_iter()
}

/// The first node: where the vhost and the user are read from (every node has the same).
pub fn first(urls: &str) -> &str {
    each(urls).next().unwrap_or(urls)
}

/// The URLs with every password replaced by `***`, fit for logs and errors.
pub fn redact(urls: &str) -> String {
    each(urls).map(redact_one).collect::<Vec<_>>().join(",")
}

/// `urls` with every node asking for frames of at most `frame_max` bytes
/// (AMQP negotiates the smaller of the client's and the broker's), unless a
/// node's URL already sets `frame_max`.
pub(crate) fn with_frame_max(urls: &str, frame_max: u32) -> String {
    each(urls)
        .map(|url| match (url.contains("frame_max="), url.contains('?')) {
            (true, _) => url.to_string(),
            (false, true) => format!("{url}&frame_max={frame_max}"),
            (false, false) => format!("{url}?frame_max={frame_max}"),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// One URL with its password replaced by `***`. Text that is not a URL with
/// a scheme is not shown at all: it may be the tail of a password.
fn redact_one(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            match credentials.find(':') {
                Some(colon) => format!("{}{}:***{}", &url[..scheme + 3], &credentials[..colon], &url[at..]),
                None => url.to_string(),
            }
        }
        (Some(_), _) => url.to_string(),
        (None, _) => "<not a URL: hidden>".to_string(),
    }
}

/// Why no node of a URL list gave a connection.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("no AMQP URL configured")]
    NoUrl,
    /// Each node tried (its redacted URL) and why it failed, in the order tried.
    #[error("{}", describe_failures(.0))]
    EveryNodeFailed(Vec<(String, NodeFailure)>),
}

/// Why one node gave no connection.
#[derive(Debug, thiserror::Error)]
pub enum NodeFailure {
    #[error(transparent)]
    Refused(#[from] lapin::Error),
    #[error("no connection within {0:?}")]
    TimedOut(Duration),
}

/// One node's failure as it is; several each behind the node they are about.
fn describe_failures(failures: &[(String, NodeFailure)]) -> String {
    match failures {
        [(_, failure)] => failure.to_string(),
        _ => failures.iter().map(|(node, failure)| format!("{node}: {failure}")).collect::<Vec<_>>().join("; "),
    }
}

/// A connection to the first node of `urls` that answers, trying each once
/// (each bounded by `timeout`); the redacted URL of the node it reached. The
/// error says why each node failed.
pub async fn connect(urls: &str, properties: ConnectionProperties, timeout: Duration) -> Result<(Connection, String), ConnectError> {
    let nodes: Vec<&str> = each(urls).collect();
    if nodes.is_empty() {
        return Err(ConnectError::NoUrl);
    }
    let start = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut order: Vec<&str> = (0..nodes.len()).map(|offset| nodes[(start + offset) % nodes.len()]).collect();
    // Stable: the rotation stays among the healthy nodes, suspects go last.
    order.sort_by_key(|url| suspect(&redact_one(url)));
    let mut failures = Vec::new();
    for url in order {
        let node = redact_one(url);
        let failure = match tokio::time::timeout(timeout, Connection::connect(url, properties.clone())).await {
            Ok(Ok(connection)) => {
                mark(&node, false);
                return Ok((connection, node));
            }
            Ok(Err(err)) => NodeFailure::Refused(err),
            Err(_) => NodeFailure::TimedOut(timeout),
        };
        mark(&node, true);
        failures.push((node, failure));
    }
    Err(ConnectError::EveryNodeFailed(failures))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_splits_on_commas_and_redacts_each_password() {
        let urls = "amqp://guest:secret@a:5672/%2f, amqp://guest:other@b:5673/%2f,";
        assert_eq!(each(urls).collect::<Vec<_>>(), ["amqp://guest:secret@a:5672/%2f", "amqp://guest:other@b:5673/%2f"]);
        assert_eq!(first(urls), "amqp://guest:secret@a:5672/%2f");
        assert_eq!(redact(urls), "amqp://guest:***@a:5672/%2f,amqp://guest:***@b:5673/%2f");
        assert_eq!(redact("amqp://guest:secret@127.0.0.1:5672/%2f"), "amqp://guest:***@127.0.0.1:5672/%2f");
        assert_eq!(redact("amqps://host/vhost"), "amqps://host/vhost");
    }

    #[test]
    fn a_comma_in_a_password_stays_in_its_url_and_is_never_shown() {
        let urls = "amqp://u:p,w@a:5672/%2f,amqp://u:x,y@b:5672/%2f";
        assert_eq!(each(urls).collect::<Vec<_>>(), ["amqp://u:p,w@a:5672/%2f", "amqp://u:x,y@b:5672/%2f"]);
        let uri: lapin::uri::AMQPUri = first(urls).parse().unwrap();
        assert_eq!(uri.authority.userinfo.password, "p,w");
        let redacted = redact(urls);
        assert!(!redacted.contains("p,w") && !redacted.contains("x,y"), "{redacted}");
        assert_eq!(redacted, "amqp://u:***@a:5672/%2f,amqp://u:***@b:5672/%2f");
        assert_eq!(redact("u:secret@host"), "<not a URL: hidden>", "fails closed");
    }

    #[test]
    fn a_frame_limit_is_asked_for_on_each_node_unless_its_url_sets_one() {
        let urls = "amqp://a/%2f,amqp://b/%2f?heartbeat=10,amqp://c/%2f?frame_max=65536";
        assert_eq!(with_frame_max(urls, 16384), "amqp://a/%2f?frame_max=16384,amqp://b/%2f?heartbeat=10&frame_max=16384,amqp://c/%2f?frame_max=65536");
        let uri: lapin::uri::AMQPUri = first(&with_frame_max(urls, 16384)).parse().unwrap();
        assert_eq!(uri.query.frame_max, Some(16384));
    }

    #[tokio::test]
    async fn connecting_tries_every_node_and_names_each_failure() {
        // Two ports nothing listens on: both are tried, both reasons reported.
        let closed = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let (a, b) = (closed(), closed());
        let urls = format!("amqp://guest:secret@127.0.0.1:{a}/%2f,amqp://guest:secret@127.0.0.1:{b}/%2f");
        let err = connect(&urls, ConnectionProperties::default(), Duration::from_secs(2)).await.expect_err("nothing listens").to_string();
        assert!(err.contains(&format!("127.0.0.1:{a}")) && err.contains(&format!("127.0.0.1:{b}")), "{err}");
        assert!(!err.contains("secret"), "{err}");
    }
}
