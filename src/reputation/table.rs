//! The immutable lookup table: every range of every source, as disjoint segments that each
//! carry the set of sources covering them, searched by binary search.
//!
//! Written by hand rather than with a prefix-trie crate: CSV sources are start–end ranges,
//! not prefixes, and one sorted array answers all sources of an address in one search.

/// Position of `::ffff:0.0.0.0`: IPv4 addresses occupy the next 2³² positions.
const V4_BASE: u128 = 0xffff_0000_0000;

/// For sorted `starts`: entry `h` is the first index whose start is at or after the IPv4
/// address `h.0.0.0 + (h << 16)` (65,537 entries, 256 KB).
pub(crate) fn v4_index(starts: &[u128]) -> Vec<u32> {
    (0..=65_536u128)
        .map(|h| {
            u32::try_from(starts.partition_point(|&s| s < V4_BASE + (h << 16))).unwrap_or(u32::MAX)
        })
        .collect()
}

/// Number of `starts` at or before `position` (the index of the covering candidate + 1),
/// searching only one /16 for IPv4 positions.
pub(crate) fn starts_at_or_before(starts: &[u128], index: &[u32], position: u128) -> usize {
    match position.checked_sub(V4_BASE) {
        Some(offset) if offset < 1 << 32 && index.len() == 65_537 => {
            let h = (offset >> 16) as usize;
            let (lo, hi) = (index[h] as usize, index[h + 1] as usize);
            lo + starts[lo..hi].partition_point(|&s| s <= position)
        }
        _ => starts.partition_point(|&s| s <= position),
    }
}

/// Disjoint segments `(start, end, set)`, sorted by start; `set` indexes `sets`.
#[derive(Debug, Clone, Default)]
pub struct RangeTable {
    /// For IPv4: `v4_index[h]` is the first segment starting at or after `h.x.y.z` with
    /// `h` the top 16 bits, so a lookup searches only the few segments of one /16.
    v4_index: Vec<u32>,
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
        table.v4_index = (0..=65_536u128)
            .map(|h| {
                u32::try_from(table.starts.partition_point(|&s| s < V4_BASE + (h << 16)))
                    .unwrap_or(u32::MAX)
            })
            .collect();
        table
    }

    /// The sources covering `position` (empty when none).
    pub fn lookup(&self, position: u128) -> &[u16] {
        let index = starts_at_or_before(&self.starts, &self.v4_index, position);
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
        self.v4_index.capacity() * 4
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
    fn adjacent_ranges_of_one_source_merge() {
        let table = RangeTable::build(vec![(0, 9, 0), (10, 19, 0), (20, 29, 1)]);
        assert_eq!(table.segments(), 2);
        assert_eq!(table.lookup(u128::MAX), &[] as &[u16]);
        let full = RangeTable::build(vec![(0, u128::MAX, 3)]);
        assert_eq!(full.lookup(u128::MAX), &[3]);
    }
}
