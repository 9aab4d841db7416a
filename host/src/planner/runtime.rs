//! The process's one wasmtime engine and component loading.
//!
//! The engine's settings (component model, epoch interruption) are the same
//! for every planner; per-call limits live in each instance's store. So one
//! engine and one epoch ticker thread serve every load in the process: start,
//! reloads, pumps, verify and the CLI.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine};

use super::PlannerError;
use super::builtin;
use super::cache::ComponentCache;
use super::contract::{ContractMismatch, ContractPre, StoreState};
use super::epoch;
use super::instance::{LoadedPlanner, PlannerLimits};

/// Where a planner's component comes from: the binary, or a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlannerSource {
    Builtin(&'static str),
    File(PathBuf),
}

impl PlannerSource {
    /// A built-in name, or else a path (relative to `base_dir`).
    pub fn parse(spec: &str, base_dir: &Path) -> PlannerSource {
        match builtin::NAMES.iter().find(|name| **name == spec) {
            Some(name) => PlannerSource::Builtin(name),
            None => PlannerSource::File(base_dir.join(spec)),
        }
    }

    /// How errors name this planner.
    pub fn label(&self) -> String {
        match self {
            PlannerSource::Builtin(name) => (*name).to_string(),
            PlannerSource::File(path) => path.display().to_string(),
        }
    }

    fn bytes(&self) -> Result<std::borrow::Cow<'static, [u8]>, PlannerError> {
        match self {
            PlannerSource::Builtin(name) => Ok(builtin::component(name).expect("built-in planner exists").into()),
            PlannerSource::File(path) => {
                std::fs::read(path).map(Into::into).map_err(|source| PlannerError::Read { planner: self.label(), path: path.display().to_string(), source })
            }
        }
    }
}

/// Why the process's engine could not be made. Kept (shared) for every later
/// load, as the engine is made once.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{0}")]
pub struct EngineUnavailable(Arc<wasmtime::Error>);

static ENGINE: OnceLock<Result<Engine, EngineUnavailable>> = OnceLock::new();
static ENGINES_CREATED: AtomicUsize = AtomicUsize::new(0);

/// The process's engine, made (with its epoch ticker) on first use.
fn shared_engine() -> Result<Engine, PlannerError> {
    ENGINE
        .get_or_init(|| {
            let mut config = Config::new();
            config.wasm_component_model(true);
            // Epoch checks cost next to nothing per call, unlike fuel.
            config.epoch_interruption(true);
            let engine = Engine::new(&config).map_err(|e| EngineUnavailable(Arc::new(e)))?;
            ENGINES_CREATED.fetch_add(1, Ordering::SeqCst);
            epoch::start_ticking(&engine);
            Ok(engine)
        })
        .clone()
        .map_err(PlannerError::from)
}

/// How many wasmtime engines this process has made: one, once any planner is loaded.
#[cfg(feature = "testing")]
pub fn engines_created() -> usize {
    ENGINES_CREATED.load(Ordering::SeqCst)
}

/// Instances each planner keeps at most: one per CPU, so every worker thread
/// can be inside a planner at once, and at least two, so one slow call never
/// holds up the next.
fn default_instances() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 16)
}

/// Loads planners with one set of limits and one cache, on the shared engine.
/// Cheap to make: one per config load.
pub struct PlannerRuntime {
    engine: Engine,
    cache: Option<ComponentCache>,
    limits: PlannerLimits,
    instances: usize,
}

impl PlannerRuntime {
    /// `cache_dir = None` compiles every time. A cache directory that someone
    /// else could write to is refused (see [`ComponentCache::open`]).
    pub fn new(limits: PlannerLimits, cache_dir: Option<PathBuf>) -> Result<Self, PlannerError> {
        let engine = shared_engine()?;
        let cache = cache_dir.map(ComponentCache::open).transpose()?;
        Ok(PlannerRuntime { engine, cache, limits, instances: default_instances() })
    }

    /// At most `instances` (≥ 1) instances per planner this runtime loads.
    pub fn with_instances(mut self, instances: usize) -> Self {
        self.instances = instances.max(1);
        self
    }

    pub fn limits(&self) -> PlannerLimits {
        self.limits
    }

    /// Instances each planner loaded here may keep at once.
    pub fn instances(&self) -> usize {
        self.instances
    }

    pub fn cache_dir(&self) -> Option<&Path> {
        self.cache.as_ref().map(ComponentCache::dir)
    }

    /// Reads and compiles (or loads from cache) a planner's component.
    pub fn compile(&self, source: &PlannerSource) -> Result<Component, PlannerError> {
        let wasm = source.bytes()?;
        let not_a_component = |reason: String| PlannerError::NotAComponent { planner: source.label(), path: source.label(), reason };
        if !wasm.starts_with(b"\0asm") {
            return Err(not_a_component("the file does not start with the WebAssembly magic bytes".into()));
        }
        if let Some(cache) = &self.cache
            && let Some(component) = cache.load(&self.engine, &wasm)
        {
            return Ok(component);
        }
        let component = Component::new(&self.engine, &wasm).map_err(|e| not_a_component(format!("{e:#}")))?;
        if let Some(cache) = &self.cache {
            cache.store(&self.engine, &wasm, &component);
        }
        Ok(component)
    }

    /// Compiles, type-checks against the contract, instantiates and configures
    /// a planner for one strategy.
    pub fn load(&self, source: &PlannerSource, config_json: String) -> Result<LoadedPlanner, PlannerError> {
        self.load_limited(source, config_json, self.limits)
    }

    /// [`load`](Self::load) under limits of the strategy's own.
    pub(crate) fn load_limited(&self, source: &PlannerSource, config_json: String, limits: PlannerLimits) -> Result<LoadedPlanner, PlannerError> {
        let component = self.compile(source)?;
        let label = source.label();
        let wrong_contract = |e: wasmtime::Error| PlannerError::WrongContract { planner: label.clone(), source: ContractMismatch::Imports(e) };
        let mut linker = Linker::<StoreState>::new(&self.engine);
        super::contract::add_to_linker(&mut linker).map_err(PlannerError::Engine)?;
        // Language runtimes (Rust's std, Python, JavaScript) import WASI; planners get none of its
        // capabilities: what a runtime calls to start is answered inertly, the rest traps.
        super::inert_wasi::define(&mut linker, &component, &self.engine).map_err(wrong_contract)?;
        linker.define_unknown_imports_as_traps(&component).map_err(wrong_contract)?;
        let pre = linker.instantiate_pre(&component).map_err(wrong_contract)?;
        let pre = ContractPre::new(pre).map_err(|source| PlannerError::WrongContract { planner: label.clone(), source })?;
        LoadedPlanner::start(label, self.engine.clone(), pre, limits, self.instances, config_json)
    }
}
