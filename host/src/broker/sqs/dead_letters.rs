//! The dead-letter queue hourglass gives each pumped queue, by name: the
//! pump parks there what it cannot forward, and a queue redriving anywhere
//! else is refused when it is set up.

const SQS_MAX_QUEUE_NAME: usize = 80;

/// The dead-letter queue of a pumped queue: `orders-delay.fifo` → `orders-delay-dlq.fifo`.
/// A name that would pass SQS's 80 characters keeps a prefix and a hash of the whole.
pub fn dead_letter_queue(queue: &str) -> String {
    let (stem, fifo) = match queue.strip_suffix(".fifo") {
        Some(stem) => (stem, ".fifo"),
        None => (queue, ""),
    };
    let name = format!("{stem}-dlq{fifo}");
    if name.len() <= SQS_MAX_QUEUE_NAME {
        return name;
    }
    // FNV-1a: stable across hosts and versions, unlike std's hasher.
    let hash = queue.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
    let tail = format!("-{:08x}-dlq{fifo}", hash as u32);
    format!("{}{tail}", &stem[..SQS_MAX_QUEUE_NAME - tail.len()])
}

/// Whether a queue's `RedrivePolicy` sends to the dead-letter queue hourglass gives it.
pub(crate) fn redrives_to_own_dead_letters(queue: &str, policy: &str) -> bool {
    let target = serde_json::from_str::<serde_json::Value>(policy).ok().and_then(|p| p["deadLetterTargetArn"].as_str().map(str::to_string));
    target.is_some_and(|arn| arn.rsplit(':').next() == Some(dead_letter_queue(queue).as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_letter_queues_sit_beside_their_queue_within_the_name_limit() {
        assert_eq!(dead_letter_queue("orders-delay.fifo"), "orders-delay-dlq.fifo");
        assert_eq!(dead_letter_queue("plain"), "plain-dlq");
        let long_a = format!("{}a-delay.fifo", "x".repeat(68));
        let long_b = format!("{}b-delay.fifo", "x".repeat(68));
        let (a, b) = (dead_letter_queue(&long_a), dead_letter_queue(&long_b));
        assert!(a.len() <= 80 && b.len() <= 80 && a.ends_with("-dlq.fifo"), "{a}");
        assert_ne!(a, b, "two long names keep distinct dead-letter queues");
        assert_eq!(a, dead_letter_queue(&long_a), "and the same one every time");
    }

    #[test]
    fn only_a_redrive_to_its_own_dead_letter_queue_is_accepted() {
        let own = r#"{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:123456789012:orders-delay-dlq.fifo","maxReceiveCount":10}"#;
        let other = r#"{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:123456789012:somewhere.fifo","maxReceiveCount":1}"#;
        assert!(redrives_to_own_dead_letters("orders-delay.fifo", own));
        assert!(!redrives_to_own_dead_letters("orders-delay.fifo", other));
        assert!(!redrives_to_own_dead_letters("orders-delay.fifo", "not json"));
    }
}
