//! Redis key names, built in one place.
//!
//! Two layouts, chosen by the hot store:
//! - **one Redis** (and in-process): `<prefix>:v1:{<subject>}:<kind>[:<qualifier>]`. The
//!   `{…}` hash tag is the subject, so a bucket and the multiplier it reads share a slot.
//! - **Redis Cluster**: `<prefix>:v2:{<shard>}<subject>:<kind>[:<qualifier>]`, where the hash
//!   tag is one of [`SHARDS`] shard tags, the one whose slot range holds the subject's own
//!   slot. A subject's keys still share one slot, and so do the keys of every subject of a
//!   shard: a script call may carry the limit checks of many subjects at once
//!   (`limiter::redis_backend`), which is what lets a cluster coalesce checks as one Redis
//!   does. The version differs so a store that changes layout starts empty (its epoch marker
//!   is missing, and the enforcement state is rebuilt from the durable store).

use std::sync::LazyLock;

use crate::model::SubjectKey;

/// Shard tags of the cluster layout, each holding 1/16 of the subjects.
///
/// Sixteen spread evenly over 2 to 8 masters (a slot range each) and keep enough checks in
/// flight per shard to share script calls (`LOAD_ONLY=cluster cargo bench --bench load`).
pub const SHARDS: usize = 16;

/// Redis Cluster's slots.
const SLOTS: u16 = 16_384;

/// The slot of a hash tag (Redis Cluster's CRC16/XMODEM, modulo 16384).
pub fn slot(tag: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(tag) % SLOTS
}

/// The tag of each shard: the first of `0`, `0.1`, `0.2`, … whose slot lies in the middle
/// eighth of the shard's 1/16 of the slot space, so shards sit evenly on however the slots are
/// split into contiguous ranges (as `redis-cli --cluster create` and resharding do).
static SHARD_TAGS: LazyLock<[String; SHARDS]> = LazyLock::new(|| {
    let width = SLOTS / SHARDS as u16;
    std::array::from_fn(|shard| {
        let low = shard as u16 * width + width * 7 / 16;
        let high = low + width / 8;
        (0u32..)
            .map(|n| {
                if n == 0 {
                    shard.to_string()
                } else {
                    format!("{shard}.{n}")
                }
            })
            .find(|tag| (low..high).contains(&slot(tag.as_bytes())))
            .expect("a tag in every range")
    })
});

/// Builds every Redis key (and in-process entry name) of one deployment.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
    sharded: bool,
}

