//! Wall-clock time as the brokers and headers carry it: Unix milliseconds.

use std::time::{SystemTime, UNIX_EPOCH};

pub fn unix_now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// An RFC 3339 timestamp (`2026-11-23T18:00:00Z`, `2026-11-23T19:00:00.250+01:00`)
/// as Unix ms, rounded up so a due time never moves earlier.
pub fn parse_rfc3339_ms(text: &str) -> Result<u64, String> {
    let at = time::OffsetDateTime::parse(text.trim(), &time::format_description::well_known::Rfc3339)
        .map_err(|e| format!("{text:?} is not an RFC 3339 time such as 2026-11-23T18:00:00Z ({e})"))?;
    let nanos = at.unix_timestamp_nanos();
    if nanos < 0 {
        return Err(format!("{text:?} is before 1970"));
    }
    Ok((nanos as u128).div_ceil(1_000_000) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_times_with_offsets_and_fractions_are_read_as_unix_ms() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:01Z"), Ok(1_000));
        assert_eq!(parse_rfc3339_ms("1970-01-01T01:00:01.250+01:00"), Ok(1_250));
        // Never earlier: a fraction of a millisecond rounds up.
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00.0001Z"), Ok(1));
        assert!(parse_rfc3339_ms("tomorrow").unwrap_err().contains("RFC 3339"));
        assert!(parse_rfc3339_ms("2026-11-23 18:00").is_err());
        assert!(parse_rfc3339_ms("1969-12-31T23:59:59Z").unwrap_err().contains("before 1970"));
    }
}
