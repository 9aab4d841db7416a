//! Scheduling: one delayed message from request to confirmed broker publish.
//!
//! The first message of a strategy declares its topology; the first message to
//! a destination checks the destination exists and applies its setup. Both are
//! remembered, so later messages cost one plan and one publish.
//!
//! Everything is `&self`: planning checks an instance out of the strategy's
//! own pool (a call is microseconds; calls to different strategies, and to one
//! strategy from several tasks, run in parallel, with no lock across
//! strategies), the publish and its confirm take none, so concurrent callers
//! keep a window of confirms outstanding. The configured strategies
//! form a *generation*; [`Scheduler::reload`] swaps in a new one while
//! messages planned with the old one finish as they were planned.

use std::collections::BTreeMap;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Instant;

use thiserror::Error;
use tokio::sync::mpsc;

use crate::clock::Clock;
use crate::command::{Command, FieldTable, FieldValue};
use crate::config::{Config, UnknownStrategy};
use crate::executor::{Envelope, Executor, ExecutorError};
use crate::headers::{DELAY_HEADER, DUE_AT_HEADER, EXCHANGE_HEADER, ID_HEADER, ROUTING_KEY_HEADER, TARGET_HEADER, is_reserved, is_routing_header};
use crate::message::Delivery;
use crate::message::Properties;
use crate::metrics::Metrics;
use crate::planner::{LoadedPlanner, Plan, PlanRequest, PlannerError, RedeliveryDecision};
pub mod strategies;
pub mod validate;

use strategies::Strategies;

