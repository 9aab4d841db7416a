//! Bundles: the messages a pump sends around again, several to one SQS message.
//!
//! Each visit of a cycling message costs a receive, a send and a delete; ten
//! messages share each request in a batch. The messages a pump sends back to
//! its own queue go further: they travel together as one SQS message, a
//! bundle, so from the second visit on a visit's requests are shared by every
//! message in up to ten bundles. A bundle stays within 64 KiB, the size SQS
//! bills as one request.
//!
//! A bundle carries the attribute `hourglass-bundle` (how many messages it
//! holds); its body is JSON listing each message as it would have been sent
//! alone: the identity its planner knows it by, its attributes, its body.
//! Only pumps make and open bundles: whatever reaches a destination, a
//! dead-letter queue or the planner is one message.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::{Message, MessageAttributeValue, SendMessageBatchRequestEntry};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::command::SQS_BILLED_BYTES;

/// The attribute that marks a bundle, with how many messages it holds.
pub const BUNDLE_ATTRIBUTE: &str = "hourglass-bundle";
/// SQS bills every 64 KiB of a message as one request: a bundle stays within one.
pub(crate) const MAX_BUNDLE_BYTES: usize = SQS_BILLED_BYTES;
/// The bundle body's format, so a later one can be told apart.
const FORMAT: u32 = 1;

/// One message inside a bundle.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bundled {
    /// What the planner knows the message by: its group and deduplication ids come from it.
    pub id: String,
    pub attributes: BTreeMap<String, Attribute>,
    pub body: String,
}

/// A message attribute as SQS has it: a data type and a text or binary value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attribute {
    #[serde(rename = "type")]
    pub data_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary: Option<String>,
}

