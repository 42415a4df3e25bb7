//! Range files and ASN lists in every format: never a panic, and every range is ordered.
#![no_main]

use libfuzzer_sys::fuzz_target;
use palisade::reputation::parse::{RangeFormat, parse_asns, parse_ranges_as};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for format in [
        RangeFormat::Auto,
        RangeFormat::Cidr,
        RangeFormat::Csv,
        RangeFormat::Urls,
    ] {
        if let Ok(ranges) = parse_ranges_as(text, format) {
            assert!(ranges.iter().all(|(start, end)| start <= end));
        }
    }
    let _ = parse_asns(text);
});
