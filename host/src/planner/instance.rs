//! A configured planner and its pool of instances, and the host-side types of its answers.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use serde::Serialize;
use wasmtime::{Engine, Store, StoreLimitsBuilder, Trap};

use super::PlannerError;
use super::bindings::hourglass::planner::types as wit;
use super::contract::{Contract, ContractPre, PlanRequestRef, StoreState};
use super::epoch::set_epoch_deadline;
pub use crate::command::BrokerFamily;
use crate::command::{Command, DueAction, DueMessage, HeldAction, HeldMessage};

#[derive(Clone, Debug, Serialize)]
pub struct ConfigKey {
    pub name: String,
    pub description: String,
    pub default_value: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PlannerInfo {
    pub name: String,
    pub version: String,
    pub family: BrokerFamily,
    pub config_keys: Vec<ConfigKey>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Granularity {
    Uniform(u64),
    Listed(Vec<u64>),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DelayRange {
    pub granularity: Granularity,
    pub max_delay_ms: u64,
}

impl DelayRange {
    /// The delay a conforming planner delivers when asked for `delay_ms`
    /// (rounded up to its granularity), or `None` if it is out of range.
    pub fn promise(&self, delay_ms: u64) -> Option<u64> {
        let promised = match &self.granularity {
            Granularity::Uniform(step) => delay_ms.checked_next_multiple_of((*step).max(1))?,
            Granularity::Listed(delays) => delays.iter().copied().find(|&d| d >= delay_ms)?,
        };
        (promised <= self.max_delay_ms).then_some(promised)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlanRequest {
    pub destination: String,
    pub delay_ms: u64,
    pub message_id: String,
    pub routing_key: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub commands: Vec<Command>,
    pub delivers_after_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RedeliveryDecision {
    RetryAfterMs(u64),
    GiveUp(String),
}

/// The sandbox's bounds for each planner call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlannerLimits {
    /// Wall-clock budget of one call.
    pub call_timeout: Duration,
    /// Wall-clock budget to instantiate and configure one instance. It is
    /// spent once per instance (at load, and after a trap discards one), so
    /// it is wider than a call's: a busy host or a large component must not
    /// fail a load that a quiet machine passes.
    pub start_timeout: Duration,
    /// Linear memory a planner may grow to. A Rust planner needs about 1.1 MiB to start.
    pub memory_bytes: usize,
}

impl Default for PlannerLimits {
    fn default() -> Self {
        PlannerLimits { call_timeout: Duration::from_millis(100), start_timeout: Duration::from_secs(1), memory_bytes: 16 << 20 }
    }
}

/// One instantiated, configured instance and its store.
struct Live {
    store: Store<StoreState>,
    contract: Contract,
    /// The names this instance registered (`names`, asked once after
    /// `configure`), which its commands' `name.registered` index.
    names: Vec<String>,
}

/// A planner loaded and configured for one strategy: a small pool of
/// instances, so calls from different tasks run in parallel.
///
/// An instance is checked out for a call and returned after it. A trap leaves
/// a wasm instance unusable, so one that trapped is dropped instead, and a
/// later checkout instantiates a fresh one from the pre-linked component and
/// configures it again. At most `bound` instances exist at once; a caller
/// finding all of them busy waits for one to come back (a call ends within
/// its time budget).
pub struct LoadedPlanner {
    label: String,
    engine: Engine,
    pre: ContractPre,
    limits: PlannerLimits,
    config_json: String,
    info: PlannerInfo,
    range: DelayRange,
    pool: Mutex<Pool>,
    returned: Condvar,
    bound: usize,
}

#[derive(Default)]
struct Pool {
    idle: Vec<Live>,
    /// Instances that exist: idle, checked out, or being made.
    existing: usize,
    /// Callers waiting in `checkout` for an instance to come back.
    waiting: usize,
}

impl Pool {
    /// Whether a change to the pool should wake a waiting caller. Waking
    /// costs a system call (std's `Condvar::notify_one` always makes one), so
    /// the common case, no one waiting, skips it.
    fn anyone_waiting(&self) -> bool {
        self.waiting > 0
    }
}

impl std::fmt::Debug for LoadedPlanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlanner").field("label", &self.label).field("info", &self.info).finish_non_exhaustive()
    }
}

/// One instance of a [`LoadedPlanner`], checked out of its pool; it goes back
/// when dropped (or is discarded, if a call trapped). Hold it only for calls:
/// not across an `.await`, where it would keep others of the pool waiting.
pub struct PlannerInstance<'p> {
    planner: &'p LoadedPlanner,
    /// `None` once a call trapped.
    live: Option<Live>,
}

impl Drop for PlannerInstance<'_> {
    fn drop(&mut self) {
        let mut pool = self.planner.lock_pool();
        match self.live.take() {
            Some(live) => pool.idle.push(live),
            None => pool.existing -= 1,
        }
        let wake = pool.anyone_waiting();
        drop(pool);
        if wake {
            self.planner.returned.notify_one();
        }
    }
}

impl LoadedPlanner {
    pub(crate) fn start(
        label: String,
        engine: Engine,
        pre: ContractPre,
        limits: PlannerLimits,
        bound: usize,
        config_json: String,
    ) -> Result<Self, PlannerError> {
        let placeholder_info = PlannerInfo { name: label.clone(), version: String::new(), family: BrokerFamily::Amqp, config_keys: vec![] };
        let placeholder_range = DelayRange { granularity: Granularity::Uniform(1), max_delay_ms: 0 };
        let mut planner = LoadedPlanner {
            label,
            engine,
            pre,
            limits,
            config_json,
            info: placeholder_info,
            range: placeholder_range,
            pool: Mutex::new(Pool::default()),
            returned: Condvar::new(),
            bound: bound.max(1),
        };
        // The first instance is made here, so a broken planner or config fails the load.
        let (live, range) = planner.instantiate()?;
        planner.range = range;
        *planner.pool.get_mut().unwrap_or_else(|p| p.into_inner()) = Pool { idle: vec![live], existing: 1, waiting: 0 };
        let info = planner.checkout()?.call("describe", |c, s| c.describe(s))?;
        planner.info = convert_info(info);
        Ok(planner)
    }