/// Why a message marked as a bundle cannot be opened, or one of its messages used.
#[derive(Debug, Error)]
pub enum BundleError {
    #[error("the bundle's body is not a bundle: {0}")]
    NotJson(#[from] serde_json::Error),
    #[error("bundle format {0} is not one this host reads ({FORMAT}): a newer host made it")]
    Format(u32),
    #[error("the bundle says it holds {declared:?} messages and holds {held}; a bundle holds at least two")]
    Count { declared: Option<String>, held: usize },
    #[error("bundled attribute {name:?}: {source}")]
    Attribute { name: String, source: AttributeError },
}

/// Why a bundled attribute cannot be turned back into SQS's.
#[derive(Debug, Error)]
pub enum AttributeError {
    #[error("binary value: {0}")]
    Binary(#[source] base64::DecodeError),
    #[error(transparent)]
    Build(#[from] aws_sdk_sqs::error::BuildError),
}

#[derive(Serialize, Deserialize)]
struct Body {
    format: u32,
    messages: Vec<Bundled>,
}

impl Bundled {
    /// The message `entry` would have sent alone, known to its planner as `id`.
    pub(crate) fn of_entry(id: &str, entry: &SendMessageBatchRequestEntry) -> Bundled {
        let attributes = entry.message_attributes().into_iter().flatten().map(|(name, value)| (name.clone(), Attribute::of(value))).collect();
        Bundled { id: id.to_string(), attributes, body: entry.message_body().to_string() }
    }

    /// Its attributes as SQS's, as they were before bundling; those that
    /// cannot be turned back are left out and the first of them named.
    pub(crate) fn sqs_attributes(&self) -> (HashMap<String, MessageAttributeValue>, Option<BundleError>) {
        let mut attributes = HashMap::with_capacity(self.attributes.len());
        let mut damaged = None;
        for (name, value) in &self.attributes {
            match value.to_sqs() {
                Ok(value) => {
                    attributes.insert(name.clone(), value);
                }
                Err(source) => {
                    damaged.get_or_insert(BundleError::Attribute { name: name.clone(), source });
                }
            }
        }
        (attributes, damaged)
    }
}

impl Attribute {
    fn of(value: &MessageAttributeValue) -> Attribute {
        Attribute {
            data_type: value.data_type().to_string(),
            text: value.string_value().map(str::to_string),
            binary: value.binary_value().map(|blob| BASE64.encode(blob.as_ref())),
        }
    }

    fn to_sqs(&self) -> Result<MessageAttributeValue, AttributeError> {
        let binary = self.binary.as_deref().map(|b| BASE64.decode(b).map(Blob::new)).transpose().map_err(AttributeError::Binary)?;
        Ok(MessageAttributeValue::builder().data_type(&self.data_type).set_string_value(self.text.clone()).set_binary_value(binary).build()?)
    }
}

/// The messages in `message` when it is a bundle; `None` when it is a message of its own.
pub fn open(message: &Message) -> Option<Result<Vec<Bundled>, BundleError>> {
    let declared = message.message_attributes()?.get(BUNDLE_ATTRIBUTE)?;
    let opened = serde_json::from_str::<Body>(message.body().unwrap_or_default()).map_err(BundleError::from).and_then(|body| {
        if body.format != FORMAT {
            return Err(BundleError::Format(body.format));
        }
        let held = body.messages.len();
        if held < 2 || declared.string_value() != Some(held.to_string().as_str()) {
            return Err(BundleError::Count { declared: declared.string_value().map(str::to_string), held });
        }
        Ok(body.messages)
    });
    Some(opened)
}

/// What a pump sends to one queue: a bundle, or a message alone.
#[derive(Debug)]
pub struct Outgoing {
    pub entry: SendMessageBatchRequestEntry,
    pub size: usize,
    /// The callers' keys of the messages it carries.
    pub members: Vec<usize>,
}

/// One message to send around again: the caller's key, the identity its
/// planner knows it by, and the entry it would be sent alone with.
pub struct Candidate {
    pub key: usize,
    pub id: String,
    pub entry: SendMessageBatchRequestEntry,
    pub size: usize,
}

/// Packs messages bound for the FIFO queue `queue` into as few bundles as
/// fit 64 KiB each, in order. A message that would be alone in its bundle, or
/// that does not fit one by itself, is sent as it is, and so is everything
/// bound for a standard queue: there each message may carry a delay of its
/// own, which a bundle would lose. Entry ids are `bundle-N` and the message's own.
pub fn pack(queue: &str, candidates: Vec<Candidate>) -> Vec<Outgoing> {
    if !queue.ends_with(".fifo") {
        return candidates.into_iter().map(alone).collect();
    }
    let mut out = Vec::new();
    let mut open: Vec<(Candidate, String)> = Vec::new();
    let mut open_bytes = 0;
    // The JSON around the messages and the bundle's own attribute.
    let overhead = serde_json::to_string(&Body { format: FORMAT, messages: Vec::new() }).map_or(0, |s| s.len()) + BUNDLE_ATTRIBUTE.len() + "Number".len() + 8;
    for candidate in candidates {
        let Ok(json) = serde_json::to_string(&Bundled::of_entry(&candidate.id, &candidate.entry)) else {
            out.push(alone(candidate));
            continue;
        };
        if overhead + json.len() + 1 > MAX_BUNDLE_BYTES {
            out.push(alone(candidate));
            continue;
        }
        if overhead + open_bytes + json.len() + 1 > MAX_BUNDLE_BYTES {
            out.extend(close(&mut open, out.len()));
            open_bytes = 0;
        }
        open_bytes += json.len() + 1;
        open.push((candidate, json));
    }
    out.extend(close(&mut open, out.len()));
    out
}

fn alone(candidate: Candidate) -> Outgoing {
    Outgoing { entry: candidate.entry, size: candidate.size, members: vec![candidate.key] }
}

/// The bundle of what is open (or the one message alone); empties `open`.
fn close(open: &mut Vec<(Candidate, String)>, number: usize) -> Option<Outgoing> {
    match open.len() {
        0 => None,
        1 => open.pop().map(|(candidate, _)| alone(candidate)),
        count => {
            let members: Vec<(Candidate, String)> = std::mem::take(open);
            let body = format!("{{\"format\":{FORMAT},\"messages\":[{}]}}", members.iter().map(|(_, json)| json.as_str()).collect::<Vec<_>>().join(","));
            // The same members sent again (a pump died before its deletes and
            // the next one received the same messages) get the same id within
            // SQS's five minutes, and go around once.
            let mut dedup_ids: Vec<&str> = members.iter().map(|(c, _)| c.entry.message_deduplication_id().unwrap_or(&c.id)).collect();
            dedup_ids.sort_unstable();
            let mut digest = Sha256::new();
            for dedup_id in dedup_ids {
                digest.update(dedup_id.as_bytes());
                digest.update(b"\n");
            }
            let id = format!("bundle-{}", &hex::encode(digest.finalize())[..40]);
            let count_attribute =
                MessageAttributeValue::builder().data_type("Number").string_value(count.to_string()).build().expect("data type and value are set");
            let size = body.len() + BUNDLE_ATTRIBUTE.len() + "Number".len() + count.to_string().len();
            let entry = SendMessageBatchRequestEntry::builder()
                .id(format!("bundle-{number}"))
                .message_body(body)
                .message_attributes(BUNDLE_ATTRIBUTE, count_attribute)
                .message_group_id(&id)
                .message_deduplication_id(&id)
                .build()
                .expect("id and body are set");
            Some(Outgoing { entry, size, members: members.into_iter().map(|(candidate, _)| candidate.key).collect() })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, body: &str) -> SendMessageBatchRequestEntry {
        SendMessageBatchRequestEntry::builder()
            .id(id)
            .message_body(body)
            .message_group_id(id)
            .message_deduplication_id(format!("{id}-3"))
            .message_attributes("hourglass-cycle", MessageAttributeValue::builder().data_type("String").string_value("n=3;delay-ms=9000;to=q").build().unwrap())
            .message_attributes("blob", MessageAttributeValue::builder().data_type("Binary").binary_value(Blob::new(vec![0u8, 255, 7])).build().unwrap())
            .message_attributes("count", MessageAttributeValue::builder().data_type("Number").string_value("12").build().unwrap())
            .build()
            .unwrap()
    }

    fn candidate(key: usize, body: &str) -> Candidate {
        let id = format!("m{key}");
        let entry = entry(&id, body);
        Candidate { key, id, size: body.len(), entry }
    }

    /// What the pump receives when `outgoing` was sent: attributes and body as SQS returns them.
    fn received(outgoing: &Outgoing) -> Message {
        Message::builder().message_id("sqs-id").body(outgoing.entry.message_body()).set_message_attributes(outgoing.entry.message_attributes().cloned()).build()
    }

    #[test]
    fn messages_come_out_of_a_bundle_as_they_went_in() {
        let bodies = ["plain", "quotes \" and \\ and \u{e9}\u{1f600}", "line\nbreaks\ttabs"];
        let packed = pack("q-delay.fifo", bodies.iter().enumerate().map(|(key, body)| candidate(key, body)).collect());
        assert_eq!(packed.len(), 1, "three small messages, one bundle");
        assert_eq!(packed[0].members, [0, 1, 2]);
        let opened = open(&received(&packed[0])).expect("a bundle").expect("readable");
        for (key, bundled) in opened.iter().enumerate() {
            let alone = entry(&format!("m{key}"), bodies[key]);
            assert_eq!(bundled.id, format!("m{key}"));
            assert_eq!(bundled.body, bodies[key]);
            let (attributes, damaged) = bundled.sqs_attributes();
            assert!(damaged.is_none());
            assert_eq!(&attributes, alone.message_attributes().unwrap(), "attributes, binary ones too, unchanged");
        }
        assert!(packed[0].size <= MAX_BUNDLE_BYTES);
    }

    #[test]
    fn bundles_stay_within_64_kib_and_a_lone_or_oversized_message_goes_as_it_is() {
        let big = "x".repeat(20_000);
        let huge = "y".repeat(70_000);
        let mut candidates: Vec<Candidate> = (0..7).map(|key| candidate(key, &big)).collect();
        candidates.push(candidate(7, &huge));
        let packed = pack("q-delay.fifo", candidates);
        let shapes: Vec<&[usize]> = packed.iter().map(|o| o.members.as_slice()).collect();
        assert_eq!(
            shapes,
            [&[0, 1, 2][..], &[3, 4, 5], &[7], &[6]],
            "three of 20 KB fit 64 KiB; the 70 KB one goes alone at once, the seventh alone at the end"
        );
        for outgoing in &packed {
            let is_bundle = outgoing.entry.message_attributes().is_some_and(|a| a.contains_key(BUNDLE_ATTRIBUTE));
            assert_eq!(is_bundle, outgoing.members.len() > 1);
            assert!(!is_bundle || outgoing.entry.message_body().len() <= MAX_BUNDLE_BYTES, "{}", outgoing.entry.message_body().len());
        }
        assert!(packed[2].entry.message_body() == huge, "sent alone, unchanged");
    }

    #[test]
    fn the_same_members_make_the_same_deduplication_id_and_others_another() {
        let ids = |keys: &[usize]| {
            let packed = pack("q-delay.fifo", keys.iter().map(|key| candidate(*key, "b")).collect());
            packed[0].entry.message_deduplication_id().unwrap().to_string()
        };
        assert_eq!(ids(&[1, 2, 3]), ids(&[3, 1, 2]), "in any order");
        assert_ne!(ids(&[1, 2, 3]), ids(&[1, 2]));
        let standard = pack("q-delay", vec![candidate(1, "b"), candidate(2, "b")]);
        assert_eq!(standard.len(), 2, "no bundles on a standard queue, where each message may have its own delay");
        assert!(standard.iter().all(|o| !o.entry.message_attributes().unwrap().contains_key(BUNDLE_ATTRIBUTE)));
    }

    #[test]
    fn an_unreadable_bundle_says_why_and_a_plain_message_is_no_bundle() {
        let plain = received(&pack("q.fifo", vec![candidate(1, "b")])[0]);
        assert!(open(&plain).is_none());
        let broken = |edit: &dyn Fn(&mut SendMessageBatchRequestEntry)| {
            let mut packed = pack("q.fifo", vec![candidate(1, "b"), candidate(2, "b")]);
            edit(&mut packed[0].entry);
            open(&received(&packed[0])).unwrap().unwrap_err().to_string()
        };
        let err = broken(&|e| e.message_body = "not json".into());
        assert!(err.contains("not a bundle"), "{err}");
        let err = broken(&|e| e.message_body = e.message_body.replace("\"format\":1", "\"format\":2"));
        assert!(err.contains("newer host"), "{err}");
        let err = broken(&|e| e.message_body = r#"{"format":1,"messages":[]}"#.into());
        assert!(err.contains("holds 0"), "an empty bundle is not deleted as done: {err}");
        let err = broken(&|e| {
            e.message_attributes
                .as_mut()
                .unwrap()
                .insert(BUNDLE_ATTRIBUTE.into(), MessageAttributeValue::builder().data_type("Number").string_value("3").build().unwrap());
        });
        assert!(err.contains("holds 2"), "{err}");
    }
}
