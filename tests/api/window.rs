//! The lockout window model on every backend: the spec cases on Redis and a cluster, steps
//! against the in-process twin, concurrent writers, the stored layout and its bounds.

use std::time::Duration;

use crate::helpers::{Backend, TestApp};
use crate::lockout::failure;

/// An instance on the production backend (single Redis) and a local 3-master Redis Cluster
/// with a connection to it (stopped when the second item is dropped); None when skipped.
async fn with_a_cluster() -> Option<(
    TestApp,
    crate::helpers::RedisCluster,
    palisade::store::RedisHot,
)> {
    let app = TestApp::spawn(Backend::Production).await?;
    let cluster = crate::helpers::RedisCluster::start().await?;
    let on_cluster = palisade::store::RedisHot::connect(&cluster.url, Duration::from_secs(5))
        .await
        .unwrap();
    Some((app, cluster, on_cluster))
}

/// The window model's specification cases (`palisade::store::window::spec`) answer the same on
/// a single Redis (the service's computation, written by `SET NX` / `lua/window_cas.lua`) and
/// on a Redis Cluster (`lua/velocity_batch.lua`) as in-process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn the_window_spec_holds_on_redis_and_on_a_cluster() {
    use palisade::lockout::velocity;
    use palisade::model::SubjectKey;
    let Some((app, _cluster, on_cluster)) = with_a_cluster().await else {
        return;
    };
    let keys = &app.app.stores.keys;
    let on_cluster = palisade::store::Hot::Redis(on_cluster);
    for (n, case) in palisade::store::window::spec::cases()
        .into_iter()
        .enumerate()
    {
        for (store, hot) in [("redis", &app.app.stores.hot), ("cluster", &on_cluster)] {
            let mut used = Vec::new();
            for (now, steps, answers) in &case.calls {
                let steps: Vec<_> = steps
                    .iter()
                    .map(|step| {
                        let key = keys.windows(
                            &SubjectKey::user(&format!("spec-{n}-{store}-{}", step.key), 64)
                                .unwrap(),
                        );
                        used.push(key.clone());
                        palisade::store::WindowStep {
                            key,
                            ..step.clone()
                        }
                    })
                    .collect();
                let got = velocity::run_sequence(hot, &steps, *now).await.unwrap();
                assert_eq!(&got, answers, "{store}: {}", case.name);
            }
            velocity::clear(hot, &used).await.unwrap();
        }
    }
}

