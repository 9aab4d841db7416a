//! The fault suite: every case runs canary traffic (valid messages from other
//! clients, through HTTP and the AMQP ingress) through one fault or bad input,
//! then checks that every acknowledged canary arrived, once unless the case
//! allows duplicates, and never before its due time; and that the bad input
//! got its documented answer. Prints a Markdown table (RELIABILITY.md quotes
//! it) and exits 1 when any case fails.
//!
//! `faults [FILTER…]` runs the cases whose name contains one of the filters.
//! Cases that kill or stop a broker use a private node (`private_node.rs`);
//! the others a private vhost on the shared broker (`HOURGLASS_TEST_AMQP_URL`).

mod broker;
mod delayed;
mod host_kill;
mod inputs;
mod load;
mod poison;
mod scale;

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use hourglass_e2e::chaos::ledger::{self, Tally};

/// One case's result: the canaries' tally and what else went wrong.
pub struct Report {
    pub name: String,
    pub tally: Tally,
    /// At-least-once cases (a host killed mid-forward) may deliver a canary twice.
    pub duplicates_allowed: bool,
    /// Fault cases: a canary sent while the broker or host is down may be refused.
    pub refusals_allowed: bool,
    /// Bad inputs that got the wrong answer, and other failed checks.
    pub problems: Vec<String>,
    /// What the case measured besides the tally (printed in the notes column).
    pub notes: Vec<String>,
    pub seconds: f64,
    /// How late a canary due outside every fault window may arrive (ms), once
    /// [`Report::judge_lateness`] ran; `None`: lateness not judged.
    pub late_bound_ms: Option<u64>,
    /// Canaries due outside every fault window later than `late_bound_ms`: how many, and the latest (ms).
    pub late_outside: (usize, u64),
}

/// How late a canary whose due time lies outside every fault window may
/// arrive (1–3 s delays on 1 s levels, through HTTP, the ingress or a delayed
/// exchange). Measured (`faults host-kill9 inputs poison delayed`, 2026-12-02,
/// debug build, other engineers' builds beside): host-kill9 max 121 ms (p99
/// 115; in the fault window max 1,689), the bad inputs 65–277 ms, poison
/// 130 ms, delayed exchange 1,018 ms with a soak starting beside it (which
/// failed a first bound of 1,000 ms). The delayed exchange again, 2026-12-03,
/// in `.ci/run` beside the 90 s soak on 4.3 (seed 1796289321549634566, whose
/// node restarts take both cores for seconds): two canaries 1,793 ms late,
/// which failed a bound of 1,500; alone, four runs: 28-30 ms. A bound of
/// 2,500 ms still fails a canary that missed a 2 s or longer hop.
pub const LATE_OUTSIDE_FAULT_MS: u64 = 2_500;

/// A note on lateness: how many, p50, p99 and max (ms).
fn lateness_note(late: &[u64]) -> String {
    if late.is_empty() {
        return "none".into();
    }
    let at = |q: usize| late[(late.len() * q).div_ceil(100).max(1) - 1];
    format!("{} canaries p50 {} ms, p99 {} ms, max {} ms", late.len(), at(50), at(99), late[late.len() - 1])
}

impl Report {
    pub fn new(name: &str) -> Report {
        Report {
            name: name.into(),
            tally: Tally::default(),
            duplicates_allowed: false,
            refusals_allowed: false,
            problems: vec![],
            notes: vec![],
            seconds: 0.0,
            late_bound_ms: None,
            late_outside: (0, 0),
        }
    }

    /// Records a failed check unless `ok`.
    pub fn check(&mut self, ok: bool, problem: impl FnOnce() -> String) {
        if !ok {
            self.problems.push(problem());
        }
    }

    /// Judges the canaries' lateness by phase: those due inside one of
    /// `windows` (Unix ms, `[from, to)`: while the fault held and until what it
    /// held up could go on) may be late by the fault; every other one must
    /// arrive within [`LATE_OUTSIDE_FAULT_MS`]. Both phases go into the notes.
    pub fn judge_lateness(&mut self, ledger: &ledger::Ledger, windows: &[(u64, u64)]) {
        let (inside, outside) = ledger.lateness_by_window(windows);
        if !windows.is_empty() {
            self.notes.push(format!("late in the fault window: {}", lateness_note(&inside)));
        }
        self.notes.push(format!("late outside it: {}", lateness_note(&outside)));
        let bound = LATE_OUTSIDE_FAULT_MS;
        let over: Vec<u64> = outside.iter().copied().filter(|late| *late > bound).collect();
        self.late_bound_ms = Some(bound);
        self.late_outside = (over.len(), outside.last().copied().unwrap_or(0));
    }

