//! Request targets: any bytes are canonicalised or refused, never a panic; the canonical path
//! starts with `/`, is ASCII and is canonical again (idempotent); classification of every
//! spelling is at least as strict as that of its canonical form; raw UTF-8 reads as its
//! escapes; and a format suffix, dot or trailing space added to the path never makes the
//! class laxer.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use palisade::config::LimitSettings;
use palisade::limiter::Budgets;
use palisade::limiter::target::canonical;

static BUDGETS: LazyLock<Budgets> = LazyLock::new(|| Budgets::from_settings(&LimitSettings::default()));

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for case_insensitive in [true, false] {
        let Ok(target) = canonical(text, case_insensitive) else {
            continue;
        };
        assert!(target.path.starts_with('/'));
        assert!(target.path.is_ascii(), "bytes outside ASCII are escaped");
        // Escaping a raw `\` or `%` makes the canonical form longer than the spelling: past
        // the input limit it is not itself a valid input, so idempotence is checked below it.
        if target.path.len() > palisade::limiter::target::MAX_TARGET_BYTES {
            continue;
        }
        let again = canonical(&target.path, case_insensitive).expect("a canonical path is valid");
        assert_eq!(again.path, target.path, "idempotent");
        let escaped: String = text
            .bytes()
            .map(|b| if b.is_ascii() { char::from(b).to_string() } else { format!("%{b:02X}") })
            .collect();
        if let Ok(other) = canonical(&escaped, case_insensitive) {
            assert_eq!(other.path, target.path, "raw UTF-8 reads as its escapes: {text:?}");
        }
        let path = text.split(['?', '#']).next().unwrap_or("");
        for method in ["GET", "POST"] {
            let spelled = BUDGETS.classify(method, text);
            let plain = BUDGETS.classify(method, &target.path);
            assert_eq!(BUDGETS.stricter(spelled, plain), spelled, "{text:?}");
            for suffix in [".json", ".", "%20", " ", ".xml."] {
                let longer = format!("{path}{suffix}");
                if canonical(&longer, case_insensitive).is_err() {
                    continue;
                }
                let class = BUDGETS.classify(method, &longer);
                assert_eq!(BUDGETS.stricter(class, spelled), class, "{longer:?} vs {text:?}");
            }
        }
    }
});