    /// The planner's name as errors show it: its built-in name or file path.
    pub fn label(&self) -> &str {
        &self.label
    }

    pub fn info(&self) -> &PlannerInfo {
        &self.info
    }

    pub fn delay_range(&self) -> &DelayRange {
        &self.range
    }

    /// The most instances this planner keeps at once.
    pub fn max_instances(&self) -> usize {
        self.bound
    }

    /// Instances that exist now (idle or checked out).
    pub fn instances(&self) -> usize {
        self.lock_pool().existing
    }

    fn lock_pool(&self) -> MutexGuard<'_, Pool> {
        // The pool's state is updated in single statements; a panic elsewhere leaves it whole.
        self.pool.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// An instance for this caller's calls: an idle one, a new one while
    /// fewer than the bound exist, or else the next one returned.
    pub fn checkout(&self) -> Result<PlannerInstance<'_>, PlannerError> {
        let mut pool = self.lock_pool();
        loop {
            if let Some(live) = pool.idle.pop() {
                return Ok(PlannerInstance { planner: self, live: Some(live) });
            }
            if pool.existing < self.bound {
                pool.existing += 1;
                drop(pool);
                // Instantiating runs the planner's `configure`: outside the lock.
                return match self.instantiate() {
                    Ok((live, _)) => Ok(PlannerInstance { planner: self, live: Some(live) }),
                    Err(err) => {
                        let mut pool = self.lock_pool();
                        pool.existing -= 1;
                        if pool.anyone_waiting() {
                            self.returned.notify_one();
                        }
                        Err(err)
                    }
                };
            }
            pool.waiting += 1;
            pool = self.returned.wait(pool).unwrap_or_else(|poisoned| poisoned.into_inner());
            pool.waiting -= 1;
        }
    }

