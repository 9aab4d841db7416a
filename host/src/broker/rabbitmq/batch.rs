//! Confirmed publishes in batches: many publishes share a channel, and each
//! still gets an answer of its own.
//!
//! Why batches: RabbitMQ confirms a channel's publishes together (`multiple`),
//! so a few channels carrying many publishes each go much faster than many
//! channels carrying one (BENCHMARKS.md, "Ingress drain").
//!
//! Why not a free-running pipeline: lapin hands a `basic.return` to whichever
//! confirm completes next, not to the publish it came back for. So a channel
//! takes one batch at a time: the batch is sent, and every confirm in it is
//! awaited before the channel takes the next one. The broker sends a return
//! before the ack of its publish, so by then each return of the batch is
//! attached to one of the batch's confirms; it is matched back to its publish
//! by what it carries (exchange, routing key, message id, body).
//!
//! When the broker closes the channel mid-batch (a publish it refuses), every
//! publish without an answer yet fails with the same error. If several did,
//! each is sent again on a channel of its own, so the refusal reaches only the
//! publish that caused it. The executor checks what it can before the wire
//! (exchanges exist, `user-id`), so this is the rare path; a publish sent again
//! may arrive twice (at-least-once), never not at all.
//!
//! Workers share one queue of publishes; a worker that is free takes the first
//! and whatever else is waiting (up to [`MAX_BATCH`]), so under light load a
//! publish goes out alone at once, and under load batches grow by themselves.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Confirmation};
use tokio::sync::{Mutex, mpsc, oneshot};
use tokio::time::Instant;

use crate::executor::ExecutorError;

use super::channels::{LEASE_TIMEOUT, PublishPool};

/// The most publishes one channel carries at once.
pub const MAX_BATCH: usize = 256;
/// How long a publish waits for the broker's confirm before it is reported unavailable.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

/// One publish, ready for the wire.
pub struct Outgoing {
    pub exchange: String,
    pub routing_key: String,
    pub mandatory: bool,
    pub body: Vec<u8>,
    pub properties: BasicProperties,
}

/// What became of one publish.
#[derive(Debug)]
pub enum Answer {
    Confirmed,
    /// The broker returned it as unroutable.
    Returned {
        code: u16,
        text: String,
    },
    Nacked,
    NotConfirmMode,
    /// The channel or connection failed before the confirm.
    Failed(lapin::Error),
    /// No confirm within [`CONFIRM_TIMEOUT`].
    NoConfirm {
        blocked: bool,
    },
    /// No channel to publish on (the broker is unreachable or blocked, or every channel stayed busy).
    NoChannel(ExecutorError),
}

struct Job {
    outgoing: Outgoing,
    queued_at: Instant,
    reply: oneshot::Sender<Answer>,
}

/// The publishing side of the executor: hands publishes to the channel workers.
pub struct Batches {
    jobs: mpsc::Sender<Job>,
}

impl Batches {
    /// Starts one worker per channel of `pool`; they end when this is dropped.
    pub fn start(pool: Arc<PublishPool>) -> Batches {
        let (jobs, queue) = mpsc::channel(pool.size() * MAX_BATCH);
        let queue = Arc::new(Mutex::new(queue));
        for _ in 0..pool.size() {
            tokio::spawn(work(pool.clone(), queue.clone()));
        }
        Batches { jobs }
    }

    /// Publishes and waits for the broker's answer.
    pub async fn publish(&self, outgoing: Outgoing) -> Answer {
        let (reply, answer) = oneshot::channel();
        let job = Job { outgoing, queued_at: Instant::now(), reply };
        if self.jobs.send(job).await.is_err() {
            return Answer::NoChannel(stopped());
        }
        answer.await.unwrap_or_else(|_| Answer::NoChannel(stopped()))
    }
}

fn stopped() -> ExecutorError {
    ExecutorError::Unavailable("the publisher stopped".into())
}

