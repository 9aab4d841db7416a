//! `hourglass serve` in the test process: a service on port 0 with a way to
//! stop it, and a small blocking HTTP client run off the async threads.

use std::sync::Arc;

use hourglass::service::{self, Service};
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A running service; `stop` shuts it down and waits for it.
pub struct Served {
    pub service: Arc<Service>,
    pub http: Http,
    stop: oneshot::Sender<()>,
    server: JoinHandle<std::io::Result<()>>,
}

impl Served {
    pub async fn start(service: Arc<Service>) -> Served {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(service::run(listener, service.clone(), async move {
            stopped.await.ok();
        }));
        Served { service, http: Http::new(&format!("http://{address}")), stop, server }
    }

    pub async fn stop(self) {
        self.stop.send(()).ok();
        self.server.await.unwrap().expect("graceful shutdown");
    }
}

#[derive(Clone)]
pub struct Http {
    pub base: String,
    agent: ureq::Agent,
}

impl Http {
    pub fn new(base: &str) -> Http {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        Http { base: base.to_string(), agent }
    }

    /// `(status, body)`; status 0 when the connection failed.
    pub async fn call(&self, method: &'static str, path: &str, token: Option<&str>, body: Option<Value>) -> (u16, String) {
        let url = format!("{}{path}", self.base);
        let agent = self.agent.clone();
        let auth = token.map(|t| format!("Bearer {t}"));
        tokio::task::spawn_blocking(move || {
            let response = if method == "POST" {
                let mut request = agent.post(&url);
                if let Some(auth) = &auth {
                    request = request.header("Authorization", auth);
                }
                match body {
                    Some(body) => request.send_json(body),
                    None => request.send_empty(),
                }
            } else {
                let mut request = agent.get(&url);
                if let Some(auth) = &auth {
                    request = request.header("Authorization", auth);
                }
                request.call()
            };
            match response {
                Ok(mut response) => (response.status().as_u16(), response.body_mut().read_to_string().unwrap_or_default()),
                Err(_) => (0, String::new()),
            }
        })
        .await
        .unwrap()
    }

    /// `POST /v1/messages`, the answer as JSON.
    pub async fn schedule(&self, token: Option<&str>, body: Value) -> (u16, Value) {
        let (status, text) = self.call("POST", "/v1/messages", token, Some(body)).await;
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// The sum of every sample of `/metrics` whose line starts with `prefix`.
    pub async fn metric(&self, prefix: &str) -> f64 {
        let (status, text) = self.call("GET", "/metrics", None, None).await;
        assert_eq!(status, 200);
        metric_sum(&text, prefix)
    }
}

/// Sums the samples of OpenMetrics text whose line starts with `prefix`.
pub fn metric_sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or_else(|| panic!("bad sample line {l:?}")))
        .sum()
}