    fn instantiate(&self) -> Result<(Live, DelayRange), PlannerError> {
        let state =
            StoreState { limits: StoreLimitsBuilder::new().memory_size(self.limits.memory_bytes).trap_on_grow_failure(true).build(), panic_message: None };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|state| &mut state.limits);
        set_epoch_deadline(&mut store, self.limits.start_timeout);
        let contract = self
            .pre
            .instantiate(&mut store)
            .map_err(|e| self.trapped("instantiate", e, None))?
            .map_err(|source| PlannerError::WrongContract { planner: self.label.clone(), source })?;
        let configured = contract.configure(&mut store, &self.config_json);
        let panic = store.data_mut().panic_message.take();
        let range = match configured {
            Ok(Ok(range)) => convert_range(range),
            Ok(Err(message)) => return Err(PlannerError::Config { planner: self.label.clone(), message }),
            Err(err) => return Err(self.trapped("configure", err, panic)),
        };
        // Under the start budget still: registering names is part of starting.
        let names = contract.names(&mut store).map_err(|err| {
            let panic = store.data_mut().panic_message.take();
            self.trapped("names", err, panic)
        })?;
        Ok((Live { store, contract, names }, range))
    }

    fn trapped(&self, function: &'static str, err: wasmtime::Error, panic: Option<String>) -> PlannerError {
        let planner = self.label.clone();
        let reason = if let Some(message) = panic {
            format!("panicked: {message}")
        } else if err.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
            let budget = if matches!(function, "instantiate" | "configure" | "names") { self.limits.start_timeout } else { self.limits.call_timeout };
            return PlannerError::Timeout { planner, function, budget };
        } else if format!("{err:?}").contains("forcing trap when growing memory") {
            format!("ran out of its memory limit of {} MiB (raise memory_limit_mib in [planners] or in its strategy's table)", self.limits.memory_bytes >> 20)
        } else if format!("{err:#}").contains("wasi:cli/stderr") {
            // A language runtime prints an uncaught exception before it traps; printing is not granted.
            format!("trapped: it tried to write to stderr, most likely an uncaught exception ({})", err.root_cause())
        } else {
            format!("trapped: {}", err.root_cause())
        };
        PlannerError::Trapped { planner, function, reason }
    }

    fn refused(&self, message: String) -> PlannerError {
        PlannerError::Refused { planner: self.label.clone(), message }
    }

    fn commands(&self, function: &'static str, commands: Vec<wit::Command>, names: &[String]) -> Result<Vec<Command>, PlannerError> {
        let invalid = |reason: String| PlannerError::InvalidOutput { planner: self.label.clone(), function, reason };
        commands
            .into_iter()
            .map(|c| {
                let command = super::convert::command_from_planner(c, names).map_err(|source| PlannerError::InvalidCommand {
                    planner: self.label.clone(),
                    function,
                    source,
                })?;
                if command.family() != self.info.family {
                    return Err(invalid(format!("{command:?} does not belong to a {:?} planner", self.info.family)));
                }
                Ok(command)
            })
            .collect()
    }

    /// The strategy's static topology (on an instance of the pool).
    pub fn topology(&self) -> Result<Vec<Command>, PlannerError> {
        self.checkout()?.topology()
    }

    pub fn destination_setup(&self, destination: &str) -> Result<Vec<Command>, PlannerError> {
        self.checkout()?.destination_setup(destination)
    }

    pub fn plan(&self, request: &PlanRequest) -> Result<Plan, PlannerError> {
        self.checkout()?.plan(request)
    }

    /// What the strategy declares and sends: its static topology plus one
    /// sample plan (up to 1 s, to `sample`), which shows the queues declared
    /// per message (hold-queues) and the publish's keys (direct levels' BCC).
    /// A refused sample plan leaves the topology alone.
    pub fn declarations(&self) -> Result<Vec<Command>, PlannerError> {
        let mut commands = self.topology()?;
        let delay_ms = self.delay_range().max_delay_ms.clamp(1, 1_000);
        if let Ok(plan) = self.plan(&PlanRequest { destination: "sample".into(), delay_ms, message_id: "sample".into(), routing_key: None }) {
            commands.extend(plan.commands);
        }
        Ok(commands)
    }

    pub fn handle_due(&self, message: &DueMessage) -> Result<DueAction, PlannerError> {
        self.checkout()?.handle_due(message)
    }

    pub fn handle_held(&self, message: &HeldMessage) -> Result<HeldAction, PlannerError> {
        self.checkout()?.handle_held(message)
    }

    pub fn decide_redelivery(&self, queue: &str, attempt: u32, seed: u64, reason: Option<&str>) -> Result<RedeliveryDecision, PlannerError> {
        self.checkout()?.decide_redelivery(queue, attempt, seed, reason)
    }
}

