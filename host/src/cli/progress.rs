//! Progress of long-running CLI work: a bar on a terminal (indicatif), plain
//! lines otherwise, so logs and CI output stay readable. Both go to stderr;
//! stdout keeps the result.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

pub struct Progress {
    bar: Option<ProgressBar>,
    total: u64,
    done: u64,
    started: Instant,
}

impl Progress {
    /// A piece of work of `total` steps.
    pub fn new(total: u64) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(total);
            let style =
                ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}").unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Progress { bar, total, done: 0, started: Instant::now() }
    }

    /// One step finished; `outcome` says what became of `item`.
    pub fn step(&mut self, item: &str, outcome: &str) {
        self.done += 1;
        match &self.bar {
            Some(bar) => {
                bar.set_message(format!("{item}: {outcome}"));
                bar.inc(1);
            }
            None => eprintln!("[{}/{}] {item}: {outcome}", self.done, self.total),
        }
    }

    /// `steps` more finished at once (a batch); a plain line names `item`.
    pub fn advance(&mut self, steps: u64, item: &str) {
        self.done += steps;
        match &self.bar {
            Some(bar) => {
                bar.set_message(item.to_string());
                bar.inc(steps);
            }
            None => eprintln!("[{}/{}] {item}", self.done, self.total),
        }
    }

    /// Clears the bar; the caller prints its summary after.
    pub fn finish(self) -> Duration {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
        self.started.elapsed()
    }
}
