//! In-process limiter vs the `governor` crate's keyed limiter, 100k keys, one thread.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use palisade::clock::ManualClock;
use palisade::config::LimitSettings;
use palisade::limiter::bucket::{self, Params};
use palisade::limiter::{LimitRequest, Limiter};
use palisade::model::{ClientIp, SubjectKey};
use palisade::store::{Hot, Keys, MemoryHot};

const KEYS: u64 = 100_000;

/// One bucket per key, every check allowed (a generous quota), keys visited round-robin:
/// the cost of the decision and the keyed store, as governor measures itself.
pub fn in_process_vs_governor(c: &mut Criterion) {
    let mut group = c.benchmark_group("in_process_check_100k_keys");
    group.throughput(Throughput::Elements(1));

    let quota = governor::Quota::per_second(NonZeroU32::new(1_000_000).unwrap());
    let governor = governor::RateLimiter::<u64, _, _>::keyed(quota);
    let mut next = 0u64;
    group.bench_function(BenchmarkId::new("governor", KEYS), |b| {
        b.iter(|| {
            next = (next + 1) % KEYS;
            black_box(governor.check_key(&next).is_ok())
        });
    });

    // The same, keyed by the very strings Palisade uses (formatted per check into a reused
    // buffer, as below): the key's construction and hashing cost the same on both sides.
    let by_string = governor::RateLimiter::<String, _, _>::keyed(quota);
    let mut string_index = 0u64;
    let mut string_key = String::with_capacity(64);
    group.bench_function(BenchmarkId::new("governor_string_keys", KEYS), |b| {
        b.iter(|| {
            use std::fmt::Write;
            string_index = (string_index + 1) % KEYS;
            string_key.clear();
            let _ = write!(string_key, "pal:v1:{{user:{string_index}}}:b:b");
            black_box(by_string.check_key(&string_key).is_ok())
        });
    });

    let memory = MemoryHot::new();
    // A bucket that never refills to full within the run, so every key stays resident,
    // as in governor (which never evicts): the comparison is check vs check.
    let params = Params {
        capacity: 1e9,
        refill_per_s: 1.0,
        multiplier: 1.0,
    };
    let mut index = 0u64;
    let mut now_us = 0.0f64;
    // The limiter builds each key as it checks (it is then in cache), as governor is handed
    // a fresh u64: format into a reused buffer instead of reading 100k cold strings.
    let mut key = String::with_capacity(64);
    group.bench_function(BenchmarkId::new("palisade", KEYS), |b| {
        b.iter(|| {
            use std::fmt::Write;
            index = (index + 1) % KEYS;
            now_us += 0.1;
            key.clear();
            let _ = write!(key, "pal:v1:{{user:{index}}}:b:b");
            let allowed = memory.update_buckets(&[key.as_str()], now_us, |states, writes| {
                let verdict = bucket::evaluate(states[0], now_us, params, 1.0);
                writes[0] = verdict.allowed.then_some(verdict.new_tat);
                verdict.allowed
            });
            black_box(allowed)
        });
    });
    group.finish();
}

/// An in-process limiter with the default budgets, each so large that its buckets never
/// refill to full within a run: every key stays resident.
fn resident_limiter(clock: &ManualClock) -> Limiter {
    let mut settings = LimitSettings::default();
    for budget in &mut settings.budgets {
        budget.limit = 1_000_000_000;
        budget.period_s = 1_000_000_000;
    }
    Limiter::new(
        &settings,
        Hot::Memory(MemoryHot::new()),
        Keys::new("pal"),
        Arc::new(clock.clone()),
    )
}