/// The packed window values give the same answer to every step of a long random sequence on
/// a single Redis (computed by the service, written by `SET NX` / `lua/window_cas.lua`), on a
/// Redis Cluster (`lua/velocity_batch.lua`, one call per value) and in-process: additions in
/// and out of order and outside the window, retried members, count-only steps, gaps,
/// membership checks, window deletes, caps, windows expiring while their value lives on,
/// steps batched in one call, and values that do not exist yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn window_steps_answer_the_same_on_redis_and_in_process() {
    use palisade::lockout::velocity::{self, Step, WindowAction};
    use palisade::model::SubjectKey;
    use rand::{Rng, SeedableRng};
    let Some((app, _cluster, on_cluster)) = with_a_cluster().await else {
        return;
    };
    let redis = &app.app.stores.hot;
    let on_cluster = palisade::store::Hot::Redis(on_cluster);
    let memory = palisade::store::Hot::Memory(palisade::store::MemoryHot::new());
    let keys = &app.app.stores.keys;
    // Three values of 10 min windows and one of 90 days (as the known IPs/devices).
    let mut values: Vec<(String, i64)> = ["conf-a", "conf-b", "conf-c", "conf-known"]
        .iter()
        .map(|name| {
            let key = keys.windows(&SubjectKey::user(name, 64).unwrap());
            let window = if *name == "conf-known" {
                90 * 86_400_000
            } else {
                600_000
            };
            (key, window)
        })
        .collect();
    let windows = ["f", "a", "i1", "d2"];
    let mut rng = rand::rngs::StdRng::seed_from_u64(20261203);
    let mut now = app.app.clock.now_ms();
    let mut used_scores = std::collections::HashSet::new();
    let mut checked = 0;
    for round in 0..300 {
        // Time moves on by up to 3 min between calls: windows fill, age out and expire.
        now += rng.random_range(0..180_000);
        // Every third call also meets a value nobody wrote yet.
        if round % 3 == 0 {
            let name = format!("conf-new-{round}");
            values.push((keys.windows(&SubjectKey::user(&name, 64).unwrap()), 600_000));
        }
        let batch = rng.random_range(1..12);
        let steps: Vec<Step> = (0..batch)
            .map(|_| {
                let pick = if rng.random_bool(0.3) {
                    values.len() - 1
                } else {
                    rng.random_range(0..values.len())
                };
                let (key, window_ms) = values[pick].clone();
                let window = windows[rng.random_range(0..windows.len())];
                let mut score;
                loop {
                    score = now - rng.random_range(-60_000..(window_ms.min(900_000)));
                    if used_scores.insert(score) {
                        break;
                    }
                }
                let roll = rng.random_range(0..100);
                let action = match roll {
                    0..10 => WindowAction::Delete,
                    10..22 => WindowAction::Contains,
                    22..32 => WindowAction::Remove,
                    _ => WindowAction::Record,
                };
                Step {
                    key,
                    window: window.to_owned(),
                    member: (roll % 10 != 0).then(|| rng.random_range(1..12u64)),
                    score,
                    window_ms,
                    // Small caps on two windows, so full windows drop their oldest often.
                    cap: match window {
                        "f" => 3,
                        "a" => 5,
                        _ => 1000,
                    },
                    gap: rng.random_bool(0.5),
                    action,
                }
            })
            .collect();
        let on_redis = velocity::run_sequence(redis, &steps, now).await.unwrap();
        let scripted = velocity::run_sequence(&on_cluster, &steps, now)
            .await
            .unwrap();
        let in_process = velocity::run_sequence(&memory, &steps, now).await.unwrap();
        assert_eq!(on_redis, in_process, "steps {steps:#?} at {now}");
        assert_eq!(scripted, in_process, "steps {steps:#?} at {now}");
        checked += steps.len();
    }
    assert!(checked > 1000, "{checked} steps");
    velocity::clear(
        redis,
        &values.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
    )
    .await
    .unwrap();
}

/// Instances writing the same window values at once lose nothing: a value changed between
/// the read and the write is not overwritten (`lua/window_cas.lua`); its steps run again
/// atomically (`lua/velocity_batch.lua`). Each call steps 150 values, so both kinds of script
/// call come in parts (`VALUES_PER_CALL` values each) and conflicts happen in every part.
/// Value `v` gets `10 + v % 31` members per writer (count-only steps after that), so an
/// answer given to the wrong value shows: no answer may exceed its value's final count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn concurrent_window_writers_lose_no_entry() {
    use palisade::lockout::velocity::{self, Step, WindowAction};
    use palisade::model::SubjectKey;
    let Some(app) = TestApp::spawn(Backend::Production).await else {
        return;
    };
    let keys: Vec<String> = (0..150)
        .map(|v| {
            let subject = SubjectKey::user(&format!("contended-{v}"), 64).unwrap();
            app.app.stores.keys.windows(&subject)
        })
        .collect();
    let adds = |v: usize| 10 + (v % 31) as u64;
    let now = app.app.clock.now_ms();
    let step = |key: &str, member: Option<u64>, score: i64| Step {
        key: key.to_owned(),
        window: "f".to_owned(),
        member,
        score,
        window_ms: 600_000,
        cap: 1000,
        gap: false,
        action: WindowAction::Record,
    };
    let mut tasks = tokio::task::JoinSet::new();
    for writer in 0..8u64 {
        let hot = app.app.stores.hot.clone();
        let keys = keys.clone();
        tasks.spawn(async move {
            let mut answers = Vec::new();
            for n in 0..40u64 {
                let score = now - 1000 + i64::try_from(n).unwrap();
                let steps: Vec<Step> = keys
                    .iter()
                    .enumerate()
                    .map(|(v, key)| {
                        let member = (n < adds(v)).then_some(writer * 1000 + n + 1);
                        step(key, member, score)
                    })
                    .collect();
                answers.push(velocity::run_sequence(&hot, &steps, now).await.unwrap());
            }
            answers
        });
    }
    let mut answered = Vec::new();
    while let Some(done) = tasks.join_next().await {
        answered.extend(done.unwrap());
    }
    let counts: Vec<Step> = keys.iter().map(|key| step(key, None, 0)).collect();
    let counted = velocity::run_sequence(&app.app.stores.hot, &counts, now)
        .await
        .unwrap();
    let expected: Vec<u32> = (0..150).map(|v| 8 * adds(v) as u32).collect();
    let finals: Vec<u32> = counted.iter().map(|c| c.0).collect();
    assert_eq!(
        finals, expected,
        "8 writers x (10 + v % 31) distinct members each"
    );
    for call in &answered {
        for (v, count) in call.iter().enumerate() {
            assert!(
                count.0 >= 1 && count.0 <= expected[v],
                "value {v} answered {} (final {})",
                count.0,
                expected[v]
            );
        }
    }
    velocity::clear(&app.app.stores.hot, &keys).await.unwrap();
}

