//! AWS `ip-ranges.json` / Google `cloud.json`: never a panic, every range ordered.
#![no_main]

use libfuzzer_sys::fuzz_target;
use palisade::reputation::parse::{RangeFormat, parse_ranges_as};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(ranges) = parse_ranges_as(text, RangeFormat::Json) {
        assert!(ranges.iter().all(|(start, end)| start <= end));
    }
});
