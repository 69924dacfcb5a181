//! Speculative decoding's draft marks, shared by the engine's tests.

/// The records as JSON without their draft marks, and the marks' (drafted, accepted) counts;
/// every mark must be consistent with its record (`accepted` iff the drafted token was
/// selected).
pub fn unmarked(records: &[nextok_core::StepRecord]) -> (String, usize, usize) {
    let (mut drafted, mut accepted) = (0, 0);
    let plain: Vec<_> = records
        .iter()
        .map(|r| {
            let mut r = r.clone();
            if let Some(d) = r.draft.take() {
                assert_eq!(d.accepted, d.token == r.selected, "mark of step {}", r.step);
                drafted += 1;
                accepted += d.accepted as usize;
            }
            r
        })
        .collect();
    (serde_json::to_string(&plain).unwrap(), drafted, accepted)
}