/// A window value not in the packed layout (a foreign writer, a corrupted value) reads as
/// empty on every path, the script included (on a cluster every window runs through it), and
/// is replaced by the next write: an answer, not a 5xx.
#[tokio::test]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn a_value_not_in_the_window_layout_reads_as_empty() {
    use palisade::lockout::velocity::{self, Step, WindowAction};
    use palisade::model::SubjectKey;
    use palisade::store::Hot;
    let Some((app, _cluster, on_cluster)) = with_a_cluster().await else {
        return;
    };
    let now = app.app.clock.now_ms();
    for (n, hot) in [&app.app.stores.hot, &Hot::Redis(on_cluster.clone())]
        .into_iter()
        .enumerate()
    {
        let Hot::Redis(redis) = hot else {
            panic!("Redis");
        };
        // A window header cut short, and a header announcing 9 entries that are not there.
        let garbled = [
            [&[1u8, b'f'][..], &[0x42; 5]].concat(),
            [&[1u8, b'f'][..], &[0x42; 8], &[0, 0, 0, 9], b"short"].concat(),
        ];
        for (g, garbage) in garbled.into_iter().enumerate() {
            let key = app
                .app
                .stores
                .keys
                .windows(&SubjectKey::user(&format!("garbled-{n}-{g}"), 64).unwrap());
            let _: redis::Value = redis
                .query(redis::cmd("SET").arg(&key).arg(garbage))
                .await
                .unwrap();
            let step = Step {
                key: key.clone(),
                window: "f".to_owned(),
                member: Some(7),
                score: now - 1000,
                window_ms: 600_000,
                cap: 1000,
                gap: false,
                action: WindowAction::Record,
            };
            let counted = velocity::run_sequence(hot, std::slice::from_ref(&step), now)
                .await
                .unwrap_or_else(|e| panic!("backend {n}, value {g}: {e}"));
            assert_eq!(
                counted[0].0, 1,
                "backend {n}, value {g}: the garbage counts nothing"
            );
            let more = [8, 9, 10].map(|m| Step {
                member: Some(m),
                ..step.clone()
            });
            let again = velocity::run_sequence(hot, &more, now).await.unwrap();
            let counts: Vec<u32> = again.iter().map(|c| c.0).collect();
            assert_eq!(
                counts,
                [2, 3, 4],
                "backend {n}, value {g}: the value was replaced"
            );
            velocity::clear(hot, &[key]).await.unwrap();
        }
    }
}

