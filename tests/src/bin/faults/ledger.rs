//! The ledger of one case's canaries: what was sent, what the service
//! acknowledged (HTTP 2xx, or the broker's confirm of an ingress publish) and
//! when each copy arrived, matched by the canary's id.
//!
//! Early means before the due time minus [`EARLY_WINDOW_MS`]: the suite and
//! the host read the same clock on the same machine, so the window only
//! absorbs rounding to whole milliseconds on both sides.

use std::collections::HashMap;
use std::sync::Mutex;

use hourglass::clock::unix_now_ms;

pub const EARLY_WINDOW_MS: u64 = 5;

#[derive(Default)]
struct Entry {
    /// Unix ms when it was sent.
    sent_ms: u64,
    /// Unix ms before which the canary must not arrive.
    due_ms: u64,
    acknowledged: bool,
    arrivals: Vec<u64>,
}

#[derive(Default)]
pub struct Ledger {
    entries: Mutex<HashMap<String, Entry>>,
}

/// A case's counts, as the table prints them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tally {
    pub sent: usize,
    pub acknowledged: usize,
    /// Distinct canaries that arrived (acknowledged or not).
    pub arrived: usize,
    /// Canaries that arrived more than once.
    pub duplicated: usize,
    /// Canaries whose first arrival came before their due time.
    pub early: usize,
    /// Acknowledged canaries that have not arrived.
    pub lost: usize,
    /// The latest arrival after its due time, ms.
    pub max_late_ms: u64,
    /// Sent but refused or unanswered (not a 2xx / not confirmed).
    pub refused: usize,
}

impl Ledger {
    /// A canary about to be sent, due at `due_ms` at the earliest.
    pub fn sent(&self, id: &str, due_ms: u64) {
        self.entries.lock().unwrap().insert(id.to_string(), Entry { sent_ms: unix_now_ms(), due_ms, ..Default::default() });
    }

    /// The service acknowledged it; `due_ms` is the due time it answered, if any.
    pub fn acknowledged(&self, id: &str, due_ms: Option<u64>) {
        if let Some(entry) = self.entries.lock().unwrap().get_mut(id) {
            entry.acknowledged = true;
            if let Some(due) = due_ms {
                entry.due_ms = entry.due_ms.max(due);
            }
        }
    }

    /// A copy of the canary arrived now. Unknown ids (another case's) are ignored.
    pub fn arrived(&self, id: &str) {
        let now = unix_now_ms();
        if let Some(entry) = self.entries.lock().unwrap().get_mut(id) {
            entry.arrivals.push(now);
        }
    }

    /// True when every acknowledged canary has arrived.
    pub fn complete(&self) -> bool {
        self.entries.lock().unwrap().values().all(|e| !e.acknowledged || !e.arrivals.is_empty())
    }

    /// The latest due time of an acknowledged canary.
    pub fn last_due_ms(&self) -> u64 {
        self.entries.lock().unwrap().values().filter(|e| e.acknowledged).map(|e| e.due_ms).max().unwrap_or(0)
    }

    /// The 99th percentile of lateness (first arrival after due, ms) of the
    /// acknowledged canaries sent in `[from_ms, to_ms)`, and how many there were.
    pub fn lateness_p99(&self, from_ms: u64, to_ms: u64) -> (Option<u64>, usize) {
        let entries = self.entries.lock().unwrap();
        let mut late: Vec<u64> = entries
            .values()
            .filter(|e| e.acknowledged && (from_ms..to_ms).contains(&e.sent_ms))
            .filter_map(|e| Some(e.arrivals.iter().min()?.saturating_sub(e.due_ms)))
            .collect();
        late.sort_unstable();
        let p99 = (!late.is_empty()).then(|| late[(late.len() * 99).div_ceil(100) - 1]);
        (p99, late.len())
    }

    pub fn tally(&self) -> Tally {
        let entries = self.entries.lock().unwrap();
        let mut tally = Tally { sent: entries.len(), ..Default::default() };
        for entry in entries.values() {
            tally.acknowledged += usize::from(entry.acknowledged);
            tally.refused += usize::from(!entry.acknowledged);
            if let Some(&first) = entry.arrivals.iter().min() {
                tally.arrived += 1;
                tally.duplicated += usize::from(entry.arrivals.len() > 1);
                tally.early += usize::from(first + EARLY_WINDOW_MS < entry.due_ms);
                tally.max_late_ms = tally.max_late_ms.max(first.saturating_sub(entry.due_ms));
            } else if entry.acknowledged {
                tally.lost += 1;
            }
        }
        tally
    }
}
