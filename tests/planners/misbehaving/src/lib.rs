//! Misbehaves on request, so tests can show the sandbox holds: the destination
//! names the misbehaviour; any other destination gets an ordinary plan, to
//! the default exchange, which it registered.

use hourglass_planner_sdk::*;

struct Misbehaving {
    default_exchange: Key,
}

/// `{"configure": "loop"}` loops while being configured.
#[derive(Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    configure: Option<String>,
}

impl Planner for Misbehaving {
    type Config = Settings;

    fn info() -> Info {
        Info::new("misbehaving", env!("CARGO_PKG_VERSION"), BrokerFamily::Amqp)
    }

    fn new(settings: Settings) -> Result<Self, String> {
        if settings.configure.as_deref() == Some("loop") {
            let mut n: u64 = 0;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }
        Ok(Misbehaving { default_exchange: Key::register("") })
    }

    fn delay_range(&self) -> DelayRange {
        DelayRange::exact(0)
    }

    fn plan(&self, request: &PlanRequest) -> Result<Plan, String> {
        match request.destination.as_str() {
            "loop" => {
                let mut n: u64 = 0;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            "panic" => panic!("asked to panic for {}", request.message_id),
            "trap" => std::process::abort(),
            "allocate" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            // A name past every registered one: the host must fail this call only.
            "unregistered" => Ok(Plan { commands: vec![publish(Name::Registered(4_000_000_000), "unregistered", vec![])], delivers_after_ms: 0 }),
            // A plan that publishes nothing: the host must not acknowledge it.
            "nothing" => Ok(Plan { commands: vec![], delivers_after_ms: 0 }),
            "wasi" => {
                // Planners have no capabilities: the environment is empty, no file opens
                // (a plan to "capability-leak" says one did), and writing to stdout traps.
                if std::env::var("HOME").is_ok() || std::fs::read("/etc/hostname").is_ok() {
                    return Ok(Plan { commands: vec![publish("", "capability-leak", vec![])], delivers_after_ms: 0 });
                }
                println!("a planner has no stdout");
                Ok(Plan { commands: vec![], delivers_after_ms: 0 })
            }
            destination => Ok(Plan { commands: vec![publish(self.default_exchange, destination, vec![])], delivers_after_ms: 0 }),
        }
    }
}

register_planner!(Misbehaving);