/// One channel's loop: take what is waiting, publish it, answer each.
async fn work(pool: Arc<PublishPool>, queue: Arc<Mutex<mpsc::Receiver<Job>>>) {
    loop {
        let batch = {
            let mut queue = queue.lock().await;
            let Some(first) = queue.recv().await else { return };
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match queue.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            batch
        };
        let (batch, late): (Vec<Job>, Vec<Job>) = batch.into_iter().partition(|job| job.queued_at.elapsed() <= LEASE_TIMEOUT);
        for job in late {
            let why = format!("all {} publish channels stayed busy for {LEASE_TIMEOUT:?}", pool.size());
            job.reply.send(Answer::NoChannel(ExecutorError::Unavailable(why))).ok();
        }
        if batch.is_empty() {
            continue;
        }
        let outgoing: Vec<&Outgoing> = batch.iter().map(|job| &job.outgoing).collect();
        let mut answers = publish_batch(&pool, &outgoing).await;
        // A channel the broker closed fails its culprit with the close's soft
        // error, and the publishes beside it with that or with the channel's
        // state (closing, closed): all of those go again alone.
        let closed_by_broker = answers.iter().any(|answer| matches!(answer, Answer::Failed(e) if e.is_amqp_soft_error()));
        let unanswered: Vec<usize> = (0..answers.len()).filter(|&i| matches!(&answers[i], Answer::Failed(_))).collect();
        if closed_by_broker && unanswered.len() > 1 {
            tracing::debug!(publishes = unanswered.len(), "the broker closed a publish channel; sending each unanswered publish alone");
            for i in unanswered {
                answers[i] = publish_batch(&pool, &[outgoing[i]]).await.pop().expect("one answer per publish");
            }
        }
        for (job, answer) in batch.into_iter().zip(answers) {
            job.reply.send(answer).ok();
        }
    }
}

/// Sends `batch` on one channel and waits for every confirm: one answer per publish, in order.
async fn publish_batch(pool: &PublishPool, batch: &[&Outgoing]) -> Vec<Answer> {
    let lease = match pool.lease().await {
        Ok(lease) => lease,
        Err(err) => return batch.iter().map(|_| Answer::NoChannel(err.clone())).collect(),
    };
    let deadline = Instant::now() + CONFIRM_TIMEOUT;
    let channel = lease.channel();
    // Polled in order, so the frames and delivery tags go out in batch order.
    let sends = batch.iter().map(|publish| {
        let options = BasicPublishOptions { mandatory: publish.mandatory, ..Default::default() };
        channel.basic_publish(publish.exchange.as_str().into(), publish.routing_key.as_str().into(), options, &publish.body, publish.properties.clone())
    });
    let confirms = async {
        let sent = join_all(sends).await;
        join_all(sent.into_iter().map(|sent| async move { sent?.await })).await
    };
    let Ok(confirms) = tokio::time::timeout_at(deadline, confirms).await else {
        let blocked = lease.link().blocked();
        // Dropping the lease closes a channel whose state is unknown.
        return batch.iter().map(|_| Answer::NoConfirm { blocked }).collect();
    };
    let mut returned = Vec::new();
    let mut answers: Vec<Answer> = confirms
        .into_iter()
        .map(|confirm| match confirm {
            Ok(Confirmation::Ack(back)) => {
                returned.extend(back);
                Answer::Confirmed
            }
            Ok(Confirmation::Nack(back)) => {
                returned.extend(back);
                Answer::Nacked
            }
            Ok(Confirmation::NotRequested) => Answer::NotConfirmMode,
            Err(err) => Answer::Failed(err),
        })
        .collect();
    let clean = answers.iter().all(|answer| !matches!(answer, Answer::Failed(_)));
    attribute_returns(batch, &mut answers, returned.into_iter().map(Returned::from));
    if clean {
        lease.release();
    }
    answers
}

/// A message the broker sent back, as much of it as tells whose it is.
struct Returned {
    exchange: String,
    routing_key: String,
    message_id: Option<String>,
    body: Vec<u8>,
    code: u16,
    text: String,
}

impl From<lapin::message::BasicReturnMessage> for Returned {
    fn from(back: lapin::message::BasicReturnMessage) -> Returned {
        Returned {
            exchange: back.delivery.exchange.to_string(),
            routing_key: back.delivery.routing_key.to_string(),
            message_id: back.delivery.properties.message_id().as_ref().map(|id| id.to_string()),
            body: back.delivery.data,
            code: back.reply_code,
            text: back.reply_text.to_string(),
        }
    }
}

