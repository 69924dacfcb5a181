#![no_main]
//! A trace file: parse the header and the step lines, and rebuild the request to replay.

use libfuzzer_sys::fuzz_target;
use nextok_engine::trace;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok((header, recorded)) = trace::parse(text) else {
        return;
    };
    let _ = header.requant();
    let _ = trace::replay_request(&header);
    if let (Some(a), Some(b)) = (recorded.first(), recorded.last()) {
        let _ = trace::first_diff("", a, b);
    }
});
