//! Compare-and-set: which condition a write carries, and what its refusal means. The
//! version a connector last saw of a key (an S3 ETag, a Redis version), by a read or by its
//! own write, is remembered per key in this process, so a CAS guards a handler's
//! read-modify-write, and a write after its own, against writes by other pods in between;
//! two threads of one pod share what was seen (as in the original).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::error::ProxyError;

/// What a connector last saw of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// A read answered 404: a write after it must create the key, not overwrite one.
    Absent,
    /// A read (or this connector's own write) saw this version.
    Version(String),
}

/// The condition a write is sent with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// Last writer wins.
    None,
    /// Only if the key does not exist (`If-None-Match: *`).
    IfAbsent,
    /// Only if the key still has this version (`If-Match`).
    IfMatch(String),
}

/// The decision: an exclusive create is always `IfAbsent`; in a CAS mode a write carries what
/// this connector last saw of the key (its read, or its own last write); only a write to a
/// key it has not seen (a first blind `open(p, "w")`, or one forgotten) is last-writer-wins,
/// as in the original.
pub fn write_condition(cas: bool, exclusive: bool, seen: Option<&Seen>) -> Condition {
    if exclusive {
        return Condition::IfAbsent;
    }
    match (cas, seen) {
        (true, Some(Seen::Absent)) => Condition::IfAbsent,
        (true, Some(Seen::Version(v))) => Condition::IfMatch(v.clone()),
        _ => Condition::None,
    }
}

/// The refusal of a write whose condition failed: an exclusive create that found the key
/// is 412; a lost compare-and-set is 409 (both FileExistsError in the runtime).
pub fn refusal(condition: &Condition, exclusive: bool, key: &str) -> ProxyError {
    match condition {
        Condition::IfAbsent if exclusive => ProxyError::Exists(key.to_string()),
        _ => ProxyError::Conflict(key.to_string()),
    }
}

/// Versions seen, per key. Bounded: past `cap` keys it forgets all (a forgotten key's next
/// write is last-writer-wins until it is read again) rather than grow without limit.
pub struct SeenVersions {
    cap: usize,
    map: Mutex<HashMap<String, Seen>>,
}

impl SeenVersions {
    pub fn new(cap: usize) -> SeenVersions {
        SeenVersions {
            cap,
            map: Mutex::new(HashMap::new()),
        }
    }

    pub fn get(&self, key: &str) -> Option<Seen> {
        self.map.lock().ok()?.get(key).cloned()
    }

    pub fn remember(&self, key: &str, seen: Seen) {
        if let Ok(mut m) = self.map.lock() {
            if m.len() >= self.cap && !m.contains_key(key) {
                m.clear();
            }
            m.insert(key.to_string(), seen);
        }
    }

    pub fn forget(&self, key: &str) {
        if let Ok(mut m) = self.map.lock() {
            m.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions() {
        let v = Seen::Version("\"e1\"".into());
        assert_eq!(write_condition(true, true, Some(&v)), Condition::IfAbsent);
        assert_eq!(
            write_condition(true, false, Some(&v)),
            Condition::IfMatch("\"e1\"".into())
        );
        assert_eq!(
            write_condition(true, false, Some(&Seen::Absent)),
            Condition::IfAbsent
        );
        assert_eq!(write_condition(true, false, None), Condition::None);
        assert_eq!(write_condition(false, false, Some(&v)), Condition::None);
        assert_eq!(write_condition(false, true, None), Condition::IfAbsent);
    }

    #[test]
    fn refusals() {
        assert_eq!(refusal(&Condition::IfAbsent, true, "k").status(), 412);
        assert_eq!(refusal(&Condition::IfAbsent, false, "k").status(), 409);
        assert_eq!(
            refusal(&Condition::IfMatch("e".into()), false, "k").status(),
            409
        );
    }

    #[test]
    fn seen_is_bounded() {
        let s = SeenVersions::new(2);
        s.remember("a", Seen::Absent);
        s.remember("b", Seen::Version("1".into()));
        s.remember("b", Seen::Version("2".into()));
        assert_eq!(s.get("b"), Some(Seen::Version("2".into())));
        s.remember("c", Seen::Absent);
        assert_eq!(s.get("a"), None);
        assert_eq!(s.get("c"), Some(Seen::Absent));
        s.forget("c");
        assert_eq!(s.get("c"), None);
    }
}
