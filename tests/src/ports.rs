//! Ports for brokers the tests start themselves, taken from below the
//! kernel's ephemeral range. A port the kernel hands out for `bind(0)` can
//! be given again, between our check and the node's own bind, as the local
//! port of any outgoing connection (the fault suite opens thousands): the
//! node then fails to listen and never comes up. Below the range only
//! something that asks for the port by number can take it.

use std::net::TcpListener;

/// The lowest port the tests pick from.
const LOWEST: u16 = 10_000;

/// The first port of the kernel's ephemeral range (`ip_local_port_range`), 32,768 when unreadable.
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok().and_then(|text| text.split_whitespace().next()?.parse().ok()).unwrap_or(32_768)
}

/// A port `first` such that `first + offset` is free for every offset, all
/// below the ephemeral range; tried at random places so parallel tests differ.
pub fn free_ports(offsets: &[u16]) -> std::io::Result<u16> {
    let span = offsets.iter().copied().max().unwrap_or(0);
    let top = ephemeral_start().saturating_sub(span).saturating_sub(1);
    if top <= LOWEST {
        return Err(std::io::Error::other(format!("no room below the ephemeral range for ports {LOWEST}+{offsets:?}")));
    }
    for _ in 0..500 {
        let random = u16::from_le_bytes(uuid::Uuid::new_v4().as_bytes()[..2].try_into().unwrap_or_default());
        let first = LOWEST + random % (top - LOWEST);
        if offsets.iter().all(|offset| TcpListener::bind(("127.0.0.1", first + offset)).is_ok()) {
            return Ok(first);
        }
    }
    Err(std::io::Error::other(format!("no free ports {offsets:?} apart below {top}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_free_and_below_the_ephemeral_range() {
        let first = free_ports(&[0, 1, 20_000]).unwrap();
        assert!(first >= LOWEST && first + 20_000 < ephemeral_start(), "{first}");
        for port in [first, first + 1, first + 20_000] {
            TcpListener::bind(("127.0.0.1", port)).unwrap();
        }
    }
}
