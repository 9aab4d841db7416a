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
    /// A cancel of it was answered 200: it must never arrive.
    cancelled: bool,
    /// A cancel of it went unanswered: it may arrive or not.
    either: bool,
    /// Found set aside with this reason (a parking, orphan or invalid queue).
    parked: Option<String>,
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
    /// Acknowledged canaries found set aside with a reason instead of arriving.
    pub parked: usize,
    /// Canaries whose cancel was answered 200 and that arrived all the same.
    pub cancelled_arrived: usize,
}

impl Entry {
    /// Acknowledged, and neither cancelled nor of unknown fate: it must arrive.
    fn expected(&self) -> bool {
        self.acknowledged && !self.cancelled && !self.either && self.parked.is_none()
    }
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

    /// A cancel of it was answered 200: from now on it must never arrive.
    pub fn cancelled(&self, id: &str) {
        if let Some(entry) = self.entries.lock().unwrap().get_mut(id) {
            entry.cancelled = true;
        }
    }

    /// A cancel of it got no clear answer: arriving and not arriving are both right.
    pub fn either(&self, id: &str) {
        if let Some(entry) = self.entries.lock().unwrap().get_mut(id) {
            entry.either = true;
        }
    }

    /// A reschedule was answered 2xx: it is due at `due_ms` now.
    pub fn rescheduled(&self, id: &str, due_ms: u64) {
        if let Some(entry) = self.entries.lock().unwrap().get_mut(id) {
            entry.due_ms = due_ms;
        }
    }

    /// It was found set aside with `reason`.
    pub fn parked(&self, id: &str, reason: &str) {
        if let Some(entry) = self.entries.lock().unwrap().get_mut(id) {
            entry.parked = Some(reason.to_string());
        }
    }

    /// The acknowledged canaries that arrived: when each was sent, due, and how late its first copy came (ms).
    pub fn lateness(&self) -> Vec<(u64, u64, u64)> {
        let entries = self.entries.lock().unwrap();
        entries
            .values()
            .filter(|e| e.acknowledged && !e.cancelled)
            .filter_map(|e| Some((e.sent_ms, e.due_ms, e.arrivals.iter().min()?.saturating_sub(e.due_ms))))
            .collect()
    }

    /// Up to `n` acknowledged canaries that have not arrived (and need to): id, sent and due (unix ms).
    pub fn missing(&self, n: usize) -> Vec<(String, u64, u64)> {
        let entries = self.entries.lock().unwrap();
        let mut missing: Vec<_> =
            entries.iter().filter(|(_, e)| e.expected() && e.arrivals.is_empty()).map(|(id, e)| (id.clone(), e.sent_ms, e.due_ms)).collect();
        missing.sort_by_key(|m| m.2);
        missing.truncate(n);
        missing
    }

    /// The `n` latest first arrivals: id and how late (ms), latest first.
    pub fn latest(&self, n: usize) -> Vec<(String, u64)> {
        let entries = self.entries.lock().unwrap();
        let mut late: Vec<_> = entries
            .iter()
            .filter(|(_, e)| e.acknowledged)
            .filter_map(|(id, e)| Some((id.clone(), e.arrivals.iter().min()?.saturating_sub(e.due_ms))))
            .collect();
        late.sort_by_key(|(_, late)| std::cmp::Reverse(*late));
        late.truncate(n);
        late
    }

    /// A copy of the canary arrived now. Unknown ids (another case's) are ignored.
    pub fn arrived(&self, id: &str) {
        let now = unix_now_ms();
        if let Some(entry) = self.entries.lock().unwrap().get_mut(id) {
            entry.arrivals.push(now);
        }
    }

    /// True when every acknowledged canary has arrived (or need not).
    pub fn complete(&self) -> bool {
        self.entries.lock().unwrap().values().all(|e| !e.expected() || !e.arrivals.is_empty())
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

    /// Acknowledged canaries whose id starts with `prefix` (one client's)
    /// still on their way: not arrived, and expected to.
    pub fn in_flight_of(&self, prefix: &str) -> usize {
        let entries = self.entries.lock().unwrap();
        entries.iter().filter(|(id, e)| id.starts_with(prefix) && e.expected() && e.arrivals.is_empty()).count()
    }

    /// Of the canaries whose id starts with `prefix` sent at or after
    /// `since_ms` (Unix ms): how many were acknowledged, and how many of those arrived.
    pub fn since(&self, prefix: &str, since_ms: u64) -> (usize, usize) {
        let entries = self.entries.lock().unwrap();
        let mine = || entries.iter().filter(|(id, e)| id.starts_with(prefix) && e.sent_ms >= since_ms && e.acknowledged).map(|(_, e)| e);
        (mine().count(), mine().filter(|e| !e.arrivals.is_empty()).count())
    }

    /// How late (ms, first arrival after due) the acknowledged canaries that
    /// arrived were, sorted, split by their due time: inside one of `windows`
    /// (Unix ms, `[from, to)`) or outside every one.
    pub fn lateness_by_window(&self, windows: &[(u64, u64)]) -> (Vec<u64>, Vec<u64>) {
        let (mut inside, mut outside) = (Vec::new(), Vec::new());
        for (_, due, late) in self.lateness() {
            if windows.iter().any(|(from, to)| (*from..*to).contains(&due)) { inside.push(late) } else { outside.push(late) }
        }
        inside.sort_unstable();
        outside.sort_unstable();
        (inside, outside)
    }

    pub fn tally(&self) -> Tally {
        self.tally_of("")
    }

    /// The tally of the canaries whose id starts with `prefix` (one client's, say).
    pub fn tally_of(&self, prefix: &str) -> Tally {
        let entries = self.entries.lock().unwrap();
        let mut tally = Tally::default();
        for entry in entries.iter().filter(|(id, _)| id.starts_with(prefix)).map(|(_, entry)| entry) {
            tally.sent += 1;
            tally.acknowledged += usize::from(entry.acknowledged);
            tally.refused += usize::from(!entry.acknowledged);
            if let Some(&first) = entry.arrivals.iter().min() {
                tally.arrived += 1;
                tally.cancelled_arrived += usize::from(entry.cancelled);
                tally.duplicated += usize::from(entry.arrivals.len() > 1);
                tally.early += usize::from(first + EARLY_WINDOW_MS < entry.due_ms);
                tally.max_late_ms = tally.max_late_ms.max(first.saturating_sub(entry.due_ms));
            } else if entry.acknowledged && entry.parked.is_some() {
                tally.parked += 1;
            } else if entry.expected() {
                tally.lost += 1;
            }
        }
        tally
    }
}
