//! Starting the service for a config: planners, broker, topology (applied or
//! verified), then what the broker's side ([`super::side`]) runs
//! beside the scheduler under the [`Supervisor`](super::supervise::Supervisor),
//! the queue-depth reading and the configured destinations.

use std::sync::Arc;
use std::time::Duration;

use super::side::{BrokerSide, Connect};
use super::{Background, DEFAULT_SHUTDOWN_TIMEOUT, Service, ServiceError};
use crate::clock::Clock;
use crate::config::{BrokerConfig, Config, TopologyAtStart};
use crate::executor::Broker;
use crate::scheduler::strategies::Strategies;
use crate::scheduler::{ScheduleError, Scheduler};

impl Service {
    /// Everything `serve` runs for a config: loads the planners, connects to
    /// the broker through `connect` (the registry's), applies or verifies the
    /// topology, starts what the broker's side runs (the ingress on RabbitMQ,
    /// the pumps on SQS, …) and prepares the configured destinations. Due
    /// times count on `clock`: its wall clock is this host's (a
    /// [`crate::clock::ShiftedClock`] plays a host whose clock is wrong), and
    /// readings of the broker's clock go into it.
    pub async fn start_on(config: Config, clock: Arc<Clock>, connect: Connect) -> Result<Arc<Service>, ServiceError> {
        let loaded = config.clone();
        let strategies = tokio::task::spawn_blocking(move || Strategies::load(&loaded)).await??;
        check_broker_family(&config.broker, &config, &strategies)?;
        let (broker, side) = connect(&config).await?;
        let topology = config.service.topology.unwrap_or(TopologyAtStart::Apply);
        let mut scheduler = Scheduler::new(&config, strategies, broker);
        scheduler.set_declaring(topology == TopologyAtStart::Apply);
        scheduler.set_clock(clock);
        let scheduler = Arc::new(scheduler);
        // Before anything can take work: a deliver_at must not be counted on a host clock that is wrong.
        side.before_work(&scheduler).await;
        check_redelivery_policies(&config, &scheduler)?;
        match topology {
            TopologyAtStart::Apply => scheduler.apply_topology(&config.default_strategy).await?,
            TopologyAtStart::Verify => verify_topology(side.as_ref(), &config).await?,
            TopologyAtStart::Skip => {}
        }
        let metrics = scheduler.metrics().clone();
        metrics.bound_labels(config.strategies.keys(), config.destinations.keys());
        let service = Arc::new(Service {
            background: Background::new(&metrics),
            side: Some(side.clone()),
            metrics,
            scheduler,
            token: config.service.token(),
            source: Some(config.path.clone()),
            topology,
            shutdown_timeout: config.service.shutdown_timeout.map_or(DEFAULT_SHUTDOWN_TIMEOUT, |d| Duration::from_millis(d.ms())),
            reloading: Default::default(),
            limits: super::http_limits(&config.service),
            depth_poll: config.service.depth_poll.map(|d| Duration::from_millis(d.ms())),
            pending: Default::default(),
            batches: Default::default(),
        });
        if let Err(err) = side.start(&service, &config).await {
            // What started before the failure stops with it.
            service.stop_background().await;
            return Err(err);
        }
        if let Some(reading) = side.depth_reading(&config) {
            super::pending::spawn_poll(&service, reading);
        }
        service.prepare_configured_destinations(&config).await;
        Ok(service)
    }

    /// Sets up each configured destination now, so pumps start and mistakes
    /// show in the log at start; a destination that fails is prepared again on
    /// its first message.
    pub(super) async fn prepare_configured_destinations(&self, config: &Config) {
        for destination in config.destinations.keys() {
            let strategy = config.strategy_for(destination).to_string();
            if let Err(err) = self.scheduler.prepare_destination(&strategy, destination).await {
                tracing::warn!(%destination, %strategy, error = %err, "configured destination not ready yet");
            }
        }
    }
}

