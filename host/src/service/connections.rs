//! Serving HTTP/1 connections with limits, so idle or slow clients cannot
//! take the API down:
//!
//! * at most `max_connections` at once: at the limit the listener stops
//!   accepting and new connections wait in the kernel's backlog, costing the
//!   process no file descriptor;
//! * `header_read_timeout`: from the moment the server waits for a request
//!   (a new connection, or after each answer on a kept-alive one) to the last
//!   header byte; a connection that sends nothing, or headers byte by byte
//!   (slowloris), is closed;
//! * `idle_timeout`: a connection on which no byte moves either way for this
//!   long (a stalled body, a client that stops reading) is closed.
//!
//! On shutdown it stops accepting, lets each connection finish the request in
//! hand, and returns once every connection closed.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::time::{Instant, Sleep};

/// Connection limits of the HTTP API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
}

impl Limits {
    /// Well under the usual 1,024 file descriptors, leaving room for the broker's connections.
    pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 512;
    pub(crate) const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
    pub(crate) const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: Self::DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: Self::DEFAULT_IDLE_TIMEOUT,
        }
    }
}

/// Serves `router` on `listener` until `stop` turns true, then waits for the
/// open connections to finish their requests and close.
pub async fn serve(listener: TcpListener, router: Router, limits: Limits, mut stop: watch::Receiver<bool>) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    let builder = Arc::new(builder);
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            () = stopped(&mut stop) => break,
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stopped(&mut stop) => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(err) => {
                // Out of file descriptors, say: wait, do not spin or give up.
                tracing::warn!(error = %err, "accepting a connection failed; retrying shortly");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(100)) => continue,
                    () = stopped(&mut stop) => break,
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(IdleTimeout::new(stream, limits.idle_timeout));
        let service = TowerToHyperService::new(router.clone());
        let (builder, mut stop) = (builder.clone(), stop.clone());
        tokio::spawn(async move {
            let connection = builder.serve_connection(io, service);
            tokio::pin!(connection);
            let served = tokio::select! {
                served = connection.as_mut() => served,
                () = stopped(&mut stop) => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(err) = served {
                tracing::debug!(error = ?err, "connection closed");
            }
            drop(slot);
        });
    }
    drop(listener);
    // Every slot back means every connection closed.
    let _all = slots.acquire_many(limits.max_connections as u32).await;
    Ok(())
}

/// Resolves once `stop` turns true (holding no borrow of it).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// A stream that fails with `TimedOut` once no byte moved either way for `idle`.
///
/// Moving bytes only notes the time; the timer is moved when it fires early.
/// Resetting it on every read and write took the runtime's timer lock twice
/// a request.
struct IdleTimeout<S> {
    inner: S,
    idle: Duration,
    last_moved: Instant,
    deadline: Pin<Box<Sleep>>,
}

impl<S> IdleTimeout<S> {
    /// Bytes written count as movement; a write still pending past the idle timeout fails.
    fn after_write(&mut self, cx: &mut Context<'_>, polled: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        match polled {
            Poll::Ready(Ok(written)) => {
                if written > 0 {
                    self.moved();
                }
                Poll::Ready(Ok(written))
            }
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(idle_error())),
            other => other,
        }
    }

    fn new(inner: S, idle: Duration) -> Self {
        IdleTimeout { inner, idle, last_moved: Instant::now(), deadline: Box::pin(tokio::time::sleep(idle)) }
    }

    fn moved(&mut self) {
        self.last_moved = Instant::now();
    }

    /// Called when the stream would block: true once `idle` passed since bytes
    /// last moved. A timer that fires sooner is set again for the rest.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        while self.deadline.as_mut().poll(cx).is_ready() {
            let due = self.last_moved + self.idle;
            if Instant::now() >= due {
                return true;
            }
            self.deadline.as_mut().reset(due);
        }
        false
    }
}

fn idle_error() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "connection idle too long")
}

impl<S: AsyncRead + Unpin> AsyncRead for IdleTimeout<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    self.moved();
                }
                Poll::Ready(result)
            }
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(idle_error())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.after_write(cx, polled)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(idle_error())),
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.after_write(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
