//! What a passive declare's failure means. RabbitMQ answers 404 NOT_FOUND not
//! only for a queue that does not exist but also for one that does whose home
//! node is down, or whose process crashed, stopped or timed out
//! (`rabbit_amqqueue:priv_absent`), and 405 RESOURCE_LOCKED for a queue that
//! exists but is exclusive to another connection. Only the first is the
//! sender's mistake; a broker that cannot answer now is nobody's.

use lapin::protocol::{AMQPErrorKind, AMQPSoftError};

use crate::executor::ExecutorError;

/// Why a passive declare failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PassiveFailure {
    /// No queue or exchange by that name.
    Missing,
    /// It may well exist, but the broker cannot answer for it now: its home
    /// node is down, its process crashed or stopped, the connection went.
    Unavailable,
    /// The queue exists and is exclusive to another connection.
    Locked,
    /// Any other refusal of the channel, in the broker's words.
    Other,
}

/// RabbitMQ's wordings (3.x `priv_absent`) for a queue that exists but cannot
/// be reached now, after "NOT_FOUND - ". Quoted names are cut out first, so a
/// queue called "stopped" is not taken for a stopped one.
const UNREACHABLE_WORDINGS: &[&str] =
    &["home node", "down or inaccessible", "crashed", "failed to restart", "stopped", "timeout", "timed out", "may be stopping", "being demoted"];

pub(crate) fn classify(err: &lapin::Error) -> PassiveFailure {
    let lapin::ErrorKind::ProtocolError(amqp) = err.kind() else { return PassiveFailure::Unavailable };
    match amqp.kind() {
        // A connection-level error (CONNECTION_FORCED when the broker stops) is "not now", not "never".
        AMQPErrorKind::Hard(_) => PassiveFailure::Unavailable,
        AMQPErrorKind::Soft(AMQPSoftError::RESOURCELOCKED) => PassiveFailure::Locked,
        AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) if names_unreachable(amqp.get_message().as_str()) => PassiveFailure::Unavailable,
        AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) => PassiveFailure::Missing,
        AMQPErrorKind::Soft(_) => PassiveFailure::Other,
    }
}

fn names_unreachable(text: &str) -> bool {
    let text = text.strip_prefix("NOT_FOUND - ").unwrap_or(text);
    // The plain "no queue 'q' in vhost '/'" (or exchange) is a missing one, whatever its name says.
    if text.starts_with("no queue ") || text.starts_with("no exchange ") {
        return false;
    }
    let unquoted: String = text.split('\'').step_by(2).collect::<Vec<_>>().join(" ");
    UNREACHABLE_WORDINGS.iter().any(|wording| unquoted.contains(wording))
}

/// The answer to a failed passive check of `subject` (`destination queue
/// "orders"`, say): `missing` says what not existing means for the caller.
pub(crate) fn check_failed(subject: &str, url: &str, err: &lapin::Error, missing: &str) -> ExecutorError {
    match classify(err) {
        PassiveFailure::Missing => ExecutorError::Refused(format!("{subject} does not exist on RabbitMQ at {url}{missing} ({err})")),
        PassiveFailure::Unavailable => {
            ExecutorError::Unavailable(format!("checking {subject}: RabbitMQ at {url} cannot answer for it now; try again later ({err})"))
        }
        PassiveFailure::Locked => ExecutorError::Refused(format!(
            "{subject} exists on RabbitMQ at {url} but is exclusive to another connection, so hourglass cannot check or use it ({err})"
        )),
        PassiveFailure::Other => ExecutorError::Refused(format!("checking {subject}: RabbitMQ at {url} refused ({err})")),
    }
}

#[cfg(test)]
mod tests {
    use lapin::protocol::AMQPError;

    use super::*;

    fn amqp(code: u16, text: &str) -> lapin::Error {
        lapin::Error::from(lapin::ErrorKind::ProtocolError(AMQPError::from_id(code, text.into()).expect("a known reply code")))
    }

    #[test]
    fn only_a_plain_not_found_is_missing() {
        assert_eq!(classify(&amqp(404, "NOT_FOUND - no queue 'orders' in vhost '/'")), PassiveFailure::Missing);
        assert_eq!(classify(&amqp(404, "NOT_FOUND - no exchange 'orders' in vhost '/'")), PassiveFailure::Missing);
        // A name that happens to read like a node problem is still just missing.
        assert_eq!(classify(&amqp(404, "NOT_FOUND - no queue 'stopped-home node-timeout' in vhost '/'")), PassiveFailure::Missing);
    }

    #[test]
    fn a_queue_whose_node_cannot_answer_is_unavailable_not_missing() {
        for text in [
            "NOT_FOUND - home node 'rabbit@b' of durable queue 'orders' in vhost '/' is down or inaccessible",
            "NOT_FOUND - queue 'orders' in vhost '/' has crashed and failed to restart",
            "NOT_FOUND - queue 'orders' in vhost '/' process is stopped by supervisor",
            "NOT_FOUND - failed to perform operation on queue 'orders' in vhost '/' due to timeout",
            "NOT_FOUND - failed to perform operation on queue 'orders' in vhost '/': its master replica <0.1.0> may be stopping or being demoted",
        ] {
            assert_eq!(classify(&amqp(404, text)), PassiveFailure::Unavailable, "{text}");
            let answer = check_failed("destination queue \"orders\"", "amqp://localhost", &amqp(404, text), "");
            assert!(matches!(&answer, ExecutorError::Unavailable(why) if !why.contains("does not exist")), "{answer:?}");
        }
    }

    #[test]
    fn a_lost_connection_is_unavailable() {
        assert_eq!(classify(&amqp(320, "CONNECTION_FORCED - broker forced connection closure")), PassiveFailure::Unavailable);
        let io = lapin::Error::from(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset"));
        assert_eq!(classify(&io), PassiveFailure::Unavailable);
    }

    #[test]
    fn an_exclusive_queue_is_named_as_such() {
        let err = amqp(405, "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'orders' in vhost '/'");
        assert_eq!(classify(&err), PassiveFailure::Locked);
        let answer = check_failed("destination queue \"orders\"", "amqp://localhost", &err, "");
        assert!(matches!(&answer, ExecutorError::Refused(why) if why.contains("exclusive") && !why.contains("does not exist")), "{answer:?}");
    }

    #[test]
    fn another_refusal_keeps_the_brokers_words() {
        let err = amqp(406, "PRECONDITION_FAILED - something else");
        assert_eq!(classify(&err), PassiveFailure::Other);
        let answer = check_failed("destination queue \"orders\"", "amqp://localhost", &err, "");
        assert!(matches!(&answer, ExecutorError::Refused(why) if why.contains("something else") && !why.contains("does not exist")), "{answer:?}");
    }
}
