//! Cancel and reschedule on SQS: a per-message log in a FIFO "fates" queue,
//! decided by whatever is at the head of the message's group.
//!
//! SQS has no shared log a host can read without consuming it, but a FIFO
//! queue gives two things per message group: an order every writer agrees on
//! (the order SQS accepted the sends), and *the head*: a receive that returns
//! a group's messages returns them oldest first, starting with the oldest one
//! not yet deleted, and returns none of them while one of them is in flight.
//! So the first message of a group in a receive is the oldest the group still
//! holds, whoever received it. The fates queue has one group per message id,
//! and four kinds of entry ([`Entry`]):
//!
//! * `cancel` and `reschedule`, sent by `DELETE` / `PATCH`;
//! * `claim`: the message itself, sent when its delay ended (by the host that
//!   received it, due, from the strategy's release queue);
//! * `released`: sent behind a claim once the claim was forwarded.
//!
//! **The head decides** ([`decide`]): a cancel at the head means nothing in
//! the group was released before it, so every claim behind it is dropped; a
//! claim at the head means nothing cancelled it first, so it is forwarded; a
//! `released` marker at the head answers later cancels `409`. An entry that
//! becomes the head stays in the group (held in flight, and received again
//! from time to time) for as long as it must answer what comes behind it;
//! entries behind a head are answered and deleted. Deletes go newest first,
//! so a host killed halfway leaves a group whose head still says the same.
//!
//! A claim at the head cannot be deleted when it is forwarded: a cancel sent
//! meanwhile would become the head and be answered 200. So the forwarding host
//! sends a `released` marker behind the claim (a fence) and makes the claim
//! visible again; when the claim is next received *with* its marker behind it,
//! everything between them came after the release (409) and the claim is
//! deleted, leaving the marker at the head. Safety needs only the head rule;
//! progress needs a receive to return the head together with what follows it,
//! which SQS attempts for FIFO groups without promising it, and the local
//! server does only while fewer than ten older entries are in the way. So a
//! claim received again without its fence is held, not forwarded again:
//! always when this host forwarded it, and once when SQS counted a receive of
//! it that was not this host's (another host may have forwarded it). One this
//! host received before and did not forward (its round failed) goes on at
//! once, and one that comes back a third time without its fence is forwarded
//! again: a duplicate only when its forwarder died before the fence or the
//! fence stayed out of reach, never a loss, never early.
//!
//! This module is the pure rule; the queue's I/O carries out its [`Decision`].

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cancellation::Answer;

/// The message attribute an entry's kind travels in (one, to leave a claim's
/// own attributes within SQS's ten).
pub const FATE_ATTRIBUTE: &str = "hourglass-fate";

/// What a claim adds to a message (its [`FATE_ATTRIBUTE`] with the strategy's
/// name, at most 62 characters as `hourglass-release-<strategy>` must be an
/// SQS queue name), at most: a message of a cancellable strategy keeps this
/// much and one attribute free from its first send, or its claim would be
/// refused forever.
pub(crate) const CLAIM_BYTES: usize = 128;

/// How long a head is first held before it is received again to answer what
/// queued behind it; doubled on each receive up to [`LONGEST_HOLD`].
pub(crate) const FIRST_HOLD: Duration = Duration::from_secs(5);
/// How long a reschedule at the head is held around its new due time, when its claim is about to come.
pub(crate) const MEETING_HOLD: Duration = Duration::from_secs(1);
/// The longest a head is held: a second cancel of a cancelled message waits at most this long for its answer.
pub const LONGEST_HOLD: Duration = Duration::from_secs(15 * 60);

/// The message group of message `id`: the id itself when SQS takes it as a
/// group id (at most 128 printable ASCII characters), else a digest of it.
pub(crate) fn group_of(id: &str) -> String {
    if !id.is_empty() && id.len() <= 128 && id.chars().all(|c| c.is_ascii_graphic()) {
        return id.to_string();
    }
    use sha2::Digest;
    format!("sha256-{}", hex::encode(sha2::Sha256::digest(id.as_bytes())))
}

/// One entry of a message's group in the fates queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "fate", rename_all = "snake_case")]
pub enum Entry {
    /// Never deliver the message. `reply`: the queue the asking host waits on for the answer.
    Cancel {
        token: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reply: Option<String>,
    },
    /// Deliver it at `due_at_ms` (Unix ms, SQS's clock) instead.
    Reschedule {
        token: String,
        due_at_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reply: Option<String>,
    },
    /// The message, due: its body and other attributes are the message's own;
    /// `strategy`: the one it goes round again if a reschedule moved it later.
    Claim {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        strategy: Option<String>,
    },
    /// The claim ahead of this marker was forwarded to its destination.
    Released,
}

