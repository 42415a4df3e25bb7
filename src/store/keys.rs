//! Redis key names, built in one place.
//!
//! Layout: `<prefix>:v1:{<subject>}:<kind>[:<qualifier>]`. The `{…}` hash tag is the subject
//! key, so a bucket and the multiplier it reads always share a Redis Cluster slot.

use crate::model::SubjectKey;

/// Builds every Redis key (and in-process entry name) of one deployment.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// Keys under `prefix` (validated by the settings: short, no `{`, `}` or `:`).
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: format!("{prefix}:v1"),
        }
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

    /// `<prefix>:{<subject>}<kind><name>`, built without `format!` (on every limit check).
    fn subject_key(&self, subject: &SubjectKey, kind: &str, name: &str) -> String {
        let subject = subject.as_str();
        let mut key =
            String::with_capacity(self.prefix.len() + subject.len() + kind.len() + name.len() + 3);
        key.push_str(&self.prefix);
        key.push_str(":{");
        key.push_str(subject);
        key.push('}');
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
}
