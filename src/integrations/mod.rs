//! What other tools read and write, in their own formats.
//!
//! - [`crowdsec`]: Palisade's IP bans as CrowdSec's decision stream, for existing bouncers.
//! - [`descriptors`]: envoyproxy/ratelimit's YAML descriptor rules, read as they are and
//!   counted in the same hot store as the classes' budgets.
//! - [`export`]: the budgets and deny entries a CDN can enforce, as its own rules.
//!
//! Each reads the rooms below it (reputation's lists, the limits' settings) and owns no
//! state a decision needs: the edge (`api/`) serves them.

pub mod crowdsec;
pub mod descriptors;
pub mod export;
