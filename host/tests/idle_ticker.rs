//! The epoch ticker sleeps while no planner is called, and a call wakes it:
//! a planner that loops right after a quiet spell is still stopped by its
//! budget. Its own test binary, so no other test's calls keep the ticker awake.

mod common;

use std::time::{Duration, Instant};

use hourglass::planner::{PlanRequest, PlannerError, PlannerLimits, PlannerRuntime, PlannerSource, epoch_ticker_asleep};

fn request(destination: &str) -> PlanRequest {
    PlanRequest { destination: destination.into(), delay_ms: 0, message_id: "m1".into(), routing_key: None }
}

fn wait_until_asleep() {
    // The ticker keeps going for its grace (1 s) after the last call's deadline.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !epoch_ticker_asleep() {
        assert!(Instant::now() < deadline, "the epoch ticker never went to sleep with no calls");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_loop_after_a_quiet_spell_is_stopped_by_its_budget_and_the_ticker_sleeps_again() {
    let limits = PlannerLimits { call_timeout: Duration::from_millis(50), ..PlannerLimits::default() };
    let runtime = PlannerRuntime::new(limits, None).unwrap();
    let planner = std::sync::Arc::new(runtime.load(&PlannerSource::File(common::test_planner("misbehaving")), "{}".into()).unwrap());

    for _ in 0..2 {
        wait_until_asleep();
        let started = Instant::now();
        // On a thread of its own: with no ticks the loop would never end, and the test must.
        let (done, outcome) = std::sync::mpsc::channel();
        let looping = planner.clone();
        std::thread::spawn(move || done.send(looping.plan(&request("loop")).map(|_| ())).ok());
        let err = outcome.recv_timeout(Duration::from_secs(10)).expect("the looping call ended: the ticker woke").unwrap_err();
        assert!(matches!(err, PlannerError::Timeout { function: "plan", .. }), "{err}");
        // The budget, plus a tick or two and a loaded machine's scheduling.
        assert!(started.elapsed() < Duration::from_secs(2), "stopped after {:?}", started.elapsed());
        planner.plan(&request("fine")).expect("the next call works");
    }
}
