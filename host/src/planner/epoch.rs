//! The epoch ticker: the wall clock of every planner call's budget.
//!
//! wasmtime's epoch interruption stops a call once the engine's epoch passes
//! the deadline its store was given, so something must advance the epoch while
//! calls run. A thread ticking forever would wake the process hundreds of
//! times a second even when it has nothing to do; this one ticks only while a
//! call may still need it: each call, once it has set its deadline, asks for
//! ticks up to that deadline (plus [`GRACE`], so steady traffic never puts the
//! thread to sleep between calls), and the thread sleeps once they are all
//! given, until the next call wakes it. What it owes only grows: a call that
//! ends early still keeps it awake until its whole budget (and the grace) is
//! over, so after each instance start (`start_timeout`) it ticks that long.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::Duration;

/// Ticks the thread keeps making after the last deadline a call asked for.
pub(crate) const GRACE: u64 = 500;

/// Epoch ticks bound every planner call; this is their period.
const EPOCH_TICK: Duration = Duration::from_millis(2);

/// The process's one ticker, advancing the shared engine's epoch while calls need it.
static TICKER: OnceLock<Arc<Ticker>> = OnceLock::new();

/// Starts the process's ticker on `engine` (once; the engine is made once too).
pub(crate) fn start_ticking(engine: &wasmtime::Engine) {
    let ticking = engine.clone();
    TICKER.get_or_init(|| Ticker::start("planner-epoch", EPOCH_TICK, GRACE, move || ticking.increment_epoch()));
}

/// Epoch ticks for a wall-clock budget (one more, so a call never gets less).
fn deadline_ticks(budget: Duration) -> u64 {
    (budget.as_micros() / EPOCH_TICK.as_micros()).max(1) as u64 + 1
}

/// Gives `store` a deadline `budget` from now, and tells the ticker to tick
/// until then (waking it if it slept).
///
/// In this order: wasmtime counts the deadline from the epoch when it is set,
/// and the ticker's promise is counted from a tick read after that, so it
/// always reaches the deadline, however long the thread stalled in between.
pub(crate) fn set_epoch_deadline<T>(store: &mut wasmtime::Store<T>, budget: Duration) {
    let ticks = deadline_ticks(budget);
    store.set_epoch_deadline(ticks);
    if let Some(ticker) = TICKER.get() {
        ticker.keep_ticking(ticks);
    }
}

/// Whether the epoch ticker sleeps, no call having needed it for a while
/// (false before any planner is loaded).
pub fn epoch_ticker_asleep() -> bool {
    TICKER.get().is_some_and(|ticker| ticker.is_asleep())
}

/// One ticking thread and what calls have asked of it.
pub(crate) struct Ticker {
    period: Duration,
    grace: u64,
    /// Ticks made so far.
    ticks: AtomicU64,
    /// Tick count the thread must reach before it may sleep.
    needed: AtomicU64,
    asleep: AtomicBool,
    thread: OnceLock<Thread>,
}

impl Ticker {
    /// Starts a thread named `name` calling `tick` every `period` while calls need it.
    pub(crate) fn start(name: &str, period: Duration, grace: u64, tick: impl Fn() + Send + 'static) -> Arc<Ticker> {
        let ticker = Arc::new(Ticker {
            period,
            grace,
            ticks: AtomicU64::new(0),
            // Awake at first for one grace period, as if a call had just asked.
            needed: AtomicU64::new(grace),
            asleep: AtomicBool::new(false),
            thread: OnceLock::new(),
        });
        let running = ticker.clone();
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || running.run(tick)).expect("spawn the epoch ticker thread");
        ticker.thread.set(thread.thread().clone()).expect("set once, here");
        ticker
    }

    /// Called once a call has set a deadline `ticks` ahead: the thread ticks at
    /// least that far from now, woken if it slept.
    pub(crate) fn keep_ticking(&self, ticks: u64) {
        // One more: the engine's epoch may be a tick ahead of the count.
        let until = self.ticks.load(Ordering::SeqCst) + ticks + 1 + self.grace;
        self.needed.fetch_max(until, Ordering::SeqCst);
        // SeqCst on both sides: either the thread sees `needed` before it
        // parks, or this sees `asleep` and unparks it (an unpark before the
        // park makes the park return at once).
        if self.asleep.load(Ordering::SeqCst)
            && let Some(thread) = self.thread.get()
        {
            thread.unpark();
        }
    }

    /// Whether the thread is asleep (or about to be), waiting for a call.
    pub(crate) fn is_asleep(&self) -> bool {
        self.asleep.load(Ordering::SeqCst)
    }

    /// Ticks made so far.
    #[cfg(test)]
    fn ticks(&self) -> u64 {
        self.ticks.load(Ordering::SeqCst)
    }

    fn run(&self, tick: impl Fn()) {
        loop {
            tick();
            let made = self.ticks.fetch_add(1, Ordering::SeqCst) + 1;
            std::thread::sleep(self.period);
            if made < self.needed.load(Ordering::SeqCst) {
                continue;
            }
            self.asleep.store(true, Ordering::SeqCst);
            // Parks return spuriously too: sleep until a call asks for more ticks.
            while self.ticks.load(Ordering::SeqCst) >= self.needed.load(Ordering::SeqCst) {
                std::thread::park();
            }
            self.asleep.store(false, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;
    use std::time::Instant;

    use super::*;

    fn wait_for(what: &str, condition: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !condition() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn counting(grace: u64) -> (Arc<Ticker>, Arc<AtomicU64>) {
        let count = Arc::new(AtomicU64::new(0));
        let counted = count.clone();
        let ticker = Ticker::start("test-ticker", Duration::from_millis(1), grace, move || _ = counted.fetch_add(1, Ordering::SeqCst));
        (ticker, count)
    }

    #[test]
    fn with_no_calls_the_thread_sleeps_after_its_grace_and_stops_ticking() {
        let (ticker, count) = counting(5);
        wait_for("the ticker to sleep", || ticker.is_asleep());
        let slept_at = count.load(Ordering::SeqCst);
        assert!(slept_at >= 5, "it ticked its grace first: {slept_at}");
        // A window, not a wait for a condition: asleep, nothing may tick in it.
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(count.load(Ordering::SeqCst), slept_at, "no ticks while asleep");
    }

    /// A call asking just as the thread decides to sleep, or after it slept:
    /// a lost wake-up would leave a looping planner with no deadline; here it
    /// would leave `keep_ticking` without its ticks and time out. (It guards
    /// the wake-up; weaker memory orderings would most likely still pass.)
    #[test]
    fn every_call_gets_its_ticks_however_it_meets_the_thread_going_to_sleep() {
        let (ticker, count) = counting(0);
        for round in 0..300 {
            if round % 2 == 0 {
                wait_for("the ticker to sleep", || ticker.is_asleep());
            }
            let before = count.load(Ordering::SeqCst);
            ticker.keep_ticking(3);
            wait_for(&format!("3 ticks after asking in round {round}"), || count.load(Ordering::SeqCst) >= before + 3);
        }
        // Asleep, no tick is under way: every tick made was counted.
        wait_for("the ticker to sleep", || ticker.is_asleep());
        assert_eq!(ticker.ticks(), count.load(Ordering::SeqCst));
    }
}