/// A distributed brute force (one account failing from many IPs: a pair window per IP) keeps
/// the account's value bounded, with the same answers on a single Redis, a Redis Cluster
/// (the script) and in-process: after each call at most `MAX_WINDOWS_PER_KIND` pair
/// windows, the ones added to least recently dropped first (also with many new ones in one
/// call), windows whose entries aged out dropped before any live one, the account's own
/// window never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn many_pair_windows_keep_an_account_value_bounded() {
    use palisade::lockout::velocity::{self, Step, WindowAction};
    use palisade::model::SubjectKey;
    use palisade::store::{Hot, MAX_WINDOWS_PER_KIND, MemoryHot};
    let Some((app, _cluster, on_cluster)) = with_a_cluster().await else {
        return;
    };
    let backends = [
        app.app.stores.hot.clone(),
        Hot::Redis(on_cluster),
        Hot::Memory(MemoryHot::new()),
    ];
    let key = app
        .app
        .stores
        .keys
        .windows(&SubjectKey::user("botnet-target", 64).unwrap());
    let window_ms = 600_000;
    let step = |window: String, member: Option<u64>, score: i64| Step {
        key: key.clone(),
        window,
        member,
        score,
        window_ms,
        cap: if member.is_some() { 10 } else { 1000 },
        gap: false,
        action: WindowAction::Record,
    };
    // A failure from IP n: the account's window and the pair window `i{n:03}`.
    let failure = |n: u64, score: i64| {
        [
            Step {
                cap: 1000,
                ..step("f".to_owned(), Some(n), score)
            },
            step(format!("i{n:03}"), Some(n), score),
        ]
    };
    let start = app.app.clock.now_ms();
    // (now, steps) per call: 200 IPs one call each, 1 ms apart; then 100 new IPs in one call.
    let mut calls: Vec<(i64, Vec<Step>)> = (0..200)
        .map(|n| (start + n as i64, failure(n, start + n as i64).to_vec()))
        .collect();
    calls.push((
        start + 300,
        (200..300).flat_map(|n| failure(n, start + 300)).collect(),
    ));
    // One call per window: the account's, then `i000` … `i499`.
    let counts_at = |now: i64| {
        std::iter::once(step("f".to_owned(), None, 0))
            .chain((0..500).map(|n| step(format!("i{n:03}"), None, 0)))
            .map(|s| (now, vec![s]))
            .collect::<Vec<_>>()
    };
    let device_windows: Vec<String> = (0..150)
        .map(|n| velocity::pair_window('d', &SubjectKey::device(&format!("dev{n}"), 64).unwrap()))
        .collect();
    // Per backend, per call: the call's window counts.
    let mut answers: Vec<Vec<velocity::WindowCounts>> = vec![Vec::new(); 3];
    let mut sizes: Vec<Vec<usize>> = vec![Vec::new(); 3];
    for (b, hot) in backends.iter().enumerate() {
        let run = |calls: Vec<(i64, Vec<Step>)>| async move {
            let mut out = Vec::new();
            for (now, steps) in calls {
                out.push(velocity::run_sequence(hot, &steps, now).await.unwrap());
            }
            out
        };
        let size = || async {
            let Hot::Redis(redis) = hot else {
                return None;
            };
            let len: usize = redis.query(redis::cmd("STRLEN").arg(&key)).await.unwrap();
            Some(len)
        };
        answers[b].extend(run(calls.clone()).await);
        answers[b].extend(run(counts_at(start + 300)).await);
        sizes[b].extend(size().await);
        // Then 128 IPs whose failures are 1 ms from leaving the window, and 2 ms later one
        // more IP.
        let late = start + 400;
        let fading: Vec<Step> = (300..428)
            .flat_map(|n| failure(n, late - window_ms + 1))
            .collect();
        answers[b].extend(run(vec![(late, fading)]).await);
        answers[b].extend(run(vec![(late + 2, failure(499, late + 2).to_vec())]).await);
        answers[b].extend(run(counts_at(late + 2)).await);
        sizes[b].extend(size().await);
        // One call whose steps alternate between this value and another (as a batch's
        // account and IP values do): 150 new windows of another kind, counted in the same
        // call and in the next. Every path (a cluster too, one script call per value) ends
        // the value's call after its last step, so the trim comes between the two.
        let interleaved: Vec<Step> = (0..150)
            .flat_map(|n| {
                let mut other = step("a".to_owned(), Some(n), late + 3);
                other.key = format!("{key}-other");
                [step(format!("j{n:03}"), Some(n), late + 3), other]
            })
            .chain((0..150).map(|n| step(format!("j{n:03}"), None, 0)))
            .collect();
        let count_j: Vec<Step> = (0..150)
            .map(|n| step(format!("j{n:03}"), None, 0))
            .collect();
        answers[b].extend(run(vec![(late + 3, interleaved), (late + 3, count_j)]).await);
        // 150 device pair windows with real names (kind and 16 hex digits, which the script
        // orders numerically) in one call, then counted.
        let devices: Vec<Step> = device_windows
            .iter()
            .map(|w| step(w.clone(), Some(7), late + 4))
            .collect();
        let count_devices: Vec<Step> = device_windows
            .iter()
            .map(|w| step(w.clone(), None, 0))
            .collect();
        answers[b].extend(run(vec![(late + 4, devices), (late + 4, count_devices)]).await);
        velocity::clear(hot, &[key.clone(), format!("{key}-other")])
            .await
            .unwrap();
    }
    assert_eq!(answers[0], answers[2], "single Redis vs in-process");
    assert_eq!(answers[1], answers[2], "cluster (script) vs in-process");
    // After 300 IPs: the 100 of the last call and the 28 newest before them, 128 in all.
    let first_counts = &answers[2][calls.len()..calls.len() + 501];
    assert_eq!(
        first_counts[0][0].0, 300,
        "the account's own window keeps every failure"
    );
    let live: Vec<usize> = (0..500)
        .filter(|&n| first_counts[1 + n][0].0 == 1)
        .collect();
    assert_eq!(live.len(), MAX_WINDOWS_PER_KIND);
    assert_eq!(live, (172..300).collect::<Vec<_>>());
    // Each pair window: byte #name, 4-byte name, expiry and count (12), one 16-byte entry;
    // the account's window: 1 + 1 + 12, then 16 per failure.
    let bytes = |pairs: usize, failures: usize| pairs * (1 + 4 + 12 + 16) + 14 + 16 * failures;
    assert_eq!(
        sizes[0][0],
        bytes(MAX_WINDOWS_PER_KIND, 300),
        "single Redis"
    );
    assert_eq!(sizes[1][0], bytes(MAX_WINDOWS_PER_KIND, 300), "cluster");
    // The 150 windows added in one call all count in it; the end of the call kept the 128
    // with the largest names (equal expiry): `j022` … `j149`.
    let [interleaved, next, _, devices_next] = answers[2].last_chunk::<4>().unwrap();
    assert!(interleaved[300..].iter().all(|c| c.0 == 1));
    let live_j: Vec<usize> = (0..150).filter(|&n| next[n].0 == 1).collect();
    assert_eq!(live_j, (22..150).collect::<Vec<_>>());
    // The same with real pair-window names: the 128 largest, bytewise.
    let mut by_name: Vec<&String> = device_windows.iter().collect();
    by_name.sort();
    let kept: std::collections::HashSet<&String> = by_name[22..].iter().copied().collect();
    let live_devices: Vec<bool> = devices_next.iter().map(|c| c.0 == 1).collect();
    let expected: Vec<bool> = device_windows.iter().map(|w| kept.contains(w)).collect();
    assert_eq!(live_devices, expected);
    // The 128 fading windows aged out 1 ms later: the next new window dropped them all.
    let last_counts = &answers[2][answers[2].len() - 505..answers[2].len() - 4];
    let live_late: Vec<usize> = (0..500).filter(|&n| last_counts[1 + n][0].0 == 1).collect();
    assert_eq!(live_late, [499]);
    // The account's window: the 300 failures of the first calls (in range), the fading ones
    // aged out, the last one.
    assert_eq!(last_counts[0][0].0, 301);
    assert_eq!(sizes[0][1], bytes(1, 301), "single Redis, late");
    assert_eq!(sizes[1][1], bytes(1, 301), "cluster, late");
}

