//! The two bounds the guard keeps per caller (a client token's fingerprint, `report:{namespace}`
//! for a namespace's sidecars, or the peer's address without authentication): a token bucket
//! of requests per second, and a count of requests in flight (a stream counts until it ends).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Requests per second per key with a burst; `rate` 0 disables it.
pub struct RateLimiter {
    pub rate: f64,
    pub burst: f64,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl RateLimiter {
    pub fn new(rate: f64, burst: f64) -> RateLimiter {
        RateLimiter {
            rate,
            burst: burst.max(1.0),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one request from `key`'s bucket; `Err(wait)` when it is empty.
    pub fn take(&self, key: &str) -> Result<(), Duration> {
        if self.rate <= 0.0 {
            return Ok(());
        }
        let Ok(mut buckets) = self.buckets.lock() else {
            return Ok(());
        };
        let now = Instant::now();
        if buckets.len() > 100_000 {
            // Forget idle callers rather than grow without bound.
            buckets.retain(|_, (_, at)| now.duration_since(*at) < Duration::from_secs(60));
        }
        let (tokens, at) = buckets.entry(key.to_string()).or_insert((self.burst, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * self.rate).min(self.burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - *tokens) / self.rate))
        }
    }
}

/// Requests in flight per key, at most `limit` each (0: no bound). Only keys with requests
/// in flight are kept.
pub struct InFlight {
    pub limit: usize,
    counts: Arc<Mutex<HashMap<String, usize>>>,
}

/// One request in flight; counted until dropped.
pub struct Permit {
    key: String,
    counts: Arc<Mutex<HashMap<String, usize>>>,
}

fn lock(m: &Mutex<HashMap<String, usize>>) -> MutexGuard<'_, HashMap<String, usize>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl InFlight {
    pub fn new(limit: usize) -> InFlight {
        InFlight {
            limit,
            counts: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// A permit for one more request of `key`; `None` when `limit` are in flight already.
    pub fn enter(&self, key: &str) -> Option<Permit> {
        let mut counts = lock(&self.counts);
        let n = counts.entry(key.to_string()).or_insert(0);
        if self.limit > 0 && *n >= self.limit {
            return None;
        }
        *n += 1;
        Some(Permit {
            key: key.to_string(),
            counts: self.counts.clone(),
        })
    }

    /// Requests of `key` in flight now.
    pub fn count(&self, key: &str) -> usize {
        lock(&self.counts).get(key).copied().unwrap_or(0)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut counts = lock(&self.counts);
        if let Some(n) = counts.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limit_refills() {
        let g = RateLimiter::new(1000.0, 2.0);
        assert!(g.take("a").is_ok());
        assert!(g.take("a").is_ok());
        assert!(g.take("a").is_err(), "burst of 2 used up");
        assert!(g.take("b").is_ok(), "per key");
        let off = RateLimiter::new(0.0, 1.0);
        assert!((0..100).all(|_| off.take("a").is_ok()));
    }

    #[test]
    fn in_flight_is_bounded_per_key_and_freed_on_drop() {
        let f = InFlight::new(2);
        let a1 = f.enter("a").unwrap();
        let a2 = f.enter("a").unwrap();
        assert!(f.enter("a").is_none(), "two in flight");
        let b = f.enter("b").expect("per key");
        assert_eq!((f.count("a"), f.count("b")), (2, 1));
        drop(a1);
        let a3 = f.enter("a").expect("one freed");
        drop((a2, a3, b));
        assert_eq!((f.count("a"), f.count("b")), (0, 0));
        assert!(lock(&f.counts).is_empty(), "idle keys are forgotten");
        let off = InFlight::new(0);
        let held: Vec<Permit> = (0..1000).filter_map(|_| off.enter("a")).collect();
        assert_eq!(held.len(), 1000);
    }
}
