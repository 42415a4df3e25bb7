//! Account and device ids: any text is made canonical or refused, never a panic; the canonical
//! id is canonical again and holds no control or invisible character.
#![no_main]

use libfuzzer_sys::fuzz_target;
use palisade::model::{AccountIds, Identifiers};

const IDS: Identifiers = Identifiers {
    accounts: AccountIds::CaseInsensitive,
    max_len: 256,
};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(id) = IDS.account("account", text) {
        assert_eq!(IDS.account("account", &id).as_deref(), Ok(&*id), "idempotent");
        assert!(!id.chars().any(char::is_control));
    }
    if let Ok(device) = IDS.device(text) {
        assert_eq!(device, device.trim());
    }
});