#[derive(Debug, Error)]
pub enum ScheduleError {
    #[error("{0}")]
    BadRequest(String),
    /// A request named a strategy the config does not define (the caller's mistake).
    #[error(transparent)]
    UnknownStrategy(#[from] UnknownStrategy),
    /// The request itself is wrong (checked before the broker): which field, and why.
    #[error("{}: {}", .0.field, .0.reason)]
    Invalid(validate::Invalid),
    /// The planner's answer cannot be carried out as asked (its fault, not the request's).
    #[error("{0}")]
    Unplannable(String),
    #[error(transparent)]
    Planner(#[from] PlannerError),
    #[error(transparent)]
    Broker(#[from] ExecutorError),
}

/// A message to deliver later.
#[derive(Clone, Debug, Default)]
pub struct ScheduleRequest {
    /// The destination queue; empty when the message is due to [`Self::exchange`].
    pub destination: String,
    /// Deliver through this exchange (RabbitMQ) with [`Self::routing_key`]
    /// instead of to one queue: when due, the strategy's release queue
    /// publishes it there, and the exchange's bindings route it.
    pub exchange: Option<String>,
    pub delay_ms: u64,
    /// Deliver at this Unix ms instead of after `delay_ms`: the delay is what
    /// is left of it when the request is planned (none once it has passed).
    pub deliver_at_ms: Option<u64>,
    pub body: Vec<u8>,
    pub headers: FieldTable,
    /// The producer's properties, carried untouched (their own headers included, of any type).
    pub properties: Properties,
    /// Overrides the destination's strategy.
    pub strategy: Option<String>,
    /// The routing key the message arrives with, for strategies that can keep
    /// one (default: the destination); with [`Self::exchange`], the key it is
    /// published to that exchange with (default: empty).
    pub routing_key: Option<String>,
    /// Send the properties exactly as given: no message id is stamped on a message without one.
    pub as_is: bool,
    /// Keep this id instead of a new one (a rescheduled message going round again).
    pub id: Option<String>,
}

impl ScheduleRequest {
    /// The queue or exchange the message is due to: what picks its strategy and labels its metrics.
    pub fn target(&self) -> &str {
        self.exchange.as_deref().unwrap_or(&self.destination)
    }

    /// The request that sends a message hourglass delivered (from a release,
    /// parking or delay queue) round `strategy` again, due at `due_at_ms`: to
    /// the queue or exchange its headers name, under the id it was scheduled
    /// with (a cancellable strategy's), body and properties kept. hourglass's
    /// headers are written afresh; the broker's death records (a kept `x-death`
    /// can get it dropped as a dead-letter cycle) and CC/BCC are left behind.
    pub fn again(delivery: &Delivery, strategy: &str, due_at_ms: u64) -> Result<ScheduleRequest, &'static str> {
        let text = |name: &str| delivery.properties.headers.get(name).and_then(|v| v.as_text()).filter(|t| !t.is_empty());
        // Due to an exchange, its target is the release queue that publishes it there.
        let exchange = text(EXCHANGE_HEADER);
        let destination = match exchange {
            Some(_) => String::new(),
            None => text(TARGET_HEADER).ok_or("no hourglass-target header")?,
        };
        let routing_key = exchange.as_ref().map(|_| text(ROUTING_KEY_HEADER).unwrap_or_default());
        let mut properties = delivery.properties.clone();
        properties.headers.retain(|name, _| !is_reserved(name) && !validate::is_death_record(name) && !is_routing_header(name));
        Ok(ScheduleRequest {
            destination,
            exchange,
            routing_key,
            deliver_at_ms: Some(due_at_ms),
            body: delivery.body.clone(),
            properties,
            strategy: Some(strategy.to_string()),
            as_is: true,
            id: text(ID_HEADER),
            ..Default::default()
        })
    }
}

/// What the broker confirmed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scheduled {
    pub id: String,
    pub strategy: String,
    /// Unix ms at which the message is due, on the broker's clock as this
    /// host reads it ([`Clock`]): for a `deliver_at`, the time asked (or
    /// later: its delay is counted from the earliest the broker's clock can
    /// read); for a delay, publish time plus the delay (the publish time on
    /// this host's clock unless the readings fault it, see [`Clock::now_ms`]).
    pub due_at_ms: u64,
    /// The delay the strategy gives, after its rounding.
    pub delivers_after_ms: u64,
}

/// Where a message is due: one queue, or an exchange whose bindings route it.
#[derive(Clone, Copy, Debug)]
enum Target<'a> {
    Queue(&'a str),
    Exchange(&'a str),
}

impl Target<'_> {
    /// Its name in the sets of prepared and missing destinations. An
    /// exchange's carries a NUL, which no queue name a client declares has.
    fn key(&self) -> String {
        match self {
            Target::Queue(queue) => queue.to_string(),
            Target::Exchange(exchange) => format!("\0exchange {exchange}"),
        }
    }
}

/// A queue a pump must drain: it appeared in a destination's setup.
#[derive(Clone, Debug)]
pub(crate) struct PumpedQueue {
    pub strategy: String,
    pub queue: String,
    /// The config whose planner the pump should load.
    pub config: Arc<Config>,
}

/// What to do when one of hourglass's own queues exists with another type.
pub(crate) const OWN_QUEUE_HINT: &str = "a queue declared before as classic needs service.queue_type = \"classic\"";

/// The queues and exchanges hourglass itself uses: the service's own queues,
/// the release queues and every object of every strategy's static topology.
fn reserved_names(config: &Config, strategies: &mut Strategies, names: &[String]) -> HashSet<String> {
    let ingress = &config.service.ingress;
    let input = config.service.redelivery_input();
    let mut reserved: HashSet<String> = [ingress.queue.clone(), ingress.invalid_queue.clone(), input.to_string(), format!("{input}.unknown")].into();
    reserved.insert(config.service.cancel.log().to_string());
    // Where the broker keeps cancellations, and each cancellable strategy's release queue, as the broker names them.
    if config.strategies.values().any(|s| s.cancellable) {
        reserved.insert(config.broker.cancellation_store(&config.service.cancel));
        reserved.extend(config.strategies.values().filter(|s| s.cancellable).map(|s| config.release_queue(&s.name)));
    }
    reserved.extend(config.strategies.values().map(|s| config.service.cancel.release_queue(&s.name)));
    for name in names {
        // A planner that cannot say its topology fails its own requests later, with its own error.
        let Some(commands) = strategies.get_mut(name).ok().and_then(|planner| planner.topology().ok()) else { continue };
        for command in commands {
            reserved.extend(command.held_names().into_iter().map(str::to_string));
        }
    }
    reserved.remove("");
    reserved
}

/// One loaded config: its planners and what has been declared for them.
struct Generation {
    config: Arc<Config>,
    /// Each strategy's planner guards its own pool of instances.
    strategies: Strategies,
    names: Vec<String>,
    /// hourglass's own queues and exchanges: never destinations.
    reserved: HashSet<String>,
    /// Strategies whose topology is declared, destinations found missing.
    /// Async lock: preparation talks to the broker, and a second caller must
    /// wait for the first instead of publishing into half-declared topology.
    prepared: tokio::sync::Mutex<Prepared>,
    /// (strategy, destination) pairs set up, and the reconnect count they
    /// belong to. Written under `prepared`, read without it: a request to a
    /// destination already set up must not queue behind someone else's slow
    /// preparation (a flood of requests to queues that do not exist, each
    /// checked on the broker).
    ready: RwLock<(u64, HashSet<(String, String)>)>,
}

/// Missing destinations remembered at once (a flood of distinct names must not grow memory).
const MISSING_REMEMBERED: usize = 1_024;
/// How long a remembered refusal can still answer a waiting request.
const MISSING_USEFUL_FOR: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Default)]
struct Prepared {
    topology: HashSet<String>,
    /// Destinations the broker said do not exist: when that check began, and its answer.
    missing: HashMap<String, (Instant, String)>,
    /// The executor's reconnect count when these were declared.
    reconnects: u64,
}

impl Generation {
    fn new(config: Config, mut strategies: Strategies) -> Generation {
        let names: Vec<String> = strategies.names().map(str::to_string).collect();
        let reserved = reserved_names(&config, &mut strategies, &names);
        Generation { config: Arc::new(config), strategies, names, reserved, prepared: Default::default(), ready: Default::default() }
    }

    /// One call into `strategy`'s planner (on an instance of its pool).
    fn call<R>(&self, strategy: &str, f: impl FnOnce(&LoadedPlanner) -> Result<R, PlannerError>) -> Result<R, ScheduleError> {
        Ok(f(self.strategies.get(strategy)?)?)
    }

