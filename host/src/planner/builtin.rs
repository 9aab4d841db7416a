//! The planners that ship inside the binary (built by `host/build.rs`).

pub(crate) const BINARY_LEVELS: &str = "binary-levels";
pub(crate) const HOLD_QUEUES: &str = "hold-queues";
pub(crate) const FIXED_INTERVALS: &str = "fixed-intervals";
pub(crate) const SQS_CYCLES: &str = "sqs-cycles";
pub(crate) const NATS_HOLD: &str = "nats-hold";
pub(crate) const NATS_SCHEDULE: &str = "nats-schedule";

pub(crate) const NAMES: [&str; 6] = [BINARY_LEVELS, HOLD_QUEUES, FIXED_INTERVALS, SQS_CYCLES, NATS_HOLD, NATS_SCHEDULE];

/// The component bytes of a built-in planner, by name.
pub fn component(name: &str) -> Option<&'static [u8]> {
    Some(match name {
        BINARY_LEVELS => include_bytes!(concat!(env!("OUT_DIR"), "/binary_levels.wasm")),
        HOLD_QUEUES => include_bytes!(concat!(env!("OUT_DIR"), "/hold_queues.wasm")),
        FIXED_INTERVALS => include_bytes!(concat!(env!("OUT_DIR"), "/fixed_intervals.wasm")),
        SQS_CYCLES => include_bytes!(concat!(env!("OUT_DIR"), "/sqs_cycles.wasm")),
        NATS_HOLD => include_bytes!(concat!(env!("OUT_DIR"), "/nats_hold.wasm")),
        NATS_SCHEDULE => include_bytes!(concat!(env!("OUT_DIR"), "/nats_schedule.wasm")),
        _ => return None,
    })
}