/// A pair (account+IP) window keeps only as many failures as the thresholds need, so one IP
/// hammering an account does not grow its value: 40 failures from one IP store 40 entries in
/// the account's window and `lockout_after` (10) in the pair window.
#[tokio::test]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn a_pair_window_keeps_only_what_the_thresholds_need() {
    use palisade::model::SubjectKey;
    use palisade::store::Hot;
    let Some(app) = TestApp::spawn(Backend::Production).await else {
        return;
    };
    let events = (0..40)
        .map(|i| failure(&format!("pair-cap-{i}"), "hammered", "203.0.113.40"))
        .collect();
    app.post_auth(events).await;
    let Hot::Redis(redis) = &app.app.stores.hot else {
        panic!("production backend");
    };
    let key = app
        .app
        .stores
        .keys
        .windows(&SubjectKey::user("hammered", 256).unwrap());
    let len: usize = redis.query(redis::cmd("STRLEN").arg(&key)).await.unwrap();
    // Per window: byte #name, the name ("f"; "i" and 16 hex digits; "q"), expiry and count
    // (12), then 16 bytes per entry; the quick-login window keeps its 16 newest.
    assert_eq!(
        len,
        (1 + 1 + 12 + 16 * 40) + (1 + 17 + 12 + 16 * 10) + (1 + 1 + 12 + 16 * 16)
    );
}

