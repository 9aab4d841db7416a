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

    /// A service started on `config` in this process, returned once `/readyz`
    /// answers 200: every consumer it runs (ingress, release, parking queue,
    /// cancellation-log reader) attached.
    pub async fn start_ready(config: &hourglass::config::Config) -> Served {
        let served = Served::start(Service::start(config.clone()).await.expect("service starts")).await;
        crate::until("readyz 200 (every consumer running)", std::time::Duration::from_secs(10), async || {
            served.http.call("GET", "/readyz", None, None).await.0 == 200
        })
        .await;
        served
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
            let response = match method {
                "POST" | "PATCH" => {
                    let mut request = if method == "POST" { agent.post(&url) } else { agent.patch(&url) };
                    if let Some(auth) = &auth {
                        request = request.header("Authorization", auth);
                    }
                    match body {
                        Some(body) => request.send_json(body),
                        None => request.send_empty(),
                    }
                }
                _ => {
                    let mut request = if method == "DELETE" { agent.delete(&url) } else { agent.get(&url) };
                    if let Some(auth) = &auth {
                        request = request.header("Authorization", auth);
                    }
                    request.call()
                }
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

    /// [`histogram_max_bucket`] of `/metrics`.
    pub async fn histogram_max_bucket(&self, family: &str, label: &str) -> (u64, f64) {
        let (status, text) = self.call("GET", "/metrics", None, None).await;
        assert_eq!(status, 200);
        histogram_max_bucket(&text, family, label)
    }

    /// The sum of every sample of `/metrics` whose line starts with `prefix`.
    pub async fn metric(&self, prefix: &str) -> f64 {
        let (status, text) = self.call("GET", "/metrics", None, None).await;
        assert_eq!(status, 200);
        metric_sum(&text, prefix)
    }
}

/// A histogram's samples for one series (`family` without `_bucket`, and a
/// label such as `strategy="main"` its series carries): how many observations
/// it holds, and the upper bound (`le`, in the family's unit) of the lowest
/// bucket that holds all of them. The largest observation is at most that
/// bound and above the bucket below it: a bound on the worst, not a mean.
/// `(0, 0.0)` when the series has no samples yet.
pub fn histogram_max_bucket(text: &str, family: &str, label: &str) -> (u64, f64) {
    let prefix = format!("{family}_bucket{{");
    let mut buckets: Vec<(f64, u64)> = text
        .lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(label))
        .map(|l| {
            let le = l.split("le=\"").nth(1).and_then(|rest| rest.split('"').next()).unwrap_or_else(|| panic!("no le in {l:?}"));
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse::<f64>().unwrap_or_else(|_| panic!("bad le in {l:?}")) };
            let count = l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or_else(|| panic!("bad sample line {l:?}"));
            (le, count as u64)
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last().map_or(0, |b| b.1);
    if total == 0 {
        return (0, 0.0);
    }
    let bound = buckets.iter().find(|b| b.1 >= total).map_or(f64::INFINITY, |b| b.0);
    (total, bound)
}

/// Sums the samples of OpenMetrics text whose line starts with `prefix`.
pub fn metric_sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or_else(|| panic!("bad sample line {l:?}")))
        .sum()
}

/// Checks `text` is well-formed OpenMetrics/Prometheus text: every line is a
/// `# HELP`/`# TYPE`/`# UNIT` comment, the closing `# EOF`, or a sample
/// `name{label="value",…} number` of a family declared by a `# TYPE` line.
pub fn assert_prometheus_text(text: &str) {
    let mut families: Vec<String> = Vec::new();
    let valid_name =
        |n: &str| !n.is_empty() && n.chars().enumerate().all(|(i, c)| c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit()));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "the text must end with # EOF");
    for line in &lines[..lines.len() - 1] {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split(' ');
            let (name, kind) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
            assert!(valid_name(name), "bad family name in {line:?}");
            assert!(["counter", "gauge", "histogram", "summary", "unknown", "info", "stateset", "gaugehistogram"].contains(&kind), "bad type in {line:?}");
            families.push(name.to_string());
            continue;
        }
        if line.starts_with("# HELP ") || line.starts_with("# UNIT ") {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value in {line:?}"));
        assert!(value.parse::<f64>().is_ok(), "value of {line:?} is not a number");
        let name = match series.split_once('{') {
            Some((name, labels)) => {
                let labels = labels.strip_suffix('}').unwrap_or_else(|| panic!("unclosed labels in {line:?}"));
                for pair in labels.split("\",").filter(|p| !p.is_empty()) {
                    let (key, quoted) = pair.split_once('=').unwrap_or_else(|| panic!("bad label {pair:?} in {line:?}"));
                    assert!(valid_name(key) && quoted.starts_with('"'), "bad label {pair:?} in {line:?}");
                }
                name
            }
            None => series,
        };
        assert!(valid_name(name), "bad sample name in {line:?}");
        assert!(families.iter().any(|f| name.starts_with(f.as_str())), "sample {name} has no # TYPE line before it");
    }
}

#[cfg(test)]
mod tests {
    use super::{assert_prometheus_text, histogram_max_bucket};

    #[test]
    fn the_max_bucket_is_the_lowest_holding_every_observation() {
        let text = "h_bucket{strategy=\"a\",le=\"0.064\"} 2\nh_bucket{strategy=\"a\",le=\"0.128\"} 2\nh_bucket{strategy=\"a\",le=\"0.256\"} 3\nh_bucket{strategy=\"a\",le=\"+Inf\"} 3\nh_bucket{strategy=\"b\",le=\"+Inf\"} 0\n";
        assert_eq!(histogram_max_bucket(text, "h", "strategy=\"a\""), (3, 0.256));
        assert_eq!(histogram_max_bucket(text, "h", "strategy=\"b\""), (0, 0.0));
    }

    #[test]
    fn well_formed_text_passes() {
        assert_prometheus_text("# HELP a_total A.\n# TYPE a counter\na_total{q=\"x\",o=\"y\"} 3\n# EOF\n");
    }

    #[test]
    #[should_panic(expected = "no # TYPE line")]
    fn an_undeclared_sample_fails() {
        assert_prometheus_text("b_total 1\n# EOF\n");
    }

    #[test]
    #[should_panic(expected = "not a number")]
    fn a_bad_value_fails() {
        assert_prometheus_text("# TYPE a counter\na_total{q=\"x\"} many\n# EOF\n");
    }
}
