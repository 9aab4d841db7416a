use super::amqp::topic_matches;
use super::nats::subject_matches;
use super::*;
use crate::command::{AmqpCommand, ExchangeKind, FieldValue, NatsCommand, SqsCommand};

fn table(pairs: &[(&str, FieldValue)]) -> FieldTable {
    pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

fn queue(name: &str, args: &[(&str, FieldValue)]) -> Command {
    Command::Amqp(AmqpCommand::DeclareQueue { name: name.into(), durable: true, arguments: table(args) })
}

fn exchange(name: &str, kind: ExchangeKind) -> Command {
    Command::Amqp(AmqpCommand::DeclareExchange { name: name.into(), kind, durable: true, arguments: FieldTable::new() })
}

fn bind(queue: &str, exchange: &str, key: &str) -> Command {
    Command::Amqp(AmqpCommand::BindQueue { queue: queue.into(), exchange: exchange.into(), routing_key: key.into(), arguments: FieldTable::new() })
}

fn publish(exchange: &str, key: &str, expiration_ms: Option<u64>) -> Command {
    Command::Amqp(AmqpCommand::Publish {
        exchange: exchange.into(),
        routing_key: key.into(),
        bcc: Vec::new(),
        headers: FieldTable::new(),
        expiration_ms,
        mandatory: true,
    })
}

fn run(sim: &mut Simulator) {
    while !matches!(sim.step(), Step::Idle) {}
}

fn ttl(ms: i64) -> (&'static str, FieldValue) {
    ("x-message-ttl", FieldValue::Int(ms))
}

fn dlx(name: &str) -> (&'static str, FieldValue) {
    ("x-dead-letter-exchange", FieldValue::Text(name.into()))
}

#[test]
fn topic_wildcards_follow_amqp_rules() {
    assert!(topic_matches("*.1.#", "0.1.dest"));
    assert!(topic_matches("*.1.#", "0.1"));
    assert!(!topic_matches("*.1.#", "1.0.dest"));
    assert!(topic_matches("#.dest", "0.0.dest"));
    assert!(topic_matches("#.dest", "dest"));
    assert!(!topic_matches("*.dest", "a.b.dest"));
    assert!(topic_matches("#", ""));
}

#[test]
fn ttl_queue_dead_letters_to_its_exchange_after_the_ttl() {
    let mut sim = Simulator::new();
    sim.declare_destination_queue("dest");
    for c in [exchange("out", ExchangeKind::Direct), queue("wait", &[ttl(5_000), dlx("out")]), bind("dest", "out", "dest")] {
        sim.apply(&c).unwrap();
    }
    sim.execute(&publish("", "wait", None), SimMessage::new("m", FieldTable::new())).unwrap();
    // The default exchange keeps the key "wait"; dead-lettering keeps it too, so `out` must route "wait".
    sim.apply(&bind("dest", "out", "wait")).unwrap();
    run(&mut sim);
    let arrival = &sim.arrivals()[0];
    assert_eq!((arrival.queue.as_str(), arrival.at_ms), ("dest", 5_000));
    assert_eq!(arrival.message.deaths[0].queue, "wait");
    assert!(sim.lost().is_empty());
}

#[test]
fn per_message_expiry_waits_behind_the_head() {
    let mut sim = Simulator::new();
    sim.declare_destination_queue("dest");
    sim.apply(&queue("wait", &[dlx(""), ("x-dead-letter-routing-key", FieldValue::Text("dest".into()))])).unwrap();
    let message = SimMessage::new("m", FieldTable::new());
    sim.execute(&publish("", "wait", Some(10_000)), message.clone()).unwrap();
    sim.execute(&publish("", "wait", Some(1_000)), message).unwrap();
    run(&mut sim);
    let times: Vec<u64> = sim.arrivals().iter().map(|a| a.at_ms).collect();
    assert_eq!(times, vec![10_000, 10_000], "the short-lived message is stuck behind the long one");
}

#[test]
fn x_expires_deletes_an_unused_queue_and_records_its_messages_as_lost() {
    let mut sim = Simulator::new();
    sim.apply(&queue("hold", &[("x-expires", FieldValue::Int(1_000))])).unwrap();
    sim.execute(&publish("", "hold", None), SimMessage::new("m", FieldTable::new())).unwrap();
    run(&mut sim);
    assert_eq!(sim.lost().len(), 1);
    assert!(sim.lost()[0].reason.contains("x-expires"), "{}", sim.lost()[0].reason);
}

#[test]
fn redeclaring_renews_x_expires() {
    let mut sim = Simulator::new();
    let hold = queue("hold", &[("x-expires", FieldValue::Int(1_000)), ttl(1_500), dlx(""), ("x-dead-letter-routing-key", FieldValue::Text("dest".into()))]);
    sim.declare_destination_queue("dest");
    sim.apply(&hold).unwrap();
    sim.execute(&publish("", "hold", None), SimMessage::new("m", FieldTable::new())).unwrap();
    // Without a renewal the queue would vanish at 1,000 ms with the message in it.
    assert_eq!(sim.next_event_ms(), Some(1_000));
    sim.advance_to(900);
    sim.apply(&hold).unwrap();
    run(&mut sim);
    assert!(sim.lost().is_empty(), "{:?}", sim.lost());
    assert_eq!(sim.arrivals()[0].at_ms, 1_500);
}

#[test]
fn an_unroutable_mandatory_publish_is_an_error_and_recorded() {
    let mut sim = Simulator::new();
    sim.apply(&exchange("x", ExchangeKind::Topic)).unwrap();
    let err = sim.execute(&publish("x", "nobody", None), SimMessage::new("m", FieldTable::new())).unwrap_err();
    assert!(matches!(err, SimError::Unroutable { .. }));
    assert_eq!(sim.lost().len(), 1);
    let err = sim.execute(&publish("missing", "k", None), SimMessage::new("m", FieldTable::new())).unwrap_err();
    assert!(matches!(err, SimError::NotFound(_)));
}

#[test]
fn redeclaring_with_other_arguments_names_the_difference() {
    let mut sim = Simulator::new();
    sim.apply(&queue("q", &[ttl(1_000)])).unwrap();
    let err = sim.apply(&queue("q", &[ttl(2_000)])).unwrap_err().to_string();
    assert!(err.contains("x-message-ttl: wanted 2000, broker has 1000"), "{err}");
}

#[test]
fn an_expiry_cycle_back_into_the_same_queue_is_dropped_like_rabbitmq() {
    let mut sim = Simulator::new();
    sim.apply(&exchange("loop", ExchangeKind::Fanout)).unwrap();
    sim.apply(&queue("q", &[ttl(10), dlx("loop")])).unwrap();
    sim.apply(&bind("q", "loop", "")).unwrap();
    sim.execute(&publish("loop", "", None), SimMessage::new("m", FieldTable::new())).unwrap();
    run(&mut sim);
    assert!(sim.lost()[0].reason.contains("dead-letter cycle"), "{}", sim.lost()[0].reason);
}

#[test]
fn headers_exchange_routes_on_matching_headers() {
    let mut sim = Simulator::new();
    sim.declare_destination_queue("a");
    sim.apply(&exchange("h", ExchangeKind::Headers)).unwrap();
    let arguments = table(&[("x-match", FieldValue::Text("all".into())), ("to", FieldValue::Text("a".into()))]);
    sim.apply(&Command::Amqp(AmqpCommand::BindQueue { queue: "a".into(), exchange: "h".into(), routing_key: String::new(), arguments })).unwrap();
    let to_a = SimMessage::new("m", table(&[("to", FieldValue::Text("a".into()))]));
    sim.execute(&publish("h", "anything", None), to_a).unwrap();
    assert_eq!(sim.arrivals()[0].message.routing_key, "anything");
    let to_b = SimMessage::new("m", table(&[("to", FieldValue::Text("b".into()))]));
    assert!(sim.execute(&publish("h", "anything", None), to_b).is_err());
}

#[test]
fn sqs_fifo_uses_the_queue_delay_and_deduplicates_within_five_minutes() {
    let mut sim = Simulator::new();
    let attributes = [("FifoQueue", "true"), ("DelaySeconds", "900")].map(|(k, v)| (k.to_string(), v.to_string())).into();
    sim.apply(&Command::Sqs(SqsCommand::EnsureQueue { name: "d.fifo".into(), attributes, pumped: true })).unwrap();
    let send = Command::Sqs(SqsCommand::Send {
        queue: "d.fifo".into(),
        delay_seconds: 0,
        attributes: BTreeMap::new(),
        group_id: Some("g".into()),
        dedup_id: Some("m-0".into()),
    });
    let message = SimMessage::new("m", FieldTable::new());
    sim.execute(&send, message.clone()).unwrap();
    sim.execute(&send, message).unwrap();
    let Step::Due(due) = sim.step() else { panic!("expected a due message") };
    assert_eq!((due.sent_timestamp_ms, due.first_receive_timestamp_ms), (0, 900_000));
    assert!(matches!(sim.step(), Step::Idle), "the duplicate was dropped");
}

#[test]
fn sqs_destination_receives_when_visible() {
    let mut sim = Simulator::new();
    sim.declare_destination_sqs_queue("orders");
    let send = Command::Sqs(SqsCommand::Send { queue: "orders".into(), delay_seconds: 125, attributes: BTreeMap::new(), group_id: None, dedup_id: None });
    sim.execute(&send, SimMessage::new("m", FieldTable::new())).unwrap();
    run(&mut sim);
    assert_eq!(sim.arrivals()[0].at_ms, 125_000);
    let missing = Command::Sqs(SqsCommand::Send { queue: "nope".into(), delay_seconds: 0, attributes: BTreeMap::new(), group_id: None, dedup_id: None });
    assert!(matches!(sim.execute(&missing, SimMessage::new("m", FieldTable::new())), Err(SimError::NotFound(_))));
}

fn text(key: &'static str, value: &str) -> (&'static str, FieldValue) {
    (key, FieldValue::Text(value.into()))
}

fn at_least_once() -> [(&'static str, FieldValue); 3] {
    [text("x-queue-type", "quorum"), text("x-dead-letter-strategy", "at-least-once"), text("x-overflow", "reject-publish")]
}

/// A wait queue dead-lettering to a delivery exchange that parks what it cannot route.
fn parking_topology(sim: &mut Simulator, wait_arguments: &[(&str, FieldValue)]) {
    sim.declare_destination_queue("dest");
    let delivery = Command::Amqp(AmqpCommand::DeclareExchange {
        name: "delivery".into(),
        kind: ExchangeKind::Direct,
        durable: true,
        arguments: table(&[text("alternate-exchange", "parking")]),
    });
    for c in [exchange("parking", ExchangeKind::Fanout), queue("parked", &[]), bind("parked", "parking", ""), delivery, bind("dest", "delivery", "dest")] {
        sim.apply(&c).unwrap();
    }
    let mut arguments = wait_arguments.to_vec();
    arguments.extend([ttl(5_000), dlx("delivery"), text("x-dead-letter-routing-key", "dest")]);
    sim.apply(&queue("wait", &arguments)).unwrap();
}

#[test]
fn a_destination_deleted_while_its_message_waits_parks_the_message() {
    let mut sim = Simulator::new();
    parking_topology(&mut sim, &at_least_once());
    sim.execute(&publish("", "wait", None), SimMessage::new("gone", FieldTable::new())).unwrap();
    sim.advance_to(1_000);
    sim.delete_queue("dest").unwrap();
    run(&mut sim);
    assert!(sim.arrivals().is_empty());
    assert!(sim.lost().is_empty(), "{:?}", sim.lost().iter().map(|l| &l.reason).collect::<Vec<_>>());
    assert_eq!(sim.queue_holding("gone"), Some("parked"));
}

#[test]
fn an_alternate_exchange_catches_only_what_its_exchange_cannot_route() {
    let mut sim = Simulator::new();
    parking_topology(&mut sim, &at_least_once());
    sim.execute(&publish("delivery", "dest", None), SimMessage::new("routed", FieldTable::new())).unwrap();
    sim.execute(&publish("delivery", "elsewhere", None), SimMessage::new("parked", FieldTable::new())).unwrap();
    assert_eq!(sim.arrivals().len(), 1);
    assert_eq!(sim.arrivals()[0].message.id, "routed");
    assert_eq!(sim.queue_holding("parked"), Some("parked"));
    assert!(sim.lost().is_empty());
}

#[test]
fn at_least_once_holds_an_unroutable_dead_letter_until_a_route_appears() {
    let mut sim = Simulator::new();
    sim.declare_destination_queue("dest");
    sim.apply(&exchange("delivery", ExchangeKind::Direct)).unwrap();
    let mut arguments = at_least_once().to_vec();
    arguments.extend([ttl(5_000), dlx("delivery"), text("x-dead-letter-routing-key", "dest")]);
    sim.apply(&queue("wait", &arguments)).unwrap();
    sim.execute(&publish("", "wait", None), SimMessage::new("m", FieldTable::new())).unwrap();
    run(&mut sim);
    assert!(sim.lost().is_empty(), "at least once keeps it");
    assert_eq!(sim.queue_holding("m"), Some("wait"));
    sim.advance_to(10_000);
    sim.apply(&bind("dest", "delivery", "dest")).unwrap();
    run(&mut sim);
    assert_eq!(sim.arrivals()[0].at_ms, 10_000 + amqp::HELD_RETRY_MS, "retried one interval after the binding");
}

#[test]
fn classic_dead_lettering_drops_what_routes_nowhere() {
    let mut sim = Simulator::new();
    sim.declare_destination_queue("dest");
    sim.apply(&exchange("delivery", ExchangeKind::Direct)).unwrap();
    sim.apply(&queue("wait", &[text("x-queue-type", "classic"), ttl(5_000), dlx("delivery")])).unwrap();
    sim.execute(&publish("", "wait", None), SimMessage::new("m", FieldTable::new())).unwrap();
    run(&mut sim);
    assert!(sim.lost()[0].reason.contains("routes it nowhere"), "{}", sim.lost()[0].reason);
    // A quorum queue without reject-publish falls back to at most once too.
    let mut sim = Simulator::new();
    sim.apply(&exchange("delivery", ExchangeKind::Direct)).unwrap();
    let drop_head = [text("x-queue-type", "quorum"), text("x-dead-letter-strategy", "at-least-once"), ttl(5_000), dlx("delivery")];
    sim.apply(&queue("wait", &drop_head)).unwrap();
    sim.execute(&publish("", "wait", None), SimMessage::new("m", FieldTable::new())).unwrap();
    run(&mut sim);
    assert_eq!(sim.lost().len(), 1);
}

/// RabbitMQ routes on the BCC keys as on the routing key, keeps them when it
/// dead-letters, and strips them before a consumer; an exchange none of whose
/// bindings match passes the message to its alternate.
#[test]
fn bcc_keys_route_survive_dead_lettering_and_never_reach_the_consumer() {
    let mut sim = Simulator::new();
    sim.declare_destination_queue("dest");
    for command in [
        exchange("delivery", ExchangeKind::Direct),
        Command::Amqp(AmqpCommand::DeclareExchange {
            name: "low".into(),
            kind: ExchangeKind::Direct,
            durable: true,
            arguments: table(&[text("alternate-exchange", "delivery")]),
        }),
        Command::Amqp(AmqpCommand::DeclareExchange {
            name: "high".into(),
            kind: ExchangeKind::Direct,
            durable: true,
            arguments: table(&[text("alternate-exchange", "low")]),
        }),
        queue("high", &[ttl(200), dlx("low")]),
        queue("low", &[ttl(100), dlx("delivery")]),
        bind("high", "high", "bit:1"),
        bind("low", "low", "bit:0"),
        bind("dest", "delivery", "to:dest"),
    ] {
        sim.apply(&command).unwrap();
    }
    let send = |bcc: &[&str]| {
        Command::Amqp(AmqpCommand::Publish {
            exchange: "high".into(),
            routing_key: "bit:1".into(),
            bcc: bcc.iter().map(|k| k.to_string()).collect(),
            headers: FieldTable::new(),
            expiration_ms: None,
            mandatory: true,
        })
    };
    sim.execute(&send(&["bit:0", "to:dest"]), SimMessage::new("both", FieldTable::new())).unwrap();
    sim.execute(&send(&["to:dest"]), SimMessage::new("high-only", FieldTable::new())).unwrap();
    run(&mut sim);
    let arrivals: Vec<(String, u64, usize)> = sim.arrivals().iter().map(|a| (a.message.id.clone(), a.at_ms, a.message.bcc.len())).collect();
    assert_eq!(arrivals, vec![("high-only".to_string(), 200, 0), ("both".to_string(), 300, 0)]);
    assert!(sim.lost().is_empty(), "{:?}", sim.lost().iter().map(|l| &l.reason).collect::<Vec<_>>());
}

fn stream(name: &str, subjects: &[&str], held: bool) -> Command {
    Command::Nats(NatsCommand::EnsureStream { name: name.into(), subjects: subjects.iter().map(|s| s.to_string()).collect(), held })
}

fn nats_publish(subject: &str) -> Command {
    Command::Nats(NatsCommand::Publish { subject: subject.into(), headers: BTreeMap::new() })
}

#[test]
fn nats_wildcards_follow_subject_rules() {
    assert!(subject_matches("orders.*", "orders.created"));
    assert!(!subject_matches("orders.*", "orders.created.eu"));
    assert!(subject_matches("orders.>", "orders.created.eu"));
    assert!(!subject_matches("orders.>", "orders"));
    assert!(subject_matches("hourglass.hold", "hourglass.hold"));
    assert!(!subject_matches("hourglass.hold", "hourglass.hold.x"));
}

#[test]
fn a_held_stream_delivers_again_after_the_wait_the_host_declined_with() {
    let mut sim = Simulator::new();
    sim.declare_destination_subject("orders.created");
    sim.apply(&stream("hold", &["hold.>"], true)).unwrap();
    sim.execute(&nats_publish("hold.m"), SimMessage::new("m", FieldTable::new())).unwrap();
    let Step::Held(held) = sim.step() else { panic!("delivered to the host at once") };
    assert_eq!((held.stream.as_str(), held.subject.as_str(), held.deliveries, sim.now_ms()), ("hold", "hold.m", 1, 0));
    sim.redeliver(held, 5_000);
    assert_eq!(sim.waiting(), [("hold".to_string(), "m".to_string())]);
    let Step::Held(held) = sim.step() else { panic!("delivered again") };
    assert_eq!((held.deliveries, sim.now_ms()), (2, 5_000));
    sim.execute(&nats_publish("orders.created"), held.message).unwrap();
    assert_eq!((sim.arrivals()[0].queue.as_str(), sim.arrivals()[0].at_ms), ("orders.created", 5_000));
    assert!(matches!(sim.step(), Step::Idle));
}

#[test]
fn a_publish_no_stream_captures_is_refused_and_streams_may_not_overlap() {
    let mut sim = Simulator::new();
    sim.apply(&stream("orders", &["orders.*"], false)).unwrap();
    let refused = sim.execute(&nats_publish("payments.created"), SimMessage::new("m", FieldTable::new()));
    assert!(matches!(refused, Err(SimError::NotFound(_))), "{refused:?}");
    assert!(matches!(sim.apply(&stream("created", &["orders.created"], false)), Err(SimError::PreconditionFailed(_))));
    // Captured by a stream nothing here consumes: kept there, and shown as waiting.
    sim.execute(&nats_publish("orders.created"), SimMessage::new("kept", FieldTable::new())).unwrap();
    assert_eq!(sim.waiting(), [("orders".to_string(), "kept".to_string())]);
}

#[test]
fn a_schedule_fires_onto_its_target_or_is_lost_naming_the_subject() {
    let mut sim = Simulator::new();
    sim.declare_destination_subject("orders.created");
    let schedule = |target: &str| Command::Nats(NatsCommand::Schedule { target: target.into(), after_ms: 90_000, headers: BTreeMap::new() });
    sim.execute(&schedule("orders.created"), SimMessage::new("on-time", FieldTable::new())).unwrap();
    sim.execute(&schedule("orders.gone"), SimMessage::new("lost", FieldTable::new())).unwrap();
    run(&mut sim);
    assert_eq!((sim.arrivals()[0].message.id.as_str(), sim.arrivals()[0].at_ms), ("on-time", 90_000));
    assert_eq!(sim.lost().len(), 1);
    assert!(sim.lost()[0].reason.contains("\"orders.gone\""), "{}", sim.lost()[0].reason);
}
