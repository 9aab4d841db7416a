//! A TCP proxy to the broker that can go dark: [`Blackhole::cut`] drops every
//! live connection and then accepts new ones but never answers, like a broker
//! behind a network that swallows packets; [`Blackhole::restore`] forwards
//! again. A client that connects while it is cut waits for its own timeout.
//! [`Blackhole::stall`] goes dark without dropping anything: what a client
//! sends from then on is read and thrown away, so a request already on its
//! way is never answered. [`Blackhole::reset`] drops every live connection
//! (stalled or not) and forwards new ones, like a proxy that dropped them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::throttle::split_host;

/// What the proxy does with connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Forward,
    /// Connections stay open; clients' bytes are swallowed and nothing comes back.
    Stall,
    /// Live connections are dropped; new ones are held unanswered.
    Cut,
}

/// The mode, and how many resets there were: a connection ends when either changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct State {
    mode: Mode,
    resets: u64,
}

/// What the proxy's connections are doing, counted.
#[derive(Clone, Default)]
struct Counts {
    /// Connections accepted while cut and held unanswered now.
    held: Arc<AtomicUsize>,
    /// Connections stalled now.
    stalled: Arc<AtomicUsize>,
    /// Bytes read from stalled connections and thrown away.
    swallowed: Arc<AtomicUsize>,
}

/// A running proxy; it stops, closing every connection, when dropped.
pub struct Blackhole {
    /// The broker's URL with the proxy as its host.
    pub url: String,
    state: watch::Sender<State>,
    counts: Counts,
    task: tokio::task::JoinHandle<()>,
}

impl Blackhole {
    /// Forwards to the broker at `url`.
    pub async fn start(url: &str) -> Blackhole {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the blackhole");
        let (upstream, url) = split_host(url, listener.local_addr().unwrap().port());
        let (state, watching) = watch::channel(State { mode: Mode::Forward, resets: 0 });
        let counts = Counts::default();
        let task = tokio::spawn({
            let counts = counts.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    tokio::spawn(serve(client, upstream.clone(), watching.clone(), counts.clone()));
                }
            }
        });
        Blackhole { url, state, counts, task }
    }

    /// Drops every live connection; new ones are accepted and never answered.
    pub fn cut(&self) {
        self.state.send_modify(|state| state.mode = Mode::Cut);
    }

    /// Keeps every connection open but passes nothing on, either way, from
    /// now on: requests already sent are never answered, new connections
    /// never hear from the broker.
    pub fn stall(&self) {
        self.state.send_modify(|state| state.mode = Mode::Stall);
    }

    /// Drops every live connection, stalled or not, and forwards new ones.
    pub fn reset(&self) {
        self.state.send_modify(|state| *state = State { mode: Mode::Forward, resets: state.resets + 1 });
    }

    /// Drops the connections held unanswered or stalled, and forwards new ones again.
    pub fn restore(&self) {
        self.state.send_modify(|state| state.mode = Mode::Forward);
    }

    /// Connections accepted while cut and held unanswered now.
    pub fn held(&self) -> usize {
        self.counts.held.load(Ordering::SeqCst)
    }

    /// Connections stalled now: from then on, what their clients send is swallowed.
    pub fn stalled(&self) -> usize {
        self.counts.stalled.load(Ordering::SeqCst)
    }

    /// Bytes clients sent on stalled connections (read and thrown away).
    pub fn swallowed(&self) -> usize {
        self.counts.swallowed.load(Ordering::SeqCst)
    }
}

/// One client: forwarded until the state changes; held silent while cut,
/// until a restore or reset; swallowed while stalled, until any change.
async fn serve(mut client: TcpStream, upstream: String, mut state: watch::Receiver<State>, counts: Counts) {
    let accepted = *state.borrow_and_update();
    let server = match accepted.mode {
        Mode::Cut => {
            counts.held.fetch_add(1, Ordering::SeqCst);
            // Never read nor written; dropped on restore or reset (or when the proxy goes).
            let _ = state.wait_for(|state| state.mode != Mode::Cut).await;
            counts.held.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        Mode::Stall => None,
        Mode::Forward => {
            let Ok(mut server) = TcpStream::connect(&upstream).await else { return };
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut server) => return,
                // Dropping both sockets is the cut: the client sees its connection end.
                _ = state.wait_for(|state| *state != accepted) => {}
            }
            Some(server)
        }
    };
    let stalled = *state.borrow_and_update();
    if stalled.mode != Mode::Stall || stalled.resets != accepted.resets {
        return;
    }
    // Both sockets stay open (the server's unread); the client's bytes go nowhere.
    let swallow = async {
        let mut buffer = [0; 4096];
        while let Ok(read @ 1..) = client.read(&mut buffer).await {
            counts.swallowed.fetch_add(read, Ordering::SeqCst);
        }
    };
    counts.stalled.fetch_add(1, Ordering::SeqCst);
    tokio::select! {
        _ = swallow => {}
        _ = state.wait_for(|state| *state != stalled) => {}
    }
    counts.stalled.fetch_sub(1, Ordering::SeqCst);
    drop(server);
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        // Dropping `state` (the only sender) ends every connection's task.
        self.task.abort();
    }
}