/// Gives each returned message to the first publish of the batch that it
/// could be and that the broker answered: two publishes alike in everything it
/// carries are interchangeable, so either may take it.
fn attribute_returns(batch: &[&Outgoing], answers: &mut [Answer], returned: impl IntoIterator<Item = Returned>) {
    for back in returned {
        let owner = (0..batch.len()).find(|&i| {
            let publish = batch[i];
            matches!(answers[i], Answer::Confirmed | Answer::Nacked)
                && back.exchange == publish.exchange
                && back.routing_key == publish.routing_key
                && back.message_id.as_deref() == publish.properties.message_id().as_ref().map(|id| id.as_str())
                && back.body == publish.body
        });
        match owner {
            Some(i) => answers[i] = Answer::Returned { code: back.code, text: back.text },
            None => tracing::error!(exchange = %back.exchange, routing_key = %back.routing_key, "the broker returned a message this batch did not send"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publish(key: &str, id: &str, body: &str) -> Outgoing {
        Outgoing {
            exchange: "levels".into(),
            routing_key: key.into(),
            mandatory: true,
            body: body.as_bytes().to_vec(),
            properties: BasicProperties::default().with_message_id(id.into()),
        }
    }

    fn returned(key: &str, id: &str, body: &str) -> Returned {
        Returned {
            exchange: "levels".into(),
            routing_key: key.into(),
            message_id: Some(id.into()),
            body: body.as_bytes().to_vec(),
            code: 312,
            text: "NO_ROUTE".into(),
        }
    }

    fn returned_at(answers: &[Answer]) -> Vec<usize> {
        (0..answers.len()).filter(|&i| matches!(answers[i], Answer::Returned { .. })).collect()
    }

    /// lapin attached the returns to other confirms (here all to the first):
    /// each still goes to the publish it came back for.
    #[test]
    fn a_return_goes_to_the_publish_it_came_back_for_whichever_confirm_carried_it() {
        let batch = [publish("a", "1", "x"), publish("b", "2", "x"), publish("a", "3", "x"), publish("c", "4", "y")];
        let batch: Vec<&Outgoing> = batch.iter().collect();
        let mut answers: Vec<Answer> = (0..4).map(|_| Answer::Confirmed).collect();
        attribute_returns(&batch, &mut answers, [returned("c", "4", "y"), returned("a", "3", "x")]);
        assert_eq!(returned_at(&answers), [2, 3]);
        assert!(matches!(&answers[3], Answer::Returned { code: 312, text } if text == "NO_ROUTE"));
    }

    /// Two publishes alike in all the broker sends back, one returned: exactly one is reported unroutable.
    #[test]
    fn of_two_identical_publishes_one_return_fails_exactly_one() {
        let batch = [publish("a", "same", "x"), publish("a", "same", "x")];
        let batch: Vec<&Outgoing> = batch.iter().collect();
        let mut answers: Vec<Answer> = (0..2).map(|_| Answer::Confirmed).collect();
        attribute_returns(&batch, &mut answers, [returned("a", "same", "x")]);
        assert_eq!(returned_at(&answers), [0]);
        attribute_returns(&batch, &mut answers, [returned("a", "same", "x")]);
        assert_eq!(returned_at(&answers), [0, 1]);
    }

    /// A publish the channel failed is sent again alone, so a return is never pinned on it;
    /// a return nothing in the batch matches changes no answer.
    #[test]
    fn failed_publishes_and_strangers_take_no_return() {
        let batch = [publish("a", "1", "x"), publish("a", "2", "x")];
        let batch: Vec<&Outgoing> = batch.iter().collect();
        let closed = lapin::Error::from(lapin::ErrorKind::InvalidChannelState(lapin::ChannelState::Closed, "basic.publish"));
        let mut answers = vec![Answer::Failed(closed), Answer::Confirmed];
        attribute_returns(&batch, &mut answers, [returned("a", "1", "x"), returned("z", "9", "q")]);
        assert!(matches!(answers[0], Answer::Failed(_)));
        assert!(matches!(answers[1], Answer::Confirmed));
    }
}
