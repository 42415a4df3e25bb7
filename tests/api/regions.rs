//! Two regions on one machine, as an operator deploys them: one Postgres, a Redis each (the
//! second started here), an instance each. What is made in one region is enforced in the
//! other within 2 s (lockouts, releases, deny-list entries); a budget held across regions
//! (`regions.global_budgets`) admits no more than its limit over both.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{ADMIN_TOKEN, Backend, ChaosProxy, OwnRedis, TestApp, free_port, socket_of};

struct TwoRegions {
    eu: TestApp,
    us: TestApp,
    _redis: OwnRedis,
    /// Stops both regions' listeners and renewals when dropped.
    _stop: tokio::sync::watch::Sender<bool>,
}

/// Regions `eu` and `us`; `global` names the budgets they share.
async fn two_regions(global: &[&str]) -> Option<TwoRegions> {
    two_regions_with(global, None).await
}

/// [`two_regions`] with `budgets` in place of the default budgets.
async fn two_regions_with(
    global: &[&str],
    budgets: Option<Vec<palisade::config::BudgetSettings>>,
) -> Option<TwoRegions> {
    let global: Vec<String> = global.iter().map(|b| (*b).to_owned()).collect();
    let eu = TestApp::spawn_with(Backend::Production, |settings| {
        settings.regions.name = "eu".to_owned();
        settings.regions.count = 2;
        settings.regions.global_budgets = global;
        if let Some(budgets) = budgets {
            settings.limits.budgets = budgets;
        }
    })
    .await?;
    let redis = OwnRedis::start(free_port(), tempfile::tempdir().unwrap()).await;
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let us = eu
        .another_instance_with(|settings| {
            settings.regions.name = "us".to_owned();
            settings.redis_url = Some(url);
        })
        .await;
    // What `palisade serve` starts in the background: listening and renewing.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    eu.app.regions.spawn(&stopped);
    us.app.regions.spawn(&stopped);
    Some(TwoRegions {
        eu,
        us,
        _redis: redis,
        _stop: stop,
    })
}

fn login(account: &str, ip: &str) -> serde_json::Value {
    json!({"endpoint": "/auth/login", "method": "POST", "ip": ip, "user_id": account})
}

