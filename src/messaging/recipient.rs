//! A recipient in canonical form: every spelling of one phone number, e-mail address or push
//! token is one key, so a budget per recipient cannot be dodged by spelling it differently.
//!
//! - **Phone numbers** are parsed with `phonenumber` (libphonenumber's metadata) and written
//!   in E.164: `+44 7700 900123`, `00447700 900123`, `tel:+44-7700-900123` and, with
//!   `messaging.default_region = "GB"`, `07700 900123` are all `+447700900123`. Their
//!   destination is the country code and the first `messaging.destination_digits` digits of
//!   the national number (`+44770`); a number in a premium-rate range (by the same metadata)
//!   is marked, and its destination budgets are tightened.
//! - **E-mail addresses** are parsed with `email_address` and lower-cased; a `+tag` after the
//!   local part is dropped (sub-addressing: the mail reaches the same mailbox at the providers
//!   that support it, and a tag is free to invent), and for `gmail.com` and `googlemail.com`
//!   dots in the local part are dropped and the domain is `gmail.com` (Gmail ignores them).
//!   Their destination is the domain.
//! - **Push tokens** (APNs, FCM, Web Push) are opaque: the key is the SHA-256 of the token
//!   as sent (hex, 32 characters), so no token is stored; no destination.
//!
//! The kind is inferred (an `@` is an address; only digits, spaces, `+`, `(`, `)`, `.` and
//! `-` is a phone number; anything else a push token) or named with a scheme: `tel:`,
//! `mailto:` or `push:`.

use sha2::{Digest, Sha256};

use crate::config::MessagingSettings;
use crate::model::{SubjectKey, SubjectKind};

/// The kind of a recipient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A phone number (SMS, voice).
    Phone,
    /// An e-mail address.
    Email,
    /// A push notification token.
    Push,
}

/// A recipient, canonical.
#[derive(Debug, Clone, PartialEq)]
pub struct Recipient {
    /// What it is.
    pub kind: Kind,
    /// `recipient:+447700900123`, `recipient:alice@example.com`, `recipient:push:3f…`.
    pub key: SubjectKey,
    /// `destination:+44770` or `destination:@example.com`; none for push tokens.
    pub destination: Option<SubjectKey>,
    /// A premium-rate number (libphonenumber's ranges).
    pub premium_rate: bool,
    /// The multiplier of its destination budgets: `messaging.premium_rate_factor` for a
    /// premium-rate number, 1 otherwise.
    pub destination_factor: f64,
}

/// Why a recipient was refused (a 400 with this message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidRecipient(String);

/// Providers whose mailboxes ignore dots in the local part.
const DOTLESS: [&str; 2] = ["gmail.com", "googlemail.com"];

impl Recipient {
    /// Parses `raw` into its canonical form.
    pub fn parse(raw: &str, settings: &MessagingSettings) -> Result<Self, InvalidRecipient> {
        let raw = raw.trim();
        if raw.is_empty() || raw.len() > 512 {
            return Err(InvalidRecipient(
                "recipient must be 1–512 characters".to_owned(),
            ));
        }
        if let Some(rest) = strip_scheme(raw, "tel:") {
            return phone(rest, settings);
        }
        if let Some(rest) = strip_scheme(raw, "mailto:") {
            return email(rest);
        }
        if let Some(rest) = strip_scheme(raw, "push:") {
            return Ok(push(rest));
        }
        if raw.contains('@') {
            return email(raw);
        }
        let phone_like = raw
            .chars()
            .all(|c| c.is_ascii_digit() || " +().-".contains(c));
        if phone_like {
            return phone(raw, settings);
        }
        Ok(push(raw))
    }
}

impl From<Recipient> for crate::limiter::RecipientKeys {
    fn from(recipient: Recipient) -> Self {
        Self {
            key: recipient.key,
            destination: recipient.destination,
            destination_factor: recipient.destination_factor,
        }
    }
}

/// Recipients made canonical under `[messaging]`, the recent spellings remembered.
///
/// A phone number's parse with libphonenumber's metadata is the dearest part of a messaging
/// check (`cargo bench --bench palisade -- messaging_check`), and a resend, a flood of one
/// number or a pump over a range repeats the same spellings.
#[derive(Debug)]
pub struct Recipients {
    settings: MessagingSettings,
    recent: quick_cache::sync::Cache<String, Result<Recipient, InvalidRecipient>>,
}

