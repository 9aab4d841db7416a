//! A TCP proxy that slows what the client sends and passes the broker's
//! answers at once. A client behind it keeps frames queued while the broker's
//! replies arrive, which opens on every run the races a loaded broker opens
//! only now and then.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A running proxy; it stops when dropped.
pub struct Throttle {
    /// The broker's URL with the proxy as its host.
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Throttle {
    /// Proxies to the broker at `url`, letting through `chunk` bytes from the
    /// client per `every`.
    pub async fn start(url: &str, chunk: usize, every: Duration) -> Throttle {
        // A small receive buffer (accepted sockets inherit it) keeps the client's bytes in the client.
        let socket = TcpSocket::new_v4().expect("a socket");
        socket.set_recv_buffer_size(64 * 1024).expect("SO_RCVBUF");
        socket.bind("127.0.0.1:0".parse().unwrap()).expect("bind the throttle");
        let listener = socket.listen(16).expect("listen");
        let port = listener.local_addr().unwrap().port();
        let (upstream, url) = split_host(url, port);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&upstream).await else { return };
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    let slow = async {
                        let mut buffer = vec![0; chunk];
                        let mut ticks = tokio::time::interval(every);
                        loop {
                            ticks.tick().await;
                            match client_read.read(&mut buffer).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) if server_write.write_all(&buffer[..n]).await.is_err() => break,
                                Ok(_) => {}
                            }
                        }
                        server_write.shutdown().await.ok();
                    };
                    let fast = async {
                        tokio::io::copy(&mut server_read, &mut client_write).await.ok();
                        client_write.shutdown().await.ok();
                    };
                    tokio::join!(slow, fast);
                });
            }
        });
        Throttle { url, task }
    }
}

/// The `host:port` of `url`, and `url` with 127.0.0.1:`port` in their place.
pub(crate) fn split_host(url: &str, port: u16) -> (String, String) {
    let (scheme, rest) = url.split_once("://").expect("an AMQP URL");
    let (credentials, rest) = rest.rsplit_once('@').map_or(("", rest), |(c, r)| (c, r));
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let upstream = if host.contains(':') { host.to_string() } else { format!("{host}:5672") };
    let at = if credentials.is_empty() { "" } else { "@" };
    (upstream, format!("{scheme}://{credentials}{at}127.0.0.1:{port}{path}"))
}

impl Drop for Throttle {
    fn drop(&mut self) {
        self.task.abort();
    }
}
