//! Answers of a planner built against an earlier contract (`hourglass:planner@0.4.0`,
//! `@0.3.0`, `@0.2.0` or `@0.1.0`) in 0.5.0's types, so everything past the call
//! sees one contract. Each version's answers are a subset of the next's: 0.2.0
//! added `bcc` to `publish`, 0.3.0 named its exchange and keys with `name` (which
//! an earlier planner's strings become as `name.text`), 0.4.0 added the NATS
//! family, which no earlier planner can answer with, and 0.5.0 `nats-schedule`.
//! The host's inputs go the other way.

use super::bindings::hourglass::planner::types as now;

/// The conversions between `old` (in scope where it is expanded) and `now`,
/// every type but `publish` alike in both; `commands` and `families` are the
/// arms of what a version has beyond 0.1.0's (the NATS family from 0.4.0).
macro_rules! upgrade_from {
    () => {
        upgrade_from!(commands: {}, families: {});
    };
    (commands: { $($command_arm:tt)* }, families: { $($family_arm:tt)* }) => {
        pub(crate) fn commands(commands: Vec<old::Command>) -> Vec<now::Command> {
            commands.into_iter().map(command).collect()
        }

        fn command(command: old::Command) -> now::Command {
            match command {
                old::Command::DeclareExchange(e) => now::Command::DeclareExchange(now::DeclareExchange {
                    name: e.name,
                    kind: exchange_kind(e.kind),
                    durable: e.durable,
                    arguments: fields(e.arguments),
                }),
                old::Command::DeclareQueue(q) => {
                    now::Command::DeclareQueue(now::DeclareQueue { name: q.name, durable: q.durable, arguments: fields(q.arguments) })
                }
                old::Command::BindQueue(b) => {
                    now::Command::BindQueue(now::BindQueue { queue: b.queue, exchange: b.exchange, routing_key: b.routing_key, arguments: fields(b.arguments) })
                }
                old::Command::BindExchange(b) => now::Command::BindExchange(now::BindExchange {
                    source: b.source,
                    destination: b.destination,
                    routing_key: b.routing_key,
                    arguments: fields(b.arguments),
                }),
                old::Command::Publish(p) => now::Command::Publish(publish(p)),
                old::Command::SqsEnsureQueue(q) => {
                    now::Command::SqsEnsureQueue(now::SqsEnsureQueue { name: q.name, attributes: attributes(q.attributes), pumped: q.pumped })
                }
                old::Command::SqsSend(s) => now::Command::SqsSend(now::SqsSend {
                    queue: s.queue,
                    delay_seconds: s.delay_seconds,
                    attributes: attributes(s.attributes),
                    group_id: s.group_id,
                    dedup_id: s.dedup_id,
                }),
                $($command_arm)*
            }
        }

        fn exchange_kind(kind: old::ExchangeKind) -> now::ExchangeKind {
            match kind {
                old::ExchangeKind::Direct => now::ExchangeKind::Direct,
                old::ExchangeKind::Fanout => now::ExchangeKind::Fanout,
                old::ExchangeKind::Topic => now::ExchangeKind::Topic,
                old::ExchangeKind::Headers => now::ExchangeKind::Headers,
            }
        }

        fn fields(fields: Vec<old::Field>) -> Vec<now::Field> {
            fields
                .into_iter()
                .map(|f| now::Field {
                    key: f.key,
                    value: match f.value {
                        old::Value::Text(s) => now::Value::Text(s),
                        old::Value::Int(i) => now::Value::Int(i),
                        old::Value::Boolean(b) => now::Value::Boolean(b),
                    },
                })
                .collect()
        }

        fn attributes(attributes: Vec<old::SqsAttribute>) -> Vec<now::SqsAttribute> {
            attributes.into_iter().map(|a| now::SqsAttribute { name: a.name, value: a.value }).collect()
        }

        pub(crate) fn delay_plan(plan: old::DelayPlan) -> now::DelayPlan {
            now::DelayPlan { commands: commands(plan.commands), delivers_after_ms: plan.delivers_after_ms }
        }

        pub(crate) fn due_action(action: old::DueAction) -> now::DueAction {
            match action {
                old::DueAction::Recycle(c) => now::DueAction::Recycle(commands(c)),
                old::DueAction::HandOver(c) => now::DueAction::HandOver(commands(c)),
            }
        }

        pub(crate) fn info(info: old::PlannerInfo) -> now::PlannerInfo {
            now::PlannerInfo {
                name: info.name,
                version: info.version,
                family: match info.family {
                    old::BrokerFamily::Amqp => now::BrokerFamily::Amqp,
                    old::BrokerFamily::Sqs => now::BrokerFamily::Sqs,
                    $($family_arm)*
                },
                config_keys: info
                    .config_keys
                    .into_iter()
                    .map(|k| now::ConfigKey { name: k.name, description: k.description, default_value: k.default_value })
                    .collect(),
            }
        }

        pub(crate) fn delay_range(range: old::DelayRange) -> now::DelayRange {
            now::DelayRange {
                granularity: match range.granularity {
                    old::Granularity::Uniform(step) => now::Granularity::Uniform(step),
                    old::Granularity::Listed(delays) => now::Granularity::Listed(delays),
                },
                max_delay_ms: range.max_delay_ms,
            }
        }

        pub(crate) fn redelivery_decision(decision: old::RedeliveryDecision) -> now::RedeliveryDecision {
            match decision {
                old::RedeliveryDecision::RetryAfterMs(ms) => now::RedeliveryDecision::RetryAfterMs(ms),
                old::RedeliveryDecision::GiveUp(why) => now::RedeliveryDecision::GiveUp(why),
            }
        }

        /// The inputs go the other way: same fields, the old types.
        pub(crate) fn due_message(message: &now::DueMessage) -> old::DueMessage {
            old::DueMessage {
                queue: message.queue.clone(),
                message_id: message.message_id.clone(),
                attributes: message.attributes.iter().map(|a| old::SqsAttribute { name: a.name.clone(), value: a.value.clone() }).collect(),
                sent_timestamp_ms: message.sent_timestamp_ms,
                first_receive_timestamp_ms: message.first_receive_timestamp_ms,
                receive_count: message.receive_count,
                host_now_ms: message.host_now_ms,
            }
        }

        pub(crate) fn redelivery_request(request: &now::RedeliveryRequest) -> old::RedeliveryRequest {
            old::RedeliveryRequest { queue: request.queue.clone(), attempt: request.attempt, seed: request.seed, reason: request.reason.clone() }
        }
    };
}