/// Spellings remembered.
const RECENT: usize = 20_000;

impl Recipients {
    /// Canonical forms under `settings`.
    pub fn new(settings: MessagingSettings) -> Self {
        // Compiled here, not on a request's path.
        std::sync::LazyLock::force(&PREMIUM_RATE);
        Self {
            settings,
            recent: quick_cache::sync::Cache::new(RECENT),
        }
    }

    /// The settings in force.
    pub fn settings(&self) -> &MessagingSettings {
        &self.settings
    }

    /// The destination named by `text`: its key as written (`destination:+44909`, `+44909`,
    /// `@example.com`), or the destination of a recipient in it (`+44 909 876 5432`).
    pub fn destination(&self, text: &str) -> Result<SubjectKey, InvalidRecipient> {
        let bare = text.trim();
        let bare = bare.strip_prefix("destination:").unwrap_or(bare);
        match self.parse(bare) {
            Ok(recipient) => recipient
                .destination
                .ok_or_else(|| InvalidRecipient("a push token has no destination".to_owned())),
            // Too short for a number: a destination's own key.
            Err(_)
                if bare.len() > 1
                    && bare.starts_with('+')
                    && bare[1..].bytes().all(|b| b.is_ascii_digit()) =>
            {
                Ok(SubjectKey::messaging(SubjectKind::Destination, bare))
            }
            Err(_) if bare.len() > 1 && bare.starts_with('@') && !bare[1..].contains('@') => Ok(
                SubjectKey::messaging(SubjectKind::Destination, &bare.to_lowercase()),
            ),
            Err(err) => Err(err),
        }
    }

    /// [`Recipient::parse`] of `raw`, remembered.
    pub fn parse(&self, raw: &str) -> Result<Recipient, InvalidRecipient> {
        if let Some(known) = self.recent.get(raw) {
            return known;
        }
        let parsed = Recipient::parse(raw, &self.settings);
        // Long inputs are rare and refused anyway: not worth a slot.
        if raw.len() <= 128 {
            self.recent.insert(raw.to_owned(), parsed.clone());
        }
        parsed
    }
}

fn strip_scheme<'a>(raw: &'a str, scheme: &str) -> Option<&'a str> {
    raw.get(..scheme.len())
        .filter(|head| head.eq_ignore_ascii_case(scheme))
        .map(|_| &raw[scheme.len()..])
}

fn phone(raw: &str, settings: &MessagingSettings) -> Result<Recipient, InvalidRecipient> {
    // Visual separators carry nothing, and the parser refuses some runs of them
    // (`+4470-0-6-…`): it is given the digits and the `+` alone.
    let compact: String = raw.chars().filter(|c| !" -.()".contains(*c)).collect();
    let region = match international_region(&compact) {
        Some(region) => Some(region),
        None => settings.default_region().map_err(InvalidRecipient)?,
    };
    let number = phonenumber::parse(region, &compact).map_err(|err| {
        InvalidRecipient(format!(
            "recipient {raw:?} is not a phone number ({err}){}",
            if region.is_none() && !raw.starts_with('+') {
                "; write it with its country code (+44…) or set messaging.default_region"
            } else {
                ""
            }
        ))
    })?;
    let code = number.code().value();
    let national = number.national().to_string();
    // Whether a number is assigned is the carrier's business (libphonenumber's validity lags
    // numbering plans, and excludes ranges such as the UK's 07700 900xxx); its length is not.
    let digits = code.to_string().len() + national.len();
    if national.len() < 4 || digits > 15 {
        return Err(InvalidRecipient(format!(
            "recipient {raw:?} is not a phone number (a national number of at least 4 digits, \
             at most 15 with the country code)"
        )));
    }
    let e164 = format!("+{code}{national}");
    let digits = national
        .get(..settings.destination_digits as usize)
        .unwrap_or(&national);
    let premium_rate = premium_rate(code, &national);
    Ok(Recipient {
        kind: Kind::Phone,
        key: SubjectKey::messaging(SubjectKind::Recipient, &e164),
        destination: Some(SubjectKey::messaging(
            SubjectKind::Destination,
            &format!("+{code}{digits}"),
        )),
        premium_rate,
        destination_factor: if premium_rate {
            settings.premium_rate_factor
        } else {
            1.0
        },
    })
}

