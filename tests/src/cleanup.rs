//! Deleting a test's own broker objects whether it passes or fails: a failing
//! run that left its quorum queues behind (each holds file handles on the
//! broker) once kept every new AMQP connection out for half an hour.

use std::sync::Mutex;

use hourglass::broker::rabbitmq::manage::{encode, vhost_of};
use hourglass::broker::rabbitmq::parked::orphan_queue;
use hourglass::command::{AmqpCommand, Command, parking_queues};
use hourglass::config::Config;

use crate::{amqp_url, management_request};

/// Queues, exchanges, policies and users a test made, deleted when this is dropped:
/// at the end of a test that passed and while one that failed unwinds. Drop
/// cannot await, so the deletes go through the management API's blocking
/// client. Make it before anything it names is declared, so it is dropped
/// after the hosts and consumers the test started (a dropped
/// [`Served`](crate::serve::Served) begins its shutdown).
#[derive(Default)]
pub struct Cleanup {
    /// `(kind in the management API's paths, name)`.
    objects: Mutex<Vec<(&'static str, String)>>,
}

impl Cleanup {
    /// The queues and exchanges `commands` declare.
    pub fn declared(commands: &[Command]) -> Cleanup {
        let cleanup = Cleanup::default();
        cleanup.also_declared(commands);
        cleanup
    }

    /// The queues and exchanges `commands` declare, beside those named
    /// already, and the orphan queue a serving host declares beside each
    /// parking queue among them.
    pub fn also_declared(&self, commands: &[Command]) {
        for command in commands {
            match command {
                Command::Amqp(AmqpCommand::DeclareQueue { name, .. }) => self.queue(name),
                Command::Amqp(AmqpCommand::DeclareExchange { name, .. }) => self.exchange(name),
                _ => {}
            }
        }
        for parking in parking_queues(commands) {
            self.queue(&orphan_queue(&parking));
        }
    }

    /// The queues of `config`'s AMQP ingress, if it is on (off, its default
    /// queues have fixed names a test must never touch on a shared broker).
    pub fn ingress(&self, config: &Config) {
        let ingress = &config.service.ingress;
        if ingress.enabled {
            self.queue(&ingress.queue);
            self.queue(&ingress.invalid_queue);
        }
    }

    pub fn queue(&self, name: &str) {
        self.add("queues", name);
    }

    pub fn exchange(&self, name: &str) {
        self.add("exchanges", name);
    }

    pub fn policy(&self, name: &str) {
        self.add("policies", name);
    }

    /// A RabbitMQ user (users belong to no vhost).
    pub fn user(&self, name: &str) {
        self.add("users", name);
    }

    fn add(&self, kind: &'static str, name: &str) {
        self.objects.lock().unwrap_or_else(|p| p.into_inner()).push((kind, name.to_string()));
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let vhost = encode(&vhost_of(&amqp_url()));
        for (kind, name) in self.objects.get_mut().unwrap_or_else(|p| p.into_inner()).drain(..) {
            let path = match kind {
                "users" => format!("/api/users/{}", encode(&name)),
                _ => format!("/api/{kind}/{vhost}/{}", encode(&name)),
            };
            let (agent, url, authorization) = management_request(&path);
            match agent.delete(&url).header("Authorization", &authorization).call() {
                Ok(_) | Err(ureq::Error::StatusCode(404)) => {}
                // No panic here: this may run while a failed test unwinds, where a second panic aborts.
                Err(err) => eprintln!("could not delete the test's {kind} {name}: {err}"),
            }
        }
    }
}
