//! Readiness reads state and never connects. With the broker behind a network
//! that swallows packets (tests/src/blackhole.rs), every readiness check
//! answers within a second, Kubernetes' default probe timeout: before, a
//! probe opened the lost connection itself, waited on it, was cut off at one
//! second, and so stayed unready for good. Reconnecting is the
//! `broker-connections` task's job, and it needs no traffic to do it.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hourglass::broker::rabbitmq::RabbitMqExecutor;
use hourglass::config::Config;
use hourglass::service::Service;
use hourglass_e2e::blackhole::Blackhole;
use hourglass_e2e::serve::Served;
use hourglass_e2e::*;
use serde_json::Value;
use tokio::sync::watch;

/// Kubernetes' default readiness probe timeout.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// `is_ready`, failing the test unless it answers within [`PROBE_TIMEOUT`].
async fn probe(executor: &RabbitMqExecutor) -> bool {
    tokio::time::timeout(PROBE_TIMEOUT, executor.is_ready()).await.unwrap_or_else(|_| panic!("is_ready took longer than {PROBE_TIMEOUT:?}"))
}

/// Runs `keep_connected` in a task; returns how to stop it.
fn keep_connected(executor: &Arc<RabbitMqExecutor>) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let (stop, stopped) = watch::channel(false);
    let executor = executor.clone();
    (stop, tokio::spawn(async move { executor.keep_connected(stopped).await }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn is_ready_answers_at_once_while_the_broker_is_unreachable_and_the_keeper_reconnects() {
    let blackhole = Blackhole::start(&amqp_url()).await;
    let executor = Arc::new(RabbitMqExecutor::connect(&blackhole.url).await.expect("connect through the blackhole"));
    assert!(probe(&executor).await, "ready through the proxy");

    blackhole.cut();
    until("not ready after the cut", Duration::from_secs(10), async || !probe(&executor).await).await;
    // Across several steps of the reconnect backoff (250 ms, 500 ms, 1 s, 2 s): still at once, still not ready.
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(4) {
        assert!(!probe(&executor).await, "ready while the broker is unreachable");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The keeper's connect hangs on the blackhole; stop still ends it at once.
    let (stop, keeper) = keep_connected(&executor);
    until("the keeper connecting into the blackhole", Duration::from_secs(10), async || blackhole.held() > 0).await;
    assert!(!probe(&executor).await);
    stop.send(true).unwrap();
    tokio::time::timeout(PROBE_TIMEOUT, keeper).await.expect("the keeper stops promptly mid-connect").unwrap();

    blackhole.restore();
    let (stop, keeper) = keep_connected(&executor);
    until("ready again, reconnected by the keeper", Duration::from_secs(30), async || probe(&executor).await).await;
    assert!(executor.reconnects() >= 2, "both connections opened again: {}", executor.reconnects());
    stop.send(true).unwrap();
    tokio::time::timeout(PROBE_TIMEOUT, keeper).await.expect("the keeper stops promptly").unwrap();
}

/// `GET /readyz` as a probe does it: the status and body, failing the test
/// unless it answers within [`PROBE_TIMEOUT`] (the client then hangs up).
async fn readyz(base: &str) -> (u16, Value) {
    let url = format!("{base}/readyz");
    let answer = tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(PROBE_TIMEOUT)).build().into();
        let started = Instant::now();
        match agent.get(&url).call() {
            Ok(mut response) => Ok((response.status().as_u16(), response.body_mut().read_to_string().unwrap_or_default())),
            Err(err) => Err(format!("{err} after {:?}", started.elapsed())),
        }
    })
    .await
    .unwrap();
    let (status, body) = answer.unwrap_or_else(|err| panic!("/readyz did not answer within {PROBE_TIMEOUT:?}: {err}"));
    (status, serde_json::from_str(&body).unwrap_or(Value::String(body)))
}

/// Serves `config` (its broker behind `blackhole`) until ready, then cuts the
/// broker off and waits for `/readyz` to say so; the service and its HTTP base.
async fn ready_then_cut_off(config: &Config, blackhole: &Blackhole) -> (Served, String) {
    let served = Served::start(Service::start(config.clone()).await.expect("service starts")).await;
    let base = served.http.base.clone();
    until("ready", Duration::from_secs(10), async || readyz(&base).await.0 == 200).await;
    blackhole.cut();
    until("readyz 503 after the cut", Duration::from_secs(10), async || readyz(&base).await.0 == 503).await;
    (served, base)
}

/// An idle service (no canary, no ingress, no requests but `/readyz`): the
/// probe answers 503 within its timeout while the broker is unreachable, and
/// 200 again once it is back, with nothing but the keeper to reconnect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_service_answers_readyz_at_once_while_cut_off_and_reconnects_by_itself() {
    let blackhole = Blackhole::start(&amqp_url()).await;
    let prefix = unique("readyz");
    let text = config_text_on(&blackhole.url, &format!("planner = \"binary-levels\"\nprefix = \"{prefix}\""), "");
    let config = Config::parse(Path::new("readyz.toml"), text).expect("test config");
    // Deletes what the service declares (through the blackhole, on the shared broker), also when the test fails.
    let _cleanup = Cleanup::declared(&topology_of(&config));
    let (served, base) = ready_then_cut_off(&config, &blackhole).await;
    // While the keeper's connect hangs on the blackhole, probes still answer at once.
    until("the keeper connecting into the blackhole", Duration::from_secs(10), async || {
        let (status, body) = readyz(&base).await;
        assert_eq!((status, &body["broker"]), (503, &Value::Bool(false)), "{body}");
        blackhole.held() > 0
    })
    .await;

    blackhole.restore();
    until("readyz 200 again, with no other traffic", Duration::from_secs(30), async || readyz(&base).await.0 == 200).await;

    served.stop().await;
}

/// A reload while the broker is unreachable is no fault of the config: 503
/// (ask again later), not 422, and the running config stays; once the broker
/// is back the same reload is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_while_the_broker_is_unreachable_answers_503_and_applies_once_it_is_back() {
    let blackhole = Blackhole::start(&amqp_url()).await;
    let prefix = unique("reload-away");
    let text = config_text_on(&blackhole.url, &format!("planner = \"binary-levels\"\nprefix = \"{prefix}\""), "");
    let path = std::env::temp_dir().join(format!("{}.toml", unique("reload-away")));
    std::fs::write(&path, text).unwrap();
    let config = Config::load(&path).expect("test config");
    let _cleanup = Cleanup::declared(&topology_of(&config));
    let (served, base) = ready_then_cut_off(&config, &blackhole).await;
    let (status, answer) = served.http.call("POST", "/v1/reload", None, None).await;
    assert_eq!(status, 503, "{answer}");
    assert_eq!(served.http.metric("hourglass_reloads_total{outcome=\"refused\"}").await, 1.0);

    blackhole.restore();
    until("readyz 200 again", Duration::from_secs(30), async || readyz(&base).await.0 == 200).await;
    let (status, answer) = served.http.call("POST", "/v1/reload", None, None).await;
    assert_eq!(status, 200, "{answer}");

    served.stop().await;
    std::fs::remove_file(&path).ok();
}
