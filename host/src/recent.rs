//! Counts per key for the most recent keys only: how often each of the last
//! `capacity` messages seen came back, with memory bounded however many
//! messages pass. The oldest key is forgotten first.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

#[derive(Debug)]
pub(crate) struct RecentCounts<K> {
    capacity: usize,
    counts: HashMap<K, u32>,
    /// Keys in the order they were first counted.
    order: VecDeque<K>,
}

impl<K: Hash + Eq + Clone> RecentCounts<K> {
    pub(crate) fn new(capacity: usize) -> RecentCounts<K> {
        RecentCounts { capacity, counts: HashMap::new(), order: VecDeque::new() }
    }

    /// The count of `key`, 0 for a key not seen (or forgotten), to change in place.
    pub(crate) fn entry(&mut self, key: K) -> &mut u32 {
        if !self.counts.contains_key(&key) {
            if self.order.len() >= self.capacity
                && let Some(oldest) = self.order.pop_front()
            {
                self.counts.remove(&oldest);
            }
            self.order.push_back(key.clone());
        }
        self.counts.entry(key).or_insert(0)
    }

    /// The count of `key`, if it is remembered.
    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut u32> {
        self.counts.get_mut(key)
    }

    pub(crate) fn forget(&mut self, key: &K) {
        if self.counts.remove(key).is_some() {
            self.order.retain(|k| k != key);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.counts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_kept_per_key_and_the_oldest_key_goes_first() {
        let mut recent = RecentCounts::new(2);
        *recent.entry("a") += 1;
        *recent.entry("a") += 1;
        *recent.entry("b") += 1;
        assert_eq!((*recent.entry("a"), *recent.entry("b")), (2, 1));
        *recent.entry("c") += 1;
        assert_eq!(recent.len(), 2);
        assert_eq!(*recent.entry("a"), 0, "a was the oldest: forgotten for c");
        recent.forget(&"c");
        assert!(recent.get_mut(&"c").is_none());
    }
}
