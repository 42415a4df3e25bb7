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

    /// The first path segment every text this matches starts with (`auth` of `/auth/*` and
    /// of `/auth`); None when a star comes before it ends (`/auth*`, `*.json`).
    pub(super) fn first_segment(&self) -> Option<&str> {
        let rest = self.pieces.first()?.strip_prefix('/')?;
        match rest.find('/') {
            Some(end) => Some(&rest[..end]),
            None if self.pieces.len() == 1 => Some(rest),
            None => None,
        }
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

/// The classes whose patterns may match a path, by the path's first segment.
///
/// A pattern that names its first segment literally (`/auth/*`, `/login`) matches only
/// paths with that segment, so a path is tried against the classes with a pattern of its own
/// segment and those with a pattern that starts with a star, in the order classes are
/// tried, rather than against every class: the cost of a path no cache holds stays flat as
/// classes are added.
#[derive(Debug, Clone, Default)]
pub(super) struct FirstSegments {
    by_segment: std::collections::HashMap<Box<str>, Vec<usize>, foldhash::fast::RandomState>,
    /// Classes with a pattern that may match any first segment.
    any: Vec<usize>,
}

impl FirstSegments {
    /// From each class's patterns, classes in the order they are tried.
    pub(super) fn new<'a>(classes: impl Iterator<Item = &'a [Pattern]>) -> Self {
        let mut out = Self::default();
        for (index, patterns) in classes.enumerate() {
            for pattern in patterns {
                let list = match pattern.first_segment() {
                    Some(segment) => out.by_segment.entry(segment.into()).or_default(),
                    None => &mut out.any,
                };
                if list.last() != Some(&index) {
                    list.push(index);
                }
            }
        }
        out
    }

    /// The classes that may match `path`, in the order they are tried.
    pub(super) fn candidates(&self, path: &str) -> impl Iterator<Item = usize> + '_ {
        let own = path
            .strip_prefix('/')
            .map(|rest| rest.split_once('/').map_or(rest, |(segment, _)| segment))
            .and_then(|segment| self.by_segment.get(segment))
            .map_or(&[][..], Vec::as_slice);
        let (mut a, mut b) = (
            own.iter().copied().peekable(),
            self.any.iter().copied().peekable(),
        );
        std::iter::from_fn(move || match (a.peek().copied(), b.peek().copied()) {
            (Some(x), Some(y)) if x == y => {
                a.next();
                b.next()
            }
            (Some(x), Some(y)) if x < y => a.next(),
            (Some(_), Some(_)) | (None, Some(_)) => b.next(),
            (Some(_), None) => a.next(),
            (None, None) => None,
        })
    }
}

/// `*` matches any run of characters (including `/`); everything else literally.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    Pattern::new(pattern).matches(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first class (in order) with a pattern matching `path`, trying every class.
    fn every_class(classes: &[Vec<Pattern>], path: &str) -> Option<usize> {
        classes
            .iter()
            .position(|patterns| patterns.iter().any(|p| p.matches(path)))
    }

    #[test]
    fn the_classes_of_a_first_segment_find_what_every_class_finds() {
        let texts: &[&[&str]] = &[
            &["/auth/*", "/login"],
            &["/login*"],
            &["*.json"],
            &["/v1/*/push*", "/devices/*/push*"],
            &["/"],
            &["/otp/send", "/sms*"],
            &[],
            &["/auth"],
            &["*"],
        ];
        let classes: Vec<Vec<Pattern>> = texts
            .iter()
            .map(|patterns| patterns.iter().map(|p| Pattern::new(p)).collect())
            .collect();
        let segments = FirstSegments::new(classes.iter().map(Vec::as_slice));
        let paths = [
            "/",
            "/auth",
            "/auth/",
            "/auth/token",
            "/authx",
            "/login",
            "/login.json",
            "/loginx/y",
            "/v1/a/push",
            "/v1/push",
            "/devices/9/push/x",
            "/otp/send",
            "/otp/send/",
            "/sms",
            "/smsx/1",
            "/x.json",
            "",
            "login",
            "/a/b/c",
            "//",
        ];
        for path in paths {
            let found = segments
                .candidates(path)
                .find(|&i| classes[i].iter().any(|p| p.matches(path)));
            assert_eq!(found, every_class(&classes, path), "{path:?}");
        }
        // Fewer classes tried than there are: `/otp/send` meets its own and the starred.
        let tried: Vec<usize> = segments.candidates("/otp/send").collect();
        assert_eq!(tried, [1, 2, 5, 8]);
    }

    proptest::proptest! {
        /// Any classes of patterns and any path over a small alphabet (slashes, stars, two
        /// letters, a dot, so that segments collide often): the first class found among the
        /// candidates is the first class a scan of every class finds.
        #[test]
        fn generated_classes_and_paths_agree_with_a_scan_of_every_class(
            texts in proptest::collection::vec(
                proptest::collection::vec("[/*ab.]{0,6}", 0..3),
                0..8,
            ),
            paths in proptest::collection::vec("[/ab.]{0,7}", 1..16),
        ) {
            let classes: Vec<Vec<Pattern>> = texts
                .iter()
                .map(|patterns| patterns.iter().map(|p| Pattern::new(p)).collect())
                .collect();
            let segments = FirstSegments::new(classes.iter().map(Vec::as_slice));
            for path in &paths {
                let found = segments
                    .candidates(path)
                    .find(|&i| classes[i].iter().any(|p| p.matches(path)));
                proptest::prop_assert_eq!(found, every_class(&classes, path), "{:?}", path);
            }
        }
    }
}
