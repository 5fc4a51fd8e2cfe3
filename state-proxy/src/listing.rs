//! A listing read from a sorted index of backend keys (Redis' per-namespace sorted set, read
//! with ZRANGEBYLEX) in batches: which range to read next, and how the keys group into
//! "directories" one level below the prefix, as S3's ListObjectsV2 does. With the delimiter,
//! a directory is one entry and the next read starts past it, so a directory's keys are not
//! read one by one. Pure: the store only runs the reads this asks for.

use crate::keys::Listing;

/// The first string after every string that starts with `prefix` (which ends in `/`, so
/// its last byte is below 0xff): `runs/` -> `runs0`.
pub fn after_prefix(prefix: &[u8]) -> Vec<u8> {
    let mut out = prefix.to_vec();
    match out.last_mut() {
        Some(b) if *b < 0xff => *b += 1,
        // Not reached with our prefixes (they end in `/`); 0xff never occurs in UTF-8.
        _ => out.push(0xff),
    }
    out
}

/// The state of one listing: `base` is the backend prefix listed (the mount's root and the
/// listing's prefix, ending in `/`), `root` the mount's root, stripped from what is returned.
pub struct IndexWalk {
    root_len: usize,
    base: Vec<u8>,
    delimiter: bool,
    /// ZRANGEBYLEX's `min` of the next read: `[` inclusive, `(` exclusive.
    start: Vec<u8>,
    end: Vec<u8>,
    limit: usize,
    listing: Listing,
    done: bool,
}

impl IndexWalk {
    /// `base` must start with `root`, and both end in `/`.
    pub fn new(root: &str, base: &str, delimiter: bool, limit: usize) -> IndexWalk {
        let mut start = b"[".to_vec();
        start.extend_from_slice(base.as_bytes());
        let mut end = b"(".to_vec();
        end.extend(after_prefix(base.as_bytes()));
        IndexWalk {
            root_len: root.len(),
            base: base.as_bytes().to_vec(),
            delimiter,
            start,
            end,
            limit,
            listing: Listing::default(),
            done: false,
        }
    }

    /// ZRANGEBYLEX's `min` and `max` of the next read, or None when the listing is complete.
    pub fn next_range(&self) -> Option<(&[u8], &[u8])> {
        (!self.done).then_some((&self.start, &self.end))
    }

    /// Takes one read's answer (at most `batch` members, in order, from the range asked).
    pub fn feed(&mut self, members: &[Vec<u8>], batch: usize) {
        let mut dir: Option<Vec<u8>> = None;
        for m in members {
            if !m.starts_with(&self.base) {
                continue;
            }
            if dir.as_ref().is_some_and(|d| m.starts_with(d)) {
                continue;
            }
            let rest = &m[self.base.len()..];
            match rest
                .iter()
                .position(|b| *b == b'/')
                .filter(|_| self.delimiter)
            {
                Some(i) => {
                    let d = m[..self.base.len() + i + 1].to_vec();
                    if let Some(p) = self.relative(&d) {
                        self.listing.prefixes.push(p);
                    }
                    dir = Some(d);
                }
                None => {
                    if let Some(k) = self.relative(m) {
                        self.listing.keys.push(k);
                    }
                }
            }
            if self.listing.keys.len() + self.listing.prefixes.len() >= self.limit {
                self.done = true;
                return;
            }
        }
        let Some(last) = members.last() else {
            self.done = true;
            return;
        };
        if members.len() < batch {
            self.done = true;
            return;
        }
        self.start = match dir.filter(|d| last.starts_with(d)) {
            // Still inside a directory: skip the rest of it in one step.
            Some(d) => [b"[".as_slice(), &after_prefix(&d)].concat(),
            None => [b"(".as_slice(), last].concat(),
        };
    }

    /// Mount-relative and text; a member that is neither (not written by a connector) is left out.
    fn relative(&self, member: &[u8]) -> Option<String> {
        let rel = std::str::from_utf8(member.get(self.root_len..)?).ok()?;
        (!rel.chars().any(char::is_control)).then(|| rel.to_string())
    }

