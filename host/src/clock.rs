//! Wall-clock time as the brokers and headers carry it: Unix milliseconds.

use std::time::{SystemTime, UNIX_EPOCH};

pub fn unix_now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
