//! Waits that give way to the stop signal (a `watch` that turns true): the
//! receive loops of the SQS tasks run one receive, or one pause after a
//! failed one, at a time, and must drop it as soon as the service stops.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;

/// `work`'s output, or `None` when `stop` changes first (a long poll in hand is dropped).
pub(crate) async fn unless_stopped<T>(stop: &mut watch::Receiver<bool>, work: impl Future<Output = T>) -> Option<T> {
    tokio::select! {
        output = work => Some(output),
        _ = stop.changed() => None,
    }
}

/// Sleeps `pause`; `false` when `stop` changed meanwhile.
pub(crate) async fn pause_unless_stopped(stop: &mut watch::Receiver<bool>, pause: Duration) -> bool {
    unless_stopped(stop, tokio::time::sleep(pause)).await.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stop signal that turns true after `after`.
    fn stopping_after(after: Duration) -> watch::Receiver<bool> {
        let (stopping, stop) = watch::channel(false);
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            stopping.send_replace(true);
            // Kept open: a dropped sender also ends the waits, which is not what is tested.
            std::future::pending::<()>().await;
        });
        stop
    }

    #[tokio::test(start_paused = true)]
    async fn work_and_pauses_run_out_unless_the_stop_comes_first() {
        let mut stop = stopping_after(Duration::from_secs(10));
        assert_eq!(unless_stopped(&mut stop, async { 7 }).await, Some(7));
        assert!(pause_unless_stopped(&mut stop, Duration::from_secs(1)).await, "no stop yet: the whole pause");
        assert_eq!(unless_stopped(&mut stop, std::future::pending::<()>()).await, None);

        let mut stop = stopping_after(Duration::from_secs(1));
        let started = tokio::time::Instant::now();
        assert!(!pause_unless_stopped(&mut stop, Duration::from_secs(3_600)).await);
        assert_eq!(started.elapsed(), Duration::from_secs(1));
    }
}