/// `lua/window_cas.lua` writes a value only if it is still as read: one changed meanwhile
/// keeps its content, one deleted meanwhile stays deleted, and both are reported (for
/// `velocity_batch.lua` to run their steps); an unchanged one takes the new value and TTL.
#[tokio::test]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn window_cas_writes_only_values_unchanged_since_read() {
    let Some(app) = TestApp::spawn(Backend::Production).await else {
        return;
    };
    let redis = redis::Client::open(app.settings.redis_url.clone().unwrap()).unwrap();
    let mut conn = redis.get_multiplexed_async_connection().await.unwrap();
    let key = |name: &str| format!("{}:cas-test:{name}", app.settings.store.redis_key_prefix);
    let (same, changed, gone, deleted) = (key("same"), key("changed"), key("gone"), key("del"));
    for (k, v) in [(&same, "a"), (&changed, "theirs"), (&deleted, "d")] {
        let _: () = redis::cmd("SET")
            .arg(k)
            .arg(v)
            .arg("PX")
            .arg(60_000)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let _: () = redis::cmd("DEL")
        .arg(&gone)
        .query_async(&mut conn)
        .await
        .unwrap();
    let failed: Vec<usize> = redis::Script::new(include_str!("../../lua/window_cas.lua"))
        .key(&same)
        .key(&changed)
        .key(&gone)
        .key(&deleted)
        .arg("a")
        .arg("a2")
        .arg(120_000)
        .arg("mine")
        .arg("mine2")
        .arg(120_000)
        .arg("was")
        .arg("was2")
        .arg(120_000)
        .arg("d")
        .arg("")
        .arg(0)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        failed,
        vec![2, 3],
        "the changed and the deleted values conflict"
    );
    let values: Vec<Option<String>> = redis::cmd("MGET")
        .arg(&same)
        .arg(&changed)
        .arg(&gone)
        .arg(&deleted)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        values,
        vec![Some("a2".to_owned()), Some("theirs".to_owned()), None, None]
    );
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&same)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(ttl > 60_000, "the written value has the new TTL ({ttl} ms)");
    let _: () = redis::cmd("DEL")
        .arg(&same)
        .arg(&changed)
        .query_async(&mut conn)
        .await
        .unwrap();
}
