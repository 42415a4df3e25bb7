//! Which class a path is in, fast: class path patterns matched without allocating, and the
//! cache of the classes of recently seen (method, endpoint) pairs.

/// Slots of the class cache (a power of two).
const CLASS_CACHE_SLOTS: usize = 512;

/// The classes of recently seen (method, endpoint) pairs as sent, direct-mapped by a hash
/// of the pair: most traffic repeats a few endpoints, and a hit skips canonicalisation and
/// every pattern. A slot whose lock is held is passed by (classified the long way); a miss
/// overwrites its slot, so unique paths (an attacker's) cost one copy and evict nothing
/// for long. Bounded: at most 512 paths of at most [`CLASS_CACHE_MAX_PATH`] bytes.
pub(super) struct ClassCache {
    slots: Box<[std::sync::Mutex<CachedClass>]>,
    hasher: foldhash::fast::RandomState,
}

/// Paths longer than this are classified every time (never cached).
const CLASS_CACHE_MAX_PATH: usize = 256;

#[derive(Default)]
struct CachedClass {
    method: String,
    endpoint: String,
    class: usize,
}

impl ClassCache {
    pub(super) fn new() -> Self {
        Self {
            slots: (0..CLASS_CACHE_SLOTS)
                .map(|_| std::sync::Mutex::new(CachedClass::default()))
                .collect(),
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    fn slot(&self, method: &str, endpoint: &str) -> &std::sync::Mutex<CachedClass> {
        use std::hash::BuildHasher;
        let hash = self.hasher.hash_one((method, endpoint));
        &self.slots[(hash as usize) & (CLASS_CACHE_SLOTS - 1)]
    }

    pub(super) fn get(&self, method: &str, endpoint: &str) -> Option<usize> {
        let slot = self.slot(method, endpoint).try_lock().ok()?;
        (!slot.endpoint.is_empty() && slot.endpoint == endpoint && slot.method == method)
            .then_some(slot.class)
    }

    pub(super) fn put(&self, method: &str, endpoint: &str, class: usize) {
        if endpoint.len() > CLASS_CACHE_MAX_PATH || method.len() > 16 {
            return;
        }
        if let Ok(mut slot) = self.slot(method, endpoint).try_lock() {
            slot.method.clear();
            slot.method.push_str(method);
            slot.endpoint.clear();
            slot.endpoint.push_str(endpoint);
            slot.class = class;
        }
    }
}

impl Clone for ClassCache {
    /// An empty cache: classes are cached per budget table.
    fn clone(&self) -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for ClassCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClassCache")
            .field("slots", &CLASS_CACHE_SLOTS)
            .finish()
    }
}

/// A path pattern: `*` matches any run of characters (including `/`); everything else
/// literally. Split once at load (the pieces between stars searched with finders built
/// then), matched on every check without allocating.
#[derive(Debug, Clone)]
pub(super) struct Pattern {
    /// The literal pieces between stars.
    pieces: Vec<String>,
    /// Finders of the pieces between the first and the last.
    middle: Vec<memchr::memmem::Finder<'static>>,
}

impl Pattern {
    pub(super) fn new(pattern: &str) -> Self {
        let pieces: Vec<String> = pattern.split('*').map(str::to_owned).collect();
        let middle = match pieces.len() {
            0..=2 => Vec::new(),
            n => pieces[1..n - 1]
                .iter()
                .map(|piece| memchr::memmem::Finder::new(piece.as_bytes()).into_owned())
                .collect(),
        };
        Self { pieces, middle }
    }

    pub(super) fn matches(&self, text: &str) -> bool {
        let Some((first, rest_pieces)) = self.pieces.split_first() else {
            return text.is_empty();
        };
        let Some(rest) = text.strip_prefix(first.as_str()) else {
            return false;
        };
        let Some(last) = rest_pieces.last() else {
            return rest.is_empty();
        };
        let mut rest = rest.as_bytes();
        for finder in &self.middle {
            match finder.find(rest) {
                Some(at) => rest = &rest[at + finder.needle().len()..],
                None => return false,
            }
        }
        rest.len() >= last.len() && rest.ends_with(last.as_bytes())
    }
}

/// `*` matches any run of characters (including `/`); everything else literally.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    Pattern::new(pattern).matches(text)
}