/// `publish` as 0.3.0 has it, and every version since: exchange and keys
/// each a registered `name` or text.
macro_rules! publish_with_names {
    () => {
        fn publish(p: old::Publish) -> now::Publish {
            now::Publish {
                exchange: name(p.exchange),
                routing_key: name(p.routing_key),
                bcc: p.bcc.into_iter().map(name).collect(),
                headers: fields(p.headers),
                expiration_ms: p.expiration_ms,
                mandatory: p.mandatory,
            }
        }

        fn name(name: old::Name) -> now::Name {
            match name {
                old::Name::Registered(index) => now::Name::Registered(index),
                old::Name::Text(text) => now::Name::Text(text),
            }
        }
    };
}

/// From `hourglass:planner@0.4.0`: everything but `nats-schedule`.
pub(crate) mod v0_4 {
    use super::now;
    use crate::planner::bindings::v0_4::hourglass::planner::types as old;

    publish_with_names!();

    fn nats_headers(headers: Vec<old::NatsHeader>) -> Vec<now::NatsHeader> {
        headers.into_iter().map(|h| now::NatsHeader { name: h.name, value: h.value }).collect()
    }

    upgrade_from!(
        commands: {
            old::Command::NatsEnsureStream(s) => now::Command::NatsEnsureStream(now::NatsEnsureStream { name: s.name, subjects: s.subjects, held: s.held }),
            old::Command::NatsPublish(p) => now::Command::NatsPublish(now::NatsPublish { subject: name(p.subject), headers: nats_headers(p.headers) }),
        },
        families: { old::BrokerFamily::Nats => now::BrokerFamily::Nats, }
    );

    pub(crate) fn held_action(action: old::HeldAction) -> now::HeldAction {
        match action {
            old::HeldAction::Wait(ms) => now::HeldAction::Wait(ms),
            old::HeldAction::HandOver(c) => now::HeldAction::HandOver(commands(c)),
        }
    }

    pub(crate) fn held_message(message: &now::HeldMessage) -> old::HeldMessage {
        old::HeldMessage {
            stream: message.stream.clone(),
            subject: message.subject.clone(),
            destination: message.destination.clone(),
            due_at_ms: message.due_at_ms,
            now_ms: message.now_ms,
            deliveries: message.deliveries,
        }
    }
}

/// From `hourglass:planner@0.3.0`: the same publish, no NATS commands.
pub(crate) mod v0_3 {
    use super::now;
    use crate::planner::bindings::v0_3::hourglass::planner::types as old;

    publish_with_names!();

    upgrade_from!();
}

/// From `hourglass:planner@0.2.0`: every name a string.
pub(crate) mod v0_2 {
    use super::now;
    use crate::planner::bindings::v0_2::hourglass::planner::types as old;

    fn publish(p: old::Publish) -> now::Publish {
        now::Publish {
            exchange: now::Name::Text(p.exchange),
            routing_key: now::Name::Text(p.routing_key),
            bcc: p.bcc.into_iter().map(now::Name::Text).collect(),
            headers: fields(p.headers),
            expiration_ms: p.expiration_ms,
            mandatory: p.mandatory,
        }
    }

    upgrade_from!();
}

/// From `hourglass:planner@0.1.0`: no `bcc`, so a publish routes on its one key.
pub(crate) mod v0_1 {
    use super::now;
    use crate::planner::bindings::v0_1::hourglass::planner::types as old;

    fn publish(p: old::Publish) -> now::Publish {
        now::Publish {
            exchange: now::Name::Text(p.exchange),
            routing_key: now::Name::Text(p.routing_key),
            bcc: Vec::new(),
            headers: fields(p.headers),
            expiration_ms: p.expiration_ms,
            mandatory: p.mandatory,
        }
    }

    upgrade_from!();
}
