use super::*;

fn limiter(clock: &crate::clock::ManualClock) -> Limiter {
    Limiter::new(
        &crate::config::LimitSettings::default(),
        Hot::Memory(crate::store::MemoryHot::new()),
        Keys::new("t"),
        Arc::new(clock.clone()),
    )
}

fn counted(limiter: &Limiter, now_ms: i64) -> u64 {
    limiter
        .rates()
        .series("read", now_ms, 5)
        .unwrap_or_default()
        .iter()
        .map(|m| m.allowed + m.limited)
        .sum()
}

#[tokio::test]
async fn an_unobserved_limiter_decides_alike_and_counts_nothing() {
    let clock = crate::clock::ManualClock::new(1_800_000_000_000);
    let request = LimitRequest {
        method: "GET".to_owned(),
        endpoint: "/feed".to_owned(),
        ip: crate::model::ClientIp::parse("192.0.2.1", 64).unwrap(),
        user: None,
        device: None,
        tenant: None,
        recipient: None,
        cost: 1,
        consume: true,
    };
    let (observed, unobserved) = (limiter(&clock), limiter(&clock).unobserved());
    for _ in 0..3 {
        let a = observed.check(&request).await.unwrap();
        let b = unobserved.check(&request).await.unwrap();
        assert_eq!((a.allowed, a.scopes), (b.allowed, b.scopes));
    }
    let now = clock.now_ms();
    assert_eq!(counted(&observed, now), 3);
    assert_eq!(counted(&unobserved, now), 0);
}
