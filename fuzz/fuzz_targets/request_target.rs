//! Request targets: any bytes are canonicalised or refused, never a panic; the canonical path
//! starts with `/` and is canonical again (idempotent), and classification of every spelling
//! is at least as strict as that of its canonical form.
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
        // Escaping a raw `\` or `%` makes the canonical form longer than the spelling: past
        // the input limit it is not itself a valid input, so idempotence is checked below it.
        if target.path.len() > palisade::limiter::target::MAX_TARGET_BYTES {
            continue;
        }
        let again = canonical(&target.path, case_insensitive).expect("a canonical path is valid");
        assert_eq!(again.path, target.path, "idempotent");
        for method in ["GET", "POST"] {
            let spelled = BUDGETS.classify(method, text);
            let plain = BUDGETS.classify(method, &target.path);
            assert_eq!(BUDGETS.stricter(spelled, plain), spelled, "{text:?}");
        }
    }
});