    /// The keys and prefixes found, each sorted (the index is read in byte order).
    pub fn finish(self) -> Listing {
        self.listing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a walk against an in-memory sorted index, as ZRANGEBYLEX with LIMIT 0 `batch`
    /// would answer; returns the listing and the number of members read.
    fn walk(index: &[&str], root: &str, base: &str, delim: bool, batch: usize) -> (Listing, usize) {
        let mut sorted: Vec<Vec<u8>> = index.iter().map(|s| s.as_bytes().to_vec()).collect();
        sorted.sort();
        let mut w = IndexWalk::new(root, base, delim, 100_000);
        let mut read = 0;
        while let Some((min, max)) = w.next_range() {
            let (inclusive, lo) = (min[0] == b'[', &min[1..]);
            let hi = &max[1..];
            let members: Vec<Vec<u8>> = sorted
                .iter()
                .filter(|m| {
                    (if inclusive {
                        m.as_slice() >= lo
                    } else {
                        m.as_slice() > lo
                    }) && m.as_slice() < hi
                })
                .take(batch)
                .cloned()
                .collect();
            read += members.len();
            w.feed(&members, batch);
        }
        (w.finish(), read)
    }

    const INDEX: [&str; 9] = [
        "ns/p/r/a",
        "ns/p/r/b/1",
        "ns/p/r/b/2",
        "ns/p/r/c/x/y",
        "ns/p/r.txt",
        "ns/p/r0",
        "ns/p/s/z",
        "ns/q/other",
        "nt/p/r/a",
    ];

    #[test]
    fn grouping_like_list_objects() {
        for batch in [1, 2, 3, 1000] {
            let (l, _) = walk(&INDEX, "ns/p/", "ns/p/r/", true, batch);
            assert_eq!(l.keys, vec!["r/a"], "batch {batch}");
            assert_eq!(l.prefixes, vec!["r/b/", "r/c/"], "batch {batch}");
            let (flat, _) = walk(&INDEX, "ns/p/", "ns/p/r/", false, batch);
            assert_eq!(flat.keys, vec!["r/a", "r/b/1", "r/b/2", "r/c/x/y"]);
            assert!(flat.prefixes.is_empty());
            let (top, _) = walk(&INDEX, "ns/p/", "ns/p/", true, batch);
            assert_eq!(top.keys, vec!["r.txt", "r0"], "batch {batch}");
            assert_eq!(top.prefixes, vec!["r/", "s/"], "batch {batch}");
        }
    }

    #[test]
    fn nothing_outside_the_base_is_listed() {
        let (l, _) = walk(&INDEX, "ns/", "ns/", false, 2);
        assert!(l.keys.iter().all(|k| !k.starts_with("nt")), "{l:?}");
        assert_eq!(l.keys.len(), 8);
        assert!(l.keys.contains(&"q/other".to_string()));
        let (none, _) = walk(&INDEX, "ns/p/", "ns/p/none/", true, 10);
        assert_eq!(none, Listing::default());
    }

    #[test]
    fn a_directory_is_skipped_not_read() {
        let mut index: Vec<String> = (0..1000).map(|i| format!("ns/big/{i:04}")).collect();
        index.push("ns/small".into());
        let refs: Vec<&str> = index.iter().map(String::as_str).collect();
        let (l, read) = walk(&refs, "ns/", "ns/", true, 10);
        assert_eq!(l.prefixes, vec!["big/"]);
        assert_eq!(l.keys, vec!["small"]);
        assert!(
            read <= 20,
            "read {read} members for one directory and one key"
        );
    }

    #[test]
    fn the_bound_stops_the_walk() {
        let index: Vec<String> = (0..50).map(|i| format!("ns/{i:03}")).collect();
        let refs: Vec<&str> = index.iter().map(String::as_str).collect();
        let mut sorted: Vec<Vec<u8>> = refs.iter().map(|s| s.as_bytes().to_vec()).collect();
        sorted.sort();
        let mut w = IndexWalk::new("ns/", "ns/", false, 7);
        w.feed(&sorted[..10], 10);
        assert!(w.next_range().is_none());
        assert_eq!(w.finish().keys.len(), 7);
    }

    #[test]
    fn members_not_written_by_a_connector_are_left_out() {
        let (l, _) = walk(&["ns/a", "ns/\u{1}x", "ns/b"], "ns/", "ns/", false, 10);
        assert_eq!(l.keys, vec!["a", "b"]);
    }

    #[test]
    fn after_a_prefix() {
        assert_eq!(after_prefix(b"runs/"), b"runs0");
        assert_eq!(after_prefix(b"ns/"), b"ns0");
    }
}
