//! Redis key names, built in one place.
//!
//! Layout: `<prefix>:v1:{<subject>}:<kind>[:<qualifier>]`. The `{…}` hash tag is the subject
//! key, so a bucket and the multiplier it reads always share a Redis Cluster slot.

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

    /// The prefix every key of this deployment starts with, e.g. `pal:v1`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_is_versioned() {
        assert_eq!(Keys::new("pal").prefix(), "pal:v1");
    }
}
