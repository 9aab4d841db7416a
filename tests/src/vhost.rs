//! A virtual host of the test's own, for what must run under fixed names
//! (the examples' `work` queue, the NServiceBus and Celery presets) or under
//! limits of its own (`max-connections`): a random vhost on the shared broker
//! holds them, and deleting the vhost removes everything in it, so no fixed
//! name or limit is ever touched on the broker others use.

use crate::{amqp_url, management_request, unique};

pub struct PrivateVhost {
    pub name: String,
    /// The AMQP URL of the test broker, on this vhost.
    pub url: String,
}

impl PrivateVhost {
    /// Creates the vhost and gives the test broker's user every permission on it.
    pub fn create(stem: &str) -> PrivateVhost {
        let name = unique(stem);
        let base = amqp_url();
        let user = base.split("://").nth(1).and_then(|rest| rest.split(':').next()).unwrap_or("guest").to_string();
        put(&format!("/api/vhosts/{name}"), serde_json::json!({}));
        put(&format!("/api/permissions/{name}/{user}"), serde_json::json!({ "configure": ".*", "write": ".*", "read": ".*" }));
        let root = base.rsplit_once('/').map_or(base.as_str(), |(root, _)| root);
        PrivateVhost { url: format!("{root}/{name}"), name }
    }

    /// From now on the broker refuses a connection to this vhost once `connections` are open.
    pub fn limit_connections(&self, connections: u32) {
        put(&format!("/api/vhost-limits/{}/max-connections", self.name), serde_json::json!({ "value": connections }));
    }
}

impl Drop for PrivateVhost {
    fn drop(&mut self) {
        let (agent, url, authorization) = management_request(&format!("/api/vhosts/{}", self.name));
        if let Err(err) = agent.delete(&url).header("Authorization", &authorization).call() {
            eprintln!("could not delete test vhost {}: {err}", self.name);
        }
    }
}

fn put(path: &str, body: serde_json::Value) {
    let (agent, url, authorization) = management_request(path);
    agent
        .put(&url)
        .header("Authorization", &authorization)
        .send_json(body)
        .unwrap_or_else(|err| panic!("management API PUT {path}: {err}; is the management plugin on? (rabbitmq-plugins enable rabbitmq_management)"));
}
