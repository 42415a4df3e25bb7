//! The immutable lookup table: every range of every source, as disjoint segments that each
//! carry the set of sources covering them, searched by binary search.
//!
//! Written by hand rather than with a prefix-trie crate: CSV sources are start–end ranges,
//! not prefixes, and one sorted array answers all sources of an address in one search.

/// Position of `::ffff:0.0.0.0`: IPv4 addresses occupy the next 2³² positions.
const V4_BASE: u128 = 0xffff_0000_0000;

/// The IPv4 part of sorted `starts`, searched a /16 at a time.
///
/// `first[h]` is the first index whose start is at or after the IPv4 address
/// `h.0.0.0 + (h << 16)` (65,537 entries, 256 KB), so a lookup searches only the starts of
/// one /16. Those are searched by their low 32 bits (`low`, beside `starts`): sixteen to a
/// cache line instead of four, so a /16 of a large table costs a miss or two, not one per
/// step of the search.
#[derive(Debug, Clone, Default)]
pub(crate) struct V4Index {
    first: Vec<u32>,
    low: Vec<u32>,
}

impl V4Index {
    pub(crate) fn new(starts: &[u128]) -> Self {
        Self {
            first: (0..=65_536u128)
                .map(|h| {
                    u32::try_from(starts.partition_point(|&s| s < V4_BASE + (h << 16)))
                        .unwrap_or(u32::MAX)
                })
                .collect(),
            // Truncated on purpose: within one /16's span every start is an IPv4 position.
            low: starts.iter().map(|&s| s as u32).collect(),
        }
    }

    /// Number of `starts` at or before `position` (the index of the covering candidate + 1).
    pub(crate) fn starts_at_or_before(&self, starts: &[u128], position: u128) -> usize {
        match position.checked_sub(V4_BASE) {
            Some(offset) if offset < 1 << 32 && self.first.len() == 65_537 => {
                let h = (offset >> 16) as usize;
                let (lo, hi) = (self.first[h] as usize, self.first[h + 1] as usize);
                lo + self.low[lo..hi].partition_point(|&s| s <= offset as u32)
            }
            _ => starts.partition_point(|&s| s <= position),
        }
    }

    /// Heap bytes.
    pub(crate) fn heap_bytes(&self) -> usize {
        (self.first.capacity() + self.low.capacity()) * 4
    }
}

/// Disjoint segments `(start, end, set)`, sorted by start; `set` indexes `sets`.
#[derive(Debug, Clone, Default)]
pub struct RangeTable {
    /// IPv4 lookups search one /16 of the starts.
    v4_index: V4Index,
    starts: Vec<u128>,
    ends: Vec<u128>,
    set_of: Vec<u32>,
    sets: Vec<Vec<u16>>,
}

impl RangeTable {
    /// Builds from `(start, end, source)` triples (overlaps allowed).
    pub fn build(mut ranges: Vec<(u128, u128, u16)>) -> Self {
        // Sweep over boundaries: +source at start, −source after end.
        let mut events: Vec<(u128, bool, u16)> = Vec::with_capacity(ranges.len() * 2);
        for &(start, end, source) in &ranges {
            events.push((start, true, source));
            if end < u128::MAX {
                events.push((end + 1, false, source));
            }
        }
        ranges.clear();
        events.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut table = RangeTable::default();
        let mut interned: std::collections::HashMap<Vec<u16>, u32> =
            std::collections::HashMap::new();
        let mut active: std::collections::BTreeMap<u16, u32> = std::collections::BTreeMap::new();
        let mut i = 0;
        while i < events.len() {
            let at = events[i].0;
            while i < events.len() && events[i].0 == at {
                let (_, opening, source) = events[i];
                let count = active.entry(source).or_insert(0);
                if opening {
                    *count += 1;
                } else {
                    *count -= 1;
                    if *count == 0 {
                        active.remove(&source);
                    }
                }
                i += 1;
            }
            if active.is_empty() {
                continue;
            }
            let end = events.get(i).map_or(u128::MAX, |e| e.0 - 1);
            let set: Vec<u16> = active.keys().copied().collect();
            let next = u32::try_from(interned.len()).unwrap_or(u32::MAX);
            let id = *interned.entry(set.clone()).or_insert_with(|| {
                table.sets.push(set);
                next
            });
            // Merge with the previous segment when contiguous and of the same set.
            if table.ends.last().is_some_and(|&e| e.wrapping_add(1) == at)
                && table.set_of.last() == Some(&id)
            {
                *table.ends.last_mut().unwrap_or(&mut 0) = end;
            } else {
                table.starts.push(at);
                table.ends.push(end);
                table.set_of.push(id);
            }
        }
        table.v4_index = V4Index::new(&table.starts);
        table
    }

