//! RabbitMQ's management HTTP API: the only place bindings and arguments can
//! be read (for `verify`), and where broker policies are set (for redelivery
//! on queues that already exist).

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use lapin::uri::AMQPUri;
use serde_json::Value;

/// The management API to use: `$HOURGLASS_MANAGEMENT_URL`, else the configured
/// URL (`broker.management_url`), else one derived from the AMQP URL.
pub fn management_url(amqp_url: &str, configured: Option<&str>) -> Option<String> {
    std::env::var("HOURGLASS_MANAGEMENT_URL").ok().or_else(|| configured.map(str::to_string)).or_else(|| default_management_url(amqp_url))
}

/// The management API's base URL (`http://user:pass@host:15672`) derived from
/// an AMQP URL (the first node's, when it lists several).
pub fn default_management_url(amqp_url: &str) -> Option<String> {
    let uri: AMQPUri = super::nodes::first(amqp_url).parse().ok()?;
    let user = &uri.authority.userinfo;
    Some(format!("http://{}:{}@{}:15672", user.username, user.password, uri.authority.host))
}

pub fn vhost_of(amqp_url: &str) -> String {
    super::nodes::first(amqp_url).parse::<AMQPUri>().map(|u| u.vhost).unwrap_or_else(|_| "/".into())
}

pub fn encode(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub struct Management {
    agent: ureq::Agent,
    base: String,
    authorization: String,
    vhost: String,
}

impl Management {
    pub fn new(management_url: &str, vhost: String) -> Result<Self, String> {
        let (scheme, rest) = management_url.split_once("://").ok_or("management URL needs http:// or https://")?;
        let (credentials, host) = rest.rsplit_once('@').unwrap_or(("guest:guest", rest));
        let authorization = format!("Basic {}", BASE64.encode(credentials.as_bytes()));
        let agent = ureq::Agent::config_builder().timeout_global(Some(std::time::Duration::from_secs(10))).http_status_as_error(false).build().into();
        Ok(Management { agent, base: format!("{scheme}://{}", host.trim_end_matches('/')), authorization, vhost })
    }

    /// `Ok(None)` for 404.
    pub fn get(&self, path: &str) -> Result<Option<Value>, String> {
        let url = format!("{}/api/{path}", self.base);
        let mut response = self.agent.get(&url).header("Authorization", &self.authorization).call().map_err(|e| format!("{url}: {e}"))?;
        match response.status().as_u16() {
            404 => Ok(None),
            200 => response.body_mut().read_json::<Value>().map(Some).map_err(|e| format!("{url}: {e}")),
            code => Err(format!("{url}: HTTP {code}")),
        }
    }

    pub fn object(&self, kind: &str, name: &str) -> Result<Option<Value>, String> {
        self.get(&format!("{kind}/{}/{}", encode(&self.vhost), encode(name)))
    }

    /// The vhost's queues that dead-letter into one of `exchanges`, with their
    /// messages and TTL: the queues a strategy declares per message (hold
    /// queues), which its static topology cannot list.
    pub fn queues_dead_lettering_to(&self, exchanges: &[String]) -> Result<Vec<(String, u64, Option<u64>)>, String> {
        let listed = self.get(&format!("queues/{}?columns=name,messages,arguments", encode(&self.vhost)))?.unwrap_or_default();
        let mut found: Vec<(String, u64, Option<u64>)> = listed
            .as_array()
            .into_iter()
            .flatten()
            .filter(|q| q["arguments"]["x-dead-letter-exchange"].as_str().is_some_and(|dlx| exchanges.iter().any(|e| e == dlx)))
            .filter_map(|q| Some((q["name"].as_str()?.to_string(), q["messages"].as_u64().unwrap_or(0), q["arguments"]["x-message-ttl"].as_u64())))
            .collect();
        found.sort();
        Ok(found)
    }

    pub fn bindings(&self, source: &str, target_kind: char, target: &str) -> Result<Vec<Value>, String> {
        let path = format!("bindings/{}/e/{}/{target_kind}/{}", encode(&self.vhost), encode(source), encode(target));
        Ok(self.get(&path)?.and_then(|v| v.as_array().cloned()).unwrap_or_default())
    }

    fn policy_url(&self, name: &str) -> String {
        format!("{}/api/policies/{}/{}", self.base, encode(&self.vhost), encode(name))
    }

    /// Creates or replaces the policy `name` (`PUT /api/policies/{vhost}/{name}`).
    pub fn put_policy(&self, name: &str, policy: &Value) -> Result<(), String> {
        let url = self.policy_url(name);
        let response = self.agent.put(&url).header("Authorization", &self.authorization).send_json(policy);
        succeeded(&url, response)
    }

    /// Removes the policy `name`; a policy that is not there is no error.
    pub fn delete_policy(&self, name: &str) -> Result<(), String> {
        let url = self.policy_url(name);
        match self.agent.delete(&url).header("Authorization", &self.authorization).call() {
            Ok(response) if response.status().as_u16() == 404 => Ok(()),
            response => succeeded(&url, response),
        }
    }
}

fn succeeded(url: &str, response: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Result<(), String> {
    match response.map_err(|e| format!("{url}: {e}"))?.status().as_u16() {
        200..=299 => Ok(()),
        code => Err(format!("{url}: HTTP {code}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_management_url_follows_the_amqp_url() {
        assert_eq!(default_management_url("amqp://guest:guest@127.0.0.1:5672/%2f").as_deref(), Some("http://guest:guest@127.0.0.1:15672"));
        assert_eq!(vhost_of("amqp://guest:guest@127.0.0.1:5672/%2f"), "/");
        assert_eq!(encode("/"), "%2F");
    }
}