    /// Waits until `check` holds, looking every 50 ms; a failed check when it
    /// does not within `deadline`.
    pub async fn wait_until(&mut self, what: &str, deadline: std::time::Duration, mut check: impl FnMut() -> bool) {
        let end = Instant::now() + deadline;
        while !check() {
            if Instant::now() > end {
                self.problems.push(format!("{what}: not within {deadline:?}"));
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    pub fn failures(&self) -> Vec<String> {
        let t = &self.tally;
        let mut out = Vec::new();
        if t.lost > 0 {
            out.push(format!("{} acknowledged canaries lost", t.lost));
        }
        if t.early > 0 {
            out.push(format!("{} canaries early", t.early));
        }
        if t.duplicated > 0 && !self.duplicates_allowed {
            out.push(format!("{} canaries duplicated", t.duplicated));
        }
        if t.refused > 0 && !self.refusals_allowed {
            out.push(format!("{} canaries refused (not 2xx / not confirmed)", t.refused));
        }
        if let Some(bound) = self.late_bound_ms
            && self.late_outside.0 > 0
        {
            out.push(format!("{} canaries due outside the fault window more than {bound} ms late (latest {} ms)", self.late_outside.0, self.late_outside.1));
        }
        if t.acknowledged == 0 {
            out.push("no canary was acknowledged".into());
        }
        out.extend(self.problems.iter().cloned());
        out
    }
}

type CaseFuture = Pin<Box<dyn Future<Output = Vec<Report>>>>;

/// A case: its name and how to run it.
type Case = (&'static str, fn() -> CaseFuture);

/// Every case, in the order they run.
fn cases() -> Vec<Case> {
    vec![
        ("broker-kill9", || Box::pin(broker::kill9())),
        ("broker-stop-start", || Box::pin(broker::stop_start())),
        ("host-kill9", || Box::pin(host_kill::kill9())),
        ("inputs", || Box::pin(inputs::matrix())),
        ("failing-10000", || Box::pin(load::failing_in_a_row())),
        ("poison", || Box::pin(poison::at_the_head())),
        ("delayed-exchange", || Box::pin(delayed::under_faults())),
        ("idle-2000", || Box::pin(load::idle_connections())),
        ("hosts-two-kill9", || Box::pin(scale::two_hosts_one_killed())),
        ("cluster-node-kill9", || Box::pin(scale::cluster_node_killed())),
    ]
}

fn main() {
    let filters: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let mut reports = Vec::new();
    let started = Instant::now();
    print_header();
    for (name, run) in cases() {
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        eprintln!("== {name}");
        let case_started = Instant::now();
        for mut report in runtime.block_on(run()) {
            if report.seconds == 0.0 {
                report.seconds = case_started.elapsed().as_secs_f64();
            }
            let failures = report.failures();
            eprintln!("   {} {}: {}", if failures.is_empty() { "PASS" } else { "FAIL" }, report.name, failures.join("; "));
            print_row(&report);
            reports.push(report);
        }
    }
    if reports.is_empty() {
        let names: Vec<&str> = cases().iter().map(|(name, _)| *name).collect();
        eprintln!("no case matches {filters:?}; the cases are: {}", names.join(", "));
        std::process::exit(2);
    }
    println!(
        "\n{} cases in {:.0} s; canaries early if they arrive more than {} ms before due.",
        reports.len(),
        started.elapsed().as_secs_f64(),
        ledger::EARLY_WINDOW_MS
    );
    runtime.shutdown_background();
    if reports.iter().any(|r| !r.failures().is_empty()) {
        std::process::exit(1);
    }
}

fn print_header() {
    println!("| case | sent | acknowledged | arrived | duplicated | early | lost | max late (s) | result | notes |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---|---|");
}

/// One row, printed as soon as its case ends so a run cut short still shows what it did.
fn print_row(r: &Report) {
    let t = &r.tally;
    let failures = r.failures();
    let result = if failures.is_empty() { "pass" } else { "**FAIL**" };
    let notes = if failures.is_empty() {
        let mut allowed = Vec::new();
        if r.duplicates_allowed {
            allowed.push("duplicates allowed");
        }
        if r.refusals_allowed {
            allowed.push("refusals allowed while down");
        }
        allowed.into_iter().map(str::to_string).chain(r.notes.iter().cloned()).collect::<Vec<_>>().join(", ")
    } else {
        failures.join("; ").replace('|', "\\|")
    };
    println!(
        "| {} | {} | {} | {} | {} | {} | {} | {:.1} | {result} | {notes} |",
        r.name,
        t.sent,
        t.acknowledged,
        t.arrived,
        t.duplicated,
        t.early,
        t.lost,
        t.max_late_ms as f64 / 1000.0
    );
}