/// Polls `refused` every 20 ms until it holds; how long that took (panics after 5 s).
async fn until<F, Fut>(what: &str, mut holds: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !holds().await {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{what}: not within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

/// True when `app` refuses `body` for `reason` (the 429's `details.reason`).
async fn refused_for(app: &TestApp, body: serde_json::Value, reason: &str) -> bool {
    let response = app.limit_check(&body).await;
    if response.status() != StatusCode::TOO_MANY_REQUESTS {
        return false;
    }
    let body: serde_json::Value = response.json().await.unwrap();
    body["error"]["details"]["reason"] == reason
}

async fn status_of(app: &TestApp, body: serde_json::Value) -> StatusCode {
    let response = app.limit_check(&body).await;
    let status = response.status();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        println!("503: {}", response.text().await.unwrap());
    }
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn what_one_region_enforces_the_other_does_within_two_seconds() {
    let Some(regions) = two_regions(&[]).await else {
        return;
    };
    let (eu, us) = (&regions.eu, &regions.us);
    // Lockouts made in eu, refused in us (from an address neither region has seen).
    let mut lags = Vec::new();
    for n in 0..8 {
        let account = format!("traveller-{n}");
        let fresh_ip = format!("198.51.100.{}", 10 + n);
        assert_eq!(
            status_of(us, login(&account, &fresh_ip)).await,
            StatusCode::OK
        );
        // Timed from the moment eu acknowledged the batch that locked the account.
        eu.fail(&format!("reg-{n}"), &account, &["192.0.2.60"], 10)
            .await;
        lags.push(
            until("a lockout made in eu refused in us", || {
                let body = login(&account, &fresh_ip);
                async move { refused_for(us, body, "account_locked").await }
            })
            .await,
        );
        assert_eq!(eu.lockouts(&format!("?account={account}")).await.len(), 1);
    }
    lags.sort();
    println!("lockout eu → us: {lags:?}");
    assert!(
        lags.last().unwrap() < &Duration::from_secs(2),
        "slowest {:?}",
        lags.last()
    );
    assert_eq!(
        us.status("traveller-0", "198.51.100.99", None).await["action"],
        "lockout",
        "the lock marker too"
    );

    // Released in us, admitted in eu again.
    let id = eu.lockouts("?account=traveller-1").await[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let released = us
        .post(
            &format!("/v1/lockouts/{id}/release"),
            Some(ADMIN_TOKEN),
            &json!({"reason": "verified by phone"}),
        )
        .await;
    assert_eq!(released.status(), StatusCode::OK);
    let lag = until("a release in us admitted in eu", || async {
        status_of(eu, login("traveller-1", "198.51.100.200")).await == StatusCode::OK
    })
    .await;
    println!("release us → eu: {lag:?}");
    assert!(lag < Duration::from_secs(2), "{lag:?}");
    assert_eq!(
        eu.status("traveller-1", "198.51.100.201", None).await["action"],
        "none"
    );

    // A deny-list entry added in eu, refused in us.
    let read = json!({"endpoint": "/v1/feed", "ip": "203.0.113.66"});
    assert_eq!(status_of(us, read.clone()).await, StatusCode::OK);
    let added = eu
        .post(
            "/v1/lists/deny",
            Some(ADMIN_TOKEN),
            &json!({"value": "203.0.113.66", "reason": "scraper"}),
        )
        .await;
    assert_eq!(added.status(), StatusCode::CREATED);
    let lag = until("a deny entry of eu refused in us", || {
        let read = read.clone();
        async move { refused_for(us, read, "ip_blocked").await }
    })
    .await;
    println!("deny entry eu → us: {lag:?}");
    assert!(lag < Duration::from_secs(2), "{lag:?}");
}

/// One account's logins (5 a minute) tried in both regions at once, from addresses of their
/// own: both regions together admit the budget, give or take what the shares' swings lend
/// (regions renewing out of step see each other's demand at different ages, so for a
/// renewal both shares can rise: each brings its new tokens at once, owed back when it
/// falls; docs/MULTI-REGION.md); without shares each would admit 5. A region with the
/// account to itself spends the whole budget after its second renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn a_global_budget_holds_across_regions() {
    let Some(regions) = two_regions(&["auth-account"]).await else {
        return;
    };
    let (eu, us) = (&regions.eu, &regions.us);
    let mut admitted = 0;
    for round in 0..6 {
        for (region, app) in [("eu", eu), ("us", us)] {
            for i in 0..3 {
                let ip = format!("10.{round}.{i}.{}", if region == "eu" { 1 } else { 2 });
                if status_of(app, login("shared-account", &ip)).await == StatusCode::OK {
                    admitted += 1;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    println!("shared-account: {admitted} admitted of 36 tried over both regions");
    assert!(
        admitted <= 7,
        "{admitted} admitted: more than the budget and a swing of each region's share"
    );
    assert!(admitted >= 3, "{admitted} admitted: the budget is starved");

    // One region alone: after its second renewal its share is the whole budget (the first
    // lease is at most the fair slice: another region may not have reported yet).
    assert_eq!(
        status_of(us, login("homebody", "10.9.0.1")).await,
        StatusCode::OK
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut alone = 1;
    for i in 0..10 {
        if status_of(us, login("homebody", &format!("10.9.1.{i}"))).await == StatusCode::OK {
            alone += 1;
        }
    }
    println!("homebody: {alone} admitted in one region");
    assert!(alone >= 4, "{alone}: the region's share did not grow");
    assert!(alone <= 5, "{alone}");
}

/// Each region checks `per_s[region]` requests a second of `tenant` for `seconds`, evenly
/// paced, both at once; per region, (checked, admitted), and how long the run took.
async fn paced(
    regions: &TwoRegions,
    tenant: &str,
    per_s: [u32; 2],
    seconds: u64,
) -> ([(u32, u32); 2], Duration) {
    let started = Instant::now();
    let body =
        json!({"endpoint": "/api/items", "method": "GET", "ip": "10.30.0.1", "tenant": tenant});
    let until = started + Duration::from_secs(seconds);
    let (eu, us) = tokio::join!(
        paced_in(&regions.eu, &body, per_s[0], until),
        paced_in(&regions.us, &body, per_s[1], until)
    );
    ([eu, us], started.elapsed())
}

/// `rate` checks of `body` a second in `app` until `until`: (checked, admitted).
async fn paced_in(
    app: &TestApp,
    body: &serde_json::Value,
    rate: u32,
    until: Instant,
) -> (u32, u32) {
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
    let (mut checked, mut admitted) = (0, 0);
    while Instant::now() < until {
        tick.tick().await;
        checked += 1;
        if status_of(app, body.clone()).await == StatusCode::OK {
            admitted += 1;
        }
    }
    (checked, admitted)
}

/// A busy tenant quota (50 a second, bursts of 50) held across two regions, as the
/// simulator's goals ask of it (`cargo bench --bench regions`): demand that fits in one
/// bucket over both regions (20 + 10 a second) is refused at most 1 % of the time, and
/// demand over it (60 + 30 a second) is admitted at most 105 % of what one bucket admits
/// over the run (its burst and its refill), and not starved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn a_busy_global_budget_admits_what_one_bucket_would() {
    let quota = palisade::config::BudgetSettings {
        name: "quota".to_owned(),
        scope: palisade::config::ScopeKind::Tenant,
        classes: vec![],
        limit: 50,
        period_s: 1,
        burst: Some(50),
        when: palisade::config::When::Always,
        shadow: false,
    };
    let Some(regions) = two_regions_with(&["quota"], Some(vec![quota])).await else {
        return;
    };
    let ([eu, us], _) = paced(&regions, "fits", [20, 10], 6).await;
    let (checked, admitted) = (eu.0 + us.0, eu.1 + us.1);
    println!("fits: {admitted} admitted of {checked} (eu {eu:?}, us {us:?})");
    assert!(
        (checked - admitted) * 100 <= checked,
        "{} of {checked} refused, more than 1 %",
        checked - admitted
    );

    let ([eu, us], took) = paced(&regions, "over", [60, 30], 8).await;
    let admitted = eu.1 + us.1;
    let one_bucket = 50.0 + 50.0 * took.as_secs_f64();
    println!(
        "over: {admitted} admitted of {} (eu {eu:?}, us {us:?}); one bucket: {one_bucket:.0} in {took:?}",
        eu.0 + us.0
    );
    assert!(
        f64::from(admitted) <= 1.05 * one_bucket,
        "{admitted} admitted, over 105 % of {one_bucket:.0}"
    );
    assert!(
        f64::from(admitted) >= 0.9 * one_bucket,
        "{admitted} admitted: the budget is starved ({one_bucket:.0})"
    );
}

/// A region cut off from Postgres keeps its last leases for a lease's time (2 s), then, for
/// a class that fails closed (`auth`), spends next to nothing of a global budget: the other
/// regions have taken its share over by then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn a_region_cut_off_from_the_database_gives_up_its_fail_closed_shares() {
    let Some(eu) = TestApp::spawn_with(Backend::Production, |settings| {
        settings.regions.name = "eu".to_owned();
        settings.regions.count = 2;
        settings.regions.global_budgets = vec!["auth-account".to_owned()];
    })
    .await
    else {
        return;
    };
    let proxy = ChaosProxy::start(socket_of(&eu.settings.database_url)).await;
    let redis = OwnRedis::start(free_port(), tempfile::tempdir().unwrap()).await;
    let (database, redis_url) = (
        proxy.proxied_url(&eu.settings.database_url),
        format!("redis://127.0.0.1:{}", redis.port),
    );
    let us = eu
        .another_instance_with(|settings| {
            settings.regions.name = "us".to_owned();
            settings.database_url = database;
            settings.redis_url = Some(redis_url);
        })
        .await;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    us.app.regions.spawn(&stopped);
    // Leased: the account is us's alone, its share grows to the whole budget.
    assert_eq!(
        status_of(&us, login("islander", "10.20.0.1")).await,
        StatusCode::OK
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        status_of(&us, login("islander", "10.20.0.2")).await,
        StatusCode::OK
    );
    proxy.blackhole();
    tokio::time::sleep(Duration::from_millis(2_600)).await;
    let refused = us.limit_check(&login("islander", "10.20.0.3")).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    proxy.restore();
    drop(stop);
}
