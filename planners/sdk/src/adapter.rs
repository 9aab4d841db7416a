//! Bridges the generated component exports to a [`Planner`] value.

use std::any::Any;
use std::cell::RefCell;
use std::marker::PhantomData;

use crate::__bindings::exports::hourglass::planner::planner::Guest;
use crate::__bindings::hourglass::planner::diagnostics;
use crate::{Command, RedeliveryDecision, RedeliveryRequest};
use crate::{DelayRange, DueAction, DueMessage, HeldAction, HeldMessage, Info, Plan, PlanRequest, Planner};

thread_local! {
    // The configured planner. Components are single-threaded; the host makes
    // one instance per strategy and calls `configure` first.
    static CONFIGURED: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

/// Implements the generated `Guest` trait for any [`Planner`]; used by [`crate::register_planner!`].
pub struct Adapter<P>(PhantomData<P>);

fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Without WASI there is no stderr; hand the message to the host instead.
        std::panic::set_hook(Box::new(|info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_string());
            let location = info.location().map(|l| format!(" (at {}:{})", l.file(), l.line())).unwrap_or_default();
            diagnostics::report_panic(&format!("{message}{location}"));
        }));
    });
}

fn with_planner<P: Planner, R>(f: impl FnOnce(&P) -> Result<R, String>) -> Result<R, String> {
    CONFIGURED.with_borrow(|slot| match slot.as_ref().and_then(|p| p.downcast_ref::<P>()) {
        Some(planner) => f(planner),
        None => Err("planner called before configure".to_string()),
    })
}

/// Parses the strategy table, naming the offending key path on error.
pub(crate) fn parse_config<C: serde::de::DeserializeOwned>(json: &str) -> Result<C, String> {
    let mut de = serde_json::Deserializer::from_str(json);
    serde_path_to_error::deserialize(&mut de).map_err(|err| {
        let path = err.path().to_string();
        // serde_json appends a position in the JSON text, which means nothing to a TOML user.
        let inner = err.inner().to_string();
        let message = match inner.rfind(" at line ") {
            Some(cut) => inner[..cut].to_string(),
            None => inner,
        };
        if path == "." || path.is_empty() { message } else { format!("{path}: {message}") }
    })
}

impl<P: Planner> Guest for Adapter<P> {
    fn describe() -> Info {
        install_panic_hook();
        P::info()
    }

    fn configure(config_json: String) -> Result<DelayRange, String> {
        install_panic_hook();
        crate::keys::unseal();
        let config = parse_config::<P::Config>(&config_json)?;
        let planner = P::new(config)?;
        let range = planner.delay_range();
        CONFIGURED.with_borrow_mut(|slot| *slot = Some(Box::new(planner)));
        Ok(range)
    }

    fn names() -> Vec<String> {
        crate::keys::seal()
    }

    fn topology() -> Result<Vec<Command>, String> {
        with_planner::<P, _>(|p| p.topology())
    }

    fn destination_setup(destination: String) -> Result<Vec<Command>, String> {
        with_planner::<P, _>(|p| p.destination_setup(&destination))
    }

    fn plan(request: PlanRequest) -> Result<Plan, String> {
        with_planner::<P, _>(|p| p.plan(&request))
    }

    fn handle_due(message: DueMessage) -> Result<DueAction, String> {
        with_planner::<P, _>(|p| p.handle_due(&message))
    }

    fn handle_held(message: HeldMessage) -> Result<HeldAction, String> {
        with_planner::<P, _>(|p| p.handle_held(&message))
    }

    fn decide_redelivery(request: RedeliveryRequest) -> Result<RedeliveryDecision, String> {
        with_planner::<P, _>(|p| p.decide_redelivery(&request))
    }
}

#[cfg(test)]
mod tests {
    use super::parse_config;

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Sample {
        levels: u32,
    }

    #[test]
    fn config_errors_name_the_key_without_json_positions() {
        let err = parse_config::<Sample>(r#"{"levls": 3}"#).unwrap_err();
        assert!(err.contains("unknown field `levls`"), "{err}");
        assert!(!err.contains("line 1"), "{err}");
        let err = parse_config::<Sample>(r#"{"levels": "x"}"#).unwrap_err();
        assert!(err.starts_with("levels: invalid type"), "{err}");
    }
}
