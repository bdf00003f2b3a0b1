//! Where a claim and the counter its fence comes from live.
//!
//! A claim takes its fence in the same script that writes it, so the claim
//! and its counter must share a slot. One node, or the master Sentinel
//! names, has one slot to speak of: a single counter serves every claim,
//! and fences grow over the whole store. In a Redis Cluster a single
//! counter would put every claim in its slot, on one master; there each
//! slot has a counter of its own, and fences grow per slot, so per key.

use std::collections::HashMap;
use std::sync::OnceLock;

use redis::cluster_routing::Slot;

/// Slots in a Redis Cluster.
const SLOTS: u16 = 16_384;

/// How claim keys and fence counters are named (`P` is the prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    /// `{P}:c:{key}` and the one counter `{P}:fence`: one node or
    /// Sentinel (and a cluster before issue 32: see `upgrade`).
    OneSlot,
    /// `P:{c:hex(key)}` and its slot's counter `P:{fN}:fence`: a cluster.
    /// The key is hex, so no key text can end the hash tag early.
    PerSlot,
}

impl Layout {
    /// The claim record of `key` (a [`ScopedKey`](crate::domain::ScopedKey)'s
    /// text).
    pub(super) fn claim_key(self, prefix: &str, key: &str) -> String {
        match self {
            Layout::OneSlot => format!("{{{prefix}}}:c:{key}"),
            Layout::PerSlot => format!("{prefix}:{{c:{}}}", hex::encode(key)),
        }
    }

    /// The counter the fence of the claim at `claim_key` comes from: in the
    /// claim's slot.
    pub(super) fn fence_key(self, prefix: &str, claim_key: &str) -> String {
        match self {
            Layout::OneSlot => format!("{{{prefix}}}:fence"),
            Layout::PerSlot => {
                format!("{prefix}:{{f{}}}:fence", slot_tag(Slot::for_key(claim_key)))
            }
        }
    }
}

/// `N` of the hash tag `fN` that lands in `slot`: the first of `f0`, `f1`,
/// … that does. Every instance computes the same table, so they agree on
/// each slot's counter. Built on first use (the last slot is filled at
/// `f157391`: 157,392 CRC16s of a few bytes); `Slot::for_key` is the CRC16
/// the redis crate routes by, the one Redis Cluster uses.
fn slot_tag(slot: Slot) -> u32 {
    static TAGS: OnceLock<HashMap<Slot, u32>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let mut tags = HashMap::with_capacity(usize::from(SLOTS));
        let mut n = 0u32;
        while tags.len() < usize::from(SLOTS) {
            tags.entry(Slot::for_key(format!("f{n}"))).or_insert(n);
            n += 1;
        }
        tags
    });
    // Every slot has an entry: the table is filled until it has all 16,384.
    tags[&slot]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slot_has_a_counter_in_that_slot() {
        for s in 0..SLOTS {
            let slot = Slot::new(s).unwrap_or_else(|| panic!("slot {s}"));
            let counter = format!("P:{{f{}}}:fence", slot_tag(slot));
            assert_eq!(Slot::for_key(&counter), slot, "{counter}");
        }
    }

    #[test]
    fn a_claim_and_its_counter_share_a_slot() {
        for key in ["a/k", "a/{x}", "a/}", "a/{", "g/src/id:1", ""] {
            for layout in [Layout::OneSlot, Layout::PerSlot] {
                let claim = layout.claim_key("dedupd", key);
                let fence = layout.fence_key("dedupd", &claim);
                assert_eq!(Slot::for_key(&claim), Slot::for_key(&fence), "{claim}");
            }
        }
    }

    #[test]
    fn per_slot_claims_spread_and_one_slot_claims_do_not() {
        let slots = |layout: Layout| {
            (0..1_000)
                .map(|n| Slot::for_key(layout.claim_key("dedupd", &format!("a/k{n}"))))
                .collect::<std::collections::HashSet<_>>()
                .len()
        };
        assert_eq!(slots(Layout::OneSlot), 1);
        // 1,000 keys over 16,384 slots: about 970 distinct.
        assert!(slots(Layout::PerSlot) > 900);
    }

    #[test]
    fn key_text_cannot_end_the_hash_tag() {
        // With the key's text in the tag, "x}" and "x}y" would share a slot.
        let claim = Layout::PerSlot.claim_key("p", "a/x}y");
        assert_eq!(claim, "p:{c:612f787d79}");
    }
}
