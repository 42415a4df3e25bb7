//! The ids a subject is known by (accounts, users, devices, tenants): how each profile makes
//! them canonical, and what every profile refuses.

use serde::{Deserialize, Serialize};

use super::SubjectKey;

/// An id that cannot name a subject.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {problem}")]
pub struct InvalidId {
    /// Which field.
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: IdProblem,
}

/// What is wrong with an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IdProblem {
    /// Empty (after trimming) or longer than allowed.
    #[error("must be 1-{0} characters")]
    Length(usize),
    /// A control character (C0, DEL, C1).
    #[error("must not contain control characters")]
    Control,
    /// An invisible character (Unicode Default_Ignorable_Code_Point: zero-width spaces and
    /// joiners, soft hyphen, variation selectors, bidi controls, …).
    #[error("must not contain invisible characters (zero-width, bidi controls, …)")]
    Invisible,
}

/// How account (and user) ids are compared. Setting `http.account_ids`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccountIds {
    /// `Alice@Example.com`, `alice@example.com` and fullwidth `ａｌｉｃｅ@…` are one
    /// account: surrounding whitespace is trimmed, then NFKC, full Unicode case folding and
    /// NFKC again (the compatibility caseless form of UAX #15 / Unicode §3.13).
    ///
    /// The full stops IDNA reads as dots (U+3002 `。`, and U+FF0E and U+FF61, which NFKC
    /// brings to `.` and `。`) become `.`: `victim@example。com` is `victim@example.com`.
    #[default]
    CaseInsensitive,
    /// As `case_insensitive`, and accents do not count either: `víctim`, `vİctim` and
    /// `victim` are one account. Combining marks are removed after canonical decomposition,
    /// and letters whose stroke or bar is their accent (`ø ł đ ħ ŧ`) are read as their base
    /// letter, as accent-insensitive collations compare them (MySQL's default
    /// `utf8mb4_0900_ai_ci`, SQL Server's `_CI_AI`). Pick it when the auth service compares
    /// accounts that way, or a stranger gets a fresh lockout for each accent.
    AccentInsensitive,
    /// Opaque ids, compared byte for byte (nothing trimmed or folded).
    Exact,
}

/// NFKC, full case folding, NFKC, repeated until it holds still (for a few characters one
/// round is not yet stable, and a canonical id must be its own canonical id); IDNA's full
/// stops read as `.`; with `accents`, accents removed as well.
fn fold(trimmed: &str, accents: bool) -> String {
    use unicode_normalization::UnicodeNormalization;
    let mut id = trimmed.to_owned();
    for _ in 0..3 {
        let nfkc: String = id.nfkc().collect();
        let folded = caseless::default_case_fold_str(&nfkc);
        let mut next: String = folded
            .nfkc()
            .map(|ch| if ch == '\u{3002}' { '.' } else { ch })
            .collect();
        if accents {
            next = next
                .nfd()
                .filter(|&ch| !unicode_normalization::char::is_combining_mark(ch))
                .map(|ch| match ch {
                    'ø' => 'o',
                    'ł' => 'l',
                    'đ' => 'd',
                    'ħ' => 'h',
                    'ŧ' => 't',
                    other => other,
                })
                .nfc()
                .collect();
        }
        let next = next.trim().to_owned();
        if next == id {
            break;
        }
        id = next;
    }
    id
}

/// The identifier profile: how account and device ids that enter Palisade (ingest, status,
/// limit checks, gateways, lists, analyst searches) become the one canonical id each
/// subject is known by.
///
/// Every profile refuses control characters and invisible ones
/// (Default_Ignorable_Code_Point): `ali\u{200b}ce` is not a way to get a fresh account.
/// Device ids are trimmed and checked but otherwise kept exactly (they are opaque).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identifiers {
    /// How account ids compare.
    pub accounts: AccountIds,
    /// Longest id in characters (after canonicalisation).
    pub max_len: usize,
}

fn check_characters(field: &'static str, id: &str) -> Result<(), InvalidId> {
    use icu_properties::props::DefaultIgnorableCodePoint;
    let invalid = |problem| InvalidId { field, problem };
    if id.chars().any(char::is_control) {
        return Err(invalid(IdProblem::Control));
    }
    let ignorable = icu_properties::CodePointSetData::new::<DefaultIgnorableCodePoint>();
    if !id.is_ascii() && id.chars().any(|ch| ignorable.contains(ch)) {
        return Err(invalid(IdProblem::Invisible));
    }
    Ok(())
}

