//! A TCP proxy to the broker that can go dark: [`Blackhole::cut`] drops every
//! live connection and then accepts new ones but never answers, like a broker
//! behind a network that swallows packets; [`Blackhole::restore`] forwards
//! again. A client that connects while it is cut waits for its own timeout.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::throttle::split_host;

/// A running proxy; it stops, closing every connection, when dropped.
pub struct Blackhole {
    /// The broker's URL with the proxy as its host.
    pub url: String,
    cut: watch::Sender<bool>,
    held: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Blackhole {
    /// Forwards to the broker at `url`.
    pub async fn start(url: &str) -> Blackhole {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the blackhole");
        let (upstream, url) = split_host(url, listener.local_addr().unwrap().port());
        let (cut, watching) = watch::channel(false);
        let held = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn({
            let held = held.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    tokio::spawn(serve(client, upstream.clone(), watching.clone(), held.clone()));
                }
            }
        });
        Blackhole { url, cut, held, task }
    }

    /// Drops every live connection; new ones are accepted and never answered.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Drops the connections held unanswered, and forwards new ones again.
    pub fn restore(&self) {
        self.cut.send_replace(false);
    }

    /// Connections accepted while cut and held unanswered now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }
}

/// One client: forwarded until a cut, or held silent until a restore.
async fn serve(mut client: TcpStream, upstream: String, mut cut: watch::Receiver<bool>, held: Arc<AtomicUsize>) {
    if *cut.borrow_and_update() {
        held.fetch_add(1, Ordering::SeqCst);
        // Never read nor written; dropped on restore (or when the proxy goes).
        let _ = cut.wait_for(|cut| !*cut).await;
        held.fetch_sub(1, Ordering::SeqCst);
        return;
    }
    let Ok(mut server) = TcpStream::connect(&upstream).await else { return };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        // Dropping both sockets is the cut: the client sees its connection end.
        _ = cut.wait_for(|cut| *cut) => {}
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        // Dropping `cut` (the only sender) ends every connection's task.
        self.task.abort();
    }
}
