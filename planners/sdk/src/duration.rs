//! Durations in planner tables: `"10s"`, `"1500ms"`, `"2h 5m"` or plain milliseconds.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

/// A duration in whole milliseconds, deserialised from a humane string or an integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DurationMs(pub u64);

impl DurationMs {
    pub fn ms(self) -> u64 {
        self.0
    }
}

/// Parses `"10s"`, `"1500ms"`, `"2h 5m"`, or a plain number of milliseconds.
/// Sub-millisecond parts are rejected rather than silently truncated.
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration".to_string());
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse::<u64>().map_err(|e| format!("duration {text:?}: {e}"));
    }
    let parsed = humantime::parse_duration(text).map_err(|e| format!("duration {text:?}: {e}"))?;
    if parsed.subsec_nanos() % 1_000_000 != 0 {
        return Err(format!("duration {text:?} is finer than a millisecond"));
    }
    u64::try_from(parsed.as_millis()).map_err(|_| format!("duration {text:?} is too long"))
}

impl<'de> Deserialize<'de> for DurationMs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct DurationVisitor;
        impl Visitor<'_> for DurationVisitor {
            type Value = DurationMs;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration such as \"10s\", \"1500ms\", \"2h 5m\" or milliseconds")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<DurationMs, E> {
                Ok(DurationMs(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<DurationMs, E> {
                u64::try_from(v).map(DurationMs).map_err(|_| E::custom(format!("negative duration {v}")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<DurationMs, E> {
                parse_duration_ms(v).map(DurationMs).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(DurationVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_forms() {
        assert_eq!(parse_duration_ms("10s"), Ok(10_000));
        assert_eq!(parse_duration_ms("1500ms"), Ok(1_500));
        assert_eq!(parse_duration_ms("2h 5m"), Ok(7_500_000));
        assert_eq!(parse_duration_ms("250"), Ok(250));
    }

    #[test]
    fn rejects_nonsense_and_sub_millisecond_values() {
        assert!(parse_duration_ms("").is_err());
        assert!(parse_duration_ms("ten seconds").is_err());
        assert!(parse_duration_ms("-5s").is_err());
        assert!(parse_duration_ms("1500us").unwrap_err().contains("finer than a millisecond"));
    }
}