    fn strategy_for(&self, destination: &str) -> String {
        self.config.strategy_for(destination).to_string()
    }

    fn is_cancellable(&self, strategy: &str) -> bool {
        self.config.strategies.get(strategy).is_some_and(|s| s.cancellable)
    }

    /// Whether the strategy's messages end in its release queue, which asks the
    /// cancellation log before forwarding (on a broker whose hold asks it itself, never).
    fn releases_to_cancel(&self, strategy: &str) -> bool {
        self.is_cancellable(strategy) && self.config.broker.capabilities().release_queue
    }

    fn check_strategy(&self, strategy: &str) -> Result<(), ScheduleError> {
        if self.names.iter().any(|n| n == strategy) {
            Ok(())
        } else {
            Err(ScheduleError::UnknownStrategy(UnknownStrategy { name: strategy.to_string(), configured: self.names.clone() }))
        }
    }
}

pub struct Scheduler<E> {
    executor: E,
    current: RwLock<Arc<Generation>>,
    metrics: Arc<Metrics>,
    pumped_queues: OnceLock<mpsc::UnboundedSender<PumpedQueue>>,
    /// Whether this scheduler declares broker objects, or trusts they exist.
    declaring: bool,
    /// What due times are counted on: the broker's clock once it was read.
    clock: Arc<Clock>,
}

impl<E: Executor> Scheduler<E> {
    pub fn new(config: &Config, strategies: Strategies, executor: E) -> Self {
        let clock = Clock::system();
        executor.count_on(clock.clone());
        Scheduler {
            executor,
            current: RwLock::new(Arc::new(Generation::new(config.clone(), strategies))),
            metrics: Arc::default(),
            pumped_queues: OnceLock::new(),
            declaring: true,
            clock,
        }
    }

    /// Counts due times on `clock` (default: the system's, until readings of the broker's clock arrive).
    pub(crate) fn set_clock(&mut self, clock: Arc<Clock>) {
        self.metrics.watch_clock(clock.clone());
        self.executor.count_on(clock.clone());
        self.clock = clock;
    }

    /// The clock due times are counted on: every `hourglass-due-at` this host
    /// writes or compares, every `deliver_at` it turns into a delay.
    pub fn clock(&self) -> &Arc<Clock> {
        &self.clock
    }

    /// `false`: never declare topology or destination setup (the operator
    /// manages them); destinations are still checked to exist.
    pub(crate) fn set_declaring(&mut self, declaring: bool) {
        self.declaring = declaring;
    }

    /// Whether this scheduler declares what it uses (`service.topology = "apply"`).
    pub(crate) fn declaring(&self) -> bool {
        self.declaring
    }

