//! Write an hourglass delay planner.
//!
//! A planner turns "deliver this message to `destination` after `delay`" into
//! broker commands. It runs inside the host as a WebAssembly component with no
//! capabilities at all: no clock, no randomness, no files, no network. This
//! crate hides the component plumbing; a planner author:
//!
//! 1. defines a `Config` type (`serde::Deserialize`) for its table in `delay.toml`,
//! 2. implements [`Planner`],
//! 3. calls [`register_planner!`] once,
//! 4. builds with `cargo build --release --target wasm32-wasip2`.
//!
//! ```
//! use hourglass_planner_sdk::*;
//!
//! struct Direct;
//! impl Planner for Direct {
//!     type Config = NoConfig;
//!     fn info() -> Info { Info::new("direct", env!("CARGO_PKG_VERSION"), BrokerFamily::Amqp) }
//!     fn new(_: NoConfig) -> Result<Self, String> { Ok(Direct) }
//!     fn delay_range(&self) -> DelayRange { DelayRange::exact(0) }
//!     fn plan(&self, request: &PlanRequest) -> Result<Plan, String> {
//!         Ok(Plan { commands: vec![publish("", &request.destination, vec![])], delivers_after_ms: 0 })
//!     }
//! }
//! register_planner!(Direct);
//! ```

// One global allocator per program: the `talc` feature (on by default) sets it.
#[cfg(all(feature = "talc", target_family = "wasm", not(target_feature = "atomics")))]
#[global_allocator]
static ALLOCATOR: talc::wasm::WasmDynamicTalc = talc::wasm::new_wasm_dynamic_allocator();

mod adapter;
mod durability;
mod duration;
mod helpers;
mod keys;
mod redelivery;

#[doc(hidden)]
pub mod __bindings {
    wit_bindgen::generate!({
        world: "planner-world",
        path: "../../wit",
        pub_export_macro: true,
        export_macro_name: "__export_planner_world",
        default_bindings_module: "hourglass_planner_sdk::__bindings",
        additional_derives: [PartialEq],
    });
}

pub use __bindings::hourglass::planner::types::{
    BindExchange, BindQueue, BrokerFamily, Command, ConfigKey, DeclareExchange, DeclareQueue, DelayPlan as Plan, DelayRange, DueAction, DueMessage,
    ExchangeKind, Field, Granularity, HeldAction, HeldMessage, Name, NatsEnsureStream, NatsHeader, NatsPublish, NatsSchedule, PlanRequest, PlannerInfo as Info,
    Publish, RedeliveryDecision, RedeliveryRequest, SqsAttribute, SqsEnsureQueue, SqsSend, Value,
};
#[doc(hidden)]
pub use adapter::Adapter;
pub use durability::{Parking, QueueType};
pub use duration::{DurationMs, parse_duration_ms};
pub use helpers::*;
pub use keys::Key;
pub use redelivery::{RedeliveryPolicy, checked_policy, decide_with};

/// A delay strategy. One value is built per strategy from its `delay.toml` table.
pub trait Planner: Sized + 'static {
    /// The strategy's table from `delay.toml`. Use `#[serde(deny_unknown_fields)]`
    /// so a misspelt key is an error rather than a silent default.
    type Config: serde::de::DeserializeOwned;

    /// Name, version, broker family and configuration keys.
    fn info() -> Info;

    /// Validates the configuration. The error text reaches the user verbatim.
    fn new(config: Self::Config) -> Result<Self, String>;

    /// Which delays this configured planner delivers, and up to what maximum.
    fn delay_range(&self) -> DelayRange;

    /// Objects to declare once when the host starts.
    fn topology(&self) -> Result<Vec<Command>, String> {
        Ok(Vec::new())
    }

    /// Objects one destination needs; the host applies them once per destination.
    fn destination_setup(&self, _destination: &str) -> Result<Vec<Command>, String> {
        Ok(Vec::new())
    }

    /// Commands that deliver one message after its delay.
    fn plan(&self, request: &PlanRequest) -> Result<Plan, String>;

    /// For pump-driven strategies: what to do with a message that became visible.
    fn handle_due(&self, _message: &DueMessage) -> Result<DueAction, String> {
        Err(format!("planner {} is not pump-driven", Self::info().name))
    }

    /// For strategies with a held stream (NATS): a message it delivered (again)
    /// waits longer, or is handed over.
    fn handle_held(&self, _message: &HeldMessage) -> Result<HeldAction, String> {
        Err(format!("planner {} holds no messages in a stream", Self::info().name))
    }

    /// Attempt `n` failed: wait how long before the next one, or give up.
    fn decide_redelivery(&self, _request: &RedeliveryRequest) -> Result<RedeliveryDecision, String> {
        Err(format!("planner {} does not decide redeliveries", Self::info().name))
    }
}

/// For planners without settings: accepts only an empty table.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoConfig {}

/// Exports a [`Planner`] implementation as the component's `planner` interface.
/// Call it exactly once, at the crate root.
#[macro_export]
macro_rules! register_planner {
    ($planner:ty) => {
        // Native builds (unit tests) skip the export: component export names
        // are not valid symbol names for a native shared library.
        #[cfg(target_arch = "wasm32")]
        type __HourglassExportedPlanner = $crate::Adapter<$planner>;
        #[cfg(target_arch = "wasm32")]
        $crate::__bindings::__export_planner_world!(__HourglassExportedPlanner);
        // Natively, mark the planner as used so its unit tests build without warnings.
        #[cfg(not(target_arch = "wasm32"))]
        const _: fn($crate::PlanRequest) = |_| {
            let _ = <$planner as $crate::Planner>::new;
        };
    };
}