/// Every strategy's planner writes commands for one broker family: an SQS
/// strategy on RabbitMQ (or the reverse) is refused, naming the strategy.
/// The memory broker simulates both.
pub(super) fn check_broker_family(broker: &BrokerConfig, config: &Config, strategies: &Strategies) -> Result<(), ServiceError> {
    let Some(wanted) = broker.capabilities().family else { return Ok(()) };
    let broker = broker.kind();
    for name in strategies.names() {
        let info = strategies.get(name).map_err(ScheduleError::from)?.info();
        if info.family != wanted {
            return Err(ServiceError::refused(
                config,
                format!(
                    "strategy {name:?}: planner {} writes {:?} commands, but broker.kind = \"{broker}\"; use a {:?} planner or another broker",
                    info.name, info.family, wanted
                ),
            ));
        }
    }
    Ok(())
}

/// A policy that cannot answer the first redelivery is a config mistake:
/// refused before anything is declared, not at the first rejection.
fn check_redelivery_policies(config: &Config, scheduler: &Scheduler<Broker>) -> Result<(), ServiceError> {
    for entry in &config.redelivery {
        scheduler
            .decide_redelivery(entry.policy_or(&config.default_strategy), &entry.queue, 1, 0, None)
            .map_err(|e| ServiceError::refused(config, format!("redelivery {:?}: {e}", entry.queue)))?;
    }
    Ok(())
}

/// Checks the default strategy's topology and the configured destinations'
/// setup on the broker, through its side.
pub(super) async fn verify_topology(side: &dyn BrokerSide, config: &Config) -> Result<(), ServiceError> {
    let mut strategies = Strategies::load(config)?;
    let planner = strategies.get_mut(&config.default_strategy).map_err(ScheduleError::from)?;
    let mut commands = planner.topology().map_err(ScheduleError::from)?;
    for destination in config.destinations.keys().filter(|d| config.strategy_for(d) == config.default_strategy) {
        commands.extend(planner.destination_setup(destination).map_err(ScheduleError::from)?);
    }
    let Some(drifts) = side.topology_drifts(&commands).await? else {
        // Config::parse refuses the setting for such a broker; a config made otherwise is refused here.
        return Err(ServiceError::refused(config, format!("service.topology = \"verify\" needs {}", BrokerConfig::topology_verifiers())));
    };
    if drifts.is_empty() {
        return Ok(());
    }
    let drifts = drifts.into_iter().map(|(object, problems)| format!("{object}: {}", problems.join("; "))).collect::<Vec<_>>().join(" | ");
    Err(ServiceError::Drift { path: config.path.display().to_string(), drifts })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Refused before any broker is contacted: nothing listens on these addresses.
    #[tokio::test]
    async fn a_strategy_for_the_other_broker_family_is_refused_at_start_naming_it() {
        let cases = [
            ("kind = \"rabbitmq\"\nurl = \"amqp://guest:guest@127.0.0.1:1/%2f\"", "planner = \"sqs-cycles\"", "sqs-cycles"),
            ("kind = \"sqs\"\nregion = \"us-east-1\"\nendpoint_url = \"http://127.0.0.1:1\"", "planner = \"binary-levels\"", "binary-levels"),
        ];
        for (broker, planner, name) in cases {
            let text = format!(
                "default_strategy = \"fine\"\n[broker]\n{broker}\n[strategies.mismatched]\n{planner}\n[strategies.fine]\n{}\n",
                if name == "sqs-cycles" { "planner = \"binary-levels\"" } else { "planner = \"sqs-cycles\"" }
            );
            let config = Config::parse(std::path::Path::new("family.toml"), text).unwrap();
            let err = match Service::start(config).await {
                Ok(_) => panic!("{name} on the wrong broker started"),
                Err(err) => err.to_string(),
            };
            assert!(err.contains("strategy \"mismatched\"") && err.contains(name), "{err}");
        }
    }
}
