//! Settings files: any TOML is accepted or refused with a one-line error naming the
//! setting, never a panic.
#![no_main]

use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use libfuzzer_sys::fuzz_target;
use palisade::Settings;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let figment = Figment::from(Serialized::defaults(Settings::default())).merge(Toml::string(text));
    if let Err(err) = Settings::from_figment(&figment) {
        assert!(!err.to_string().contains('\n'), "one line: {err}");
    }
});