    pub fn executor(&self) -> &E {
        &self.executor
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Every pumped queue a destination setup declares from now on is sent here.
    pub(crate) fn report_pumped_queues(&self, to: mpsc::UnboundedSender<PumpedQueue>) {
        let _ = self.pumped_queues.set(to);
    }

    fn generation(&self) -> Arc<Generation> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The config of the current generation.
    pub fn config(&self) -> Arc<Config> {
        self.generation().config.clone()
    }

    /// Swaps in a new config and its strategies; returns the old config.
    /// With `apply_default_topology`, the new default strategy's topology is
    /// declared first, and a broker refusal leaves the old config in place.
    /// Messages already planned finish with the old planners.
    pub async fn reload(&self, config: Config, strategies: Strategies, apply_default_topology: bool) -> Result<Arc<Config>, ScheduleError> {
        let next = Arc::new(Generation::new(config, strategies));
        if apply_default_topology {
            let default = next.config.default_strategy.clone();
            let mut prepared = self.prepared(&next).await;
            self.apply_topology_in(&next, &mut prepared, &default).await?;
        }
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        Ok(std::mem::replace(&mut *current, next).config.clone())
    }

    /// A strategy's static topology, without applying it.
    pub fn topology_of(&self, strategy: &str) -> Result<Vec<Command>, ScheduleError> {
        self.call_checked(strategy, |planner| planner.topology())
    }

    /// One call into a configured strategy's planner; an unknown name is a bad request.
    fn call_checked<R>(&self, strategy: &str, f: impl FnOnce(&LoadedPlanner) -> Result<R, PlannerError>) -> Result<R, ScheduleError> {
        let generation = self.generation();
        generation.check_strategy(strategy)?;
        generation.call(strategy, f)
    }

    /// What a strategy declares: its topology, plus one sample plan for
    /// strategies that declare queues per message (hold-queues).
    fn declarations_of(&self, strategy: &str) -> Vec<Command> {
        self.call_checked(strategy, |planner| planner.declarations()).unwrap_or_default()
    }

    /// Every strategy's declarations (see [`LoadedPlanner::declarations`])
    /// and release queue, in one list: what a broker's start-up checks weigh
    /// (RabbitMQ probes the mechanisms they use and their quorum queues).
    pub(crate) fn all_declarations(&self) -> Vec<Command> {
        let config = self.config();
        self.strategy_names()
            .into_iter()
            .flat_map(|strategy| {
                let release = config.broker.release_queue_declaration(&config.release_queue(&strategy));
                self.declarations_of(&strategy).into_iter().chain([release])
            })
            .collect()
    }

    /// Per strategy, the queues it declares that dead-letter at most once
    /// (classic): a broker crash can lose messages waiting there.
    pub fn at_most_once_queues(&self) -> BTreeMap<String, Vec<String>> {
        self.queues_per_strategy(crate::command::at_most_once_dead_lettering)
    }

    /// Whether `strategy`'s topology is on the broker now (declared since the last reconnect).
    pub(crate) async fn topology_applied(&self, strategy: &str) -> bool {
        let generation = self.generation();
        let prepared = generation.prepared.lock().await;
        prepared.reconnects == self.executor.reconnects() && prepared.topology.contains(strategy)
    }

    /// Per strategy, the queues of its static topology where messages wait,
    /// with their TTL; strategies with none (SQS ones) are left out.
    pub fn waiting_queues(&self) -> BTreeMap<String, Vec<(String, Option<u64>)>> {
        self.strategy_names()
            .into_iter()
            .filter_map(|strategy| {
                let queues = crate::command::waiting_queues(&self.topology_of(&strategy).unwrap_or_default());
                (!queues.is_empty()).then_some((strategy, queues))
            })
            .collect()
    }

    /// Per strategy that declares waiting queues per message (hold-queues),
    /// the exchanges those queues dead-letter into: a broker listing finds
    /// them by it. Strategies with static queues only are left out.
    pub(crate) fn per_message_queue_targets(&self) -> BTreeMap<String, Vec<String>> {
        self.strategy_names()
            .into_iter()
            .filter_map(|strategy| {
                let targets = crate::command::per_message_queue_targets(&self.topology_of(&strategy).unwrap_or_default(), &self.declarations_of(&strategy));
                (!targets.is_empty()).then_some((strategy, targets))
            })
            .collect()
    }

    /// Per strategy, its parking queues (where messages whose destination vanished wait).
    pub fn parking_queues(&self) -> BTreeMap<String, Vec<String>> {
        self.queues_per_strategy(crate::command::parking_queues)
    }

    /// `pick` applied to each strategy's declarations; strategies it finds nothing in are left out.
    fn queues_per_strategy(&self, pick: fn(&[Command]) -> Vec<String>) -> BTreeMap<String, Vec<String>> {
        self.strategy_names()
            .into_iter()
            .filter_map(|strategy| {
                let queues = pick(&self.declarations_of(&strategy));
                (!queues.is_empty()).then_some((strategy, queues))
            })
            .collect()
    }

    pub fn default_strategy(&self) -> String {
        self.generation().config.default_strategy.clone()
    }

    pub(crate) fn strategy_names(&self) -> Vec<String> {
        self.generation().names.clone()
    }

    pub fn strategy_for(&self, destination: &str) -> String {
        self.generation().strategy_for(destination)
    }

    /// The plan a message would get, without sending anything.
    pub(crate) fn plan_only(&self, strategy: &str, request: &PlanRequest) -> Result<Plan, ScheduleError> {
        self.call_checked(strategy, |planner| planner.plan(request))
    }

    /// Asks `strategy`'s planner what to do after delivery `attempt` of a message on `queue` failed.
    pub fn decide_redelivery(&self, strategy: &str, queue: &str, attempt: u32, seed: u64, reason: Option<&str>) -> Result<RedeliveryDecision, ScheduleError> {
        self.call_checked(strategy, |planner| planner.decide_redelivery(queue, attempt, seed, reason))
    }

    /// What `generation` has prepared, forgotten if the broker connection was
    /// lost since: the broker may have lost it too (restarted, queue deleted).
    async fn prepared<'g>(&self, generation: &'g Generation) -> tokio::sync::MutexGuard<'g, Prepared> {
        let mut prepared = generation.prepared.lock().await;
        let reconnects = self.executor.reconnects();
        if prepared.reconnects != reconnects {
            *prepared = Prepared { reconnects, ..Default::default() };
        }
        prepared
    }

    /// Whether `(strategy, destination)` is set up on the connection the executor has now.
    fn is_ready(&self, generation: &Generation, pair: &(String, String)) -> bool {
        let ready = generation.ready.read().unwrap_or_else(|p| p.into_inner());
        ready.0 == self.executor.reconnects() && ready.1.contains(pair)
    }

    /// Declares a strategy's static topology (idempotent on the broker).
    pub async fn apply_topology(&self, strategy: &str) -> Result<(), ScheduleError> {
        let generation = self.generation();
        let mut prepared = self.prepared(&generation).await;
        self.apply_topology_in(&generation, &mut prepared, strategy).await
    }

    async fn apply_topology_in(&self, generation: &Generation, prepared: &mut Prepared, strategy: &str) -> Result<(), ScheduleError> {
        generation.check_strategy(strategy)?;
        let commands = generation.call(strategy, |planner| planner.topology())?;
        if self.declaring {
            self.executor.apply(&commands).await?;
        }
        prepared.topology.insert(strategy.to_string());
        Ok(())
    }

    /// Checks the destination exists and applies its setup for `strategy`.
    pub async fn prepare_destination(&self, strategy: &str, destination: &str) -> Result<(), ScheduleError> {
        let generation = self.generation();
        let asked = Instant::now();
        let mut prepared = self.prepared(&generation).await;
        self.prepare_destination_in(&generation, &mut prepared, strategy, Target::Queue(destination), asked).await
    }

    /// Prepares `destination` for a request made at `asked`.
    async fn prepare_destination_in(
        &self,
        generation: &Generation,
        prepared: &mut Prepared,
        strategy: &str,
        target: Target<'_>,
        asked: Instant,
    ) -> Result<(), ScheduleError> {
        match target {
            Target::Queue(queue) => validate::check_destination(queue, &generation.reserved),
            Target::Exchange(exchange) => validate::check_exchange(exchange, &generation.reserved),
        }
        .map_err(ScheduleError::Invalid)?;
        let destination = &target.key();
        if !prepared.topology.contains(strategy) {
            self.apply_topology_in(generation, prepared, strategy).await?;
        }
        // A check that began after this request was made answers it as well as
        // its own would: a flood of requests to one missing queue, waiting here
        // on each other, costs the broker one check per wave instead of one each
        // (and keeps the lock valid requests need for no longer than that).
        if let Some((began, answer)) = prepared.missing.get(destination)
            && *began >= asked
        {
            return Err(ExecutorError::Refused(answer.clone()).into());
        }
        let began = Instant::now();
        let checked = match target {
            Target::Queue(queue) => self.executor.check_destination(queue).await,
            Target::Exchange(exchange) => self.executor.check_exchange(exchange).await,
        };
        match checked {
            Ok(()) => {
                prepared.missing.remove(destination);
            }
            Err(ExecutorError::Refused(answer)) => {
                if prepared.missing.len() >= MISSING_REMEMBERED {
                    // Only answers younger than the requests still waiting are of use.
                    prepared.missing.retain(|_, (began, _)| began.elapsed() < MISSING_USEFUL_FOR);
                    if prepared.missing.len() >= MISSING_REMEMBERED {
                        prepared.missing.clear();
                    }
                }
                prepared.missing.insert(destination.to_string(), (began, answer.clone()));
                return Err(ExecutorError::Refused(answer).into());
            }
            Err(err) => return Err(err.into()),
        }
        // A cancellable strategy delivers every message to its release queue, and
        // every strategy a message due to an exchange; the host forwards it from there.
        let released = generation.releases_to_cancel(strategy) || matches!(target, Target::Exchange(_));
        let ends_in = match target {
            Target::Queue(queue) if !released => queue.to_string(),
            _ => generation.config.release_queue(strategy),
        };
        let setup = generation.call(strategy, |planner| planner.destination_setup(&ends_in))?;
        if self.declaring {
            if released {
                let declaration = generation.config.broker.release_queue_declaration(&ends_in);
                self.executor.apply(&[declaration]).await?;
            }
            self.executor.apply(&setup).await?;
        }
        for command in &setup {
            let Some(name) = command.pumped_queue() else { continue };
            // Tagged before any message is accepted, so a host that dies right
            // after still leaves the queue where the next one will find it.
            if self.declaring {
                self.executor.mark_pumped(name, strategy).await?;
            }
            if let Some(report) = self.pumped_queues.get() {
                let _ = report.send(PumpedQueue { strategy: strategy.to_string(), queue: name.to_string(), config: generation.config.clone() });
            }
        }
        let mut ready = generation.ready.write().unwrap_or_else(|p| p.into_inner());
        if ready.0 != prepared.reconnects {
            *ready = (prepared.reconnects, HashSet::new());
        }
        ready.1.insert((strategy.to_string(), destination.to_string()));
        Ok(())
    }

    pub async fn schedule(&self, request: ScheduleRequest) -> Result<Scheduled, ScheduleError> {
        let (scheduled, commands, envelope) = self.plan(request).await?;
        self.send(scheduled, &commands, &envelope).await
    }

    async fn send(&self, scheduled: Scheduled, commands: &[Command], envelope: &Envelope) -> Result<Scheduled, ScheduleError> {
        let started = Instant::now();
        self.executor.send(commands, envelope).await?;
        self.metrics.observe_confirm(started.elapsed());
        Ok(scheduled)
    }

    /// Schedules many messages with up to `window` publishes awaiting their
    /// confirms at once. Results come back in request order; a failed message
    /// never hides behind a successful one.
    pub async fn schedule_many(&self, requests: Vec<ScheduleRequest>, window: usize) -> Vec<Result<Scheduled, ScheduleError>> {
        use futures_util::StreamExt;
        let mut planned = Vec::with_capacity(requests.len());
        for request in requests {
            planned.push(self.plan(request).await);
        }
        futures_util::stream::iter(planned)
            .map(|planned| async move {
                let (scheduled, commands, envelope) = planned?;
                self.send(scheduled, &commands, &envelope).await
            })
            .buffered(window.max(1))
            .collect()
            .await
    }

    /// Everything up to the publish: preparation on first use, the plan, the envelope.
    async fn plan(&self, mut request: ScheduleRequest) -> Result<(Scheduled, Vec<Command>, Envelope), ScheduleError> {
        let asked = Instant::now();
        let generation = self.generation();
        if let Some(at) = request.deliver_at_ms {
            // Counted from before the declares and the publish, so it can only come out later;
            // and from the earliest the broker's clock can read now (its TTLs do the waiting),
            // so a host clock that is ahead cannot make it early.
            request.delay_ms = at.saturating_sub(self.clock.earliest_ms());
        }
        validate::check(&mut request, &generation.reserved).map_err(ScheduleError::Invalid)?;
        let strategy = request.strategy.clone().unwrap_or_else(|| generation.strategy_for(request.target()));
        generation.check_strategy(&strategy)?;
        let id = request.id.take().unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let cancellable = generation.is_cancellable(&strategy);
        // Due to an exchange, a message ends in its strategy's release queue, which publishes it there.
        let released = generation.releases_to_cancel(&strategy) || request.exchange.is_some();
        if cancellable {
            let retention_ms = generation.config.service.cancel.retention_ms();
            if request.delay_ms > retention_ms {
                let reason =
                    format!("{} ms is longer than strategy {strategy:?} keeps cancellations (service.cancel.retention = {retention_ms} ms)", request.delay_ms);
                return Err(ScheduleError::Invalid(validate::Invalid { field: "delay", reason }));
            }
        }
        let release_queue = released.then(|| generation.config.release_queue(&strategy));
        let plan_request = PlanRequest {
            destination: release_queue.clone().unwrap_or_else(|| request.destination.clone()),
            delay_ms: request.delay_ms,
            message_id: id.clone(),
            // The release queue is reached by its own name; the host forwards to the destination by its name.
            routing_key: if released { None } else { request.routing_key.clone() },
        };
        let started = Instant::now();
        let plan = generation.call(&strategy, |planner| planner.plan(&plan_request))?;
        self.metrics.observe_planner_call(&strategy, started.elapsed());
        if !plan.commands.iter().any(Command::sends_the_message) {
            return Err(ScheduleError::Unplannable(format!("strategy {strategy:?} planned no publish for this message; nothing was sent")));
        }
        // Only a request that planned cleanly declares anything on the broker.
        let target = match &request.exchange {
            Some(exchange) => Target::Exchange(exchange),
            None => Target::Queue(&request.destination),
        };
        let pair = (strategy.clone(), target.key());
        if !self.is_ready(&generation, &pair) {
            // Boxed, as the broker's cold paths are: this runs once per destination, and inline
            // its declares would make every request's future (moved whole at each spawn) kilobytes larger.
            Box::pin(async {
                let mut prepared = self.prepared(&generation).await;
                // Someone may have set it up while this request waited for the lock.
                if !self.is_ready(&generation, &pair) {
                    self.prepare_destination_in(&generation, &mut prepared, &strategy, target, asked).await?;
                }
                Ok::<(), ScheduleError>(())
            })
            .await?;
        }
        // A deliver_at's due time is on the clock its delay was counted against
        // (so at or after the time asked); a delay's is its publish time as reported.
        let now = if request.deliver_at_ms.is_some() { self.clock.earliest_ms() } else { self.clock.now_ms() };
        let due_at_ms = now + request.delay_ms;
        let mut headers = request.headers;
        headers.insert(DELAY_HEADER.into(), FieldValue::Int(request.delay_ms as i64));
        headers.insert(DUE_AT_HEADER.into(), FieldValue::Int(due_at_ms as i64));
        // Where it is going travels with it: the release queue forwards by it, and `transfer` moves by it.
        // Due to an exchange, its target is the release queue that publishes it there.
        match &request.exchange {
            Some(exchange) => {
                headers.insert(TARGET_HEADER.into(), FieldValue::Text(release_queue.unwrap_or_default()));
                headers.insert(EXCHANGE_HEADER.into(), FieldValue::Text(exchange.clone()));
                headers.insert(ROUTING_KEY_HEADER.into(), FieldValue::Text(request.routing_key.clone().unwrap_or_default()));
            }
            None => _ = headers.insert(TARGET_HEADER.into(), FieldValue::Text(request.destination.clone())),
        }
        if cancellable {
            headers.insert(ID_HEADER.into(), FieldValue::Text(id.clone()));
        }
        let envelope = Envelope { id: id.clone(), body: request.body, headers, properties: request.properties, stamp_message_id: !request.as_is };
        let scheduled = Scheduled { id, strategy, due_at_ms, delivers_after_ms: plan.delivers_after_ms };
        Ok((scheduled, plan.commands, envelope))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::executor::testing::Accepting;

    fn two_strategies() -> Config {
        let text =
            "default_strategy = \"a\"\n[planners]\ncache = false\n[strategies.a]\nplanner = \"hold-queues\"\n[strategies.b]\nplanner = \"binary-levels\"\n";
        Config::parse(Path::new("delay.toml"), text.into()).unwrap()
    }

    /// With one lock over all planners (as before pools), holding strategy A's
    /// planner stopped every call in the process; now only A's own pool is
    /// touched, and it has more than one instance.
    #[test]
    fn while_an_instance_of_a_is_held_a_call_to_b_and_a_second_call_to_a_both_complete() {
        let config = two_strategies();
        let scheduler = Scheduler::new(&config, Strategies::load(&config).unwrap(), Accepting);
        let generation = scheduler.generation();
        let a = generation.strategies.get("a").unwrap();
        assert!(a.max_instances() >= 2, "{}", a.max_instances());
        let held = a.checkout().unwrap();

        let (done, finished) = std::sync::mpsc::channel();
        let results = std::thread::scope(|scope| {
            for (strategy, destination) in [("b", "to-b"), ("a", "to-a")] {
                let (done, scheduler) = (done.clone(), &scheduler);
                scope.spawn(move || {
                    let request = ScheduleRequest { destination: destination.into(), delay_ms: 5_000, strategy: Some(strategy.into()), ..Default::default() };
                    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                    // The full path: topology, destination setup and plan, each a planner call.
                    let result = runtime.block_on(scheduler.schedule(request));
                    done.send((strategy, result.map(|s| s.strategy).map_err(|e| e.to_string()))).unwrap();
                });
            }
            // A deadline for a failure to show, not a wait for success: both normally finish in milliseconds.
            let results: Vec<_> = (0..2).map(|_| finished.recv_timeout(Duration::from_secs(60))).collect();
            let instances_meanwhile = a.instances();
            // Released before asserting, so a failing run ends instead of hanging on the blocked threads.
            drop(held);
            (results, instances_meanwhile)
        });
        let (mut results, instances_meanwhile) = results;
        results.sort_by_key(|r| r.as_ref().map(|(strategy, _)| *strategy).ok());
        assert_eq!(results, [Ok(("a", Ok("a".to_string()))), Ok(("b", Ok("b".to_string())))], "both calls completed while an instance of a was checked out");
        assert_eq!(instances_meanwhile, 2, "the second call to a got an instance of its own");
    }

    /// Counts what reaches the broker, to show refused requests touch nothing.
    #[derive(Default)]
    struct Counting {
        inner: Accepting,
        calls: std::sync::atomic::AtomicUsize,
    }

    impl Executor for Counting {
        fn describe(&self) -> String {
            self.inner.describe()
        }

        async fn apply(&self, commands: &[Command]) -> Result<(), ExecutorError> {
            self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.inner.apply(commands).await
        }
        async fn check_destination(&self, destination: &str) -> Result<(), ExecutorError> {
            self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.inner.check_destination(destination).await
        }
        async fn send(&self, commands: &[Command], envelope: &Envelope) -> Result<(), ExecutorError> {
            self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.inner.send(commands, envelope).await
        }
    }

    /// A broker on which every queue named `missing…` does not exist, and
    /// each check takes a while (as a passive declare whose refusal closes a
    /// channel does).
    #[derive(Default)]
    struct SlowMissing {
        inner: Accepting,
        checks: std::sync::atomic::AtomicUsize,
    }

    impl Executor for SlowMissing {
        fn describe(&self) -> String {
            self.inner.describe()
        }

        async fn apply(&self, commands: &[Command]) -> Result<(), ExecutorError> {
            self.inner.apply(commands).await
        }
        async fn check_destination(&self, destination: &str) -> Result<(), ExecutorError> {
            self.checks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(100)).await;
            if destination.starts_with("missing") {
                return Err(ExecutorError::Refused(format!("destination queue {destination:?} does not exist")));
            }
            self.inner.check_destination(destination).await
        }
        async fn send(&self, commands: &[Command], envelope: &Envelope) -> Result<(), ExecutorError> {
            self.inner.send(commands, envelope).await
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_waiting_on_one_missing_destination_share_one_check() {
        let config = two_strategies();
        let scheduler = Arc::new(Scheduler::new(&config, Strategies::load(&config).unwrap(), SlowMissing::default()));
        let request = |destination: &str| ScheduleRequest { destination: destination.into(), delay_ms: 1_000, ..Default::default() };
        let flood: Vec<_> = (0..50)
            .map(|_| {
                let scheduler = scheduler.clone();
                tokio::spawn(async move { scheduler.schedule(request("missing-orders")).await })
            })
            .collect();
        for answer in futures_util::future::join_all(flood).await {
            match answer.unwrap() {
                Err(ScheduleError::Broker(ExecutorError::Refused(why))) => assert!(why.contains("missing-orders"), "{why}"),
                other => panic!("expected the missing queue refused, got {other:?}"),
            }
        }
        let checks = scheduler.executor().checks.load(std::sync::atomic::Ordering::SeqCst);
        // One check was under way when the others arrived; the next one, begun after all of them, answers the rest.
        assert!(checks <= 3, "{checks} checks for 50 requests that waited on each other");
        // A request made after the last check is checked again: the queue may exist by now.
        let _ = scheduler.schedule(request("missing-orders")).await;
        assert_eq!(scheduler.executor().checks.load(std::sync::atomic::Ordering::SeqCst), checks + 1);
        scheduler.schedule(request("orders")).await.expect("an existing destination beside them is scheduled");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_destination_already_set_up_does_not_wait_behind_checks_of_missing_ones() {
        let config = two_strategies();
        let scheduler = Arc::new(Scheduler::new(&config, Strategies::load(&config).unwrap(), SlowMissing::default()));
        let request = |destination: &str| ScheduleRequest { destination: destination.into(), delay_ms: 1_000, ..Default::default() };
        scheduler.schedule(request("orders")).await.expect("set up once");
        let checks = || scheduler.executor().checks.load(std::sync::atomic::Ordering::SeqCst);
        let before = checks();
        // Twenty different missing queues: each needs a check of its own (100 ms each, one at a time).
        let flood: Vec<_> = (0..20)
            .map(|n| {
                let scheduler = scheduler.clone();
                tokio::spawn(async move { scheduler.schedule(request(&format!("missing-{n}"))).await })
            })
            .collect();
        // Two checks done: by then (200 ms) the rest of the flood is queued for its turn.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while checks() < before + 2 {
            assert!(std::time::Instant::now() < deadline, "the flood never reached the broker check");
            tokio::task::yield_now().await;
        }
        let asked = checks();
        scheduler.schedule(request("orders")).await.expect("the valid request");
        let during = checks() - asked;
        assert!(during <= 1, "the valid request waited for {during} checks of missing queues");
        for answer in futures_util::future::join_all(flood).await {
            assert!(matches!(answer.unwrap(), Err(ScheduleError::Broker(ExecutorError::Refused(_)))));
        }
        assert_eq!(checks() - before, 20);
    }

    /// A host whose clock runs 5 s ahead. Before it has read the broker's
    /// clock it can only trust its own (a `deliver_at` 4 s away is past due
    /// by it: sent at once, the documented assumption that the host's clock
    /// is right); once it has, the delay is counted on the broker's clock and
    /// the due time is the one asked, at or after it.
    #[tokio::test]
    async fn deliver_at_counts_on_the_host_clock_until_the_broker_s_is_read_then_on_the_broker_s() {
        use crate::clock::estimate::Reading;
        use crate::clock::{ShiftedClock, monotonic_ms, unix_now_ms};
        let config = two_strategies();
        let mut scheduler = Scheduler::new(&config, Strategies::load(&config).unwrap(), Accepting);
        let clock = Clock::new(ShiftedClock::new(5_000));
        scheduler.set_clock(clock.clone());
        let at = unix_now_ms() + 4_000;
        let request = || ScheduleRequest { destination: "orders".into(), deliver_at_ms: Some(at), ..Default::default() };
        let unread = scheduler.schedule(request()).await.unwrap();
        assert!(unread.due_at_ms >= unix_now_ms() + 4_900, "counted on the host's clock, 5 s ahead: {unread:?}");

        // The broker's clock is the system's (this test's): a millisecond stamp of it.
        let sent = monotonic_ms();
        let stamp = unix_now_ms();
        clock.record(Reading::stamp(stamp, sent, monotonic_ms()), "test");
        let read = scheduler.schedule(request()).await.unwrap();
        assert!(read.due_at_ms >= at && read.due_at_ms - at < 50, "due when asked, on the broker's clock: {read:?} for {at}");
        let delayed = scheduler.schedule(ScheduleRequest { destination: "orders".into(), delay_ms: 1_000, ..Default::default() }).await.unwrap();
        let truth = unix_now_ms() + 1_000;
        assert!(delayed.due_at_ms <= truth && truth - delayed.due_at_ms < 50, "a delay's due time on the broker's clock, not 5 s off: {delayed:?}");
    }

    #[tokio::test]
    async fn a_refused_request_reaches_no_broker_and_names_its_field() {
        let config = two_strategies();
        let scheduler = Scheduler::new(&config, Strategies::load(&config).unwrap(), Counting::default());
        let text = |name: &str, value: &str| -> FieldTable { [(name.to_string(), FieldValue::Text(value.into()))].into() };
        let refused = [
            ("destination", ScheduleRequest { destination: "d".repeat(256), delay_ms: 1_000, ..Default::default() }),
            (
                "destination",
                ScheduleRequest { destination: "hourglass.direct-level-01".into(), delay_ms: 1_000, strategy: Some("b".into()), ..Default::default() },
            ),
            ("headers", ScheduleRequest { destination: "orders".into(), delay_ms: 1_000, headers: text("CC", "elsewhere"), ..Default::default() }),
            ("headers", ScheduleRequest { destination: "orders".into(), delay_ms: 1_000, headers: text("x-death", "made up"), ..Default::default() }),
            ("headers", ScheduleRequest { destination: "orders".into(), delay_ms: 1_000, headers: text(&"h".repeat(256), "v"), ..Default::default() }),
        ];
        for (field, request) in refused {
            match scheduler.schedule(request).await {
                Err(ScheduleError::Invalid(invalid)) => assert_eq!(invalid.field, field, "{invalid:?}"),
                other => panic!("expected a refusal naming {field}, got {other:?}"),
            }
        }
        assert_eq!(scheduler.executor().calls.load(std::sync::atomic::Ordering::SeqCst), 0, "a refused request declared, checked or sent something");
        let valid = ScheduleRequest { destination: "orders".into(), delay_ms: 1_000, ..Default::default() };
        scheduler.schedule(valid).await.expect("a valid request beside them is scheduled");
        assert!(scheduler.executor().calls.load(std::sync::atomic::Ordering::SeqCst) > 0);
    }
}