/// A fates-queue attribute hourglass did not write.
#[derive(Debug, thiserror::Error)]
#[error("{FATE_ATTRIBUTE} attribute {text:?} is not an entry: {source}")]
pub struct NotAnEntry {
    pub text: String,
    pub source: serde_json::Error,
}

impl Entry {
    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("an entry is plain data")
    }

    pub fn decode(text: &str) -> Result<Entry, NotAnEntry> {
        serde_json::from_str(text).map_err(|source| NotAnEntry { text: text.to_string(), source })
    }

    /// Who waits for the answer to this entry, and under which token.
    pub fn asker(&self) -> Option<(&str, Option<&str>)> {
        match self {
            Entry::Cancel { token, reply } | Entry::Reschedule { token, reply, .. } => Some((token, reply.as_deref())),
            Entry::Claim { .. } | Entry::Released => None,
        }
    }
}

/// An entry as received: oldest first within its group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub entry: Entry,
    /// SQS's `ApproximateReceiveCount`: 1 the first time it is received.
    pub receive_count: u32,
    /// SQS's `SentTimestamp`.
    pub sent_ms: u64,
    /// How many of the receives SQS counted before this one were this host's
    /// (of a claim; it remembers them for a while).
    pub received_here: u32,
    /// A claim this host forwarded and fenced itself (it remembers them for a while).
    pub forwarded_here: bool,
}

/// What to do with one group's received entries (indexes into them). The
/// I/O carries it out in this order: answers, forwards and replans; then the
/// fence; then the deletes, in the order given (newest first); then the
/// head's hold and the reveals. A failure stops it there: what is left
/// comes back and is decided again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// Answers to send to the entry's asker.
    pub answers: Vec<(usize, Answer)>,
    /// Claims to forward to their destination.
    pub forward: Vec<usize>,
    /// Claims to send round their strategy again, due at the time given.
    pub replan: Vec<(usize, u64)>,
    /// Claims dropped because they were cancelled (deleted below; counted).
    pub dropped: Vec<usize>,
    /// Send a `released` marker behind everything in the group.
    pub fence: bool,
    /// Entries to delete, newest first.
    pub delete: Vec<usize>,
    /// The entry left at the head, held in flight this long.
    pub hold: Option<(usize, Duration)>,
    /// Entries to make visible again at once.
    pub reveal: Vec<usize>,
}

/// What the head says about the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Cancelled,
    Rescheduled {
        due_at_ms: u64,
    },
    /// A `released` marker.
    Released,
    /// A claim nothing cancelled: forwarded unless its fence follows it.
    Claimed,
}

/// How long a head is held on its `receive_count`-th receive.
pub(crate) fn hold_for(receive_count: u32) -> Duration {
    let doublings = receive_count.saturating_sub(1).min(16);
    (FIRST_HOLD * 2u32.pow(doublings)).min(LONGEST_HOLD)
}