    /// The sources covering `position` (empty when none).
    pub fn lookup(&self, position: u128) -> &[u16] {
        let index = self.v4_index.starts_at_or_before(&self.starts, position);
        if index == 0 {
            return &[];
        }
        let i = index - 1;
        if position <= self.ends[i] {
            &self.sets[self.set_of[i] as usize]
        } else {
            &[]
        }
    }

    /// Number of disjoint segments.
    pub fn segments(&self) -> usize {
        self.starts.len()
    }

    /// Approximate heap bytes.
    pub fn heap_bytes(&self) -> usize {
        self.v4_index.heap_bytes()
            + self.starts.capacity() * 16
            + self.ends.capacity() * 16
            + self.set_of.capacity() * 4
            + self
                .sets
                .iter()
                .map(|s| s.capacity() * 2 + 24)
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_ranges_report_every_source() {
        let table = RangeTable::build(vec![(10, 20, 0), (15, 30, 1), (40, 40, 2)]);
        assert_eq!(table.lookup(9), &[] as &[u16]);
        assert_eq!(table.lookup(10), &[0]);
        assert_eq!(table.lookup(15), &[0, 1]);
        assert_eq!(table.lookup(20), &[0, 1]);
        assert_eq!(table.lookup(21), &[1]);
        assert_eq!(table.lookup(31), &[] as &[u16]);
        assert_eq!(table.lookup(40), &[2]);
        assert_eq!(table.lookup(u128::MAX), &[] as &[u16]);
    }

    #[test]
    fn the_ipv4_index_finds_segments_that_start_in_an_earlier_slash_16() {
        let base = V4_BASE;
        // 10.0.0.0/8 spans many /16 blocks; 10.5.1.1 is found through the index.
        let table = RangeTable::build(vec![
            (base + (10 << 24), base + (11 << 24) - 1, 0),
            (
                base + (10 << 24) + (5 << 16) + 7,
                base + (10 << 24) + (5 << 16) + 7,
                1,
            ),
        ]);
        assert_eq!(table.lookup(base + (10 << 24) + (5 << 16) + 257), &[0]);
        assert_eq!(table.lookup(base + (10 << 24) + (5 << 16) + 7), &[0, 1]);
        assert_eq!(table.lookup(base + (11 << 24)), &[] as &[u16]);
        assert_eq!(table.lookup(base + (1 << 32) - 1), &[] as &[u16]);
        assert_eq!(table.lookup(base - 1), &[] as &[u16]);
    }

    #[test]
    fn lookups_find_what_a_scan_of_every_range_finds() {
        // Random IPv4 ranges packed into a few /8s (many per /16, some spanning /16s) and a
        // few IPv6 ones, against a scan of every range.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut ranges = Vec::new();
        for i in 0..3000u64 {
            let source = (i % 5) as u16;
            if i % 10 == 0 {
                let start = u128::from(next()) << 64;
                ranges.push((start, start + u128::from(next() >> 20), source));
            } else {
                let start = (10u32 << 24) | (next() as u32 & 0x03ff_ffff);
                let len = (next() % 300_000) as u32;
                let end = start.saturating_add(len);
                ranges.push((
                    V4_BASE + u128::from(start),
                    V4_BASE + u128::from(end),
                    source,
                ));
            }
        }
        let table = RangeTable::build(ranges.clone());
        for _ in 0..20_000 {
            let position = match next() % 4 {
                0 => u128::from(next()) << 64 | u128::from(next() >> 40),
                1 => V4_BASE + u128::from(next() as u32),
                _ => V4_BASE + u128::from((10u32 << 24) | (next() as u32 & 0x03ff_ffff)),
            };
            let mut want: Vec<u16> = ranges
                .iter()
                .filter(|(s, e, _)| (*s..=*e).contains(&position))
                .map(|r| r.2)
                .collect();
            want.sort_unstable();
            want.dedup();
            assert_eq!(table.lookup(position), want.as_slice(), "{position:#x}");
        }
    }

    #[test]
    fn adjacent_ranges_of_one_source_merge() {
        let table = RangeTable::build(vec![(0, 9, 0), (10, 19, 0), (20, 29, 1)]);
        assert_eq!(table.segments(), 2);
        assert_eq!(table.lookup(u128::MAX), &[] as &[u16]);
        let full = RangeTable::build(vec![(0, u128::MAX, 3)]);
        assert_eq!(full.lookup(u128::MAX), &[3]);
    }
}
