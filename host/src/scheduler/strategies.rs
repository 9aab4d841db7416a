//! Strategies: the configured planners, loaded and ready to call.

use std::collections::BTreeMap;

use thiserror::Error;

use crate::config::{Config, Location, UnknownStrategy};
use crate::planner::{LoadedPlanner, PlannerError, PlannerRuntime};

/// A strategy that cannot be loaded; `strategy` is empty when the fault is
/// not one strategy's (the planner cache directory, the engine).
#[derive(Debug, Error)]
#[error("{location}: {}{source}", if .strategy.is_empty() { String::new() } else { format!("strategy {:?}: ", .strategy) })]
pub struct StrategyError {
    pub location: Location,
    pub strategy: String,
    // Boxed: planner errors are large, and this one travels in every Result of a load.
    #[source]
    pub source: Box<StrategyFault>,
}

/// What kept a strategy from loading.
#[derive(Debug, Error)]
pub enum StrategyFault {
    #[error(transparent)]
    Planner(#[from] PlannerError),
    /// [`Strategies::load_one`] was asked for a strategy the config lacks.
    #[error(transparent)]
    Unknown(#[from] UnknownStrategy),
}

/// Every strategy in a config, each with its own planner and pool of
/// instances: calls need only `&self`, and run in parallel.
pub struct Strategies {
    planners: BTreeMap<String, LoadedPlanner>,
    runtime: PlannerRuntime,
}

/// Where to point for a planner runtime that cannot be made: the cache
/// directory's setting when that is refused, else the file (the engine is no setting's).
fn runtime_location(config: &Config, err: &PlannerError) -> Location {
    match err {
        PlannerError::CacheDir { .. } => config.cache_dir_location(),
        _ => Location { path: config.path.clone(), line: 1, column: 1 },
    }
}

impl Strategies {
    /// Loads and configures every strategy, so a broken one fails at start.
    pub fn load(config: &Config) -> Result<Strategies, StrategyError> {
        let runtime = PlannerRuntime::new(config.planner_limits, config.cache_dir.clone()).map_err(|source| StrategyError {
            location: runtime_location(config, &source),
            strategy: String::new(),
            source: Box::new(source.into()),
        })?;
        let mut planners = BTreeMap::new();
        for strategy in config.strategies.values() {
            let limits = strategy.planner_limits(config.planner_limits);
            let planner = runtime.load_limited(&strategy.planner, strategy.table.to_string(), limits).map_err(|source| {
                let location = match &source {
                    PlannerError::Config { message, .. } => config.table_error_location(strategy, message),
                    _ => config.planner_location(strategy),
                };
                StrategyError { location, strategy: strategy.name.clone(), source: Box::new(source.into()) }
            })?;
            planners.insert(strategy.name.clone(), planner);
        }
        Ok(Strategies { planners, runtime })
    }

    /// One strategy's planner loaded on its own, for a task of its own (a pump).
    pub fn load_one(config: &Config, name: &str) -> Result<LoadedPlanner, StrategyError> {
        let located = |source: StrategyFault| StrategyError {
            location: Location { path: config.path.clone(), line: 1, column: 1 },
            strategy: name.to_string(),
            source: Box::new(source),
        };
        let strategy = config.strategy(name).map_err(|unknown| located(unknown.into()))?;
        let runtime = PlannerRuntime::new(config.planner_limits, config.cache_dir.clone()).map_err(|err| StrategyError {
            location: runtime_location(config, &err),
            strategy: name.to_string(),
            source: Box::new(err.into()),
        })?;
        runtime.load_limited(&strategy.planner, strategy.table.to_string(), strategy.planner_limits(config.planner_limits)).map_err(|source| StrategyError {
            location: config.planner_location(strategy),
            strategy: name.to_string(),
            source: Box::new(source.into()),
        })
    }

    pub fn runtime(&self) -> &PlannerRuntime {
        &self.runtime
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.planners.keys().map(String::as_str)
    }

    /// A strategy's planner; calls on it check an instance out of its pool.
    pub fn get(&self, name: &str) -> Result<&LoadedPlanner, UnknownStrategy> {
        self.planners.get(name).ok_or_else(|| self.unknown(name))
    }

    pub fn get_mut(&mut self, name: &str) -> Result<&mut LoadedPlanner, UnknownStrategy> {
        if !self.planners.contains_key(name) {
            return Err(self.unknown(name));
        }
        Ok(self.planners.get_mut(name).expect("just checked"))
    }

    fn unknown(&self, name: &str) -> UnknownStrategy {
        UnknownStrategy { name: name.to_string(), configured: self.planners.keys().cloned().collect() }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_cache_directory_others_can_write_fails_the_load_pointing_at_its_setting() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        std::fs::create_dir(&cache).unwrap();
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
        let text = format!("[planners]\ncache_dir = {:?}\n[strategies.a]\nplanner = \"hold-queues\"\n", cache.display().to_string());
        let config = Config::parse(&dir.path().join("delay.toml"), text).unwrap();
        let err = Strategies::load(&config).err().expect("refused").to_string();
        assert!(
            err.starts_with(&format!(
                "{}:2:13: planner cache directory {}: writable by group and others",
                dir.path().join("delay.toml").display(),
                cache.display()
            )),
            "{err}"
        );

        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o700)).unwrap();
        Strategies::load(&config).expect("a private cache directory is fine");
    }
}