/// The main region of an international number's country calling code (`+44…`: GB), found
/// from its first one to three digits (calling codes are prefix-free); None for a number
/// written without `+`, or a non-geographic code.
///
/// The parser is told it: without a region it finds which region of a shared code a
/// number belongs to by matching it against every region's number patterns before it reads
/// it, and its patterns are matched through one process-wide cache of 100 compiled
/// expressions behind a mutex, so a mix of countries keeps recompiling them (the bench's
/// `phonenumber_parse_every_country` against `parse_phone_every_country`). The region picks only the
/// national-prefix rule, which the regions of one code share; `+1 1 869…` is then the same
/// number as `+1 869…`, as it is dialled.
fn international_region(compact: &str) -> Option<phonenumber::country::Id> {
    let digits = compact.strip_prefix('+')?;
    (1..=3).find_map(|len| {
        let code: u16 = digits.get(..len)?.parse().ok()?;
        let regions = phonenumber::metadata::DATABASE.by_code(&code)?;
        let main = regions
            .iter()
            .find(|metadata| metadata.is_main_country_for_code())
            .or(regions.first())?;
        main.id().parse().ok()
    })
}

/// One region's premium-rate numbers: their national lengths (any, when empty) and pattern.
struct PremiumRange {
    lengths: Vec<u16>,
    pattern: regex::Regex,
}

/// Premium-rate ranges by country calling code, compiled once from libphonenumber's metadata
/// (the parser's own matchers share the thrashing cache above).
static PREMIUM_RATE: std::sync::LazyLock<std::collections::HashMap<u16, Vec<PremiumRange>>> =
    std::sync::LazyLock::new(|| {
        let mut ranges: std::collections::HashMap<u16, Vec<PremiumRange>> =
            std::collections::HashMap::new();
        for metadata in phonenumber::metadata::DATABASE.iter() {
            let Some(premium) = metadata.descriptors().premium_rate() else {
                continue;
            };
            let source = format!("^(?:{})$", premium.national_number().as_str());
            // The metadata's patterns are written across lines (whitespace is not part of
            // them, as for the crate's own matchers). They are libphonenumber's and compile;
            // one that did not would only leave its region's numbers unmarked.
            if let Ok(pattern) = regex::RegexBuilder::new(&source)
                .ignore_whitespace(true)
                .build()
            {
                ranges
                    .entry(metadata.country_code())
                    .or_default()
                    .push(PremiumRange {
                        lengths: premium.possible_length().to_vec(),
                        pattern,
                    });
            }
        }
        ranges
    });

/// Whether `national` is in a premium-rate range of a region of calling code `code` (the
/// regions of one code do not number each other's ranges).
fn premium_rate(code: u16, national: &str) -> bool {
    PREMIUM_RATE.get(&code).is_some_and(|ranges| {
        ranges.iter().any(|range| {
            (range.lengths.is_empty() || range.lengths.contains(&(national.len() as u16)))
                && range.pattern.is_match(national)
        })
    })
}

fn email(raw: &str) -> Result<Recipient, InvalidRecipient> {
    let address: email_address::EmailAddress = raw.parse().map_err(|err| {
        InvalidRecipient(format!(
            "recipient {raw:?} is not an e-mail address ({err})"
        ))
    })?;
    let mut domain = address.domain().to_lowercase();
    let mut local = address.local_part().to_lowercase();
    if let Some((mailbox, _tag)) = local.split_once('+')
        && !mailbox.is_empty()
    {
        local = mailbox.to_owned();
    }
    if DOTLESS.contains(&domain.as_str()) {
        local.retain(|c| c != '.');
        domain = "gmail.com".to_owned();
    }
    Ok(Recipient {
        kind: Kind::Email,
        key: SubjectKey::messaging(SubjectKind::Recipient, &format!("{local}@{domain}")),
        destination: Some(SubjectKey::messaging(
            SubjectKind::Destination,
            &format!("@{domain}"),
        )),
        premium_rate: false,
        destination_factor: 1.0,
    })
}

