//! Lateness you can graph: every `[service.canary] every`, the host sends one
//! small probe through each strategy to a queue of its own, and consumes that
//! queue (with the AMQP consumer on RabbitMQ, the SQS one on SQS). Arrival minus the probe's due time (sent plus delay) is observed in
//! `hourglass_delivery_lateness_seconds{strategy}`; a probe that arrives early
//! is counted in `hourglass_delivery_early_total{strategy}` and logged, since
//! early is the one thing a delay must never be.
//!
//! The probe's body is the strategy's name, so any host may consume any
//! host's probes (several hosts share the queue as competing consumers, and a
//! restarted host reads the probes its predecessor sent). A strategy that
//! cannot plan the probe's delay (a redelivery-only strategy, say) is left out.
//!
//! Times are on the host's [`Clock`](crate::clock::Clock): the broker's clock
//! as read, on the early side. A probe carries when it was sent
//! (`canary-sent`) and which clock read that (`canary-clock`): its own host
//! compares exactly; another host counts it early only when it is early for
//! certain by the broker's clock (hosts' readings differ by up to their
//! errors, `hourglass_clock_offset_error_seconds`).

use std::sync::Arc;
use std::time::Duration;

use crate::command::{Command, FieldValue};
use crate::config::CanaryConfig;
use crate::executor::Broker;
use crate::headers::{DELAY_HEADER, DUE_AT_HEADER};
use crate::message::{Delivery, Handler, Outcome, Settled};
use crate::planner::PlannerError;
use crate::scheduler::{OWN_QUEUE_HINT, ScheduleError, ScheduleRequest, Scheduler};

/// Consumes the canary queue and times each probe.
pub struct Canary {
    config: CanaryConfig,
    scheduler: Arc<Scheduler<Broker>>,
}

impl Canary {
    pub fn new(config: CanaryConfig, scheduler: Arc<Scheduler<Broker>>) -> Arc<Self> {
        Arc::new(Canary { config, scheduler })
    }

    /// Sends one probe through every strategy that can plan its delay, now
    /// and every `every`, until `stop` turns true. A strategy whose planner
    /// refuses the delay is left out; any other failure is logged and tried
    /// again next time: the canary never holds anything up.
    pub(crate) async fn send_probes(scheduler: Arc<Scheduler<Broker>>, config: CanaryConfig, mut stop: tokio::sync::watch::Receiver<bool>) {
        let every = Duration::from_millis(config.every.ms());
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !*stop.borrow() {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = stop.wait_for(|stopping| *stopping) => return,
            }
            // A send may wait on a broker that does not answer; stop cuts it short (a probe is only the host's own).
            tokio::select! {
                () = send_each(&scheduler, &config) => {}
                _ = stop.wait_for(|stopping| *stopping) => return,
            }
        }
    }
}

/// Names the clock (the host) that sent a probe.
const CLOCK_HEADER: &str = "canary-clock";
/// When the probe was sent, as [`Clock::earliest_ms`](crate::clock::Clock::earliest_ms) of its host read it.
const SENT_HEADER: &str = "canary-sent";

/// One probe through every strategy that can plan its delay.
async fn send_each(scheduler: &Scheduler<Broker>, config: &CanaryConfig) {
    for strategy in scheduler.strategy_names() {
        let request = ScheduleRequest {
            destination: config.queue.clone(),
            delay_ms: config.delay.ms(),
            body: strategy.clone().into_bytes(),
            headers: [
                (CLOCK_HEADER.to_string(), FieldValue::Text(scheduler.clock().id().to_string())),
                (SENT_HEADER.to_string(), FieldValue::Int(scheduler.clock().earliest_ms() as i64)),
            ]
            .into(),
            strategy: Some(strategy.clone()),
            ..Default::default()
        };
        match scheduler.schedule(request).await {
            // A strategy that cannot plan the probe's delay (redelivery-only, say) has no canary.
            Ok(_) | Err(ScheduleError::Planner(PlannerError::Refused { .. })) => {}
            Err(err) => tracing::warn!(%strategy, error = %err, "canary probe not sent; trying again next period"),
        }
    }
}

impl Handler for Canary {
    type Note = ();

    fn queue(&self) -> &str {
        &self.config.queue
    }

    fn prefetch(&self) -> u16 {
        16
    }

    fn declarations(&self) -> Vec<Command> {
        let config = self.scheduler.config();
        vec![config.broker.own_queue_declaration(&self.config.queue, config.service.queue_type)]
    }

    fn declaration_hint(&self) -> Option<String> {
        Some(OWN_QUEUE_HINT.into())
    }

    async fn handle(&self, delivery: &Delivery) -> (Outcome, ()) {
        let clock = self.scheduler.clock();
        let strategy = String::from_utf8_lossy(&delivery.body).into_owned();
        let header = |name: &str| delivery.properties.headers.get(name).and_then(|v| v.as_whole_number()).and_then(|n| u64::try_from(n).ok());
        let own = delivery.properties.headers.get(CLOCK_HEADER).and_then(|v| v.as_text()).is_some_and(|id| id == clock.id());
        // Due when it was sent plus its delay, both as the sender wrote them. Its own
        // host compares on the clock the send was read on, which runs without jumps
        // (exact to its slew, 1 % of the delay). Another host's reading of the broker's
        // clock may be closer than this one's (both err to the early side, by up to their
        // errors): it counts a probe early only when it is early for certain, by the
        // latest the broker's clock can read. A probe without them (from an older host)
        // has its hourglass-due-at compared with this host's clock, as before.
        let (due_at, now, latest) = match (header(SENT_HEADER), header(DELAY_HEADER)) {
            (Some(sent), Some(delay)) => {
                let now = clock.earliest_ms();
                (Some(sent + delay), now, if own { now } else { clock.latest_ms() })
            }
            _ => {
                let now = clock.host_now_ms();
                (header(DUE_AT_HEADER), now, now)
            }
        };
        match due_at {
            Some(due) if latest < due => {
                tracing::error!(%strategy, early_ms = due - latest, "canary probe arrived EARLY");
                self.scheduler.metrics().delivered_early(&strategy);
            }
            Some(due) => self.scheduler.metrics().observe_lateness(&strategy, Duration::from_millis(now.saturating_sub(due))),
            None => tracing::warn!(queue = %self.config.queue, "a message without hourglass-due-at on the canary queue; dropped"),
        }
        (Outcome::Ack, ())
    }

    /// A probe is the host's own: one it cannot read is dropped.
    fn poisoned(&self, _delivery: &Delivery, _reason: &str) -> Outcome {
        Outcome::Ack
    }

    fn settled(&self, _note: Option<()>, _outcome: &Outcome, _settled: &Settled) {}
}
