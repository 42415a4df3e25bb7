//! Scratch: Redis CPU of the window script on the bench's shape (not committed).
use palisade::lockout::velocity::{self, Step, WindowAction};
use palisade::model::SubjectKey;
use palisade::store::{Hot, Keys, RedisHot};

#[tokio::test]
#[ignore]
async fn scratch_window_cpu() {
    let port: u16 = std::env::var("SCRATCH_PORT").unwrap().parse().unwrap();
    let hot = Hot::Redis(
        RedisHot::connect(
            &format!("redis://127.0.0.1:{port}"),
            std::time::Duration::from_secs(5),
        )
        .await
        .unwrap(),
    );
    let keys = Keys::new("scr");
    let now = 1_764_000_000_000i64;
    let mut n = 0u64;
    let mut total = 0;
    for _ in 0..60 {
        let mut steps = Vec::new();
        for _ in 0..500 {
            n += 1;
            let acct = SubjectKey::user(&format!("acct{n}"), 64).unwrap();
            let ip = SubjectKey::ip(
                &palisade::model::ClientIp::parse(
                    &format!("10.{}.{}.{}", n >> 16 & 255, n >> 8 & 255, n & 255),
                    64,
                )
                .unwrap(),
            );
            let id = velocity::member_id(&format!("ev-{n}"));
            let mk = |key: String, window: String, member| Step {
                key,
                window,
                member: Some(member),
                score: now,
                window_ms: 600_000,
                cap: 1000,
                gap: false,
                action: WindowAction::Record,
            };
            steps.push(mk(keys.windows(&acct), "f".into(), id));
            steps.push(mk(keys.windows(&acct), velocity::pair_window('i', &ip), id));
            steps.push(mk(
                keys.windows(&ip),
                "a".into(),
                velocity::member_id(acct.as_str()),
            ));
            steps.push(mk(keys.windows(&ip), "f".into(), id));
        }
        total += velocity::run_sequence(&hot, &steps, now)
            .await
            .unwrap()
            .len();
    }
    println!("ops {total}");
}
