use super::*;
use crate::store::MemoryHot;
use rand::{Rng, SeedableRng};

#[test]
fn a_value_packed_and_read_back_steps_as_the_kept_one() {
    let memory = MemoryHot::new();
    let mut stored: std::collections::HashMap<String, Vec<u8>> = Default::default();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut now = 1_800_000_000_000i64;
    let keys = ["a", "b", "c"];
    let windows = ["f", "a", "i1"];
    for round in 0..3000 {
        now += rng.random_range(0..180_000);
        let batch = rng.random_range(1..8);
        let steps: Vec<WindowStep> = (0..batch)
            .map(|_| {
                let roll = rng.random_range(0..100);
                let key = keys[rng.random_range(0..3)];
                let window = windows[rng.random_range(0..3)];
                let window_ms = if key == "c" { 90 * 86_400_000 } else { 600_000 };
                WindowStep {
                    key: key.to_owned(),
                    window: window.to_owned(),
                    member: (roll % 10 != 0).then(|| rng.random_range(1..12u64)),
                    score: now - rng.random_range(-60_000..(window_ms.min(900_000))),
                    window_ms,
                    cap: match window {
                        "f" => 3,
                        "a" => 5,
                        _ => 1000,
                    },
                    gap: rng.random_bool(0.5),
                    action: match roll {
                        0..10 => WindowAction::Delete,
                        10..22 => WindowAction::Contains,
                        22..32 => WindowAction::Remove,
                        _ => WindowAction::Record,
                    },
                }
            })
            .collect();
        let in_memory = memory.window_steps(&steps, now);
        let mut out = vec![(0, None); steps.len()];
        for key in keys {
            let mut value = stored
                .get(key)
                .and_then(|b| WindowValue::unpack(b, now))
                .unwrap_or_default();
            for (i, step) in steps.iter().enumerate().filter(|(_, s)| s.key == key) {
                out[i] = value.step(step, now);
            }
            value.finish(now);
            if value.changed() {
                match value.packed(now) {
                    Some((bytes, _)) => {
                        stored.insert(key.to_owned(), bytes);
                    }
                    None => {
                        stored.remove(key);
                    }
                }
            }
        }
        assert_eq!(in_memory, out, "round {round}: {steps:#?}");
    }
}