/// A whole `Limiter::check` in-process: classify, build the keys of every scope, read
/// multipliers, check and consume atomically (read class with user and device: 4 scopes).
pub fn full_check(c: &mut Criterion) {
    let mut group = c.benchmark_group("limiter_check_in_process");
    group.throughput(Throughput::Elements(1));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let clock = ManualClock::new(1_800_000_000_000);
    let limiter = resident_limiter(&clock);
    let requests: Vec<LimitRequest> = (0..KEYS)
        .map(|i| LimitRequest {
            method: "GET".to_owned(),
            endpoint: "/v1/feed".to_owned(),
            ip: ClientIp::parse(
                &format!("10.{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255),
                64,
            )
            .unwrap(),
            user: Some(SubjectKey::user(&format!("user-{i}"), 64).unwrap()),
            device: Some(SubjectKey::device(&format!("device-{i}"), 64).unwrap()),
            tenant: None,
            recipient: None,
            cost: 1,
            consume: true,
        })
        .collect();
    let mut index = 0usize;
    group.bench_function(BenchmarkId::new("four_scopes", KEYS), |b| {
        b.iter(|| {
            index = (index + 1) % requests.len();
            clock.advance(Duration::from_micros(1));
            let decision = runtime.block_on(limiter.check(&requests[index])).unwrap();
            black_box(decision.allowed)
        });
    });
    group.finish();
}

/// A messaging check (`POST /otp/send`, anonymous) in-process, without and with a recipient
/// (a phone number: its parse to E.164 and the recipient and destination buckets; first seen,
/// and remembered from an earlier request), and the parse of a phone number, an e-mail
/// address and a push token alone.
pub fn messaging_check(c: &mut Criterion) {
    use palisade::config::MessagingSettings;
    use palisade::messaging::Recipient;
    let mut group = c.benchmark_group("messaging_check_in_process");
    group.throughput(Throughput::Elements(1));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let clock = ManualClock::new(1_800_000_000_000);
    let limiter = resident_limiter(&clock);
    let messaging = MessagingSettings::default();
    let numbers: Vec<String> = (0..KEYS)
        .map(|i| format!("+44 7{:03} {:06}", 100 + i % 900, i))
        .collect();
    let request = |i: usize, recipient: Option<palisade::limiter::RecipientKeys>| LimitRequest {
        method: "POST".to_owned(),
        endpoint: "/otp/send".to_owned(),
        ip: ClientIp::parse(
            &format!("10.{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255),
            64,
        )
        .unwrap(),
        user: None,
        device: None,
        tenant: None,
        recipient,
        cost: 1,
        consume: true,
    };
    let mut index = 0usize;
    group.bench_function(BenchmarkId::new("without_recipient", KEYS), |b| {
        b.iter(|| {
            index = (index + 1) % numbers.len();
            clock.advance(Duration::from_micros(1));
            let decision = runtime
                .block_on(limiter.check(&request(index, None)))
                .unwrap();
            black_box(decision.allowed)
        });
    });
    group.bench_function(BenchmarkId::new("with_phone_recipient", KEYS), |b| {
        b.iter(|| {
            index = (index + 1) % numbers.len();
            clock.advance(Duration::from_micros(1));
            let recipient = Recipient::parse(&numbers[index], &messaging).unwrap();
            let decision = runtime
                .block_on(limiter.check(&request(index, Some(recipient.into()))))
                .unwrap();
            black_box(decision.allowed)
        });
    });
    // A resend, a flood or a pump repeats its spellings: the service remembers them.
    let recipients = palisade::messaging::Recipients::new(MessagingSettings::default());
    // The service's path for a number it has not seen: the parse, then remembering it (100k
    // numbers in turn overflow what is remembered: every one misses, is stored, evicts).
    group.bench_function(
        BenchmarkId::new("with_phone_recipient_first_seen_remembered", KEYS),
        |b| {
            b.iter(|| {
                index = (index + 1) % numbers.len();
                clock.advance(Duration::from_micros(1));
                let recipient = recipients.parse(&numbers[index]).unwrap();
                let decision = runtime
                    .block_on(limiter.check(&request(index, Some(recipient.into()))))
                    .unwrap();
                black_box(decision.allowed)
            });
        },
    );
    let repeated: Vec<String> = numbers.iter().take(1000).cloned().collect();
    group.bench_function(
        BenchmarkId::new("with_phone_recipient_remembered", 1000),
        |b| {
            b.iter(|| {
                index = (index + 1) % numbers.len();
                clock.advance(Duration::from_micros(1));
                let recipient = recipients.parse(&repeated[index % repeated.len()]).unwrap();
                let decision = runtime
                    .block_on(limiter.check(&request(index, Some(recipient.into()))))
                    .unwrap();
                black_box(decision.allowed)
            });
        },
    );
    for (name, raw) in [
        ("parse_phone", "+44 7700 900123"),
        ("parse_email", "J.Doe+news@gmail.com"),
        (
            "parse_push_token",
            "fcm:APA91bHPRgkF3JUikC4ENAHEeMrd41Zxv3hVZjC9KtT8OvPVGJ",
        ),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| black_box(Recipient::parse(black_box(raw), &messaging).unwrap()))
        });
    }
    // Every region's example mobile in turn: libphonenumber's parse left to find the region
    // (its shared cache of 100 compiled expressions thrashes) against the recipient's parse.
    let every_country: Vec<String> = phonenumber::metadata::DATABASE
        .iter()
        .filter_map(|m| {
            let example = m.descriptors().mobile()?.example()?;
            Some(format!("+{}{example}", m.country_code()))
        })
        .collect();
    let mut next = 0usize;
    group.bench_function("phonenumber_parse_every_country", |b| {
        b.iter(|| {
            next = (next + 1) % every_country.len();
            black_box(phonenumber::parse(None, black_box(&every_country[next])).ok())
        })
    });
    group.bench_function("parse_phone_every_country", |b| {
        b.iter(|| {
            next = (next + 1) % every_country.len();
            black_box(Recipient::parse(black_box(&every_country[next]), &messaging).ok())
        })
    });
    group.finish();
}

/// The client side of one 4-scope `token_bucket.lua` reply: redis-rs parsing 29 integer
/// replies (the script's earlier format) against one bulk string of 29 little-endian i64s
/// (its format now) and their decoding. Same values in both.
pub fn reply_decoding(c: &mut Criterion) {
    let mut group = c.benchmark_group("token_bucket_reply_4_scopes");
    group.throughput(Throughput::Elements(1));
    let mut values = vec![1i64];
    for _ in 0..4 {
        values.extend([1, 600, 599, 1000, 0, 1_000_000, -2]);
    }
    let mut integers = format!("*{}\r\n", values.len()).into_bytes();
    for v in &values {
        integers.extend(format!(":{v}\r\n").bytes());
    }
    let packed: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut bulk = format!("${}\r\n", packed.len()).into_bytes();
    bulk.extend(&packed);
    bulk.extend(b"\r\n");
    group.bench_function("integer_replies", |b| {
        b.iter(|| {
            let value = redis::parse_redis_value(black_box(&integers)).unwrap();
            let ints: Vec<i64> = redis::from_redis_value(value).unwrap();
            black_box(ints)
        });
    });
    group.bench_function("packed_bulk_string", |b| {
        b.iter(|| {
            let value = redis::parse_redis_value(black_box(&bulk)).unwrap();
            let bytes: Vec<u8> = redis::from_redis_value(value).unwrap();
            let ints: Vec<i64> = bytes
                .chunks_exact(8)
                .map(|v| i64::from_le_bytes(v.try_into().unwrap()))
                .collect();
            black_box(ints)
        });
    });
    group.finish();
}