impl PlannerInstance<'_> {
    /// Runs one export under the call budget; a trap discards the instance.
    fn call<R>(&mut self, function: &'static str, f: impl FnOnce(&Contract, &mut Store<StoreState>) -> wasmtime::Result<R>) -> Result<R, PlannerError> {
        let planner = self.planner;
        if self.live.is_none() {
            // Trapped earlier on this checkout: start afresh, as the pool would.
            self.live = Some(planner.instantiate()?.0);
        }
        let live = self.live.as_mut().expect("just made live");
        set_epoch_deadline(&mut live.store, planner.limits.call_timeout);
        match f(&live.contract, &mut live.store) {
            Ok(result) => Ok(result),
            Err(err) => {
                let panic = live.store.data_mut().panic_message.take();
                self.live = None;
                Err(planner.trapped(function, err, panic))
            }
        }
    }

    /// The live instance's registered names: a call that answered left it live.
    fn names(&self) -> &[String] {
        self.live.as_ref().map_or(&[], |live| &live.names)
    }

    pub fn topology(&mut self) -> Result<Vec<Command>, PlannerError> {
        let result = self.call("topology", |c, s| c.topology(s))?;
        let commands = result.map_err(|m| self.planner.refused(m))?;
        self.planner.commands("topology", commands, self.names())
    }

    pub fn destination_setup(&mut self, destination: &str) -> Result<Vec<Command>, PlannerError> {
        let result = self.call("destination-setup", |c, s| c.destination_setup(s, destination))?;
        let commands = result.map_err(|m| self.planner.refused(m))?;
        self.planner.commands("destination-setup", commands, self.names())
    }

    pub fn plan(&mut self, request: &PlanRequest) -> Result<Plan, PlannerError> {
        let borrowed = PlanRequestRef {
            destination: &request.destination,
            delay_ms: request.delay_ms,
            message_id: &request.message_id,
            routing_key: request.routing_key.as_deref(),
        };
        let result = self.call("plan", |c, s| c.plan(s, borrowed))?;
        let plan = result.map_err(|m| self.planner.refused(m))?;
        if plan.delivers_after_ms < request.delay_ms {
            return Err(PlannerError::InvalidOutput {
                planner: self.planner.label.clone(),
                function: "plan",
                reason: format!("promised {}ms for a {}ms delay: planners may round up, never down", plan.delivers_after_ms, request.delay_ms),
            });
        }
        Ok(Plan { commands: self.planner.commands("plan", plan.commands, self.names())?, delivers_after_ms: plan.delivers_after_ms })
    }

    pub fn handle_due(&mut self, message: &DueMessage) -> Result<DueAction, PlannerError> {
        let wit_message = wit::DueMessage {
            queue: message.queue.clone(),
            message_id: message.message_id.clone(),
            attributes: message.attributes.iter().map(|(name, value)| wit::SqsAttribute { name: name.clone(), value: value.clone() }).collect(),
            sent_timestamp_ms: message.sent_timestamp_ms,
            first_receive_timestamp_ms: message.first_receive_timestamp_ms,
            receive_count: message.receive_count,
            host_now_ms: message.host_now_ms,
        };
        let result = self.call("handle-due", |c, s| c.handle_due(s, &wit_message))?;
        let planner = self.planner;
        Ok(match result.map_err(|m| planner.refused(m))? {
            wit::DueAction::Recycle(c) => DueAction::Recycle(planner.commands("handle-due", c, self.names())?),
            wit::DueAction::HandOver(c) => DueAction::HandOver(planner.commands("handle-due", c, self.names())?),
        })
    }

    pub fn handle_held(&mut self, message: &HeldMessage) -> Result<HeldAction, PlannerError> {
        let wit_message = wit::HeldMessage {
            stream: message.stream.clone(),
            subject: message.subject.clone(),
            destination: message.destination.clone(),
            due_at_ms: message.due_at_ms,
            now_ms: message.now_ms,
            deliveries: message.deliveries,
        };
        let result = self.call("handle-held", |c, s| c.handle_held(s, &wit_message))?;
        let planner = self.planner;
        Ok(match result.map_err(|m| planner.refused(m))? {
            wit::HeldAction::Wait(ms) => HeldAction::Wait { ms },
            wit::HeldAction::HandOver(c) => HeldAction::HandOver { commands: planner.commands("handle-held", c, self.names())? },
        })
    }

    pub fn decide_redelivery(&mut self, queue: &str, attempt: u32, seed: u64, reason: Option<&str>) -> Result<RedeliveryDecision, PlannerError> {
        let request = wit::RedeliveryRequest { queue: queue.into(), attempt, seed, reason: reason.map(Into::into) };
        let result = self.call("decide-redelivery", |c, s| c.decide_redelivery(s, &request))?;
        Ok(match result.map_err(|m| self.planner.refused(m))? {
            wit::RedeliveryDecision::RetryAfterMs(ms) => RedeliveryDecision::RetryAfterMs(ms),
            wit::RedeliveryDecision::GiveUp(why) => RedeliveryDecision::GiveUp(why),
        })
    }
}

fn convert_info(info: wit::PlannerInfo) -> PlannerInfo {
    PlannerInfo {
        name: info.name,
        version: info.version,
        family: match info.family {
            wit::BrokerFamily::Amqp => BrokerFamily::Amqp,
            wit::BrokerFamily::Sqs => BrokerFamily::Sqs,
            wit::BrokerFamily::Nats => BrokerFamily::Nats,
        },
        config_keys: info.config_keys.into_iter().map(|k| ConfigKey { name: k.name, description: k.description, default_value: k.default_value }).collect(),
    }
}

fn convert_range(range: wit::DelayRange) -> DelayRange {
    DelayRange {
        granularity: match range.granularity {
            wit::Granularity::Uniform(step) => Granularity::Uniform(step),
            wit::Granularity::Listed(delays) => Granularity::Listed(delays),
        },
        max_delay_ms: range.max_delay_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promises_round_up_within_the_range() {
        let uniform = DelayRange { granularity: Granularity::Uniform(1_000), max_delay_ms: 10_000 };
        assert_eq!(uniform.promise(1), Some(1_000));
        assert_eq!(uniform.promise(10_000), Some(10_000));
        assert_eq!(uniform.promise(10_001), None);
        let listed = DelayRange { granularity: Granularity::Listed(vec![0, 5, 15]), max_delay_ms: 15 };
        assert_eq!(listed.promise(6), Some(15));
        assert_eq!(listed.promise(16), None);
    }
}
