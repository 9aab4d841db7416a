//! Names a planner registers once: exchanges and routing keys its plans use
//! again and again.
//!
//! A registered name crosses into the host once, when the host asks for the
//! list after `configure`; a publish then carries only its index
//! (`name.registered`), where a string would be copied out of the planner,
//! checked and freed on every call. Register in [`Planner::new`](crate::Planner::new):
//!
//! ```
//! use hourglass_planner_sdk::*;
//!
//! let level = Key::register("delays.level-03");
//! let bit = Key::register("bit:3");
//! let command = publish_bcc(level, bit, vec!["to:orders".into()], vec![]);
//! let Command::Publish(p) = &command else { unreachable!() };
//! assert_eq!(p.exchange, "delays.level-03");
//! assert_eq!(p.bcc, vec!["to:orders"]);
//! ```
//!
//! A string known only per call (`to:<destination>`) goes as text: any
//! `&str` or `String` converts into a [`Name`].

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use crate::Name;

/// A registered name: a small copyable handle that converts into a
/// [`Name`] (`Name::Registered`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key(u32);

/// Every name registered in this program, in order, each once. Append only:
/// an index handed out stays valid, so planners made again (natively, in
/// tests) or a second `configure` never invalidate a key. In a component
/// there is one planner, and the list is what `names` answers.
struct Registry {
    names: Vec<&'static str>,
    index: BTreeMap<&'static str, u32>,
    /// Set once the host has read the list: a name registered after it could
    /// not be resolved, so registering one then panics.
    sealed: bool,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry { names: Vec::new(), index: BTreeMap::new(), sealed: false });

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Key {
    /// The key for `name`, registering it on first use (the same string
    /// always gets the same key). Call it while the planner is made
    /// ([`Planner::new`](crate::Planner::new)): the host reads the list right
    /// after, and a name new after that panics.
    pub fn register(name: &str) -> Key {
        let mut registry = registry();
        if let Some(&index) = registry.index.get(name) {
            return Key(index);
        }
        assert!(!registry.sealed, "name {name:?} registered after the host read the names: register names in Planner::new");
        let index = u32::try_from(registry.names.len()).expect("fewer than 2^32 names");
        // Leaked: a registered name lives as long as the program (the list only grows).
        let name: &'static str = Box::leak(name.into());
        registry.names.push(name);
        registry.index.insert(name, index);
        Key(index)
    }

    /// The string this key stands for.
    pub fn as_str(self) -> &'static str {
        registry().names[self.0 as usize]
    }

    /// Its index in the list the host reads.
    pub fn index(self) -> u32 {
        self.0
    }
}

/// Every registered name, in index order (what the adapter answers `names` with).
pub(crate) fn seal() -> Vec<String> {
    let mut registry = registry();
    registry.sealed = true;
    registry.names.iter().map(|name| name.to_string()).collect()
}

/// Before `configure` makes the planner: it may register names again.
pub(crate) fn unseal() {
    registry().sealed = false;
}

impl Name {
    /// The string this name stands for, registered or not.
    pub fn as_str(&self) -> &str {
        match self {
            Name::Registered(index) => registry().names.get(*index as usize).copied().unwrap_or("<unregistered>"),
            Name::Text(text) => text,
        }
    }
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<Key> for Name {
    fn from(key: Key) -> Name {
        Name::Registered(key.0)
    }
}

impl From<&Key> for Name {
    fn from(key: &Key) -> Name {
        Name::Registered(key.0)
    }
}

impl From<String> for Name {
    fn from(text: String) -> Name {
        Name::Text(text)
    }
}

impl From<&String> for Name {
    fn from(text: &String) -> Name {
        Name::Text(text.clone())
    }
}

impl From<&str> for Name {
    fn from(text: &str) -> Name {
        Name::Text(text.to_string())
    }
}

/// Compares by the string a name stands for, registered or not.
impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for Name {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_string_gets_the_same_key_and_names_compare_by_their_string() {
        let a = Key::register("keys-test.a");
        assert_eq!(Key::register("keys-test.a"), a);
        let b = Key::register("keys-test.b");
        assert_ne!(a, b);
        assert_eq!(b.as_str(), "keys-test.b");
        assert_eq!(Name::from(b), "keys-test.b");
        assert_eq!(Name::from("keys-test.b"), "keys-test.b");
        assert_ne!(Name::from(b), Name::from("keys-test.b"), "a registered name and text are different on the wire");
    }
}