/// Free text people write and others read (reasons, token names), checked.
///
/// Surrounding whitespace trimmed, 1 to `max` characters, no control characters (a `\r` or
/// `\n` forges lines in logs and exported files) and no invisible ones (bidi controls such
/// as U+202E reorder what a reader sees; zero-width characters hide text).
pub fn free_text(text: &str, max: usize) -> Result<&str, IdProblem> {
    let text = text.trim();
    let count = text.chars().count();
    if count == 0 || count > max {
        return Err(IdProblem::Length(max));
    }
    check_characters("text", text).map_err(|invalid| invalid.problem)?;
    Ok(text)
}

/// `text` safe to write on one line of a file another program parses (a VCL comment).
///
/// Every control or invisible character becomes a space: for text stored before
/// [`free_text`] refused them, and for any text that did not pass through it.
pub fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    use icu_properties::props::DefaultIgnorableCodePoint;
    let ignorable = icu_properties::CodePointSetData::new::<DefaultIgnorableCodePoint>();
    let bad = |ch: char| ch.is_control() || (!ch.is_ascii() && ignorable.contains(ch));
    if !text.chars().any(bad) {
        return std::borrow::Cow::Borrowed(text);
    }
    std::borrow::Cow::Owned(
        text.chars()
            .map(|ch| if bad(ch) { ' ' } else { ch })
            .collect(),
    )
}

pub(super) fn check_length(field: &'static str, id: &str, max: usize) -> Result<(), InvalidId> {
    let count = if id.is_ascii() {
        id.len()
    } else {
        id.chars().count()
    };
    if count == 0 || count > max {
        return Err(InvalidId {
            field,
            problem: IdProblem::Length(max),
        });
    }
    Ok(())
}

impl Identifiers {
    /// The canonical form of an account id sent in `field`.
    pub fn account<'a>(
        &self,
        field: &'static str,
        raw: &'a str,
    ) -> Result<std::borrow::Cow<'a, str>, InvalidId> {
        use std::borrow::Cow;
        let id = match self.accounts {
            AccountIds::Exact => {
                check_characters(field, raw)?;
                Cow::Borrowed(raw)
            }
            AccountIds::CaseInsensitive | AccountIds::AccentInsensitive => {
                let trimmed = raw.trim();
                check_characters(field, trimmed)?;
                if trimmed.is_ascii() {
                    // NFKC leaves ASCII alone, folding ASCII is lower-casing it and it has no
                    // accents (a copy only when there is upper case: most ids arrive
                    // canonical).
                    if trimmed.bytes().any(|b| b.is_ascii_uppercase()) {
                        Cow::Owned(trimmed.to_ascii_lowercase())
                    } else {
                        Cow::Borrowed(trimmed)
                    }
                } else {
                    let id = fold(trimmed, self.accounts == AccountIds::AccentInsensitive);
                    // Normalisation may map a visible character to an invisible one (the
                    // halfwidth Hangul filler): checked again.
                    check_characters(field, &id)?;
                    Cow::Owned(id)
                }
            }
        };
        check_length(field, &id, self.max_len)?;
        Ok(id)
    }

    /// The `user:` subject of an account or user id sent in `field`.
    pub fn user_key(&self, field: &'static str, raw: &str) -> Result<SubjectKey, InvalidId> {
        let id = self.account(field, raw)?;
        SubjectKey::user(&id, usize::MAX)
    }

    /// A device id as kept: surrounding whitespace trimmed, checked, otherwise exact.
    pub fn device<'a>(&self, raw: &'a str) -> Result<&'a str, InvalidId> {
        let id = raw.trim();
        check_characters("device_id", id)?;
        check_length("device_id", id, self.max_len)?;
        Ok(id)
    }

    /// The `device:` subject of a device id.
    pub fn device_key(&self, raw: &str) -> Result<SubjectKey, InvalidId> {
        SubjectKey::device(self.device(raw)?, usize::MAX)
    }

    /// The `tenant:` subject of a tenant id: surrounding whitespace trimmed, checked,
    /// otherwise exact (as a device id).
    pub fn tenant_key(&self, raw: &str) -> Result<SubjectKey, InvalidId> {
        let id = raw.trim();
        check_characters("tenant", id)?;
        check_length("tenant", id, self.max_len)?;
        SubjectKey::tenant(id, usize::MAX)
    }
}
