//! Redis TIME is the only clock of the scripts, and windows are aligned to the Unix epoch: tests
//! read TIME first and pick a window length that puts "now" where they need it in the window.

use std::ops::Range;

use sluice_testkit::resp::{Reply, Resp};

/// Redis TIME in µs since the epoch.
pub fn redis_time_us(client: &mut Resp) -> u64 {
    let Reply::Array(time) = client.cmd(&["TIME"]) else {
        panic!("TIME did not answer an array")
    };
    let [seconds, micros] = [&time[0], &time[1]].map(|r| r.text().parse::<u64>().unwrap());
    seconds * 1_000_000 + micros
}

/// A window length in ms, from `lengths`, whose current window (at `now_us`) has between
/// `left_ms.start` and `left_ms.end` ms left. Windows start at multiples of their length since
/// the epoch, so lengths a millisecond apart put their boundaries far apart near `now`.
pub fn window_with_left(now_us: u64, lengths: Range<u64>, left_ms: Range<u64>) -> u64 {
    let now_ms = now_us / 1000;
    lengths
        .clone()
        .find(|&length| left_ms.contains(&(length - now_ms % length)))
        .unwrap_or_else(|| panic!("no window in {lengths:?} ms has {left_ms:?} ms left"))
}

/// A window length in ms whose current window has at least `margin_ms` behind and ahead of
/// `now_us`: a test that takes less than `margin_ms` stays in one window.
pub fn window_around(now_us: u64, lengths: Range<u64>, margin_ms: u64) -> u64 {
    let now_ms = now_us / 1000;
    lengths
        .clone()
        .find(|&length| {
            let elapsed = now_ms % length;
            elapsed >= margin_ms && length - elapsed >= margin_ms
        })
        .unwrap_or_else(|| panic!("no window in {lengths:?} ms with {margin_ms} ms either side"))
}