impl Keys {
    /// Keys under `prefix` (validated by the settings: short, no `{`, `}` or `:`), in the
    /// layout of one Redis.
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: format!("{prefix}:v1"),
            sharded: false,
        }
    }

    /// Keys under `prefix` in the cluster layout: subjects grouped into [`SHARDS`] hash tags.
    pub fn sharded(prefix: &str) -> Self {
        Self {
            prefix: format!("{prefix}:v2"),
            sharded: true,
        }
    }

    /// True in the cluster layout ([`Keys::sharded`]).
    pub fn is_sharded(&self) -> bool {
        self.sharded
    }

    /// In the cluster layout, `subject`'s key `kind``name` placed in `beside`'s shard instead
    /// of its own: a part of a budget held in every shard (the `global` budget's sixteenth
    /// that a check of `beside` spends, in the slot of the check's other scopes). In the
    /// layout of one Redis, the subject's own key.
    pub fn part_key(
        &self,
        beside: &SubjectKey,
        subject: &SubjectKey,
        kind: &str,
        name: &str,
    ) -> String {
        if !self.sharded {
            return self.subject_key(subject, kind, name);
        }
        let shard = Self::shard_tag(beside.as_str());
        let subject = subject.as_str();
        let mut key = String::with_capacity(
            self.prefix.len() + shard.len() + subject.len() + kind.len() + name.len() + 3,
        );
        key.push_str(&self.prefix);
        key.push_str(":{");
        key.push_str(shard);
        key.push('}');
        key.push_str(subject);
        key.push_str(kind);
        key.push_str(name);
        key
    }

    /// The shard tag of `subject` in the cluster layout.
    pub fn shard_tag(subject: &str) -> &'static str {
        let shard = usize::from(slot(subject.as_bytes()) / (SLOTS / SHARDS as u16));
        &SHARD_TAGS[shard]
    }

    /// The `{…}` hash tag of a key built here (what decides its Redis Cluster slot); the
    /// whole key when it has none.
    pub fn hash_tag(key: &str) -> &str {
        key.find('{')
            .and_then(|open| {
                let close = open + key[open..].find('}')?;
                Some(&key[open + 1..close])
            })
            .unwrap_or(key)
    }

    /// The prefix every key of this deployment starts with, e.g. `pal:v1`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A token bucket of `budget` for `subject`: `pal:v1:{ip:203.0.113.7}:b:ip-anon`.
    pub fn bucket(&self, subject: &SubjectKey, budget: &str) -> String {
        self.subject_key(subject, ":b:", budget)
    }

    /// The multiplier of `subject` for endpoint class `class`, read by the bucket script:
    /// `pal:v1:{user:42}:m:auth`. Same hash tag as the subject's buckets.
    pub fn multiplier(&self, subject: &SubjectKey, class: &str) -> String {
        self.subject_key(subject, ":m:", class)
    }

    /// The sliding windows of login failures of `subject`, packed in one value
    /// (`lua/velocity_batch.lua`; windows `f` failures, `a` distinct accounts, `i…` / `d…`
    /// an account's failures per IP / device): `pal:v1:{user:alice}:win`.
    pub fn windows(&self, subject: &SubjectKey) -> String {
        self.subject_key(subject, ":", "win")
    }

    /// An account's lockout marker (value `lockout_id`, TTL = until): `pal:v1:{user:a}:lock`.
    pub fn lock(&self, account: &SubjectKey) -> String {
        self.subject_key(account, ":", "lock")
    }

    /// IPs and devices an account logged in from successfully, a window value (window `k`):
    /// `pal:v1:{user:a}:seen`. (Before windows were packed it was a sorted set named
    /// `known`; the new name keeps a new reader from meeting an old sorted set.)
    pub fn known(&self, account: &SubjectKey) -> String {
        self.subject_key(account, ":", "seen")
    }

    /// The stored scoring factors of `subject` (a hash, field per factor, `_v` version):
    /// `pal:v1:{ip:203.0.113.7}:f`. Same hash tag as its multipliers.
    pub fn factors(&self, subject: &SubjectKey) -> String {
        self.subject_key(subject, ":", "f")
    }

    /// A one-off marker of `subject` (alert de-duplication, spraying): `pal:v1:{user:a}:x:anomaly`.
    pub fn marker(&self, subject: &SubjectKey, name: &str) -> String {
        self.subject_key(subject, ":x:", name)
    }

    /// A deployment-wide scoring key, all in one slot: `pal:v1:{scoring}:due` (subjects to
    /// republish), `:active` (subjects with published multipliers), `:decisions` (the
    /// change stream), `:offenders:<minute>`, `:rates:<minute>` (request counts per key).
    pub fn scoring(&self, name: &str) -> String {
        let mut key = String::with_capacity(self.prefix.len() + name.len() + 12);
        key.push_str(&self.prefix);
        key.push_str(":{scoring}:");
        key.push_str(name);
        key
    }

    /// A deployment-wide sorted set of marks (`pal:v1:<name>`, scored by the Unix ms each
    /// member is marked until).
    pub fn marks(&self, name: &str) -> String {
        format!("{}:{name}", self.prefix)
    }

    /// One of the login guard's keys, all in one slot: `pal:v1:{login_guard}:<part>` (a
    /// slot's counts by its number, `until`, `released`, `baseline`).
    pub fn login_guard(&self, part: &str) -> String {
        format!("{}:{{login_guard}}:{part}", self.prefix)
    }

    /// The allow/deny lists' version (`pal:v1:{lists}:version`): bumped on every change, so
    /// each instance reloads its lists when it moves.
    pub fn lists_version(&self) -> String {
        format!("{}:{{lists}}:version", self.prefix)
    }

    /// The hot store's epoch marker (`pal:v1:{hot}:epoch`): written when its enforcement
    /// state is complete; gone means the hot store lost its data.
    pub fn epoch(&self) -> String {
        format!("{}:{{hot}}:epoch", self.prefix)
    }

    /// The lease of the instance rebuilding the hot store (`pal:v1:{hot}:rebuilding`).
    pub fn rebuild_lease(&self) -> String {
        format!("{}:{{hot}}:rebuilding", self.prefix)
    }

    /// A revoked API token's marker (`pal:v1:{access}:revoked:<token id>`): instances that
    /// cannot reach the database while it lives still drop the token from their caches.
    pub fn revoked_token(&self, token_id: &str) -> String {
        format!("{}:{{access}}:revoked:{token_id}", self.prefix)
    }

    /// `<prefix>:{<subject>}<kind><name>`, or `<prefix>:{<shard>}<subject><kind><name>` in the
    /// cluster layout; built without `format!` (on every limit check).
    fn subject_key(&self, subject: &SubjectKey, kind: &str, name: &str) -> String {
        let subject = subject.as_str();
        let shard = if self.sharded {
            Self::shard_tag(subject)
        } else {
            ""
        };
        let mut key = String::with_capacity(
            self.prefix.len() + shard.len() + subject.len() + kind.len() + name.len() + 3,
        );
        key.push_str(&self.prefix);
        key.push_str(":{");
        if self.sharded {
            key.push_str(shard);
            key.push('}');
            key.push_str(subject);
        } else {
            key.push_str(subject);
            key.push('}');
        }
        key.push_str(kind);
        key.push_str(name);
        key
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn hash_tags_are_the_subject() {
        use super::Keys;
        assert_eq!(Keys::hash_tag("pal:v1:{user:ann}:w:f"), "user:ann");
        assert_eq!(Keys::hash_tag("pal:v1:{scoring}:due"), "scoring");
        assert_eq!(Keys::hash_tag("no-tag"), "no-tag");
        assert_eq!(Keys::hash_tag("open{only"), "open{only");
    }

    use super::*;

    #[test]
    fn prefix_is_versioned() {
        assert_eq!(Keys::new("pal").prefix(), "pal:v1");
    }

    #[test]
    fn bucket_and_multiplier_share_the_subject_hash_tag() {
        let keys = Keys::new("pal");
        let user = SubjectKey::user("42", 64).unwrap();
        assert_eq!(
            keys.bucket(&user, "user-read"),
            "pal:v1:{user:42}:b:user-read"
        );
        assert_eq!(keys.multiplier(&user, "auth"), "pal:v1:{user:42}:m:auth");
        assert_eq!(
            keys.bucket(&SubjectKey::global(), "global"),
            "pal:v1:{global}:b:global"
        );
    }

    #[test]
    fn the_cluster_layout_groups_subjects_into_shards_spread_over_the_slots() {
        let keys = Keys::sharded("pal");
        let user = SubjectKey::user("42", 64).unwrap();
        let bucket = keys.bucket(&user, "user-read");
        let tag = Keys::hash_tag(&bucket);
        assert_eq!(bucket, format!("pal:v2:{{{tag}}}user:42:b:user-read"));
        // Every key of a subject shares the slot, and the shard is the subject's own slot's.
        for key in [
            keys.multiplier(&user, "auth"),
            keys.windows(&user),
            keys.lock(&user),
            keys.factors(&user),
        ] {
            assert_eq!(Keys::hash_tag(&key), tag, "{key}");
        }
        let width = SLOTS / SHARDS as u16;
        assert_eq!(
            slot(tag.as_bytes()) / width,
            slot(b"user:42") / width,
            "{tag}"
        );
        // Each shard's tag sits in the middle of its range: the contiguous ranges of 3
        // masters hold 5, 6 and 5 shards.
        let mut per_master = [0; 3];
        for (shard, tag) in SHARD_TAGS.iter().enumerate() {
            let s = slot(tag.as_bytes());
            assert_eq!(usize::from(s / width), shard, "{tag}");
            assert!((s % width).abs_diff(width / 2) <= width / 16, "{tag}");
            per_master[usize::from(s) * 3 / usize::from(SLOTS)] += 1;
        }
        assert_eq!(per_master, [5, 6, 5]);
        // Many subjects spread over every shard.
        let mut seen = std::collections::HashSet::new();
        for n in 0..1000 {
            seen.insert(Keys::shard_tag(&format!("ip:10.0.{}.{}", n / 256, n % 256)));
        }
        assert_eq!(seen.len(), SHARDS);
        assert_eq!(Keys::hash_tag("pal:v2:{scoring}:due"), "scoring");
        // A global part beside an address: in the address's slot.
        let ip = SubjectKey::from_text("ip:192.0.2.1").unwrap();
        let part = keys.part_key(&ip, &SubjectKey::global(), ":b:", "global");
        assert_eq!(
            Keys::hash_tag(&part),
            Keys::hash_tag(&keys.bucket(&ip, "ip-anon"))
        );
        assert!(part.ends_with("}global:b:global"), "{part}");
        assert_eq!(
            Keys::new("pal").part_key(&ip, &SubjectKey::global(), ":b:", "global"),
            "pal:v1:{global}:b:global"
        );
    }
}