/// Decides one group's received entries (`seen[0]` is its head). `now_ms`:
/// SQS's clock, read no later than it is; `remember_ms`: how long a
/// `released` marker answers cancels `409` before it is deleted.
pub fn decide(seen: &[Seen], now_ms: u64, remember_ms: u64) -> Decision {
    let mut decision = Decision::default();
    let Some(first) = seen.first() else { return decision };
    let first_time = |i: usize| seen[i].receive_count <= 1;
    let mut head = 0;
    let mut state = match first.entry {
        Entry::Cancel { .. } => State::Cancelled,
        Entry::Reschedule { due_at_ms, .. } => State::Rescheduled { due_at_ms },
        Entry::Released => State::Released,
        Entry::Claim { .. } => State::Claimed,
    };
    // A request at the head is answered once: the first time it is seen there.
    // (A host killed before answering leaves its asker to time out and ask again.)
    match (&first.entry, first_time(0)) {
        (Entry::Cancel { .. }, true) => decision.answers.push((0, Answer::Cancelled)),
        (Entry::Reschedule { .. }, true) => decision.answers.push((0, Answer::Rescheduled)),
        _ => {}
    }
    for (i, seen_i) in seen.iter().enumerate().skip(1) {
        match (state, &seen_i.entry) {
            (State::Cancelled, Entry::Cancel { .. } | Entry::Reschedule { .. }) => {
                decision.answers.push((i, Answer::AlreadyCancelled));
                decision.delete.push(i);
            }
            (State::Cancelled, Entry::Claim { .. }) => {
                decision.dropped.push(i);
                decision.delete.push(i);
            }
            (State::Released | State::Claimed, Entry::Cancel { .. } | Entry::Reschedule { .. }) => {
                decision.answers.push((i, Answer::AlreadyReleased));
                decision.delete.push(i);
            }
            // A claim behind one that goes, or went, on: another copy of the
            // message (a send SQS did not deduplicate, or the id used again). Never lost: it goes on too.
            (State::Released | State::Claimed, Entry::Claim { .. }) => {
                decision.forward.push(i);
                decision.delete.push(i);
            }
            // The head claim's fence: it was forwarded, and the marker takes over the head.
            (State::Claimed, Entry::Released) => {
                decision.delete.push(head);
                head = i;
                state = State::Released;
            }
            (State::Cancelled | State::Released | State::Rescheduled { .. }, Entry::Released) => decision.delete.push(i),
            (State::Rescheduled { .. }, Entry::Cancel { .. }) => {
                decision.answers.push((i, Answer::Cancelled));
                decision.delete.push(head);
                head = i;
                state = State::Cancelled;
            }
            (State::Rescheduled { .. }, Entry::Reschedule { due_at_ms, .. }) => {
                decision.answers.push((i, Answer::Rescheduled));
                decision.delete.push(head);
                head = i;
                state = State::Rescheduled { due_at_ms: *due_at_ms };
            }
            // Claimed before its new due time: round the strategy again; the reschedule stays to meet the next claim.
            // "Before" by the claim's own SentTimestamp, not by now: every round (on any host,
            // whatever its clock) then decides this claim alike, so an answer given to an entry
            // behind it (a cancel's 200) stays true if this round dies before the claim is deleted.
            (State::Rescheduled { due_at_ms }, Entry::Claim { .. }) if due_at_ms > seen[i].sent_ms => {
                decision.replan.push((i, due_at_ms));
                decision.delete.push(i);
            }
            // Claimed at or after it: the reschedule is spent, and the claim is the head.
            (State::Rescheduled { .. }, Entry::Claim { .. }) => {
                decision.delete.push(head);
                head = i;
                state = State::Claimed;
            }
        }
    }
    match state {
        // This host forwarded it and sent its fence, which this receive did not
        // reach (a receive returns at most ten entries, and need not keep a
        // group's together): forwarding it again would be a duplicate. Held,
        // so other groups' entries come forward and it comes back with its fence.
        State::Claimed if seen[head].forwarded_here => decision.hold = Some((head, hold_for(seen[head].receive_count))),
        // Received once before, not by this host, and without its fence in this
        // receive: most likely forwarded by another host, whose fence is out of
        // reach. Held once so it comes back with it; forwarded only if it comes
        // back without it again (its forwarder died before the fence: late,
        // never lost). Received before by this host and not forwarded (its
        // round failed), nobody else has seen it: it goes on now.
        State::Claimed if seen[head].receive_count == 2 && seen[head].received_here == 0 => decision.hold = Some((head, FIRST_HOLD)),
        State::Claimed => {
            // Nothing ahead cancelled it, and its fence is not in hand: forward it
            // (again, if its fence was sent but not received with it), fence it,
            // and let it come back with the fence.
            decision.forward.push(head);
            decision.fence = true;
            decision.reveal.push(head);
        }
        State::Released if now_ms.saturating_sub(seen[head].sent_ms) > remember_ms => decision.delete.push(head),
        State::Released => {
            let left = Duration::from_millis(remember_ms.saturating_sub(now_ms.saturating_sub(seen[head].sent_ms)) + 1_000);
            decision.hold = Some((head, hold_for(seen[head].receive_count).min(left)));
        }
        State::Cancelled => decision.hold = Some((head, hold_for(seen[head].receive_count))),
        // Its claim comes back at its new due time: be there to meet it then,
        // not a doubled hold later (that would make the message late by it).
        State::Rescheduled { due_at_ms } => {
            let passed = Duration::from_millis(now_ms.saturating_sub(due_at_ms));
            let hold = match due_at_ms.checked_sub(now_ms) {
                Some(ahead) => hold_for(seen[head].receive_count).min(Duration::from_millis(ahead) + MEETING_HOLD),
                // Its claim comes a second or two after its due time: looked for every second for a minute.
                None if passed < Duration::from_secs(60) => MEETING_HOLD,
                None if passed < LONGEST_HOLD => FIRST_HOLD,
                // A reschedule of an id never scheduled: back off again.
                None => hold_for(seen[head].receive_count),
            };
            decision.hold = Some((head, hold));
        }
    }
    // Newest first: a host killed between two deletes leaves a head that still says the same.
    decision.delete.sort_unstable_by(|a, b| b.cmp(a));
    decision.delete.dedup();
    decision
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_with_the_longest_strategy_name_fits_the_room_kept_for_it() {
        let claim = Entry::Claim { strategy: Some("s".repeat(80 - "hourglass-release-".len())) };
        assert!(FATE_ATTRIBUTE.len() + "String".len() + claim.encode().len() <= CLAIM_BYTES, "{}", claim.encode());
    }

    const NOW: u64 = 1_000_000;
    const REMEMBER: u64 = 600_000;

    fn cancel(n: u32) -> Seen {
        Seen { entry: Entry::Cancel { token: "t".into(), reply: None }, receive_count: n, sent_ms: NOW - 1, received_here: 0, forwarded_here: false }
    }
    fn reschedule(due_at_ms: u64, n: u32) -> Seen {
        Seen {
            entry: Entry::Reschedule { token: "t".into(), due_at_ms, reply: None },
            receive_count: n,
            sent_ms: NOW - 1,
            received_here: 0,
            forwarded_here: false,
        }
    }
    fn claim(n: u32) -> Seen {
        Seen { entry: Entry::Claim { strategy: None }, receive_count: n, sent_ms: NOW - 1, received_here: 0, forwarded_here: false }
    }
    fn released(n: u32, sent_ms: u64) -> Seen {
        Seen { entry: Entry::Released, receive_count: n, sent_ms, received_here: 0, forwarded_here: false }
    }

    #[test]
    fn a_cancel_at_the_head_drops_every_claim_behind_it_and_stays() {
        let d = decide(&[cancel(1), claim(1), cancel(1), reschedule(NOW + 5, 1)], NOW, REMEMBER);
        assert_eq!(d.answers, vec![(0, Answer::Cancelled), (2, Answer::AlreadyCancelled), (3, Answer::AlreadyCancelled)]);
        assert_eq!((d.dropped, d.forward, d.fence), (vec![1], vec![], false));
        assert_eq!(d.delete, vec![3, 2, 1], "newest first; the head stays");
        assert_eq!(d.hold, Some((0, FIRST_HOLD)));
        let again = decide(&[cancel(4)], NOW, REMEMBER);
        assert!(again.answers.is_empty(), "answered once, the first time it is the head");
        assert_eq!(again.hold, Some((0, FIRST_HOLD * 8)));
    }

    #[test]
    fn a_claim_at_the_head_is_forwarded_fenced_and_kept_until_its_fence_comes_back_with_it() {
        let d = decide(&[claim(1)], NOW, REMEMBER);
        assert_eq!((d.forward.clone(), d.fence, d.reveal.clone(), d.delete.clone()), (vec![0], true, vec![0], vec![]));
        // A cancel sent after the claim, before its fence: 409, never 200.
        let d = decide(&[claim(2), cancel(1), released(1, NOW)], NOW, REMEMBER);
        assert_eq!(d.answers, vec![(1, Answer::AlreadyReleased)]);
        assert!(d.forward.is_empty() && !d.fence, "its fence is in hand: it was forwarded");
        assert_eq!(d.delete, vec![1, 0], "the cancel before the claim, so the claim never leaves it at the head");
        assert_eq!(d.hold, Some((2, FIRST_HOLD)));
    }

    #[test]
    fn a_claim_seen_again_without_its_fence_is_held_once_then_forwarded_again_never_dropped() {
        let once = decide(&[claim(2), cancel(1)], NOW, REMEMBER);
        assert_eq!(once.answers, vec![(1, Answer::AlreadyReleased)]);
        assert!(once.forward.is_empty() && !once.fence, "{once:?}");
        assert_eq!(once.hold, Some((0, FIRST_HOLD)), "it may come back with its fence");
        let twice = decide(&[claim(3), cancel(1)], NOW, REMEMBER);
        assert_eq!(twice.answers, vec![(1, Answer::AlreadyReleased)]);
        assert_eq!((twice.forward, twice.fence), (vec![0], true));
    }

    /// SQS's receive count says whether anyone received a claim before; only
    /// a receive this host did not make says someone else may have forwarded it.
    #[test]
    fn a_claim_this_host_received_before_and_did_not_forward_goes_on_at_once_not_held() {
        // Its first round here failed before the forward (the destination was
        // gone, SQS refused): back after its visibility timeout, seen only here.
        let retried = decide(&[Seen { received_here: 1, ..claim(2) }], NOW, REMEMBER);
        assert_eq!((retried.forward, retried.fence, retried.reveal, retried.hold), (vec![0], true, vec![0], None));
        // SQS counted a receive this host did not make: another host's, which may have forwarded it.
        let elsewhere = decide(&[claim(2)], NOW, REMEMBER);
        assert_eq!((elsewhere.forward, elsewhere.hold), (vec![], Some((0, FIRST_HOLD))));
        // Held here once after another host's receive: the third receive forwards it, as before.
        let third = decide(&[Seen { received_here: 1, ..claim(3) }], NOW, REMEMBER);
        assert_eq!((third.forward, third.fence), (vec![0], true));
    }

    #[test]
    fn a_claim_this_host_fenced_is_not_forwarded_again_when_its_fence_is_out_of_reach() {
        let mine = Seen { received_here: 1, forwarded_here: true, ..claim(2) };
        let d = decide(&[mine.clone(), cancel(1)], NOW, REMEMBER);
        assert_eq!(d.answers, vec![(1, Answer::AlreadyReleased)], "it was forwarded before the cancel was seen");
        assert!(d.forward.is_empty() && !d.fence && d.reveal.is_empty(), "{d:?}");
        assert_eq!(d.hold, Some((0, hold_for(2))));
        let with_fence = decide(&[mine, released(1, NOW)], NOW, REMEMBER);
        assert_eq!((with_fence.delete, with_fence.hold), (vec![0], Some((1, FIRST_HOLD))));
    }

    #[test]
    fn a_released_marker_answers_409_until_it_is_forgotten() {
        let d = decide(&[released(2, NOW - 1_000), cancel(1), claim(1)], NOW, REMEMBER);
        assert_eq!(d.answers, vec![(1, Answer::AlreadyReleased)]);
        assert_eq!(d.forward, vec![2], "another copy of a released message goes on");
        assert_eq!(d.delete, vec![2, 1]);
        assert_eq!(d.hold, Some((0, hold_for(2))));
        let old = decide(&[released(9, NOW - REMEMBER - 1)], NOW, REMEMBER);
        assert_eq!((old.delete, old.hold), (vec![0], None));
        let late = decide(&[released(9, NOW - REMEMBER + 2_000)], NOW, REMEMBER);
        assert_eq!(late.hold, Some((0, Duration::from_millis(3_000))), "not held past the window");
    }

    #[test]
    fn a_reschedule_holds_claims_until_its_due_time_then_gives_the_head_to_the_claim() {
        let early = decide(&[reschedule(NOW + 60_000, 1), claim(1)], NOW, REMEMBER);
        assert_eq!(early.answers, vec![(0, Answer::Rescheduled)]);
        assert_eq!((early.replan, early.delete, early.hold), (vec![(1, NOW + 60_000)], vec![1], Some((0, FIRST_HOLD))));
        let due = decide(&[reschedule(NOW - 1, 3), claim(1)], NOW, REMEMBER);
        assert_eq!((due.forward, due.fence, due.reveal, due.delete), (vec![1], true, vec![1], vec![0]));
        let cancelled = decide(&[reschedule(NOW + 60_000, 2), cancel(1), claim(1)], NOW, REMEMBER);
        assert_eq!(cancelled.answers, vec![(1, Answer::Cancelled)]);
        assert_eq!((cancelled.dropped, cancelled.delete, cancelled.hold), (vec![2], vec![2, 0], Some((1, FIRST_HOLD))));
        let moved = decide(&[reschedule(NOW + 60_000, 2), reschedule(NOW + 90_000, 1), claim(1)], NOW, REMEMBER);
        assert_eq!(moved.answers, vec![(1, Answer::Rescheduled)]);
        assert_eq!(moved.replan, vec![(2, NOW + 90_000)], "the newest reschedule wins");
    }

    /// A cancel behind a reschedule and a claim made before the new due time is
    /// answered 200 while the claim goes round again. If that round dies before the
    /// claim is deleted, the group comes back after the new due time: the claim
    /// must be decided the same way (it was made before it), or the cancelled
    /// message would be forwarded.
    #[test]
    fn a_claim_made_before_a_new_due_time_goes_round_again_in_every_round_so_a_cancel_behind_it_holds() {
        let first = decide(&[reschedule(NOW + 60_000, 1), claim(1), cancel(1)], NOW, REMEMBER);
        assert_eq!(first.answers, vec![(0, Answer::Rescheduled), (2, Answer::Cancelled)]);
        assert_eq!(first.replan, vec![(1, NOW + 60_000)]);
        let after_a_kill = decide(&[reschedule(NOW + 60_000, 2), claim(2), cancel(2)], NOW + 120_000, REMEMBER);
        assert!(after_a_kill.forward.is_empty(), "the cancelled message is not forwarded: {:?}", after_a_kill.forward);
        assert_eq!(after_a_kill.replan, vec![(1, NOW + 60_000)]);
        assert!(after_a_kill.answers.contains(&(2, Answer::Cancelled)));
    }

    #[test]
    fn a_reschedule_head_is_held_no_longer_than_its_due_time_so_its_claim_is_met_then() {
        let far = decide(&[reschedule(NOW + 600_000, 6)], NOW, REMEMBER);
        assert_eq!(far.hold, Some((0, hold_for(6))));
        let near = decide(&[reschedule(NOW + 2_000, 6)], NOW, REMEMBER);
        assert_eq!(near.hold, Some((0, Duration::from_millis(2_000) + MEETING_HOLD)));
        let just_passed = decide(&[reschedule(NOW - 2_000, 9)], NOW, REMEMBER);
        assert_eq!(just_passed.hold, Some((0, MEETING_HOLD)), "its claim is due any moment");
        let passed = decide(&[reschedule(NOW - 120_000, 9)], NOW, REMEMBER);
        assert_eq!(passed.hold, Some((0, FIRST_HOLD)));
        let long_passed = decide(&[reschedule(NOW - LONGEST_HOLD.as_millis() as u64 - 1, 9)], NOW, REMEMBER);
        assert_eq!(long_passed.hold, Some((0, hold_for(9))), "a reschedule of an id never scheduled backs off again");
    }

    #[test]
    fn a_host_killed_between_deletes_leaves_a_head_that_says_the_same() {
        // [claim, cancel, fence]: the cancel is deleted before the claim. Killed after the first delete:
        let rest = decide(&[claim(3), released(2, NOW)], NOW, REMEMBER);
        assert!(rest.answers.is_empty() && rest.forward.is_empty(), "{rest:?}");
        assert_eq!(rest.hold, Some((1, hold_for(2))));
        // [reschedule, claim (due), fence]: forwarded, then killed before the reschedule was deleted.
        let rest = decide(&[reschedule(NOW - 5, 3), claim(2), released(1, NOW)], NOW, REMEMBER);
        assert!(rest.forward.is_empty(), "the fence says it went: {rest:?}");
        assert_eq!(rest.delete, vec![1, 0]);
    }

    #[test]
    fn ids_sqs_takes_as_groups_are_their_own_group_others_a_digest() {
        assert_eq!(group_of("order-17"), "order-17");
        let long = "x".repeat(200);
        assert!(group_of(&long).starts_with("sha256-") && group_of(&long).len() <= 128);
        assert_ne!(group_of("a b"), group_of("a_b"));
        assert_eq!(group_of(&group_of(&long)), group_of(&long), "a group maps to itself");
    }

    #[test]
    fn backoff_doubles_to_its_cap() {
        assert_eq!(hold_for(1), FIRST_HOLD);
        assert_eq!(hold_for(2), FIRST_HOLD * 2);
        assert_eq!(hold_for(100), LONGEST_HOLD);
    }

    #[test]
    fn an_entry_reads_back_as_written() {
        let entry = Entry::Reschedule { token: "k".into(), due_at_ms: 42, reply: Some("q".into()) };
        assert_eq!(entry.encode(), r#"{"fate":"reschedule","token":"k","due_at_ms":42,"reply":"q"}"#);
        assert_eq!(Entry::decode(&entry.encode()).unwrap(), entry);
        assert_eq!(Entry::decode(r#"{"fate":"claim"}"#).unwrap(), Entry::Claim { strategy: None });
        let claim = Entry::Claim { strategy: Some("main".into()) };
        assert_eq!(Entry::decode(&claim.encode()).unwrap(), claim);
        assert!(Entry::decode("claim").is_err());
    }
}