fn push(token: &str) -> Recipient {
    let digest = Sha256::digest(token.trim().as_bytes());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    Recipient {
        kind: Kind::Push,
        key: SubjectKey::messaging(SubjectKind::Recipient, &format!("push:{hex}")),
        destination: None,
        premium_rate: false,
        destination_factor: 1.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gb() -> MessagingSettings {
        MessagingSettings {
            default_region: "GB".to_owned(),
            ..MessagingSettings::default()
        }
    }

    fn key(raw: &str, settings: &MessagingSettings) -> String {
        Recipient::parse(raw, settings).unwrap().key.to_string()
    }

    #[test]
    fn every_spelling_of_a_phone_number_is_one_recipient() {
        let settings = gb();
        for raw in [
            "+44 7700 900123",
            "+447700900123",
            "00447700900123",
            "07700 900123",
            "(07700) 900-123",
            "tel:+44-7700-900123",
            "TEL:+44 7700 900123",
            "+44 (0) 7700 900123",
            "+44-7-7-0-0-9-0-0.1-2-3",
        ] {
            assert_eq!(key(raw, &settings), "recipient:+447700900123", "{raw}");
        }
        let number = Recipient::parse("07700 900123", &settings).unwrap();
        assert_eq!(number.kind, Kind::Phone);
        assert_eq!(
            number.destination.unwrap().to_string(),
            "destination:+44770"
        );
        assert!(!number.premium_rate);
    }

    #[test]
    fn a_national_number_needs_a_region() {
        let err = Recipient::parse("07700 900123", &MessagingSettings::default()).unwrap_err();
        assert!(
            err.to_string().contains("messaging.default_region"),
            "{err}"
        );
        assert_eq!(
            key("+44 7700 900123", &MessagingSettings::default()),
            "recipient:+447700900123"
        );
        assert!(Recipient::parse("+44 12", &gb()).is_err(), "too short");
    }

    #[test]
    fn premium_rate_numbers_are_marked() {
        // 09098 765432: the UK premium-rate example of libphonenumber's metadata.
        let premium = Recipient::parse("+44 909 876 5432", &gb()).unwrap();
        assert!(premium.premium_rate);
        assert_eq!(premium.destination_factor, 0.1);
        assert_eq!(
            premium.destination.unwrap().to_string(),
            "destination:+44909"
        );
    }

    /// Every region's example numbers of every type, as `+<code><national>`.
    fn every_example_number() -> Vec<(u16, String)> {
        let mut numbers = Vec::new();
        for metadata in phonenumber::metadata::DATABASE.iter() {
            let d = metadata.descriptors();
            for descriptor in [
                d.fixed_line(),
                d.mobile(),
                d.toll_free(),
                d.premium_rate(),
                d.shared_cost(),
                d.personal_number(),
                d.voip(),
                d.pager(),
                d.uan(),
                d.voicemail(),
            ]
            .into_iter()
            .flatten()
            {
                if let Some(example) = descriptor.example() {
                    numbers.push((metadata.country_code(), example.to_owned()));
                }
            }
        }
        assert!(numbers.len() > 1000, "{} examples", numbers.len());
        numbers
    }

    #[test]
    fn naming_the_region_of_an_international_number_changes_no_canonical_form() {
        let settings = MessagingSettings::default();
        let mut compared = 0;
        for (code, example) in every_example_number() {
            let raw = format!("+{code}{example}");
            // The library left to find the region itself.
            let Ok(unhinted) = phonenumber::parse(None, &raw) else {
                continue;
            };
            let Ok(ours) = Recipient::parse(&raw, &settings) else {
                continue;
            };
            assert_eq!(
                ours.key.to_string(),
                format!(
                    "recipient:+{}{}",
                    unhinted.code().value(),
                    unhinted.national()
                ),
                "{raw}"
            );
            compared += 1;
        }
        assert!(compared > 1000, "{compared} compared");
    }

    #[test]
    fn premium_rate_ranges_are_the_regions_own() {
        let settings = MessagingSettings::default();
        let (mut premium, mut other) = (0, 0);
        for (code, example) in every_example_number() {
            let raw = format!("+{code}{example}");
            let Ok(number) = phonenumber::parse(None, &raw) else {
                continue;
            };
            let national = number.national().to_string();
            // The library's answer for the region the number belongs to.
            let expected = number
                .metadata(&phonenumber::metadata::DATABASE)
                .and_then(|metadata| metadata.descriptors().premium_rate())
                .is_some_and(|range| range.is_match(&national));
            let Ok(ours) = Recipient::parse(&raw, &settings) else {
                continue;
            };
            assert_eq!(ours.premium_rate, expected, "{raw}");
            if expected {
                premium += 1;
            } else {
                other += 1;
            }
        }
        assert!(
            premium > 100 && other > 900,
            "{premium} premium, {other} other"
        );
    }

    #[test]
    fn every_spelling_of_an_email_address_is_one_recipient() {
        let settings = gb();
        for raw in [
            "alice@example.com",
            "Alice@Example.COM",
            "alice+news@example.com",
            "mailto:alice@example.com",
            " alice@example.com ",
        ] {
            assert_eq!(key(raw, &settings), "recipient:alice@example.com", "{raw}");
        }
        // Dots are the same mailbox only where the provider says so.
        for raw in [
            "j.doe@gmail.com",
            "JDoe+x@googlemail.com",
            "j.d.o.e@GMAIL.com",
        ] {
            assert_eq!(key(raw, &settings), "recipient:jdoe@gmail.com", "{raw}");
        }
        assert_eq!(
            key("j.doe@example.com", &settings),
            "recipient:j.doe@example.com"
        );
        assert!(Recipient::parse("not@an@address", &settings).is_err());
        assert_eq!(
            Recipient::parse("bob@example.org", &settings)
                .unwrap()
                .destination
                .unwrap()
                .to_string(),
            "destination:@example.org"
        );
    }

    proptest::proptest! {
        /// Any spelling of a UK mobile (international, `00`, national or `tel:` prefix,
        /// separators anywhere) is the one E.164 key.
        #[test]
        fn generated_spellings_of_a_number_are_one_recipient(
            digits in "[0-9]{9}",
            prefix in 0usize..5,
            separators in proptest::collection::vec(0usize..4, 10),
        ) {
            let national = format!("7{digits}");
            let mut spelled = String::new();
            for (i, digit) in national.chars().enumerate() {
                spelled.push_str(["", " ", "-", "."][separators[i]]);
                spelled.push(digit);
            }
            let raw = match prefix {
                0 => format!("+44{spelled}"),
                1 => format!("0044{spelled}"),
                2 => format!("0{spelled}"),
                3 => format!("tel:+44{spelled}"),
                _ => format!("TEL:0044 {spelled}"),
            };
            proptest::prop_assert_eq!(key(&raw, &gb()), format!("recipient:+44{national}"), "{}", raw);
        }

        /// Any case of an address and any `+tag` is the one mailbox.
        #[test]
        fn generated_spellings_of_an_address_are_one_recipient(
            local in "[a-z]{1,12}",
            domain in "[a-z]{1,10}",
            tag in proptest::option::of("[a-z0-9]{1,8}"),
            upper in proptest::collection::vec(proptest::bool::ANY, 30),
        ) {
            let address = format!("{local}@{domain}.example");
            let mut raw: String = address
                .chars()
                .zip(upper.iter().cycle())
                .map(|(c, up)| if *up { c.to_ascii_uppercase() } else { c })
                .collect();
            if let Some(tag) = tag {
                let at = raw.find('@').unwrap();
                raw.insert_str(at, &format!("+{tag}"));
            }
            proptest::prop_assert_eq!(key(&raw, &gb()), format!("recipient:{address}"), "{}", raw);
        }
    }

    #[test]
    fn push_tokens_are_hashed() {
        let settings = gb();
        let token = "fcm:APA91bH-token_with:colons";
        let recipient = Recipient::parse(token, &settings).unwrap();
        assert_eq!(recipient.kind, Kind::Push);
        let text = recipient.key.to_string();
        assert!(
            text.starts_with("recipient:push:") && text.len() == 15 + 32,
            "{text}"
        );
        assert!(!text.contains("APA91"), "the token itself is not kept");
        assert_eq!(key(&format!("push:{token}"), &settings), text);
        assert!(recipient.destination.is_none());
        // An APNs token of hex digits is not a phone number.
        let apns = "a3f1".repeat(16);
        assert_eq!(Recipient::parse(&apns, &settings).unwrap().kind, Kind::Push);
    }
}
