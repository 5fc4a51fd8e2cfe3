//! Which RabbitMQ deliveries can be acknowledged now, and how (docs/DESIGN.md §4 "At least
//! once"). Pure: the consume channel's I/O is `rabbitmq_ack`'s.
//!
//! Delivery tags grow on a channel, and `basic.ack` with `multiple` acknowledges every
//! outstanding tag up to the one named. So a run of finished deliveries at the front of the
//! ledger (every lower tag finished too, or already settled) goes in one frame; a delivery
//! still open, or being given back on its own (a nack, a requeued copy), splits the run: the
//! finished ones behind it are acknowledged one by one, never held back (a held ack would
//! keep its prefetch slot, and a slow handler would stall the consumer).

use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Handed out, not finished: its successors may not be confirmed yet.
    Open,
    /// Every successor confirmed by the broker: may be acknowledged.
    Done,
    /// Being nacked or acked on its own (its frame not yet written): no `multiple` may
    /// cover it, or the broker would take the ack and our own frame would name a tag it no
    /// longer knows (closing the channel).
    Settling,
}

/// The acknowledgements to send, in this order (frames on a channel keep their order).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct AckPlan {
    /// The last tag of the run at the front and how many deliveries it covers: one frame,
    /// with `multiple` when it covers more than one.
    pub run: Option<(u64, usize)>,
    /// Finished deliveries behind an open or settling one, each acknowledged alone.
    pub singles: Vec<u64>,
}

impl AckPlan {
    pub fn is_empty(&self) -> bool {
        self.run.is_none() && self.singles.is_empty()
    }
}

/// The deliveries handed out on one channel and not yet settled, by tag.
#[derive(Debug, Default)]
pub struct AckLedger {
    tags: BTreeMap<u64, State>,
}

impl AckLedger {
    /// A delivery handed out (tags arrive in increasing order on a channel).
    pub fn received(&mut self, tag: u64) {
        self.tags.insert(tag, State::Open);
    }

    /// A delivery whose successors are all confirmed. False when `tag` is not open (unknown
    /// or already settling): the caller must not acknowledge it through a plan.
    pub fn finished(&mut self, tag: u64) -> bool {
        match self.tags.get_mut(&tag) {
            Some(s @ State::Open) => {
                *s = State::Done;
                true
            }
            _ => false,
        }
    }

    /// A delivery about to be nacked or acked on its own. False when `tag` is not open.
    pub fn settling(&mut self, tag: u64) -> bool {
        match self.tags.get_mut(&tag) {
            Some(s @ State::Open) => {
                *s = State::Settling;
                true
            }
            _ => false,
        }
    }

    /// The frame of a settling delivery is written (or its channel is gone).
    pub fn settled(&mut self, tag: u64) {
        self.tags.remove(&tag);
    }

    /// Deliveries handed out and not settled.
    pub fn len(&self) -> usize {
        self.tags.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tags.is_empty()
    }

    /// Takes every finished delivery out of the ledger and says how to acknowledge it.
    pub fn plan(&mut self) -> AckPlan {
        let mut plan = AckPlan::default();
        let mut front = true;
        let mut run_len = 0;
        let mut taken = Vec::new();
        for (&tag, &state) in &self.tags {
            match state {
                State::Done if front => {
                    run_len += 1;
                    plan.run = Some((tag, run_len));
                    taken.push(tag);
                }
                State::Done => {
                    plan.singles.push(tag);
                    taken.push(tag);
                }
                State::Open | State::Settling => front = false,
            }
        }
        for t in taken {
            self.tags.remove(&t);
        }
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(tags: std::ops::RangeInclusive<u64>) -> AckLedger {
        let mut l = AckLedger::default();
        for t in tags {
            l.received(t);
        }
        l
    }

    #[test]
    fn a_finished_front_run_is_one_multiple_ack() {
        let mut l = ledger(1..=5);
        for t in [2, 1, 3] {
            assert!(l.finished(t));
        }
        let p = l.plan();
        assert_eq!(p.run, Some((3, 3)));
        assert!(p.singles.is_empty());
        // 4 and 5 stay open; nothing more to send until one finishes.
        assert_eq!(l.len(), 2);
        assert!(l.plan().is_empty());
    }

    #[test]
    fn an_open_delivery_splits_the_run_and_those_behind_go_alone() {
        let mut l = ledger(1..=6);
        for t in [1, 2, 4, 6] {
            l.finished(t);
        }
        let p = l.plan();
        assert_eq!(p.run, Some((2, 2)));
        assert_eq!(p.singles, vec![4, 6]);
        // 3 and 5 are still open: a later multiple ack can never cover them unfinished.
        assert_eq!(l.len(), 2);
        l.finished(5);
        assert_eq!(l.plan().singles, vec![5], "3 still open: 5 goes alone");
        l.finished(3);
        assert_eq!(l.plan().run, Some((3, 1)));
        assert!(l.is_empty());
    }

    #[test]
    fn a_delivery_being_given_back_is_never_covered() {
        let mut l = ledger(1..=4);
        assert!(l.settling(2));
        for t in [1, 3, 4] {
            l.finished(t);
        }
        let p = l.plan();
        assert_eq!(p.run, Some((1, 1)));
        assert_eq!(p.singles, vec![3, 4]);
        // The nack of 2 is written: the ledger forgets it, a later run may pass over its tag.
        l.settled(2);
        assert!(l.is_empty());
        for t in 5..=7 {
            l.received(t);
            l.finished(t);
        }
        assert_eq!(l.plan().run, Some((7, 3)));
    }

    #[test]
    fn settled_tags_below_do_not_block_a_run() {
        let mut l = ledger(1..=3);
        l.settling(1);
        l.settled(1);
        l.finished(2);
        l.finished(3);
        assert_eq!(l.plan().run, Some((3, 2)));
    }

    #[test]
    fn only_open_deliveries_can_finish_or_settle() {
        let mut l = ledger(1..=2);
        assert!(!l.finished(9), "unknown tag");
        assert!(l.settling(1));
        assert!(!l.finished(1), "settling on its own already");
        assert!(!l.settling(1));
        assert!(l.finished(2));
        assert!(!l.settling(2), "finished: the plan acknowledges it");
        assert!(!l.finished(2), "finished twice");
        assert_eq!(l.plan().singles, vec![2]);
        assert!(l.plan().is_empty(), "each tag is planned once");
    }

    #[test]
    fn nothing_finished_plans_nothing() {
        let mut l = ledger(1..=3);
        assert!(l.plan().is_empty());
        assert_eq!(l.len(), 3);
        assert!(AckLedger::default().plan().is_empty());
    }
}
