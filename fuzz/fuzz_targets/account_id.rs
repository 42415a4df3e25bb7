//! Account and device ids: any text is made canonical or refused, never a panic; the canonical
//! id is canonical again and holds no control or invisible character.
#![no_main]

use libfuzzer_sys::fuzz_target;
use palisade::model::{AccountIds, Identifiers};

const PROFILES: [Identifiers; 2] = [
    Identifiers {
        accounts: AccountIds::CaseInsensitive,
        max_len: 256,
    },
    Identifiers {
        accounts: AccountIds::AccentInsensitive,
        max_len: 256,
    },
];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for ids in PROFILES {
        if let Ok(id) = ids.account("account", text) {
            assert_eq!(ids.account("account", &id).as_deref(), Ok(&*id), "idempotent");
            assert!(!id.chars().any(char::is_control));
        }
    }
    if let Ok(device) = PROFILES[0].device(text) {
        assert_eq!(device, device.trim());
    }
});
